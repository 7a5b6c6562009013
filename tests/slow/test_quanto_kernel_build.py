"""The slow tier: set-up builds optimum-quanto's C++ kernel from nothing where `ninja` is not on PATH (the
Dockerfile's set-up, which does not activate the environment): it compiles the kernel (about 70 s on 2 cores),
so it runs with `make test-slow`, beside the image check that proves the same inside the image. The cheap
halves (which ninja the build finds, what the notes say) stay in tests/faults/test_quanto_kernel.py."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kvlab.caches import backends

REPO = Path(__file__).resolve().parents[2]


def quanto_copy(tmp_path: Path) -> Path:
    """A copy of the installed optimum package under tmp_path/site, without quanto's kernel build folder; returns
    that (absent) build folder."""
    import optimum.quanto

    package = Path(optimum.quanto.__file__).parent
    shutil.copytree(package.parent, tmp_path / "site" / "optimum", ignore=shutil.ignore_patterns("__pycache__"))
    build = tmp_path / "site" / "optimum" / "quanto" / "library" / "extensions" / "cpp" / "build"
    shutil.rmtree(build, ignore_errors=True)
    return build


def path_without_ninja(folder: Path) -> str:
    """A PATH of one folder of links to every program on this PATH except ninja."""
    folder.mkdir()
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = folder / entry.name
            if entry.name != backends.NINJA and not link.exists() and not link.is_symlink():
                link.symlink_to(entry.path)
    return str(folder)


def test_a_set_up_without_ninja_on_path_builds_the_kernel(tmp_path):
    build = quanto_copy(tmp_path)
    hidden = path_without_ninja(tmp_path / "bin")
    assert shutil.which(backends.NINJA, path=hidden) is None and shutil.which("c++", path=hidden)
    env = {**os.environ, "PATH": hidden, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    env.pop("CXX", None)
    proc = subprocess.run([sys.executable, "-m", "kvlab.caches.backends"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "kvlab.caches.backends: quanto C++ kernel ready", proc.stdout + proc.stderr[-3000:]
    assert (build / "quanto_cpp.so").is_file()


