"""One-time preparation of the quantization backends, outside any timed region and without a compiler at run time.

optimum-quanto unpacks its 2- and 4-bit tensors on CPU with a C++ kernel
(`quanto_cpp`) that it compiles with the system's C++ compiler the first time
it is needed, inside that first run: about 20 s of stalled decoding, or a
failure with a long build log where no compiler exists (the `python:3.11-slim`
image has none). torch's extension builder runs `ninja` from PATH; the PyPI
`ninja` package (an optimum-quanto dependency) puts it in the environment's
bin/, which is not on PATH where the environment is not activated (the
Dockerfile, `make run`). kvlab instead:

- builds the kernel once at set-up (`scripts/setup.sh` and the Dockerfile call
  `python -m kvlab.caches.backends`), where a compiler is present, with the
  environment's bin/ on PATH when ninja is found only there;
- at run time loads the built library directly when it matches the installed
  torch, so neither the compiler nor ninja runs inside a user's run;
- where it is not built and cannot be (no compiler, no ninja, missing Python
  headers, a read-only install), uses a pure-PyTorch unpack with the same
  result as quanto's own pure-PyTorch path (`optimum/quanto/library/unpack.py`,
  whose function is not importable because its registration decorator returns
  None) and says why in one line: what set-up's build found (it writes that
  beside the kernel's build), else what is missing now.

This module prepares; it does not quantize or measure.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import sys
import sysconfig
import threading
import types

import torch

QUANTO_EXTENSION = "quanto_cpp"
NINJA = "ninja"
"""The build tool torch's extension builder runs (`torch.utils.cpp_extension.verify_ninja_availability`)."""
NINJA_HINT = "`pip install ninja`, then `python -m kvlab.caches.backends`"
ERROR_LINE_CHARS = 100
BUILD_FAILURE_FILE = "kvlab-build-failure.txt"
"""Written by set-up into quanto's build folder when the kernel's build fails: the reason, for the run's note."""
_COMPILER_ERROR = re.compile(r"(fatal )?error:")

_lock = threading.Lock()
_quanto_note: str | None = None
_quanto_ready = False


