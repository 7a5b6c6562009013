#!/usr/bin/env bash
# Write requirements.lock: the exact version of every package installed in .venv (or the environment given
# with --venv DIR), `pip freeze` style, which scripts/setup.sh and the Dockerfile install with `-c`.
#
#   scripts/lock.sh [--venv DIR]
#
# Run it after `make test` passed with the versions to ship; commit the lock with the change that needed it.
# kvlab itself (editable) is left out; a local build's direct URL becomes its `name==version` pin, and a
# torch build tag such as `+cpu` is dropped (the pin then admits the CPU wheel and the default one alike).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="$repo_root/.venv"
if [[ "${1:-}" == "--venv" && -n "${2:-}" ]]; then
    venv_dir="$2"
elif [[ $# -gt 0 ]]; then
    sed -n '2,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
fi

"$venv_dir/bin/python" - "$repo_root/requirements.lock" <<'PY'
import sys
from importlib.metadata import distributions

skip = {"kvlab", "pip", "setuptools", "wheel"}
pins = {}
for dist in distributions():
    name = dist.metadata["Name"]
    if not name or name.lower() in skip:
        continue
    pins[name.lower().replace("_", "-")] = dist.version.split("+")[0]
header = ("# The exact versions the test suite passed with (scripts/lock.sh writes this file from the environment).\n"
          "# scripts/setup.sh and the Dockerfile install requirements*.txt with `-c requirements.lock`; the ranges\n"
          "# in requirements.txt stay for installing kvlab as a library.\n")
with open(sys.argv[1], "w", encoding="utf-8") as out:
    out.write(header + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
PY
echo "lock: wrote $repo_root/requirements.lock ($(grep -vc '^#' "$repo_root/requirements.lock") packages)"
