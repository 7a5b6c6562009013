"""From the lab to the serving engine: for each strategy (and its knobs) the nearest setting in vLLM, SGLang,
TensorRT-LLM and llama.cpp, with the version it was checked in and the source, or why there is none.

The one place this mapping lives: the "view code" snippet (`kvlab.ui.shared.code.code_snippet`) prints it under
the code, and docs/serving.md is its table. `serving_settings(name, knobs)` answers for a registered strategy;
a strategy with no entry raises `KeyError` naming it (tests/unit/test_serving_map.py fails the same way, so a
new strategy cannot ship without its row). "Nearest" is said plainly: where an engine's setting does not do what
kvlab's strategy does, the note says how it differs.
"""

from __future__ import annotations

from collections.abc import Callable

from ..engines import ENGINES, ServingSetting
from ..engines import no_equivalent as _none
from ..engines.settings import (
    LLAMA_ARGS,
    LLAMA_SERVER,
    LLAMA_VERSION,
    SGLANG_ARGS,
    SGLANG_KV,
    TRT_LONG,
    TRT_QUANT,
    TRT_RUN,
    VLLM_ARGS,
    VLLM_ARGS_042,
    VLLM_KV,
    VLLM_TURBOQUANT,
)


def _no_cache(knobs: dict) -> list[ServingSetting]:
    return _none("every engine keeps a KV cache; recomputing the whole prefix each step is what a cache avoids")


def _dynamic(knobs: dict) -> list[ServingSetting]:
    return [ServingSetting("vLLM", "--kv-cache-dtype auto (the default)", "0.4.2", VLLM_ARGS_042,
                           "a paged cache grown block by block"),
            ServingSetting("SGLang", "--kv-cache-dtype auto (the default)", "0.5.13", SGLANG_ARGS),
            ServingSetting("TensorRT-LLM", "the default paged KV cache", "0.9", TRT_RUN),
            ServingSetting("llama.cpp", "--cache-type-k f16 --cache-type-v f16 (the default)", LLAMA_VERSION,
                           LLAMA_SERVER)]


def _static(knobs: dict) -> list[ServingSetting]:
    return [ServingSetting("vLLM", "--gpu-memory-utilization / --max-model-len", "0.5.3", VLLM_ARGS,
                           "the KV pool is allocated once at start, as a static cache is"),
            ServingSetting("SGLang", "--mem-fraction-static", "0.5.13", SGLANG_ARGS,
                           "the KV pool is allocated once at start"),
            ServingSetting("TensorRT-LLM", "--kv_cache_free_gpu_memory_fraction", "0.9", TRT_RUN,
                           "the KV pool is allocated once at start"),
            ServingSetting("llama.cpp", "--ctx-size N", LLAMA_VERSION, LLAMA_SERVER,
                           "the cache is allocated for N tokens at start")]


def _offloaded(knobs: dict) -> list[ServingSetting]:
    return [ServingSetting("vLLM", "--swap-space GiB", "0.5.3", VLLM_ARGS,
                           "CPU space for the KV blocks of preempted requests, not layer-by-layer prefetch"),
            ServingSetting("SGLang", None, note="no layer-by-layer KV offload in the server arguments checked"),
            ServingSetting("TensorRT-LLM", None, note="no layer-by-layer KV offload in the run options checked"),
            ServingSetting("llama.cpp", "--no-kv-offload (-nkvo)", LLAMA_VERSION, LLAMA_ARGS,
                           "the KV cache stays in host memory and attention runs there")]


def _fp8_like(nbits: int) -> tuple[str, str, str]:
    """(vLLM setting, SGLang setting, llama.cpp types) nearest to an `nbits`-bit KV cache."""
    llama = {8: "q8_0", 4: "q4_0"}.get(nbits, "q4_0")
    return "--kv-cache-dtype fp8", "--kv-cache-dtype fp8_e4m3", llama


def _quantized(knobs: dict) -> list[ServingSetting]:
    backend, nbits = knobs.get("backend", "quanto"), int(knobs.get("nbits", 4))
    vllm, sglang, llama = _fp8_like(nbits)
    coarser = "" if nbits == 8 else f"8 bits against {nbits}: the nearest the engine ships"
    llama_note = ("groups of 32 with one scale each, like quanto/HQQ's groups; V quantization needs -fa on"
                  if nbits in (4, 8) else f"no {nbits}-bit cache type: q4_0 is the nearest; V needs -fa on")
    trt = "int8" if backend != "fp8" and nbits == 8 else "fp8"
    return [ServingSetting("vLLM", vllm, "0.4.2", VLLM_KV, coarser or "per-tensor scale, as kvlab's fp8"),
            ServingSetting("SGLang", sglang, "0.5.13", SGLANG_KV, coarser),
            ServingSetting("TensorRT-LLM", f"quantize.py --kv_cache_dtype {trt}", "0.9", TRT_QUANT,
                           coarser or "calibrated scales"),
            ServingSetting("llama.cpp", f"--cache-type-k {llama} --cache-type-v {llama} -fa on", LLAMA_VERSION,
                           LLAMA_SERVER, llama_note)]


