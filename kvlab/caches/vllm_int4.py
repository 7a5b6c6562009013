"""vLLM's `--kv-cache-dtype int4_per_token_head`, reproduced in PyTorch (vLLM
`v1/attention/ops/int4_per_token_head.py`; commit in `kvlab.caches.quant.vllm`).

Each key and value vector (one token, one KV head) is first rotated by one randomized Hadamard transform,
x ↦ H·(s ⊙ x) with H the unnormalized Sylvester matrix (H·H = d·I) and s a fixed ±1 vector (torch's Bernoulli(½)
draw from seed 0x9E3779B9, as vLLM draws it), and cast back to the model's dtype. Then, per vector:
scale = max((max - min)/15, 1e-6), zero point zp = clamp(round(-min/scale), 0, 15), code = clamp(round(x/scale
+ zp), 0, 15) (round: half away from zero, x/scale as x·(1/scale)), two codes per byte (the even coordinate in the
low nibble): d/2 bytes; and one float32 whose low four mantissa bits are replaced by zp (the scale used is that
float with those bits cleared): 4 bytes. Keys and values alike: d + 8 bytes per token and KV head. Read back:
(code - zp)·scale, then the inverse transform s ⊙ (H·x)/d. vLLM computes attention in the rotated space (queries
rotated, the output rotated back); that is the same linear map, so dequantizing the keys and values here gives
the same attention up to float rounding. vLLM's Triton backend writes the cache first and attends from it, the
prefill included, so the prompt too reads its keys and values decoded. This module encodes and decodes; it keeps
no cache.
"""

from __future__ import annotations

import torch

from .vllm_turboquant import byte_table, hadamard, is_power_of_two

KV_CACHE_DTYPE = "int4_per_token_head"
SIGN_SEED = 0x9E3779B9
"""vLLM's `_get_rht_signs` seed for its single (round 0) transform."""
LEVELS = 15
SCALE_FLOOR = 1e-6
ZERO_POINT_MASK = 0xF


def rht_signs(head_dim: int) -> torch.Tensor:
    """The ±1 float32 vector vLLM multiplies by before its Hadamard transform."""
    generator = torch.Generator(device="cpu").manual_seed(SIGN_SEED)
    return 2.0 * torch.bernoulli(torch.full((head_dim,), 0.5), generator=generator) - 1.0


def _round_half_away(values: torch.Tensor) -> torch.Tensor:
    """Triton's `where(x >= 0, int(x + 0.5), int(x - 0.5))` (int truncates toward zero), as float32."""
    return torch.where(values >= 0, (values + 0.5).trunc(), (values - 0.5).trunc())


class Int4PerTokenHeadCodec:
    """Encodes (…, tokens, head_dim) keys and values into uint8 codes (…, tokens, head_dim/2) and float32 scales
    (…, tokens, 1) each, and back, with the transform's tables on one device.

    `attends_raw_chunks` is False: vLLM's Triton backend attends from the cache, prefill included.

    Raises:
        ValueError: head_dim is not a power of two (vLLM's transform needs one).
    """

    attends_raw_chunks = False

    def __init__(self, head_dim: int, device: torch.device | str = "cpu", tables: dict | None = None):
        if not is_power_of_two(head_dim):
            raise ValueError(f"{KV_CACHE_DTYPE} needs a power-of-two head_dim (its Hadamard transform), "
                             f"got {head_dim!r}")
        self.head_dim = head_dim
        made = tables or {"hadamard": hadamard(head_dim) * head_dim ** 0.5, "signs": rht_signs(head_dim)}
        self.tables = {name: t.to(device) for name, t in made.items()}
        # decode-time helpers (not stored in the cache): the inverse transform as one matrix, a byte's two codes
        self._inverse = self.tables["hadamard"] * self.tables["signs"] / head_dim
        self._nibbles = byte_table(torch.arange(16, dtype=torch.float32, device=device), 4)

    def to(self, device) -> "Int4PerTokenHeadCodec":
        return Int4PerTokenHeadCodec(self.head_dim, device, self.tables)

    def tensors(self) -> list[torch.Tensor]:
        return list(self.tables.values())

    def _encode_one(self, vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rotated = ((vectors.float() * self.tables["signs"]) @ self.tables["hadamard"]).to(vectors.dtype).float()
        low, high = rotated.amin(-1, keepdim=True), rotated.amax(-1, keepdim=True)
        scale = torch.clamp_min((high - low) / LEVELS, SCALE_FLOOR)
        zero_point = _round_half_away(-low / scale).clamp(0, LEVELS)
        codes = _round_half_away(rotated * (1.0 / scale) + zero_point).clamp(0, LEVELS).to(torch.uint8)
        packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
        bits = (scale.view(torch.int32) & -16) | zero_point.to(torch.int32)
        return packed, bits.view(torch.float32)

    def _decode_one(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """(code - zp)·scale, then s ⊙ (H·x)/d (as one matrix: H's columns times s, over d)."""
        codes = self._nibbles.index_select(0, packed.reshape(-1).long()).view(*packed.shape[:-1], -1)
        bits = scales.view(torch.int32)
        zero_point = (bits & ZERO_POINT_MASK).float()
        rotated = (codes - zero_point) * (bits & -16).view(torch.float32)
        return rotated @ self._inverse

    def encode(self, keys: torch.Tensor, values: torch.Tensor) -> dict[str, torch.Tensor]:
        """{key_codes, key_scales, value_codes, value_scales} for keys and values (…, tokens, head_dim); shapes
        only on the meta device (the planner)."""
        if keys.is_meta:
            codes = torch.empty((*keys.shape[:-1], self.head_dim // 2), dtype=torch.uint8, device=keys.device)
            scales = torch.empty((*keys.shape[:-1], 1), dtype=torch.float32, device=keys.device)
            return {"key_codes": codes, "key_scales": scales, "value_codes": codes.clone(), "value_scales": scales.clone()}
        key_codes, key_scales = self._encode_one(keys)
        value_codes, value_scales = self._encode_one(values)
        return {"key_codes": key_codes, "key_scales": key_scales, "value_codes": value_codes,
                "value_scales": value_scales}

    def decode(self, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) float32 (…, tokens, head_dim)."""
        if state["key_codes"].is_meta:
            shape = (*state["key_codes"].shape[:-1], self.head_dim)
            return torch.empty(shape, device="meta"), torch.empty(shape, device="meta")
        return (self._decode_one(state["key_codes"], state["key_scales"]),
                self._decode_one(state["value_codes"], state["value_scales"]))

    def parts(self, state: dict[str, torch.Tensor]) -> dict[str, list[torch.Tensor]]:
        """Codes `packed`, scales (zero points inside) `scales`."""
        return {"packed": [state["key_codes"], state["value_codes"]],
                "scales": [state["key_scales"], state["value_scales"]], "other": []}

    def bytes_per_token_head(self) -> int:
        """head_dim/2 + 4 for keys and for values."""
        return 2 * (self.head_dim // 2 + 4)
