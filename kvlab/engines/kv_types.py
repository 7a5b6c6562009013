"""The engines' quantized KV cache types chosen by bits per stored value, shared by every quantized strategy's
serving note (`kvlab.caches.quant.*.serving`): which `--kv-cache-dtype` / `KvCacheConfig(dtype=...)` / `-ctk`
value stores a key or value nearest to a kvlab format of that many bits, and how the engine's format differs.

The values are members of the copied lists in `kvlab.engines.choices`; the versions and sources are
`kvlab.engines.settings`'. Nothing here runs an engine.
"""

from __future__ import annotations

from .settings import (LLAMA_ARGS, LLAMA_VERSION, SGLANG_MODEL_ARGS, SGLANG_VERSION, TRT_QUANT, TRT_VERSION,
                       VLLM_CACHE, VLLM_VERSION, ServingSetting)

FP4_SGLANG = "4-bit floats (E2M1) in blocks of 16 with an fp8 scale each"
FP4_TRT = "4-bit floats (E2M1) in blocks of 16 with an fp8 scale each; needs a ModelOpt-calibrated checkpoint"
INT4_VLLM = ("4-bit integers with one scale per token and KV head, after a randomized Hadamard transform "
             "(vllm/v1/attention/ops/int4_per_token_head.py)")
INT8_VLLM = "8-bit integers, one absmax/127 scale per token and KV head"


def vllm_int(bits: int) -> tuple[str, str]:
    """vLLM 0.34.0's integer per-token-head type for `bits` (4 or fewer: int4, more: int8) and how it stores."""
    return ("int4_per_token_head", INT4_VLLM) if bits <= 4 else ("int8_per_token_head", INT8_VLLM)


def sglang_type(bits: int) -> tuple[str, str]:
    """SGLang 0.5.23's `--kv-cache-dtype` for `bits` (4 or fewer: nvfp4, more: fp8_e4m3) and how it stores."""
    return ("nvfp4", FP4_SGLANG) if bits <= 4 else ("fp8_e4m3", "8-bit floats with a per-tensor scale")


def trt_type(bits: int) -> tuple[str, str]:
    """TensorRT-LLM 1.4.0rc4's `KvCacheConfig(dtype=...)` for `bits` (4 or fewer: nvfp4, more: fp8)."""
    return ("nvfp4", FP4_TRT) if bits <= 4 else ("fp8", "8-bit floats with a per-tensor scale")


def llama_type(bits: int) -> str:
    """llama.cpp's nearest block type for `bits` (8 or more: q8_0, 5–7: q5_0, 4 or fewer: q4_0)."""
    return "q8_0" if bits >= 8 else "q5_0" if bits >= 5 else "q4_0"


def fewer_bits_note(bits: int, engine_bits: int) -> str:
    """The note's prefix when the engine's type has more bits than kvlab's (`""` when it has as many)."""
    return f"no {bits}-bit type: the {engine_bits}-bit one is the nearest; " if engine_bits > bits else ""


def engine_settings(bits: int, what: str, vllm: tuple[str, str] | None = None) -> list[ServingSetting]:
    """vLLM, SGLang and TensorRT-LLM settings for a kvlab format of `bits` bits per value, `what` saying what
    kvlab stores (for the notes: "against <what>"); `vllm` overrides vLLM's (dtype, whole note)."""
    if vllm is None:
        dtype, how = vllm_int(bits)
        vllm = (dtype, f"{fewer_bits_note(bits, 4 if dtype.startswith('int4') else 8)}{how}, against {what}")
    sglang, trt = sglang_type(bits), trt_type(bits)
    return [ServingSetting("vLLM", f"--kv-cache-dtype {vllm[0]}", VLLM_VERSION, VLLM_CACHE, vllm[1]),
            ServingSetting("SGLang", f"--kv-cache-dtype {sglang[0]}", SGLANG_VERSION, SGLANG_MODEL_ARGS,
                           f"{fewer_bits_note(bits, 4 if sglang[0] == 'nvfp4' else 8)}{sglang[1]}, against {what}; "
                           "no integer or rotated KV type in its list"),
            ServingSetting("TensorRT-LLM", f"KvCacheConfig(dtype=\"{trt[0]}\")", TRT_VERSION, TRT_QUANT,
                           f"{fewer_bits_note(bits, 4 if trt[0] == 'nvfp4' else 8)}{trt[1]}, against {what}")]


def llama_setting(type_k: str, type_v: str, note: str, measured: str = "") -> ServingSetting:
    """llama.cpp's `-ctk type_k -ctv type_v -fa on` (a quantized V needs flash attention) with `note`."""
    return ServingSetting("llama.cpp", f"llama-server -ctk {type_k} -ctv {type_v} -fa on", LLAMA_VERSION, LLAMA_ARGS,
                          note, measured)