TURBOQUANT_TYPES = {(4, 4): "turboquant_4bit_nc", (3, 3): "turboquant_3bit_nc", (3, 4): "turboquant_k3v4_nc",
                    (8, 4): "turboquant_k8v4"}
"""vLLM's TurboQuant `--kv-cache-dtype` values by (key bits, value bits) (the vLLM blog of 2026-05-11)."""


def _rotation_quantized(knobs: dict) -> list[ServingSetting]:
    bits = (int(knobs.get("key_bits", 4)), int(knobs.get("value_bits", 4)))
    dtype = TURBOQUANT_TYPES.get(bits, "turboquant_4bit_nc")
    note = "" if bits in TURBOQUANT_TYPES else f"no k{bits[0]}/v{bits[1]} type: 4-bit keys and values is the nearest"
    other = "no rotation-quantized KV type in the options checked; its plain fp8 / q4_0 cache types are the nearest"
    return [ServingSetting("vLLM", f"--kv-cache-dtype {dtype}", "0.20.0", VLLM_TURBOQUANT,
                           note or "TurboQuant: random rotation + Lloyd-Max scalar codes, as kvlab's"),
            *(ServingSetting(engine, None, note=other) for engine in ENGINES[1:])]


def _sliding_window(knobs: dict) -> list[ServingSetting]:
    own = "the model's own sliding layers are honoured by default"
    return [ServingSetting("vLLM", "the default (--disable-sliding-window turns it off)", "0.5.3", VLLM_ARGS, own),
            ServingSetting("SGLang", "the default", "0.5.13", SGLANG_ARGS, own),
            ServingSetting("TensorRT-LLM", "KvCacheConfig(max_attention_window=[...])", "main", TRT_LONG,
                           "a cyclic KV cache per layer; also forces a window on full-attention layers"),
            ServingSetting("llama.cpp", "the default", LLAMA_VERSION, LLAMA_SERVER, own)]


def _sink(knobs: dict) -> list[ServingSetting]:
    sinks, window = int(knobs.get("num_sink_tokens", 4)), int(knobs.get("window_length", 256))
    paged = "no attention-sink window: the paged cache keeps every token of a request"
    return [ServingSetting("vLLM", None, note=paged), ServingSetting("SGLang", None, note=paged),
            ServingSetting("TensorRT-LLM", f"--sink_token_length {sinks} --max_attention_window_size {window}", "0.9",
                           TRT_RUN, "StreamingLLM; the engine built with trtllm-build --streamingllm enable"),
            ServingSetting("llama.cpp", f"--context-shift --keep {sinks}", LLAMA_VERSION, LLAMA_SERVER,
                           "when the context is full, half of the tokens after the kept ones are dropped at once, "
                           "not a rolling window")]


EVICTION_REASON = ("score-based token eviction is in none of the four engines' documented options (kvpress and the "
                   "papers' code run on transformers); their paged caches share blocks between requests")


def _eviction(knobs: dict) -> list[ServingSetting]:
    from .quantize_knob import parse

    settings = _none(EVICTION_REASON)
    quantize = str(knobs.get("quantize", "none"))
    parsed = parse(quantize)
    if parsed is not None:
        backend, layer = parsed
        part = (_rotation_quantized(layer) if backend.name == "rotation"
                else _quantized({"backend": backend.name, "nbits": layer.get("nbits", 8)}))
        settings += [ServingSetting(s.engine, s.setting, s.version, s.source,
                                    f"for the quantize={quantize} part only" + (f"; {s.note}" if s.note else ""))
                     for s in part if s.setting is not None]
    return settings


SERVING: dict[str, Callable[[dict], list[ServingSetting]]] = {
    "no_cache": _no_cache, "dynamic": _dynamic, "static": _static, "offloaded": _offloaded,
    "offloaded_static": _offloaded, "quantized": _quantized, "rotation_quantized": _rotation_quantized,
    "sliding_window": _sliding_window, "sink": _sink, "snapkv": _eviction, "pyramidkv": _eviction, "tova": _eviction,
    "observed_attention": _eviction, "knorm": _eviction, "expected_attention": _eviction, "random": _eviction,
}
"""Strategy name -> its knobs -> the nearest setting per engine."""


def serving_settings(name: str, knobs: dict | None = None) -> list[ServingSetting]:
    """The nearest serving-engine settings of strategy `name` with `knobs` (`Strategy.knobs()`).

    Raises:
        KeyError: `name` has no entry in SERVING; the message names it and where to add it.
    """
    if name not in SERVING:
        raise KeyError(f"strategy {name!r} has no serving-engine entry: add it to SERVING in "
                       "kvlab/strategies/serving.py and a row to docs/serving.md")
    return SERVING[name](dict(knobs or {}))


def serving_comment(strategy) -> list[str]:
    """The "view code" lines for `strategy` (a `kvlab.strategies.Strategy`): a header and one `# ` line per
    engine; no lines for a strategy without an entry (the unit test catches that, not the page)."""
    try:
        settings = serving_settings(strategy.name, strategy.knobs())
    except KeyError:
        return []
    return ["", "# ── the nearest setting in a serving engine (kvlab docs/serving.md) ──",
            *(f"# {setting.line()}" for setting in settings)]
