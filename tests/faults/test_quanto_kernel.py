"""Fault catalogue: optimum-quanto compiled its C++ CPU kernel with the system compiler inside the first quanto
run (about 20 s of stalled decoding), and where no compiler exists (the python:3.11-slim image) the column
failed with a build log over a thousand characters long. Right: the kernel is built at set-up, loaded without a
compiler at run time, and where it is not built and cannot be, the column runs on a pure-PyTorch unpack and
says so in one line.

Also: torch's extension builder runs `ninja` from PATH, and the ninja that optimum-quanto's dependency installs
lies in the environment's bin/, off PATH where it is not activated (the Dockerfile's set-up): the kernel was not
built there and the column said "kvlab's set-up builds it". Right: set-up puts that folder on PATH for the build,
and where no ninja exists the note says so."""

import os
import shutil
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

import pytest
import torch

from kvlab.caches import backends

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_the_pure_unpack_gives_the_kernel_s_values():
    backends.prepare_quanto(build=False)
    packed = torch.randint(0, 256, (6, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for bits in (2, 4):
        expected = torch.ops.quanto.unpack(packed, bits)
        assert torch.equal(backends.unpack_pure(packed, bits), expected)


def test_without_a_built_kernel_or_a_compiler_the_pure_unpack_is_attached_and_said(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    ext = types.SimpleNamespace(_lib=None, build_directory=str(tmp_path / "build"))
    note = backends._attach_kernel(ext, build=True)
    assert ext._lib.unpack is backends.unpack_pure
    assert note == ("quanto: its C++ kernel is not built and no C++ compiler is available (CXX=/nonexistent/c++); "
                    "using a pure-PyTorch unpack instead (same values, slower)")


def test_a_quanto_column_runs_without_a_compiler_and_an_unbuilt_kernel(tmp_path):
    import optimum.quanto

    package = Path(optimum.quanto.__file__).parent
    copy = tmp_path / "site" / "optimum"
    shutil.copytree(package.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(copy / "quanto" / "library" / "extensions" / "cpp" / "build", ignore_errors=True)
    env = {**os.environ, "CXX": "/nonexistent/c++", "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--prompt", "Say hi", "--strategies",
                           "dynamic,quantized:backend=quanto:nbits=4:residual_length=4", "--max-new-tokens", "6",
                           "--no-fidelity"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("quantized quanto"))
    assert " ok " in row and "using a pure-PyTorch unpack instead" in row
    assert "ninja" not in proc.stderr and "/nonexistent/c++" not in proc.stderr
    assert not (copy / "quanto" / "library" / "extensions" / "cpp" / "build" / "quanto_cpp.so").exists()


@pytest.mark.parametrize("build, said", [
    (True, "its C++ kernel could not be built at set-up: ninja is missing"),
    (False, "its C++ kernel is not built and cannot be here: ninja is missing"),
])
def test_without_ninja_the_note_says_ninja_is_missing(tmp_path, monkeypatch, build, said):
    monkeypatch.setattr(backends, "compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(backends, "ninja", lambda: None)
    ext = types.SimpleNamespace(_lib=None, build_directory=str(tmp_path / "build"))
    note = backends._attach_kernel(ext, build=build)
    assert ext._lib.unpack is backends.unpack_pure
    assert note == (f"quanto: {said} (`pip install ninja`, then `python -m kvlab.caches.backends`); "
                    "using a pure-PyTorch unpack instead (same values, slower)")


def test_an_unbuilt_kernel_with_a_compiler_and_ninja_names_the_command_that_builds_it(tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(backends, "ninja", lambda: "/usr/bin/ninja")
    ext = types.SimpleNamespace(_lib=None, build_directory=str(tmp_path / "build"))
    note = backends._attach_kernel(ext, build=False)
    assert note.startswith("quanto: its C++ kernel is not built (`python -m kvlab.caches.backends` builds it); ")
    assert "set-up builds it" not in note


class RecordingExtension:
    """Stands in for quanto's extension: its `lib` property (the build) records which ninja PATH finds."""

    def __init__(self, build_directory: str):
        self._lib = None
        self.build_directory = build_directory
        self.ninja_seen = "not built"

    @property
    def lib(self):
        self.ninja_seen = shutil.which(backends.NINJA)
        self._lib = types.SimpleNamespace(unpack=None)
        return self._lib


def test_the_build_finds_the_environment_s_ninja_off_path_and_restores_path(tmp_path, monkeypatch):
    beside = Path(sysconfig.get_path("scripts")) / backends.NINJA
    assert beside.exists(), "optimum-quanto's dependency `ninja` is not installed in this environment"
    monkeypatch.setattr(backends, "compiler", lambda: "/usr/bin/c++")
    monkeypatch.setenv("PATH", str(tmp_path))
    ext = RecordingExtension(str(tmp_path / "build"))
    assert backends._attach_kernel(ext, build=True) is None
    assert ext.ninja_seen == str(beside)
    assert os.environ["PATH"] == str(tmp_path)


class FailingExtension(RecordingExtension):
    """Stands in for quanto's extension: its build fails as torch's does without Python's headers."""

    @property
    def lib(self):
        raise RuntimeError(
            "Error building extension 'quanto_cpp': [1/3] c++ -MMD -MF unpack.o.d -c unpack.cpp -o unpack.o\n"
            "FAILED: [code=1] unpack.o\n"
            "In file included from torch/include/torch/csrc/Device.h:5,\n"
            "torch/include/torch/csrc/python_headers.h:13:10: fatal error: Python.h: No such file or directory\n"
            "compilation terminated.")


def test_a_failed_build_s_note_quotes_the_compiler_s_error_not_the_command(tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(backends, "ninja", lambda: "/usr/bin/ninja")
    ext = FailingExtension(str(tmp_path / "build"))
    note = backends._attach_kernel(ext, build=True)
    assert ext._lib.unpack is backends.unpack_pure
    assert note == ("quanto: its C++ kernel could not be built at set-up (RuntimeError: fatal error: Python.h: No "
                    "such file or directory); using a pure-PyTorch unpack instead (same values, slower)")


def test_a_run_says_what_set_up_s_failed_build_found_until_a_build_succeeds(tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "compiler", lambda: "/usr/bin/c++")
    monkeypatch.setattr(backends, "ninja", lambda: "/usr/bin/ninja")
    folder = str(tmp_path / "build")
    at_set_up = backends._attach_kernel(FailingExtension(folder), build=True)
    at_run = backends._attach_kernel(types.SimpleNamespace(_lib=None, build_directory=folder), build=False)
    assert at_run == at_set_up and "Python.h: No such file or directory" in at_run

    assert backends._attach_kernel(RecordingExtension(folder), build=True) is None
    assert not (tmp_path / "build" / backends.BUILD_FAILURE_FILE).exists()
    unbuilt = backends._attach_kernel(types.SimpleNamespace(_lib=None, build_directory=folder), build=False)
    assert unbuilt.startswith("quanto: its C++ kernel is not built (`python -m kvlab.caches.backends` builds it)")
