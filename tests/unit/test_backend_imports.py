"""The backend stays free of gradio: importing `kvlab` and every module of the
package (found with pkgutil.walk_packages, except the UI subpackage `kvlab.ui`
and `kvlab.__main__`, which runs the command line rather than defining
anything) in a fresh interpreter leaves `gradio` out of `sys.modules`."""

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
IMPORT_TIMEOUT_S = 300

IMPORT_EVERY_BACKEND_MODULE = """
import importlib
import json
import pkgutil
import sys

import kvlab

names = sorted(
    info.name for info in pkgutil.walk_packages(kvlab.__path__, prefix="kvlab.")
    if info.name not in ("kvlab.ui", "kvlab.__main__") and not info.name.startswith("kvlab.ui.")
)
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "gradio": sorted(m for m in sys.modules if m.split(".")[0] == "gradio")}))
"""


def test_no_backend_module_imports_gradio():
    proc = subprocess.run([sys.executable, "-c", IMPORT_EVERY_BACKEND_MODULE], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"kvlab.cli", "kvlab.compare.runner", "kvlab.strategies.dynamic"} <= set(report["imported"])
    assert report["gradio"] == [], f"importing the backend loaded {report['gradio']}"
