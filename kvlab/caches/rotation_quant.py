"""Rotation quantization of key/value head vectors (TurboQuant-MSE; Zandieh et al., "TurboQuant: Online Vector
Quantization with Near-optimal Distortion Rate", arXiv 2504.19874, Algorithm 1).

Each vector x (one key or value of one head at one position, `head_dim` = d coordinates) is stored as its
L2 norm ||x|| and, per coordinate of the rotated unit vector Π·x/||x||, the index of the Lloyd-Max codebook
of a random unit vector's coordinates (`kvlab.caches.lloyd_max`). Dequantizing looks the centroids up,
rotates back (Πᵀ) and multiplies by the norm. Π is one Haar-random orthogonal d×d matrix drawn from a seed
(`haar_rotation`). For a uniformly random unit vector the expected squared error is then the codebook's
`distortion` (close to 0.3634, 0.1175, 0.03454, 0.0095 at 1-4 bits); the rotation makes any fixed vector's
rotated coordinates follow that law, so an outlier channel costs nothing extra.

Stored layout, exact to the byte (`packed_nbytes`, `codec_nbytes`):
- indices: uint8, shape (..., tokens, bits·ceil(d/8)). A vector's d indices form one little-endian bit stream,
  index j in bits j·bits .. j·bits+bits-1 (least significant first), byte k holding stream bits 8k..8k+7,
  padded with zero indices to a multiple of 8 coordinates: bits·ceil(d/8) bytes per vector (= d·bits/8
  whenever 8 divides d, as it does for every common head size).
- norms: float16 (NORM_DTYPE), shape (..., tokens): 2 bytes per vector. A norm beyond float16's range
  (65504) is refused rather than stored as infinity.
- the codec: the rotation, float32 d×d (4·d² bytes), the 2**bits centroids and 2**bits - 1 boundaries,
  float32 (4·(2**(bits+1) - 1) bytes); a cache shares one rotation between all its layers, keys and values.
Arithmetic runs in float32 whatever the input dtype; `dequantize` returns the input's dtype.
This module quantizes tensors; the cache layer that keeps them is `kvlab.caches.rotation_cache`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import torch

from .lloyd_max import coordinate_codebook

NORM_DTYPE = torch.float16
"""How each vector's norm is stored (2 bytes; relative rounding 2**-11, far below the 4-bit error)."""
CODEC_DTYPE = torch.float32
"""The rotation's and the codebooks' dtype, and the dtype all quantization arithmetic runs in."""
GROUP_COORDINATES = 8
"""Indices are packed 8 coordinates at a time into `bits` bytes."""


class PackedVectors(NamedTuple):
    """Vectors quantized by `quantize`.

    indices: uint8 (..., tokens, bits·ceil(head_dim/8)), the bit-packed codebook indices (layout in the module
    docstring); norms: NORM_DTYPE (..., tokens); bits, head_dim: what the indices unpack with; dtype: the dtype
    `dequantize` returns. Only `indices` and `norms` hold memory.
    """

    indices: torch.Tensor
    norms: torch.Tensor
    bits: int
    head_dim: int
    dtype: torch.dtype

    @property
    def tokens(self) -> int:
        """Positions held (the sequence axis, -2 of the unpacked shape)."""
        return self.norms.shape[-1]

    @property
    def shape(self) -> torch.Size:
        """The shape the vectors stand for, (..., tokens, head_dim), as a quantized tensor reports it."""
        return torch.Size((*self.norms.shape, self.head_dim))


@dataclass(frozen=True, eq=False)
class Codec:
    """What quantizing at `bits` bits per coordinate needs, on one device: `rotation` (head_dim, head_dim),
    `centroids` (2**bits,) and `boundaries` (2**bits - 1,), all CODEC_DTYPE (a plain object, so that byte
    accounting that walks tensors, tuples and dicts never counts a shared codec twice)."""

    bits: int
    rotation: torch.Tensor
    centroids: torch.Tensor
    boundaries: torch.Tensor

    @property
    def head_dim(self) -> int:
        return self.rotation.shape[0]

    def to(self, device: torch.device | str) -> "Codec":
        """The same codec with its tensors on `device` (the rotation moved once per call)."""
        return Codec(self.bits, self.rotation.to(device), self.centroids.to(device), self.boundaries.to(device))

    def tensors(self) -> list[torch.Tensor]:
        return [self.rotation, self.centroids, self.boundaries]


