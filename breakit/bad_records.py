"""Write the hostile records page_bad_records.py and cli_bad_records.sh read.

Usage: python breakit/bad_records.py OUT_DIR   (e.g. /tmp/breakit/bad)
"""
import copy
import json
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/breakit/bad")
out.mkdir(parents=True, exist_ok=True)
base = json.loads(Path("tests/fixtures/record_v3_compare.json").read_text())


def write(name, obj=None, text=None):
    (out / name).write_text(text if text is not None else json.dumps(obj))


def variant(**changes):
    record = copy.deepcopy(base)
    for path, value in changes.items():
        node = record
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value
    return record


write("deep.json", text="[" * 100000 + "]" * 100000)
write("deep_str.json", text='{"a": "' + "[" * 100000 + '"}')
write("nan.json", text=json.dumps(base).replace('"wall_s": ', '"wall_s": NaN, "x": ', 1))
write("cols_str.json", variant(columns="notalist"))
write("cols5000.json", variant(columns=[base["columns"][0]] * 5000))
write("v99.json", variant(format_version=99))
write("nocols.json", variant(columns=[]))
write("nomodel.json", variant(model=None))
write("multiline_name.json", variant(columns__0__name="x\n" * 50))
write("surrogate.json", variant(columns__0__text="\ud800"))
write("array.json", [1, 2])
write("empty.json", text="")
write("bom.json", text="\ufeff" + json.dumps(base))
write("dupkeys.json", text='{"format": "kvlab.compare", "format": "kvlab.compare"}')
write("wide_obj.json", text="{" + ",".join(f'"k{i}": {{}}' for i in range(199000)) + "}")
write("many_numbers.json", text='{"format":"kvlab.compare","x":[' + ",".join(["1.5"] * 3000000) + "]}")
print("written to", out)
