"""TriAttention's calibration: per full-attention layer and query head, the mean pre-RoPE query (its "centre")
and mean magnitude per RoPE frequency pair, from one pass over a shipped text; cached per model.

What the authors' `scripts/calibrate.py` (github.com/WeianMao/triattention at
c3744ee6a50522a1559a577f85aef2b165a344f2) computes and TensorRT-LLM 1.3.0rc27 loads through
`calibration_path` (it does not calibrate): over every token of the text, q_f = q[f] + i q[f + d/2] per frequency
pair f of each head's query before RoPE, and the statistics E[q_f] (`q_mean`) and E|q_f| (`q_abs_mean`).
kvlab runs it itself on the last `CALIBRATION_TOKENS` tokens of the shipped Python Language Reference text
(`kvlab/quality/texts/python_reference.txt`; the quality report reads the text from its start, so the two stay
apart), prefilled in chunks of `CHUNK_TOKENS` through a dynamic cache (the same queries as one forward, bounded
memory). The queries are the layer's own (`q_proj`, then `q_norm`
where the model has one, as Qwen 3 and Gemma 3 attend with); the authors' script reads `q_proj` alone.

Cache: in memory (per process) and on disk, one file per model under kvlab's cache folder
(`KVLAB_CACHE_DIR`, default `~/.cache/kvlab`) in `triattention/`, written whole by
`kvlab.models.atomic.write_atomic` (a temporary file in the same folder, fsynced, then `os.replace`). The key is
a SHA-256 of the calibration's settings (format, text, tokens), the model's config and dtype, and 4,096 evenly
spaced values of every parameter (`model_key`; not every weight, which would take longer than calibrating a
large model). A file that cannot be read or does not fit the model is computed again and replaced; a folder
that cannot be written leaves the calibration in memory only, and the note says so. Each result carries its
cost (seconds, tokens) and where it came from (`QueryCentres.note`).
This module does not score or evict (`kvlab.eviction.triattention`).
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
import weakref
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import torch

from .prefill import decoder_of, sliding_layer_indices
from .scoring import prerope_queries
from .triattention import LayerCentres

CALIBRATION_TEXT = "python_reference.txt"
"""The calibration text: the quality report's shipped text (`kvlab/quality/texts/`, PSF-2.0), about 8,500
SmolLM2 tokens of English technical prose with code."""
CALIBRATION_FORMAT = 1
"""Version of the stored file and of what it holds (bump when the statistics change)."""
CALIBRATION_TOKENS = 4096
"""Tokens of the calibration text fed (its last ones). The authors suggest up to 32,768; 4,096 tokens estimate a
per-head mean well and take about 30 s for SmolLM2-135M on 2 CPU cores."""
CHUNK_TOKENS = 1024
"""Tokens per forward of the calibration pass."""
SAMPLED_VALUES = 4096
"""Evenly spaced values of each parameter that enter `model_key`."""
MEMORY_ENTRIES = 8
"""Calibrations kept in memory (the oldest goes first)."""
FOLDER = "triattention"
"""Sub-folder of kvlab's cache folder holding the calibration files."""


@dataclass(frozen=True)
class QueryCentres:
    """A model's calibration: `layers` (full-attention layer index -> `LayerCentres`), the `tokens` of `text` it
    read and the `seconds` it took, its `key` (`model_key`), `origin` (`computed`, `disk`, `memory`) and `saved`
    ('' when a file holds it, else why not)."""

    layers: dict[int, LayerCentres]
    tokens: int
    seconds: float
    text: str
    key: str
    origin: str = "computed"
    saved: str = ""

    def note(self) -> str:
        """One line: the calibration's cost and where this copy came from."""
        where = {"computed": "computed now", "disk": "read from kvlab's cache folder",
                 "memory": "reused from this process"}[self.origin]
        kept = f" (not saved: {self.saved})" if self.saved else ""
        return (f"TriAttention calibration: query centres of {len(self.layers)} full-attention layers from "
                f"{self.tokens:,} tokens of {self.text}, {self.seconds:.1f} s to compute; {where}{kept}")


