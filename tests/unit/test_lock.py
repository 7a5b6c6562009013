"""requirements.lock: every dependency pinned inside its range, the set-up script's own pins agreeing with it, and
this environment installed at the locked versions (what `make test` and the image install)."""

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def locked() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            assert pinned and " " not in pinned, f"requirements.lock: {line!r} is not name==version"
            pins[_name(name)] = pinned
    return pins


def requirements(file: str) -> list[Requirement]:
    lines = (REPO / file).read_text(encoding="utf-8").splitlines()
    return [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]


def test_every_requirement_is_locked_at_a_version_its_range_admits():
    pins = locked()
    for file in ("requirements.txt", "requirements-test.txt"):
        for requirement in requirements(file):
            name = _name(requirement.name)
            assert name in pins, f"{requirement.name} ({file}) is not in requirements.lock"
            assert requirement.specifier.contains(Version(pins[name]), prereleases=True), \
                f"requirements.lock pins {name}=={pins[name]}, outside {file}'s {requirement.specifier}"


def test_the_setup_scripts_own_pins_agree_with_the_lock():
    pins = locked()
    script = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    torch = re.search(r'^readonly TORCH_VERSION="([^"]+)"', script, re.MULTILINE)[1]
    assert pins["torch"] == torch
    packages = re.findall(r'"?([a-z0-9][a-z0-9-]*)==(\$GEMMA_VERSION|[0-9][^"\s]*)"', script)
    assert len(packages) >= 6, f"expected the bundled model packages' pins in setup.sh, found {packages}"
    for name, pinned in packages:
        if pinned == "$GEMMA_VERSION":
            pinned = re.search(r'^readonly GEMMA_VERSION="([^"]+)"', script, re.MULTILINE)[1]
        assert pins.get(_name(name)) == pinned, f"setup.sh installs {name}=={pinned}, the lock says {pins.get(name)}"


def test_this_environment_has_the_locked_versions_of_what_it_installed():
    wrong = []
    for name, pinned in locked().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # locked for an optional part (a constraint installs nothing by itself)
        if Version(installed).public != Version(pinned).public:
            wrong.append(f"{name} {installed} (locked {pinned})")
    assert not wrong, "installed versions differ from requirements.lock: " + ", ".join(wrong)
