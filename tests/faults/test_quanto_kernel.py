"""Fault catalogue: optimum-quanto compiled its C++ CPU kernel with the system compiler inside the first quanto
run (about 20 s of stalled decoding), and where no compiler exists (the python:3.11-slim image) the column
failed with a build log over a thousand characters long. Right: the kernel is built at set-up, loaded without a
compiler at run time, and where it is not built and cannot be, the column runs on a pure-PyTorch unpack and
says so in one line."""

import os
import shutil
import subprocess
import sys
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