@lru_cache(maxsize=16)
def _haar_rotation_cpu(head_dim: int, seed: int) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    gaussian = torch.randn(head_dim, head_dim, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    signs = torch.where(torch.diagonal(r) >= 0, 1.0, -1.0).to(torch.float64)
    return (q * signs).to(CODEC_DTYPE)


def haar_rotation(head_dim: int, seed: int) -> torch.Tensor:
    """A Haar-distributed random orthogonal matrix, (head_dim, head_dim) CODEC_DTYPE on the CPU, the same for
    the same (head_dim, seed) on every machine: the Q of the QR decomposition of a float64 standard Gaussian
    matrix drawn from `torch.Generator().manual_seed(seed)`, its columns multiplied by the signs of R's
    diagonal (without that correction Q is not Haar; Mezzadri 2007, "How to generate random matrices from the
    classical compact groups"). A fresh copy each call.

    Raises:
        ValueError: head_dim < 1 or a negative seed.
    """
    if not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive integer, got {head_dim!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return _haar_rotation_cpu(head_dim, seed).clone()


def make_codec(head_dim: int, bits: int, seed: int = 0, rotation: torch.Tensor | None = None) -> Codec:
    """The codec for vectors of `head_dim` at `bits` bits on the CPU: `rotation` if given (to share one between
    codecs), else `haar_rotation(head_dim, seed)`, and `coordinate_codebook(head_dim, bits)`.

    Raises:
        ValueError: bits not in 1-4, head_dim below the codebook's minimum, a negative seed, or a rotation of
            another shape.
    """
    codebook = coordinate_codebook(head_dim, bits)
    rotation = haar_rotation(head_dim, seed) if rotation is None else rotation
    if tuple(rotation.shape) != (head_dim, head_dim):
        raise ValueError(f"rotation must be ({head_dim}, {head_dim}), got {tuple(rotation.shape)}")
    return Codec(bits, rotation, torch.tensor(codebook.centroids, dtype=CODEC_DTYPE),
                 torch.tensor(codebook.boundaries, dtype=CODEC_DTYPE))


def pack_indices(indices: torch.Tensor, bits: int) -> torch.Tensor:
    """Bit-pack codebook indices (..., d), integers in [0, 2**bits), into uint8 (..., bits·ceil(d/8)) (the
    module docstring's layout)."""
    *lead, dim = indices.shape
    groups = -(-dim // GROUP_COORDINATES)
    padded = torch.nn.functional.pad(indices.to(torch.uint8), (0, groups * GROUP_COORDINATES - dim))
    if GROUP_COORDINATES % bits == 0:
        per_byte = 8 // bits
        shifts = torch.arange(per_byte, device=indices.device, dtype=torch.uint8) * bits
        fields = padded.view(*lead, groups * bits, per_byte) << shifts
        packed = fields[..., 0]
        for position in range(1, per_byte):
            packed = packed | fields[..., position]
        return packed
    shifts = torch.arange(GROUP_COORDINATES, device=indices.device, dtype=torch.int64) * bits
    words = (padded.view(*lead, groups, GROUP_COORDINATES).to(torch.int64) << shifts).sum(-1)
    byte_shifts = torch.arange(bits, device=indices.device, dtype=torch.int64) * 8
    return ((words.unsqueeze(-1) >> byte_shifts) & 0xFF).to(torch.uint8).reshape(*lead, groups * bits)


def unpack_indices(packed: torch.Tensor, bits: int, head_dim: int) -> torch.Tensor:
    """The inverse of `pack_indices`: uint8 (..., bits·ceil(head_dim/8)) -> int64 indices (..., head_dim)."""
    *lead, width = packed.shape
    mask = (1 << bits) - 1
    if GROUP_COORDINATES % bits == 0:
        shifts = torch.arange(8 // bits, device=packed.device, dtype=torch.uint8) * bits
        fields = (packed.unsqueeze(-1) >> shifts) & mask
        return fields.reshape(*lead, width * (8 // bits))[..., :head_dim].to(torch.int64)
    groups = width // bits
    byte_shifts = torch.arange(bits, device=packed.device, dtype=torch.int64) * 8
    words = (packed.view(*lead, groups, bits).to(torch.int64) << byte_shifts).sum(-1)
    shifts = torch.arange(GROUP_COORDINATES, device=packed.device, dtype=torch.int64) * bits
    fields = (words.unsqueeze(-1) >> shifts) & mask
    return fields.reshape(*lead, groups * GROUP_COORDINATES)[..., :head_dim]


def quantize(states: torch.Tensor, codec: Codec) -> PackedVectors:
    """Quantize vectors along the last axis: `states` (..., tokens, head_dim), typically (batch, kv_heads,
    tokens, head_dim), any float dtype, on the codec's device. A zero vector is stored with norm 0 and comes
    back as zeros.

    Raises:
        ValueError: the last axis is not the codec's head_dim, or a norm is not finite in NORM_DTYPE (a
            vector longer than 65504 or holding inf/nan; not checked on the meta device, where only shapes exist).
    """
    if states.shape[-1] != codec.head_dim:
        raise ValueError(f"states have {states.shape[-1]} coordinates per vector, the codec {codec.head_dim}")
    vectors = states.to(CODEC_DTYPE)
    norms = torch.linalg.vector_norm(vectors, dim=-1, keepdim=True)
    rotated = (vectors / norms.clamp_min(torch.finfo(CODEC_DTYPE).tiny)) @ codec.rotation.T
    indices = torch.bucketize(rotated, codec.boundaries)
    stored_norms = norms.squeeze(-1).to(NORM_DTYPE)
    if not stored_norms.is_meta and not bool(torch.isfinite(stored_norms).all()):
        raise ValueError(f"a vector norm is not finite in {NORM_DTYPE} (largest {float(norms.max()):.4g}); "
                         "rotation quantization stores norms in float16")
    return PackedVectors(pack_indices(indices, codec.bits), stored_norms, codec.bits, codec.head_dim,
                         states.dtype)


def dequantize(packed: PackedVectors, codec: Codec) -> torch.Tensor:
    """The vectors `packed` stands for: (..., tokens, head_dim) in `packed.dtype`, on the codec's device:
    centroids[indices] · rotation (i.e. Πᵀ applied to each rotated vector) · norm.

    Raises:
        ValueError: `packed` was made at other bits or head_dim than `codec`'s.
    """
    if (packed.bits, packed.head_dim) != (codec.bits, codec.head_dim):
        raise ValueError(f"packed at {packed.bits} bits x {packed.head_dim} dims; the codec is "
                         f"{codec.bits} bits x {codec.head_dim} dims")
    rotated = codec.centroids[unpack_indices(packed.indices, packed.bits, packed.head_dim)]
    vectors = (rotated @ codec.rotation) * packed.norms.to(CODEC_DTYPE).unsqueeze(-1)
    return vectors.to(packed.dtype)


def concat_packed(first: PackedVectors, second: PackedVectors) -> PackedVectors:
    """`first`'s positions followed by `second`'s (same bits, head_dim and leading shape)."""
    return first._replace(indices=torch.cat([first.indices, second.indices], dim=-2),
                          norms=torch.cat([first.norms, second.norms], dim=-1))


def drop_front(packed: PackedVectors, tokens: int) -> PackedVectors:
    """`packed` without its first `tokens` positions, copied so the dropped ones free their memory."""
    return packed._replace(indices=packed.indices[..., tokens:, :].clone(), norms=packed.norms[..., tokens:].clone())


def select_batch(packed: PackedVectors, rows: torch.Tensor) -> PackedVectors:
    """`packed` with its batch axis (0) reordered to `rows` (beam search)."""
    rows = rows.to(packed.indices.device)
    return packed._replace(indices=packed.indices.index_select(0, rows), norms=packed.norms.index_select(0, rows))


def index_bytes_per_vector(head_dim: int, bits: int) -> int:
    """Bytes of packed indices per vector: bits · ceil(head_dim / 8)."""
    return bits * -(-head_dim // GROUP_COORDINATES)


def packed_nbytes(batch: int, kv_heads: int, tokens: int, head_dim: int, bits: int) -> int:
    """Exact bytes `quantize` stores for states of shape (batch, kv_heads, tokens, head_dim) at `bits`:
    batch·kv_heads·tokens·(bits·ceil(head_dim/8) + 2) (indices, then the float16 norm)."""
    vectors = batch * kv_heads * tokens
    return vectors * (index_bytes_per_vector(head_dim, bits) + torch.empty((), dtype=NORM_DTYPE).element_size())


def codec_nbytes(head_dim: int, bits: int, with_rotation: bool = True) -> int:
    """Bytes of one codec's tensors: the float32 rotation 4·head_dim² (if `with_rotation`), plus
    4·(2**bits centroids + 2**bits - 1 boundaries)."""
    element = torch.empty((), dtype=CODEC_DTYPE).element_size()
    rotation = head_dim * head_dim if with_rotation else 0
    return element * (rotation + 2 ** (bits + 1) - 1)