_MEMORY: dict[str, QueryCentres] = {}
_KEYS: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
_LOCK = threading.RLock()


def clear_memory() -> None:
    """Forget the calibrations held in memory (the files stay)."""
    with _LOCK:
        _MEMORY.clear()
        _KEYS.clear()


def calibration_text() -> tuple[str, str]:
    """(name, text) of the calibration text, read from the installed package."""
    return CALIBRATION_TEXT, resources.files("kvlab").joinpath("quality", "texts", CALIBRATION_TEXT).read_text(
        encoding="utf-8")


def rope_tables(rotary, layer_type: str, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """((F,) float64 RoPE frequencies, (F,) float64 squared `attention_scaling`) of a layer type, read from the
    model's rotary module (`<layer_type>_inv_freq` where it keeps one per type, as Gemma 3 does, else `inv_freq`).

    Raises:
        ValueError: no such table, or it does not rotate the whole head (partial RoPE).
    """
    inv_freq = getattr(rotary, f"{layer_type}_inv_freq", None)
    scale = getattr(rotary, f"{layer_type}_attention_scaling", None)
    if not isinstance(inv_freq, torch.Tensor):
        inv_freq, scale = getattr(rotary, "inv_freq", None), getattr(rotary, "attention_scaling", 1.0)
    if not isinstance(inv_freq, torch.Tensor):
        raise ValueError("TriAttention needs the model's rotary embedding frequencies (inv_freq)")
    if 2 * inv_freq.numel() != head_dim:
        raise ValueError(f"TriAttention needs RoPE over the whole head ({head_dim} dims), this model rotates "
                         f"{2 * inv_freq.numel()}")
    freqs = inv_freq.detach().double().cpu()
    return freqs, torch.full_like(freqs, float(scale if scale is not None else 1.0) ** 2)


def full_attention_layers(model) -> list[int]:
    """Indices of the decoder layers TriAttention evicts from (the ones not sliding)."""
    sliding = sliding_layer_indices(model)
    return [i for i in range(len(decoder_of(model).layers)) if i not in sliding]


def model_key(model) -> str:
    """The hex SHA-256 naming a model's calibration (see the module docstring); memoized per model object, so
    weights changed in place after the first call keep the key."""
    with _LOCK:
        known = _KEYS.get(model)
    if known is not None:
        return known
    text_name, text = calibration_text()
    digest = hashlib.sha256(f"{CALIBRATION_FORMAT}|{CALIBRATION_TOKENS}|{text_name}|".encode())
    digest.update(hashlib.sha256(text.encode()).digest())
    digest.update(model.config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            flat = parameter.detach().reshape(-1)
            step = max(1, flat.numel() // SAMPLED_VALUES)
            sample = flat[::step][:SAMPLED_VALUES].float().cpu().contiguous()
            digest.update(f"{name}|{tuple(parameter.shape)}|{parameter.dtype}|".encode())
            digest.update(sample.numpy().tobytes())
    key = digest.hexdigest()
    with _LOCK:
        _KEYS[model] = key
    return key


def calibrate(model, tokenizer, tokens: int | None = None) -> QueryCentres:
    """Compute a model's `QueryCentres` from the last `tokens` (default `CALIBRATION_TOKENS`) tokens of the
    calibration text (one pass, in chunks of `CHUNK_TOKENS`).

    Raises:
        ValueError: the model has no full-attention layer, no `q_proj`, or a RoPE this cannot read.
    """
    from transformers import DynamicCache

    layers = full_attention_layers(model)
    if not layers:
        raise ValueError("TriAttention evicts from full-attention layers, and this model has none")
    decoder = decoder_of(model)
    attention = {i: decoder.layers[i].self_attn for i in layers}
    sums: dict[int, list] = {i: [0.0, 0.0] for i in layers}

    def hook(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        queries = prerope_queries(module, hidden)[0].double()  # (heads, seq, head_dim)
        half = queries.shape[-1] // 2
        pairs = torch.complex(queries[..., :half], queries[..., half:])
        sums[module.layer_idx][0] = sums[module.layer_idx][0] + pairs.sum(1)
        sums[module.layer_idx][1] = sums[module.layer_idx][1] + pairs.abs().sum(1)

    text_name, text = calibration_text()
    tokens = CALIBRATION_TOKENS if tokens is None else tokens
    ids = tokenizer(text, return_tensors="pt").input_ids[:, -tokens:].to(next(model.parameters()).device)
    started = time.perf_counter()
    handles = [module.register_forward_pre_hook(hook, with_kwargs=True) for module in attention.values()]
    try:
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            for start in range(0, ids.shape[1], CHUNK_TOKENS):
                model(input_ids=ids[:, start:start + CHUNK_TOKENS], cache=cache, use_cache=True, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
    count = ids.shape[1]
    centres = {}
    for i in layers:
        module = attention[i]
        omega, scale_sq = rope_tables(decoder.rotary_emb, getattr(module, "layer_type", None) or "full_attention",
                                      module.head_dim)
        centres[i] = LayerCentres((sums[i][0] / count).cpu(), (sums[i][1] / count).cpu(), omega, scale_sq)
    return QueryCentres(centres, count, time.perf_counter() - started, text_name, model_key(model))


def calibration_file(key: str) -> Path:
    """The file that holds (or would hold) the calibration named `key`."""
    from ..models.gguf_cache import cache_dir

    return cache_dir() / FOLDER / f"{key[:32]}.pt"


def _payload(centres: QueryCentres) -> dict:
    return {"format": CALIBRATION_FORMAT, "key": centres.key, "text": centres.text, "tokens": centres.tokens,
            "seconds": centres.seconds,
            "layers": {str(i): {"q_mean_real": c.q_mean.real.contiguous(), "q_mean_imag": c.q_mean.imag.contiguous(),
                                "q_abs_mean": c.q_abs_mean, "omega": c.omega, "scale_sq": c.scale_sq}
                       for i, c in centres.layers.items()}}


def save(centres: QueryCentres) -> str:
    """Write `centres` to its `calibration_file` whole (`kvlab.models.atomic.write_atomic`). Returns '' or, when it
    cannot, why (one phrase)."""
    from ..models.atomic import write_atomic

    path = calibration_file(centres.key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(_payload(centres), buffer)
        write_atomic(path, buffer.getvalue())
    except OSError as err:
        return err.strerror or type(err).__name__
    return ""


def load(key: str, model) -> QueryCentres | None:
    """The calibration stored for `key`, or None when there is none or it is unreadable, of another format or key,
    or does not fit `model`'s full-attention layers and heads."""
    path = calibration_file(key)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if payload.get("format") != CALIBRATION_FORMAT or payload.get("key") != key:
            return None
        layers = {int(i): LayerCentres(torch.complex(c["q_mean_real"], c["q_mean_imag"]), c["q_abs_mean"],
                                       c["omega"], c["scale_sq"]) for i, c in payload["layers"].items()}
        config = model.config.get_text_config(decoder=True)
        heads, head_dim = config.num_attention_heads, decoder_of(model).layers[0].self_attn.head_dim
        if sorted(layers) != full_attention_layers(model) or any(
                tuple(c.q_mean.shape) != (heads, head_dim // 2) for c in layers.values()):
            return None
        return QueryCentres(layers, int(payload["tokens"]), float(payload["seconds"]), str(payload["text"]), key,
                            "disk")
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001 - a damaged or foreign file of any kind is computed again
        return None


def query_centres(model, tokenizer) -> QueryCentres:
    """A model's calibration: from memory, else from its file, else computed (then saved). Calibrations of one
    model are computed once at a time (a lock), so columns started together share one.

    Raises:
        ValueError: from `calibrate`.
    """
    key = model_key(model)
    with _LOCK:
        known = _MEMORY.get(key)
        if known is not None:
            return replace(known, origin="memory")
        found = load(key, model)
        if found is None:
            found = calibrate(model, tokenizer)
            found = replace(found, saved=save(found))
        while len(_MEMORY) >= MEMORY_ENTRIES:
            _MEMORY.pop(next(iter(_MEMORY)))
        _MEMORY[key] = found
        return found
