"""llama.cpp's KV cache formats as torch tensors: ggml's block-32 quantization types and the Walsh-Hadamard
rotation llama.cpp applies to a quantized KV cache.

Block types (ggml `ggml-common.h`; quantization as ggml's reference code `ggml-quants.c`
`quantize_row_<type>_ref`, which gguf-py's `gguf.quants` reproduces in numpy and llama.cpp's CPU backend runs
for every type but q8_0, see below). Each run of 32 consecutive values along head_dim is one block:
- q8_0, 34 bytes: d (float16) = amax/127, 32 int8 codes roundf(x/d) (half away from zero);
- q4_0, 18 bytes: d = m/-8 where m is the value of largest magnitude (its first occurrence, sign kept), 16 bytes
  of 4-bit codes min(15, trunc(x/d + 8.5)), value j in the low nibble of byte j and value j+16 in its high nibble;
- q4_1, 20 bytes: d = (max - min)/15 and m = min (both float16), codes min(15, trunc((x - min)/d + 0.5));
- q5_0, 22 bytes: d = m/-16, codes min(31, trunc(x/d + 16.5)): the low 4 bits packed as q4_0's, the fifth bits
  as one little-endian uint32 qh (bit j = code j's fifth bit);
- q5_1, 24 bytes: d = (max - min)/31, m = min, codes trunc((x - min)/d + 0.5), packed as q5_0's;
- iq4_nl, 18 bytes: 4-bit indices into the non-linear table IQ4_NL_VALUES, packed as q4_0's: each value's index
  is the table entry nearest x·(-127/m) (`best_index_int8`), and d is then the least-squares scale
  Σ w·q·x / Σ w·q² with weights w = x², summed in order (`quantize_row_iq4_nl_ref`, which llama.cpp's CPU backend
  runs for the cache: no search over scales); a block of magnitudes below 1e-15 gets d = 0 and, here, codes 0
  (ggml leaves its codes to whatever its buffer held; both de-quantize to 0).
Dequantized: d·(code - 8), d·code + m, d·(code - 16), d·code + m, d·code, d·IQ4_NL_VALUES[code], in float32, as
ggml's `dequantize_row_*`. All arithmetic runs in float32 in the reference's order (1/d, then x·(1/d)), so the
stored blocks are ggml's bit for bit (`tests/unit/test_llamacpp_kv.py` holds them to `gguf.quants`, and
`tests/integration/test_llamacpp_agreement.py` to ggml's own C reference). llama.cpp's x86 CPU backend quantizes
q8_0 with its own AVX path (`ggml-cpu/arch/x86/quants.c`: 127/amax as the inverse scale, round half to even),
which can differ from the reference in the last bit of a code: about one block in 8,000 of random data.

The stored form (`Blocks`) keeps a block's parts apart: `qs` (packed low bits or int8 codes, uint8), `qh`
(q5's fifth bits, uint8) and `scales` (d, and m for the _1 types, float16), shaped (..., blocks, bytes), so the
bytes are exactly ggml's (`TYPES[name].type_size` per 32 values) and `ggml_bytes` lays them out as ggml does.

Rotation (llama.cpp PR #21038, `src/llama-kv-cache.cpp`, `src/llama-graph.cpp`): with a quantized K type and
head_dim divisible by 64, the query and the key are multiplied by an orthonormal Sylvester-Walsh-Hadamard
matrix H (H[0][0] = 1/sqrt(n), doubled by [[H, H], [H, -H]]; symmetric, H·H = I) applied to each run of n
values, n the largest power of two that divides head_dim (64 at least), before the key is stored; with a
quantized V type and head_dim divisible by 64, the value is multiplied by H of n = 64 before it is stored and
the attention output by the same H after. `hadamard(n)` builds that matrix as ggml does, `rotation_size` says
which n applies. This module quantizes tensors; the cache layer keeping them is `kvlab.caches.ggml_cache`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch

BLOCK = 32
"""Values per block (QK8_0 = QK4_0 = QK4_1 = QK5_0 = QK5_1 = 32)."""
ROTATION_MULTIPLE = 64
"""llama.cpp rotates a quantized K/V only when head_dim is a multiple of this (and uses n >= 64)."""
V_ROTATION_SIZE = 64
"""The Hadamard size llama.cpp uses for values (its K size is the largest power of two dividing head_dim)."""
SCALE_DTYPE = torch.float16
COMPUTE_DTYPE = torch.float32


@dataclass(frozen=True)
class BlockType:
    """One ggml block type: `name` (ggml's, as `-ctk` takes it), `bits` per code, `offset` subtracted from a code
    (8, 16; 0 for the types with a minimum), `has_min` (q4_1, q5_1 store min), `type_size` bytes per block."""

    name: str
    bits: int
    offset: int
    has_min: bool

    @property
    def scale_bytes(self) -> int:
        """Bytes of float16 scale (and min) per block."""
        return 2 * (1 + self.has_min)

    @property
    def type_size(self) -> int:
        """Bytes per block of 32 values: the scale (and min) and 32·bits/8 bytes of codes (q5: 16 + 4)."""
        return self.scale_bytes + BLOCK * self.bits // 8


TYPES: dict[str, BlockType] = {t.name: t for t in (
    BlockType("q8_0", 8, 0, False), BlockType("q4_0", 4, 8, False), BlockType("q4_1", 4, 0, True),
    BlockType("iq4_nl", 4, 0, False), BlockType("q5_0", 5, 16, False), BlockType("q5_1", 5, 0, True))}
"""llama.cpp's quantized KV types (`-ctk`/`-ctv`, `common/arg.cpp` `kv_cache_types`), in its order."""
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
"""ggml's `kvalues_iq4nl`: the values an iq4_nl index stands for, times d."""
EPSILON = 1e-15
"""ggml's GROUP_MAX_EPS: an iq4_nl block whose largest magnitude is below it is stored as zeros."""
PLAIN_TYPES: dict[str, torch.dtype] = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
"""llama.cpp's unquantized KV types: stored as that dtype, never rotated."""


class Blocks(NamedTuple):
    """Values quantized by `quantize`: `qs` uint8 (..., blocks, 16 or 32), `qh` uint8 (..., blocks, 4) for q5
    types else None, `scales` SCALE_DTYPE (..., blocks, 1 or 2: d, then min); `kind` the type's name. Only the
    tensors hold memory; `ggml_bytes` lays them out as ggml's blocks."""

    qs: torch.Tensor
    qh: torch.Tensor | None
    scales: torch.Tensor
    kind: str

    @property
    def values_per_row(self) -> int:
        """Values one row (the axis before the blocks) stands for."""
        return self.qs.shape[-2] * BLOCK


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """C's roundf (half away from zero), exactly, as gguf-py's `np_roundf`."""
    a = x.abs()
    floored = a.floor()
    return torch.sign(x) * (floored + (2 * (a - floored)).floor())


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """ggml's `id = d ? 1.0f/d : 0.0f`."""
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / torch.where(d == 0, torch.ones_like(d), d))


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """(..., 32) codes -> (..., 16) bytes: code j low nibble, code j+16 high nibble of byte j."""
    low, high = codes[..., :BLOCK // 2], codes[..., BLOCK // 2:]
    return (low & 0x0F) | ((high & 0x0F) << 4)


def _fifth_bits(codes: torch.Tensor) -> torch.Tensor:
    """(..., 32) 5-bit codes -> (..., 4) bytes: bit j of the little-endian uint32 is code j's fifth bit."""
    bits = ((codes >> 4) & 1).reshape(*codes.shape[:-1], 4, 8)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=codes.device)
    return (bits * weights).sum(-1, dtype=torch.uint8)


