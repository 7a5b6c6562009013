"""vLLM's TurboQuant KV-cache slot (`--kv-cache-dtype turboquant_*`), reproduced byte for byte in PyTorch.

What vLLM stores per token and KV head is one slot of `slot_size_aligned` bytes,
`[key_packed | value_packed | pad]` (vLLM `model_executor/layers/quantization/turboquant/config.py`, the store
kernels of `v1/attention/ops/triton_turboquant_store.py`, the dequantization of
`v1/attention/ops/triton_turboquant_decode.py`; commits in `kvlab.caches.quant.vllm`):
- keys, `key_bits` 8 (`turboquant_k8v4`): the key cast to float8 e4m3 (saturating), head_dim bytes, no scale.
- keys, `key_bits` 3 or 4: the float32 norm ‖k‖, the unit vector k/(‖k‖+1e-8) rotated by the orthonormal
  Sylvester Hadamard matrix H (`y = x̂·H`; one H for every layer, no random signs), each coordinate's index in
  the Lloyd-Max codebook of N(0, 1/d) (`gaussian_lloyd_max`, vLLM's `centroids.py` procedure), found against the
  midpoints (a coordinate equal to a midpoint takes the upper cell); packed ceil(d·b/8) bytes (4 bits: two per
  byte, the even coordinate in the low nibble; 3 bits: eight coordinates in three bytes, little-endian), then
  the norm as float16 (2 bytes). Read back: centroids → (norm correction, `_nc`: divided by their own norm) → ·H
  → · norm.
- values: uniform codes per vector: scale = (max - min)/(2^b - 1) (at least 1e-8), code = ⌊(v - min)/scale +
  0.5⌋ clamped to [0, 2^b - 1], packed as the key indices, then scale and min as float16 (4 bytes); read back
  code·scale + min with the float16 scale and min.
- pad: one zero byte when key + value bytes are odd (`slot_size_aligned`).

Two departures from vLLM, each a knob that shows the paper's choice (TurboQuant, Zandieh et al., arXiv
2504.19874) beside vLLM's: `values="lloyd_max"` stores values as the keys are stored (rotation, Lloyd-Max codes,
float16 norm: ceil(d·b/8) + 2 bytes), and `qjl=True` stores keys as TurboQuant-prod (Algorithm 2): b - 1 bits of
Lloyd-Max codes, one QJL sign bit per coordinate of S·r (r the unit vector's residual, S a seeded d×d standard
Gaussian matrix), the float16 norm and the float16 residual norm ‖r‖ (ceil(d·(b-1)/8) + ceil(d/8) + 4 bytes),
read back as the codes' vector + sqrt(π/2)/d·‖r‖·Sᵀ·signs. `rotation="haar"` uses the paper's random
orthogonal matrix instead of H. This module encodes and decodes slots; it keeps no cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from .rotation_quant import haar_rotation, pack_indices, unpack_indices

PRESETS = {"turboquant_k8v4": (8, 4, False), "turboquant_4bit_nc": (4, 4, True),
           "turboquant_k3v4_nc": (3, 4, True), "turboquant_3bit_nc": (3, 3, True)}
"""vLLM's `TQ_PRESETS`: --kv-cache-dtype -> (key_quant_bits, value_quant_bits, norm_correction)."""
VALUE_CODES = ("uniform", "lloyd_max")
ROTATIONS = ("hadamard", "haar")
NORM_EPS = 1e-8
"""Added to a key's norm before dividing by it (vLLM's store launcher)."""
NC_EPS = 1e-16
"""Added to a centroid vector's squared norm before the norm correction divides by it (vLLM's decode kernel)."""
SCALE_FLOOR = 1e-8
"""Smallest uniform value scale (vLLM's store kernel)."""
LLOYD_MAX_ITERATIONS, LLOYD_MAX_TOLERANCE = 200, 1e-10
"""vLLM's `solve_lloyd_max` defaults: at most 200 Lloyd iterations, stop when no centroid moves 1e-10."""
INIT_SIGMAS, EDGE_FACTOR = 3.5, 3.0
"""Initial centroids evenly spaced in ±3.5σ; the outer cells end at 3·(±3.5σ)."""
SEED = 0
"""Seed of the Haar rotation (`rotation="haar"`) and of the QJL matrix S (`qjl=True`)."""
FP8 = torch.float8_e4m3fn
HALF = torch.float16


