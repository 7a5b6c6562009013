"""Probe model-source handling on a public (Space) kvlab: every front that takes a model source.

Usage: python breakit/sources_probe.py http://127.0.0.1:7911/
Prints each source and the reply of /plan_memory and /compare_strategies (1 token); flags replies that differ
between an existing and a missing path, or that contain file bytes or server paths.
"""
import sys
from gradio_client import Client

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7911/"
SOURCES = [
    "/etc", "/etc/passwd", "/nonexistent-xyz", "file:///etc/passwd", "~", "~/.bashrc", "..", "../../etc",
    "a/../../etc", "kvlab/ui", "kvlab/nope", "presets/quickstart.yaml", "presets/nope.yaml", "docs/spaces.md",
    "tests/unit", "scripts/setup.sh", "records/smollm2.md", "%2Fetc%2Fpasswd", "\uff0fetc\uff0fpasswd",
    "\u2215etc\u2215passwd", "proc/self", "etc/passwd", "x" * 5000, "kvlab/__init__.py", "Dockerfile/x",
    "bundled:../../etc/passwd", "bundled:/etc/passwd", "bundled:nope", "bundled:gemma-3-270m/../..",
    "HuggingFaceTB/SmolLM2-135M-Instruct", "app.py", "kvlab", "\x00/etc", "owner/name\n/etc/passwd",
    " /etc/passwd", "kvlab/ui ", "C:\\Windows", "\\\\server\\share",
]


def main():
    client = Client(URL, verbose=False)
    for src in SOURCES:
        for api, args in (("/plan_memory", dict(model=src, contexts="1k", strategies="dynamic")),
                          ("/compare_strategies", dict(strategies="dynamic", prompt="hi", max_new_tokens=1,
                                                       model=src))):
            try:
                out = client.predict(api_name=api, **args)
                text = str(out)
            except Exception as err:  # noqa: BLE001
                text = f"EXC {type(err).__name__}: {err}"
            print(f"{api:20} {src[:40]!r:45} -> {text[:400]!r}")


if __name__ == "__main__":
    main()