def quantize(values: torch.Tensor, kind: str) -> Blocks:
    """Quantize (..., n) values (n a multiple of BLOCK, any float dtype, read as float32) to ggml `kind` blocks,
    bit for bit as ggml's reference `quantize_row_<kind>_ref`.

    Raises:
        ValueError: an unknown type, or n not a multiple of BLOCK.
    """
    block_type = _block_type(kind)
    if values.shape[-1] % BLOCK:
        raise ValueError(f"{kind} stores blocks of {BLOCK} values; the last axis has {values.shape[-1]}")
    x = values.to(COMPUTE_DTYPE).reshape(*values.shape[:-1], values.shape[-1] // BLOCK, BLOCK)
    if block_type.bits == 8:
        d = x.abs().amax(-1, keepdim=True) / 127
        codes = _roundf(x * _inverse(d)).to(torch.int8).view(torch.uint8)
        return Blocks(codes, None, d.to(SCALE_DTYPE), kind)
    if kind == "iq4_nl":
        return _quantize_iq4_nl(x)
    top = 2 ** block_type.bits - 1
    if block_type.has_min:
        low = x.amin(-1, keepdim=True)
        d = (x.amax(-1, keepdim=True) - low) / top
        codes = torch.trunc((x - low) * _inverse(d) + 0.5)
        scales = torch.cat([d, low], dim=-1).to(SCALE_DTYPE)
    else:
        peak = x.gather(-1, x.abs().argmax(-1, keepdim=True))
        d = peak / -block_type.offset
        codes = torch.trunc(x * _inverse(d) + (block_type.offset + 0.5))
        scales = d.to(SCALE_DTYPE)
    codes = codes.clamp(0, top).to(torch.uint8)
    qh = _fifth_bits(codes) if block_type.bits == 5 else None
    return Blocks(_pack_nibbles(codes), qh, scales, kind)


def _quantize_iq4_nl(x: torch.Tensor) -> Blocks:
    """(..., blocks, 32) float32 -> iq4_nl blocks, as ggml's `quantize_row_iq4_nl_impl` with ntry -1."""
    table = torch.tensor(IQ4_NL_VALUES, dtype=COMPUTE_DTYPE, device=x.device)
    peak = x.gather(-1, x.abs().argmax(-1, keepdim=True))
    scaled = _inverse(peak / table[0]) * x
    upper = torch.searchsorted(table, scaled.contiguous(), right=True).clamp(1, len(table) - 1)
    index = torch.where(scaled - table[upper - 1] < table[upper] - scaled, upper - 1, upper)
    index = torch.where(scaled <= table[0], 0, torch.where(scaled >= table[-1], len(table) - 1, index))
    value, weight = table[index], x * x
    sum_qx = sum_q2 = torch.zeros_like(x[..., 0])
    for j in range(BLOCK):  # ggml sums in this order, in float32
        weighted = weight[..., j] * value[..., j]
        sum_qx, sum_q2 = sum_qx + weighted * x[..., j], sum_q2 + weighted * value[..., j]
    d = torch.where(sum_q2 > 0, sum_qx / torch.where(sum_q2 > 0, sum_q2, torch.ones_like(sum_q2)), 0.0)
    flat = x.abs().amax(-1) < EPSILON
    d = torch.where(flat, 0.0, d)
    index = torch.where(flat.unsqueeze(-1), 0, index).to(torch.uint8)
    return Blocks(_pack_nibbles(index), None, d.unsqueeze(-1).to(SCALE_DTYPE), "iq4_nl")


def dequantize(blocks: Blocks) -> torch.Tensor:
    """(..., n) float32 values from `quantize`'s blocks, as ggml's `dequantize_row_<kind>`."""
    block_type = _block_type(blocks.kind)
    d = blocks.scales[..., :1].to(COMPUTE_DTYPE)
    if block_type.bits == 8:
        x = d * blocks.qs.view(torch.int8).to(COMPUTE_DTYPE)
    else:
        codes = torch.cat([blocks.qs & 0x0F, blocks.qs >> 4], dim=-1)
        if blocks.qh is not None:
            shifts = torch.arange(8, dtype=torch.uint8, device=codes.device)
            fifth = ((blocks.qh.unsqueeze(-1) >> shifts) & 1).reshape(*codes.shape)
            codes = codes | (fifth << 4)
        if blocks.kind == "iq4_nl":
            x = d * torch.tensor(IQ4_NL_VALUES, dtype=COMPUTE_DTYPE, device=codes.device)[codes.long()]
        elif block_type.has_min:
            x = d * codes.to(COMPUTE_DTYPE) + blocks.scales[..., 1:].to(COMPUTE_DTYPE)
        else:
            x = d * (codes.to(torch.int16) - block_type.offset).to(COMPUTE_DTYPE)
    return x.reshape(*x.shape[:-2], x.shape[-2] * BLOCK)


def ggml_bytes(blocks: Blocks) -> torch.Tensor:
    """(..., blocks, type_size) uint8: each block as ggml stores it (d, then m, then qh, then qs)."""
    parts = [blocks.scales.contiguous().view(torch.uint8)]
    if blocks.qh is not None:
        parts.append(blocks.qh)
    return torch.cat([*parts, blocks.qs], dim=-1)


def nbytes(kind: str, values: int) -> int:
    """Bytes `values` values take in type `kind` (a multiple of BLOCK for a block type)."""
    if kind in PLAIN_TYPES:
        return values * torch.empty((), dtype=PLAIN_TYPES[kind]).element_size()
    return values // BLOCK * _block_type(kind).type_size


def is_quantized(kind: str) -> bool:
    """Whether `kind` is one of ggml's block types (llama.cpp's `ggml_is_quantized`) rather than f32/f16/bf16."""
    return kind in TYPES


def _block_type(kind: str) -> BlockType:
    if kind not in TYPES:
        raise ValueError(f"no ggml block type {kind!r}; kvlab stores {list(TYPES)}")
    return TYPES[kind]


def rotation_size(head_dim: int, kind: str, role: str) -> int | None:
    """The Hadamard size llama.cpp rotates `role` ("key" or "value") vectors of a `kind` cache by, or None:
    only quantized types and head_dim a multiple of ROTATION_MULTIPLE; keys the largest power of two dividing
    head_dim, values V_ROTATION_SIZE (`llama_kv_cache::build_input_k_rot` / `build_input_v_rot`)."""
    if not is_quantized(kind) or head_dim % ROTATION_MULTIPLE:
        return None
    if role == "value":
        return V_ROTATION_SIZE
    return head_dim & -head_dim


@lru_cache(maxsize=16)
def hadamard(n: int, device: str = "cpu") -> torch.Tensor:
    """The n×n float32 orthonormal Walsh-Hadamard matrix as ggml builds it (`ggml_gen_hadamard`: H[0][0] =
    1.0/sqrtf(n), then [[H, H], [H, -H]] doubling; symmetric, H·H = I), on `device`. One shared copy per
    size and device (llama.cpp keeps its matrices in host memory, outside the KV cache): do not modify it.

    Raises:
        ValueError: n is not a power of two.
    """
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard size must be a power of two, got {n}")
    with torch.inference_mode(False):  # a normal tensor, usable in and out of inference mode
        first = torch.tensor(1.0 / float(torch.tensor(float(n), dtype=torch.float32).sqrt()), dtype=torch.float32)
        matrix = first.reshape(1, 1)
        while matrix.shape[0] < n:
            matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
        return matrix.to(device)


def rotate(values: torch.Tensor, n: int | None) -> torch.Tensor:
    """(..., head_dim) float32 values with each run of n along head_dim multiplied by `hadamard(n)`; the values
    themselves for n None. Its own inverse."""
    if n is None:
        return values
    matrix = hadamard(n, str(values.device))
    shape = values.shape
    return (values.reshape(*shape[:-1], shape[-1] // n, n) @ matrix).reshape(shape)