def unpack_pure(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Unpack 2- or 4-bit values packed in uint8 along dim 0, as quanto's pure-PyTorch `quanto::unpack` does.

    Args:
        packed: uint8 tensor, each byte holding 8 // bits values (lowest bits first).
        bits: 2 or 4.

    Returns:
        uint8 tensor with dim 0 multiplied by 8 // bits.
    """
    parts = []
    for i in range(8 // bits):
        mask = 2 ** (bits * (i + 1)) - 1
        parts.append((packed & mask) >> (bits * i))
    return torch.cat(parts).to(torch.uint8)


def compiler() -> str | None:
    """The C++ compiler torch's extension builder would run (`CXX`, else `c++`), or None when it is absent."""
    return shutil.which(os.environ.get("CXX") or "c++")


def ninja() -> str | None:
    """The ninja the kernel build runs: the one on PATH, else the one the PyPI `ninja` package put in this
    interpreter's scripts folder (a virtual environment's bin/, off PATH unless activated); None when neither."""
    return shutil.which(NINJA) or shutil.which(NINJA, path=sysconfig.get_path("scripts"))


@contextlib.contextmanager
def _on_path(program: str):
    """Put `program`'s folder first on PATH while the block runs (torch runs ninja by name), then restore PATH."""
    folder = os.path.dirname(program)
    before = os.environ.get("PATH")
    if shutil.which(os.path.basename(program)) == program:
        yield
        return
    os.environ["PATH"] = os.pathsep.join([folder, before if before is not None else os.defpath])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def _error_line(text: str) -> str:
    """The line of a build log that says what failed: from the first compiler `error:` on (the log's first line
    is the command ninja ran), else its first line; at most ERROR_LINE_CHARS characters."""
    lines = text.splitlines() or [""]
    for line in lines:
        found = _COMPILER_ERROR.search(line)
        if found:
            return line[found.start():][:ERROR_LINE_CHARS]
    return lines[0][:ERROR_LINE_CHARS]


def _built_library(ext) -> str | None:
    """Path of quanto's built kernel when it exists and was built for the installed torch, else None."""
    version_file = os.path.join(ext.build_directory, "pytorch_version.txt")
    library = os.path.join(ext.build_directory, f"{QUANTO_EXTENSION}.so")
    try:
        with open(version_file) as handle:
            built_for = handle.read().strip()
    except OSError:
        return None
    return library if built_for == torch.__version__ and os.path.isfile(library) else None


def _load(path: str):
    loader = importlib.machinery.ExtensionFileLoader(QUANTO_EXTENSION, path)
    spec = importlib.util.spec_from_file_location(QUANTO_EXTENSION, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def prepare_quanto(build: bool = True) -> str | None:
    """Make quanto's CPU unpack kernel ready without compiling inside a run; once per process.

    Args:
        build: compile the kernel now when it is not built and a compiler is present (set-up time).

    Returns:
        None when the C++ kernel is in use (or quanto is not installed); otherwise one sentence saying that the
        pure-PyTorch unpack is used and why.
    """
    global _quanto_note, _quanto_ready
    with _lock:
        if _quanto_ready:
            return _quanto_note
        if importlib.util.find_spec("optimum.quanto") is None:
            _quanto_ready = True
            return None
        from optimum.quanto.library.extensions.cpp import ext

        _quanto_note = _attach_kernel(ext, build)
        _quanto_ready = True
        return _quanto_note


def _attach_kernel(ext, build: bool) -> str | None:
    """Attach the built kernel, build it, or attach the pure-PyTorch unpack; the note for the last case."""
    if ext._lib is not None:
        return None
    built = _built_library(ext)
    if built is not None:
        try:
            ext._lib = _load(built)
            return None
        except ImportError as err:
            reason = f"its built C++ kernel does not load ({err})"
    else:
        reason = _build(ext) if build else _unbuilt_reason(ext)
        if reason is None:
            return None
    ext._lib = types.SimpleNamespace(unpack=unpack_pure)
    return f"quanto: {reason}; using a pure-PyTorch unpack instead (same values, slower)"


def _no_compiler() -> str:
    return f"its C++ kernel is not built and no C++ compiler is available (CXX={os.environ.get('CXX') or 'c++'})"


def _build(ext) -> str | None:
    """Build the kernel (set-up time): None when it is built; else why not, also written to its build folder
    (BUILD_FAILURE_FILE) so that a run says what set-up found."""
    if compiler() is None:
        reason = _no_compiler()
    elif ninja() is None:
        reason = f"its C++ kernel could not be built at set-up: ninja is missing ({NINJA_HINT})"
    else:
        try:
            with _on_path(ninja()):
                ext.lib  # noqa: B018 - the property compiles and loads the kernel
            reason = None
        except Exception as err:  # noqa: BLE001 - any build failure falls back, reported in one line
            reason = f"its C++ kernel could not be built at set-up ({type(err).__name__}: {_error_line(str(err))})"
    record = os.path.join(ext.build_directory, BUILD_FAILURE_FILE)
    with contextlib.suppress(OSError):
        if reason is None:
            os.remove(record)
        else:
            os.makedirs(ext.build_directory, exist_ok=True)
            with open(record, "w") as handle:
                handle.write(reason)
    return reason


def _unbuilt_reason(ext) -> str:
    """Why the kernel is not built (run time): what set-up wrote when its build failed, else what is missing."""
    with contextlib.suppress(OSError), open(os.path.join(ext.build_directory, BUILD_FAILURE_FILE)) as handle:
        recorded = handle.read().strip()
        if recorded:
            return recorded
    if compiler() is None:
        return _no_compiler()
    if ninja() is None:
        return f"its C++ kernel is not built and cannot be here: ninja is missing ({NINJA_HINT})"
    return "its C++ kernel is not built (`python -m kvlab.caches.backends` builds it)"


def built_quanto_library() -> str | None:
    """Path of quanto's built CPU kernel for the installed torch, or None (not built, or quanto not installed)."""
    if importlib.util.find_spec("optimum.quanto") is None:
        return None
    from optimum.quanto.library.extensions.cpp import ext

    return _built_library(ext)


def main(argv: list[str] | None = None) -> int:
    """`python -m kvlab.caches.backends [--stamp FILE]`: build what the backends need, once (set-up time);
    prints what was done. With `--stamp FILE`, writes the built kernel's path there when it is ready (nothing
    when the pure-PyTorch unpack is used), so `scripts/setup.sh` can skip this import of torch and quanto on
    its next run while that file exists."""
    argv = sys.argv[1:] if argv is None else argv
    note = prepare_quanto(build=True)
    print(f"kvlab.caches.backends: {note}" if note else "kvlab.caches.backends: quanto C++ kernel ready")
    if len(argv) == 2 and argv[0] == "--stamp":
        library = None if note else built_quanto_library()
        with contextlib.suppress(OSError):
            if library:
                with open(argv[1], "w") as handle:
                    handle.write(library + "\n")
            else:
                os.remove(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