def is_power_of_two(value: int) -> bool:
    return isinstance(value, int) and value > 0 and value & (value - 1) == 0


@lru_cache(maxsize=8)
def _hadamard_cpu(head_dim: int) -> torch.Tensor:
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < head_dim:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    return (matrix / math.sqrt(head_dim)).to(torch.float32)


def hadamard(head_dim: int) -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix H (float32, symmetric, H·H = I) of a power-of-two head_dim.

    Raises:
        ValueError: head_dim is not a power of two.
    """
    if not is_power_of_two(head_dim):
        raise ValueError(f"a Hadamard rotation needs a power-of-two head_dim, got {head_dim!r}")
    return _hadamard_cpu(head_dim).clone()


def _normal_cell(a: float, b: float, sigma: float) -> tuple[float, float]:
    """(∫ x·pdf, ∫ pdf) of N(0, sigma²) over [a, b], in closed form."""
    pdf = lambda x: math.exp(-x * x / (2 * sigma * sigma)) / math.sqrt(2 * math.pi * sigma * sigma)  # noqa: E731
    mass = 0.5 * (math.erf(b / (sigma * math.sqrt(2))) - math.erf(a / (sigma * math.sqrt(2))))
    return sigma * sigma * (pdf(a) - pdf(b)), mass


@lru_cache(maxsize=None)
def gaussian_lloyd_max(head_dim: int, bits: int) -> tuple[float, ...]:
    """vLLM's Lloyd-Max centroids (ascending, 2**bits) for a coordinate of a rotated unit vector, taken as
    N(0, 1/head_dim): start evenly spaced in ±3.5σ, cells bounded by the midpoints and ±10.5σ, each centroid
    moved to its cell's conditional mean, at most LLOYD_MAX_ITERATIONS times, stopping (without taking the last
    move) once none moves LLOYD_MAX_TOLERANCE. vLLM integrates with scipy's `quad`; the integrals here are
    closed-form, which agrees to ~1e-12."""
    sigma, levels = 1.0 / math.sqrt(head_dim), 2 ** bits
    low, high = -INIT_SIGMAS * sigma, INIT_SIGMAS * sigma
    centroids = [low + (high - low) * (i + 0.5) / levels for i in range(levels)]
    for _ in range(LLOYD_MAX_ITERATIONS):
        edges = [low * EDGE_FACTOR] + [(a + b) / 2 for a, b in zip(centroids, centroids[1:])] + [high * EDGE_FACTOR]
        moved = []
        for i in range(levels):
            first, mass = _normal_cell(edges[i], edges[i + 1], sigma)
            moved.append(first / mass if mass > 1e-15 else centroids[i])
        if max(abs(new - old) for new, old in zip(moved, centroids)) < LLOYD_MAX_TOLERANCE:
            break
        centroids = moved
    return tuple(centroids)


@dataclass(frozen=True)
class SlotFormat:
    """One slot's layout: `head_dim`, `key_bits` (8: float8 keys; 3 or 4: Lloyd-Max codes), `value_bits` (3 or
    4), `norm_correction`, `values` (VALUE_CODES), `qjl` (paper's TurboQuant-prod keys), `rotation` (ROTATIONS).
    Byte counts follow vLLM's `TurboQuantConfig` (`key_packed_size`, `value_packed_size`, `slot_size`,
    `slot_size_aligned`) for vLLM's choices and extend them for the paper's."""

    head_dim: int
    key_bits: int
    value_bits: int
    norm_correction: bool
    values: str = "uniform"
    qjl: bool = False
    rotation: str = "hadamard"

    @property
    def key_fp8(self) -> bool:
        return self.key_bits == 8

    @property
    def key_mse_bits(self) -> int:
        """Bits of Lloyd-Max code per key coordinate (0 for float8 keys; one fewer with QJL)."""
        return 0 if self.key_fp8 else self.key_bits - int(self.qjl)

    def _code_bytes(self, bits: int) -> int:
        return math.ceil(self.head_dim * bits / 8)

    @property
    def key_packed_size(self) -> int:
        """head_dim (float8) | codes + float16 norm | with QJL: codes + sign bits + two float16 norms."""
        if self.key_fp8:
            return self.head_dim
        qjl = self._code_bytes(1) + 2 if self.qjl else 0
        return self._code_bytes(self.key_mse_bits) + 2 + qjl

    @property
    def value_packed_size(self) -> int:
        """Codes + float16 scale and min (uniform) | codes + float16 norm (lloyd_max)."""
        return self._code_bytes(self.value_bits) + (4 if self.values == "uniform" else 2)

    @property
    def slot_size(self) -> int:
        return self.key_packed_size + self.value_packed_size

    @property
    def slot_size_aligned(self) -> int:
        """Slot bytes rounded up to an even number: what vLLM allocates per token and KV head."""
        return self.slot_size + self.slot_size % 2


def byte_table(table: torch.Tensor, bits: int) -> torch.Tensor:
    """(256, 8/bits): the `table` entries a byte's codes stand for, least significant code first (1, 2, 4 bits)."""
    codes = (torch.arange(256).unsqueeze(-1) >> (torch.arange(8 // bits) * bits)) & ((1 << bits) - 1)
    return table[codes]


def lookup(raw: torch.Tensor, bits: int, table: torch.Tensor, head_dim: int, by_byte: torch.Tensor | None = None):
    """`table[code]` for every code packed in `raw` (…, bytes) as `pack_indices` packs them: (…, head_dim) in the
    table's dtype. `by_byte` is `byte_table(table, bits)` for 1, 2 and 4 bits (a byte's codes in one gather);
    3 bits read each 8-code group as one 24-bit word."""
    if 8 % bits == 0:
        by_byte = byte_table(table, bits) if by_byte is None else by_byte
        looked = by_byte.index_select(0, raw.reshape(-1).long())  # index_select: several times faster than [...]
        return looked.view(*raw.shape[:-1], -1)[..., :head_dim]
    if bits != 3:
        codes = unpack_indices(raw, bits, head_dim)
    else:
        triples = raw.view(*raw.shape[:-1], -1, 3).to(torch.int32)
        words = triples[..., 0] | (triples[..., 1] << 8) | (triples[..., 2] << 16)
        shifts = torch.arange(8, device=raw.device, dtype=torch.int32) * 3
        codes = ((words.unsqueeze(-1) >> shifts) & 7).flatten(-2)[..., :head_dim]
    return table.index_select(0, codes.reshape(-1).long()).view(codes.shape)


def _f16_bytes(values: torch.Tensor) -> torch.Tensor:
    """(..., 1) values as float16, their two bytes (..., 2) little-endian, as vLLM writes them."""
    return values.to(HALF).contiguous().view(torch.uint8)


def _from_f16(raw: torch.Tensor) -> torch.Tensor:
    """(..., 2) bytes -> (..., 1) float32."""
    return raw.contiguous().view(HALF).float()


class TurboQuantCodec:
    """Encodes (…, tokens, head_dim) keys and values into (…, tokens, slot_size_aligned) uint8 slots and back,
    for one `SlotFormat`, with its tables on one device: the rotation (float32 d×d), the key and value
    codebooks and midpoints, the QJL matrix. Arithmetic runs in float32. `attends_raw_chunks`: vLLM's TurboQuant
    backend attends a first prefill chunk (and a long later one) to the raw keys and values."""

    attends_raw_chunks = True

    def __init__(self, fmt: SlotFormat, device: torch.device | str = "cpu", tables: dict | None = None):
        self.fmt = fmt
        self.tables = {name: t.to(device) for name, t in (tables or self._make_tables(fmt)).items()}
        self._byte_tables: dict[tuple, torch.Tensor] = {}

    @staticmethod
    def _make_tables(fmt: SlotFormat) -> dict[str, torch.Tensor]:
        d = fmt.head_dim
        tables = {"matrix": hadamard(d) if fmt.rotation == "hadamard" else haar_rotation(d, SEED)}
        for role, bits in (("key", fmt.key_mse_bits), ("value", fmt.value_bits if fmt.values == "lloyd_max" else 0)):
            if bits:
                centroids = torch.tensor(gaussian_lloyd_max(d, bits), dtype=torch.float32)
                tables[f"{role}_centroids"] = centroids
                tables[f"{role}_midpoints"] = (centroids[:-1] + centroids[1:]) / 2
        if fmt.qjl and not fmt.key_fp8:
            tables["qjl"] = torch.randn(d, d, generator=torch.Generator().manual_seed(SEED), dtype=torch.float32)
        return tables

    def _by_byte(self, name: str, bits: int) -> torch.Tensor | None:
        """`byte_table` of a table, made once per codec (decode-time speed only; not stored in the cache)."""
        if 8 % bits:
            return None
        key = (name, bits)
        if key not in self._byte_tables:
            table = self.tables[name] if name in self.tables else torch.arange(2 ** bits, dtype=torch.float32,
                                                                                device=self.tables["matrix"].device)
            self._byte_tables[key] = byte_table(table, bits)
        return self._byte_tables[key]

    @property
    def head_dim(self) -> int:
        return self.fmt.head_dim

    def to(self, device) -> "TurboQuantCodec":
        return TurboQuantCodec(self.fmt, device, self.tables)

    def tensors(self) -> list[torch.Tensor]:
        return list(self.tables.values())

    def bytes_per_token_head(self) -> int:
        """`slot_size_aligned`: what one token of one KV head costs."""
        return self.fmt.slot_size_aligned

    # ----- Lloyd-Max coded unit vectors (keys; values with values="lloyd_max") -----

    def _mse_encode(self, vectors: torch.Tensor, role: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indices, norms (…, 1), unit vectors) of float32 vectors."""
        norms = torch.linalg.vector_norm(vectors, dim=-1, keepdim=True)
        unit = vectors / (norms + NORM_EPS)
        rotated = unit @ self.tables["matrix"].T
        return torch.bucketize(rotated, self.tables[f"{role}_midpoints"], right=True), norms, unit

    def _mse_decode(self, indices: torch.Tensor, role: str) -> torch.Tensor:
        """The unit vector (float32) the indices stand for, norm-corrected when the format says so."""
        return self._rotate_back(self.tables[f"{role}_centroids"][indices])

    def _rotate_back(self, centroids: torch.Tensor, norms: torch.Tensor | None = None) -> torch.Tensor:
        """centroids (norm-corrected: divided by their own norm) · rotation, times `norms` when given."""
        scale = norms
        if self.fmt.norm_correction:
            inverse = torch.rsqrt((centroids * centroids).sum(-1, keepdim=True) + NC_EPS)
            scale = inverse if scale is None else scale * inverse
        rotated = centroids @ self.tables["matrix"]
        return rotated if scale is None else rotated * scale

    def _packed_mse(self, raw: torch.Tensor, role: str, bits: int, norms: torch.Tensor | None) -> torch.Tensor:
        """Decode packed Lloyd-Max codes straight to (norm-scaled) vectors."""
        name = f"{role}_centroids"
        centroids = lookup(raw, bits, self.tables[name], self.fmt.head_dim, self._by_byte(name, bits))
        return self._rotate_back(centroids, norms)

    def _key_bytes(self, keys: torch.Tensor) -> list[torch.Tensor]:
        fmt = self.fmt
        if fmt.key_fp8:
            return [keys.to(FP8).view(torch.uint8)]
        indices, norms, unit = self._mse_encode(keys, "key")
        parts = [pack_indices(indices, fmt.key_mse_bits)]
        if fmt.qjl:
            residual = unit - self._mse_decode(indices, "key")
            signs = (residual @ self.tables["qjl"].T >= 0).to(torch.int64)
            parts.append(pack_indices(signs, 1))
            return parts + [_f16_bytes(norms), _f16_bytes(torch.linalg.vector_norm(residual, dim=-1, keepdim=True))]
        return parts + [_f16_bytes(norms)]

    def _value_bytes(self, values: torch.Tensor) -> list[torch.Tensor]:
        bits = self.fmt.value_bits
        if self.fmt.values == "lloyd_max":
            indices, norms, _ = self._mse_encode(values, "value")
            return [pack_indices(indices, bits), _f16_bytes(norms)]
        low, high = values.amin(-1, keepdim=True), values.amax(-1, keepdim=True)
        scale = (high - low) / (2 ** bits - 1)
        scale = torch.where(scale > SCALE_FLOOR, scale, torch.full_like(scale, SCALE_FLOOR))
        codes = ((values - low) / scale + 0.5).to(torch.int32).clamp(0, 2 ** bits - 1)
        return [pack_indices(codes, bits), _f16_bytes(scale), _f16_bytes(low)]

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"slots": uint8 (…, tokens, slot_size_aligned)} for keys and values (…, tokens, head_dim), any float
        dtype; on the meta device (the planner) a slot tensor of the right shape and nothing computed."""
        shape = (*keys.shape[:-1], self.fmt.slot_size_aligned)
        if keys.is_meta:
            return {"slots": torch.empty(shape, dtype=torch.uint8, device=keys.device)}
        parts = self._key_bytes(keys.float()) + self._value_bytes(values.float())
        pad = self.fmt.slot_size_aligned - self.fmt.slot_size
        if pad:
            parts.append(torch.zeros((*shape[:-1], pad), dtype=torch.uint8, device=keys.device))
        return {"slots": torch.cat(parts, dim=-1)}

    def offsets(self) -> dict[str, tuple[int, int]]:
        """Byte ranges of the slot's fields: key codes (or float8 keys), QJL signs, key norm, residual norm, value
        codes, value scale and min (or value norm), pad."""
        fmt, spans, start = self.fmt, {}, 0
        fields = ([("key_codes", fmt.head_dim)] if fmt.key_fp8 else
                  [("key_codes", fmt._code_bytes(fmt.key_mse_bits))]
                  + ([("qjl_signs", fmt._code_bytes(1))] if fmt.qjl else []) + [("key_norm", 2)]
                  + ([("residual_norm", 2)] if fmt.qjl else []))
        fields += [("value_codes", fmt._code_bytes(fmt.value_bits))]
        fields += [("value_scale", 2), ("value_min", 2)] if fmt.values == "uniform" else [("value_norm", 2)]
        fields += [("pad", fmt.slot_size_aligned - fmt.slot_size)]
        for name, size in fields:
            spans[name] = (start, start + size)
            start += size
        return spans

    def decode(self, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) float32 (…, tokens, head_dim) that the slots stand for."""
        slots, fmt, at = state["slots"], self.fmt, self.offsets()
        if slots.is_meta:
            shape = (*slots.shape[:-1], fmt.head_dim)
            return torch.empty(shape, device=slots.device), torch.empty(shape, device=slots.device)
        field = lambda name: slots[..., at[name][0]:at[name][1]]  # noqa: E731
        if fmt.key_fp8:
            keys = field("key_codes").contiguous().view(FP8).float()
        elif fmt.qjl:
            keys = self._packed_mse(field("key_codes"), "key", fmt.key_mse_bits, None)
            signs = lookup(field("qjl_signs"), 1, torch.tensor([-1.0, 1.0], device=slots.device), fmt.head_dim)
            keys = (keys + math.sqrt(math.pi / 2) / fmt.head_dim * _from_f16(field("residual_norm"))
                    * (signs @ self.tables["qjl"])) * _from_f16(field("key_norm"))
        else:
            keys = self._packed_mse(field("key_codes"), "key", fmt.key_mse_bits, _from_f16(field("key_norm")))
        if fmt.values == "lloyd_max":
            values = self._packed_mse(field("value_codes"), "value", fmt.value_bits, _from_f16(field("value_norm")))
        else:
            codes = lookup(field("value_codes"), fmt.value_bits,
                           torch.arange(2 ** fmt.value_bits, dtype=torch.float32, device=slots.device), fmt.head_dim,
                           self._by_byte("value_levels", fmt.value_bits))
            values = codes * _from_f16(field("value_scale")) + _from_f16(field("value_min"))
        return keys, values

    def parts(self, state: dict[str, torch.Tensor]) -> dict[str, list[torch.Tensor]]:
        """The slots' bytes by `kvlab.accounting.LAYER_PARTS` name, as views: codes (and float8 keys, QJL signs)
        `packed`, norms/scales/mins `scales`, the alignment byte `other`."""
        slots, kinds = state["slots"], {"packed": [], "scales": [], "other": []}
        for name, (start, stop) in self.offsets().items():
            if stop > start:
                kind = "packed" if name.endswith(("codes", "signs")) else "other" if name == "pad" else "scales"
                kinds[kind].append(slots[..., start:stop])
        return kinds
