"""Write hostile kvlab records: every free-text string field of a real record replaced by markup carrying a
marker (`data-bk`), so a DOM scan can tell which field became an element.

Usage: python breakit/hostile_record.py OUT_DIR
Writes OUT_DIR/hostile_compare.json (from tests/fixtures/record_v3_compare.json),
OUT_DIR/hostile_needle.json (from tests/fixtures/record_v1_needle.json), OUT_DIR/fields.json (marker -> field
path), and a file whose *name* is markup.
"""
import json
import sys
from pathlib import Path

ENUMS = {"format", "status", "strategy", "policy", "dtype", "device", "mode", "state", "fidelity_status",
         "measured_at", "layer_types", "backend", "kind", "format"}


def payload(i: int) -> str:
    return (f'<img src="http://example.invalid/{i}.png" data-bk="{i}" onerror="window.__bk={i}">'
            f'<b data-bk="{i}">B{i}</b><form data-bk="{i}"><input type=password></form>'
            f'[L{i}](javascript:alert({i})) ![I{i}](http://example.invalid/md{i}.png) **S{i}** $x^{i}$')


def poison(node, path, fields, skip=ENUMS):
    if isinstance(node, dict):
        return {k: (v if k in skip else poison(v, f"{path}.{k}", fields, skip)) for k, v in node.items()}
    if isinstance(node, list):
        return [poison(v, f"{path}[{n}]", fields, skip) for n, v in enumerate(node)]
    if isinstance(node, str):
        i = len(fields)
        fields[i] = path
        return payload(i)
    return node


def main(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    fields = {}
    for name, src in (("compare", "tests/fixtures/record_v3_compare.json"),
                      ("needle", "tests/fixtures/record_v1_needle.json")):
        data = json.loads(Path(src).read_text())
        start = len(fields)
        hostile = poison(data, name, fields)
        (out / f"hostile_{name}.json").write_text(json.dumps(hostile))
        print(name, "fields poisoned:", len(fields) - start)
    (out / "fields.json").write_text(json.dumps(fields, indent=1))
    evil_name = out / '<img src=x data-bk=\"name\" onerror=alert(1)>[n](javascript:1).json'
    evil_name.write_text(Path("tests/fixtures/record_v3_compare.json").read_text())


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/breakit/records"))
