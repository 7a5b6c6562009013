"""Lloyd-Max scalar codebooks for the coordinates of a random unit vector (and for a unit Gaussian).

A coordinate of a vector drawn uniformly from the unit sphere of R^d has the density
f(x) ∝ (1 - x²)^((d-3)/2) on [-1, 1], close to N(0, 1/d) for large d. TurboQuant (Zandieh et al.,
"TurboQuant: Online Vector Quantization with Near-optimal Distortion Rate", arXiv 2504.19874) quantizes
each coordinate of a randomly rotated unit vector with the Lloyd-Max codebook of that density; this module
computes those codebooks numerically: Lloyd's iteration (boundaries at the midpoints of neighbouring
centroids, centroids at the conditional means of their cells; Lloyd 1982, Max 1960) on a fine midpoint grid,
the cell masses and moments read from prefix sums interpolated at the boundaries. It is deterministic and
remembered per (head_dim, bits). The Gaussian codebook is the reference of Max (1960), whose distortions at
1-4 bits are MAX_1960_DISTORTION. This module computes codebooks; it does not quantize tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

BITS = (1, 2, 3, 4)
"""Bits per coordinate a codebook is made for (2**bits levels)."""
MIN_HEAD_DIM = 3
"""Smallest vector size: below it the coordinate density (1 - x²)^((d-3)/2) is unbounded at ±1."""
GRID_CELLS = 200_000
"""Midpoint-rule cells over the support (in units of the coordinate's standard deviation 1/sqrt(d))."""
TAIL_SIGMAS = 12.0
"""Half-width of the grid in standard deviations where the support is wider (the mass beyond is < 1e-32)."""
MAX_ITERATIONS = 10_000
TOLERANCE = 1e-12
"""Lloyd's iteration stops when no centroid moves by more than this (in standard deviations)."""
MAX_1960_DISTORTION = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497}
"""Mean squared error of the Lloyd-Max quantizer of a unit Gaussian at 1-4 bits (Max 1960, Table I)."""


@dataclass(frozen=True)
class Codebook:
    """A Lloyd-Max scalar quantizer.

    centroids: the 2**bits reconstruction values, ascending; boundaries: the 2**bits - 1 cell edges between
    them, ascending (a value in (boundaries[i-1], boundaries[i]] maps to centroids[i]); distortion: the
    expected squared error per vector, i.e. `head_dim` times the per-coordinate mean squared error (for the
    Gaussian codebook, the per-coordinate error of a unit Gaussian).
    """

    bits: int
    centroids: tuple[float, ...]
    boundaries: tuple[float, ...]
    distortion: float


def _check(head_dim: int | None, bits: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {list(BITS)}, got {bits!r}")
    if head_dim is not None and (not isinstance(head_dim, int) or head_dim < MIN_HEAD_DIM):
        raise ValueError(f"head_dim must be an integer >= {MIN_HEAD_DIM}, got {head_dim!r}")


def _grid(head_dim: int | None) -> tuple[float, torch.Tensor]:
    """(half-width, cell probabilities) of a uniform float64 grid over the standardized coordinate
    z = x·sqrt(d), from -half-width to +half-width; a unit Gaussian for `head_dim` None."""
    half = TAIL_SIGMAS if head_dim is None else min(TAIL_SIGMAS, math.sqrt(head_dim))
    edges = torch.linspace(-half, half, GRID_CELLS + 1, dtype=torch.float64)
    mids = 0.5 * (edges[1:] + edges[:-1])
    if head_dim is None:
        log_density = -0.5 * mids**2
    else:
        log_density = 0.5 * (head_dim - 3) * torch.log1p(-(mids**2) / head_dim)
    mass = torch.exp(log_density - log_density.max())
    return half, mass / mass.sum()


def _cumulative_at(cuts: torch.Tensor, half: float, cumulative: torch.Tensor) -> torch.Tensor:
    """`cumulative` (GRID_CELLS + 1 values at the uniform grid's edges) linearly interpolated at `cuts`."""
    position = ((cuts + half) / (2 * half) * GRID_CELLS).clamp(0, GRID_CELLS)
    low = position.floor().long().clamp(max=GRID_CELLS - 1)
    fraction = position - low
    return cumulative[low] * (1 - fraction) + cumulative[low + 1] * fraction


def _lloyd(half: float, mass: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Lloyd's iteration on a gridded density: (centroids, boundaries, mean squared error), standardized."""
    step = 2 * half / GRID_CELLS
    mids = -half + step * (torch.arange(GRID_CELLS, dtype=torch.float64) + 0.5)
    zero = torch.zeros(1, dtype=torch.float64)
    moments = [torch.cat([zero, torch.cumsum(mass * mids**power, 0)]) for power in range(3)]
    ends = torch.tensor([-half, half], dtype=torch.float64)

    def cells(boundaries):
        cuts = torch.cat([ends[:1], boundaries, ends[1:]])
        return [torch.diff(_cumulative_at(cuts, half, cumulative)) for cumulative in moments]

    quantiles = (torch.arange(levels, dtype=torch.float64) + 0.5) / levels
    low = torch.searchsorted(moments[0], quantiles).clamp(1, GRID_CELLS) - 1
    centroids = mids[low]
    for _ in range(MAX_ITERATIONS):
        weight, first, _ = cells(0.5 * (centroids[1:] + centroids[:-1]))
        updated = first / weight
        moved = float((updated - centroids).abs().max())
        centroids = updated
        if moved < TOLERANCE:
            break
    boundaries = 0.5 * (centroids[1:] + centroids[:-1])
    weight, first, second = cells(boundaries)
    error = float(torch.sum(second - 2 * centroids * first + centroids**2 * weight))
    return centroids, boundaries, error


@lru_cache(maxsize=None)
def coordinate_codebook(head_dim: int, bits: int) -> Codebook:
    """The Lloyd-Max codebook for one coordinate of a uniformly random unit vector in R^head_dim, in the
    coordinate's own units (centroids within [-1, 1], about ±3/sqrt(head_dim) at the extremes).

    Raises:
        ValueError: `bits` not in BITS or `head_dim` below MIN_HEAD_DIM.
    """
    _check(head_dim, bits)
    centroids, boundaries, error = _lloyd(*_grid(head_dim), 2**bits)
    scale = 1.0 / math.sqrt(head_dim)
    return Codebook(bits, tuple(float(c) * scale for c in centroids.tolist()), tuple(float(b) * scale for b in boundaries.tolist()),
                    float(error))


@lru_cache(maxsize=None)
def gaussian_codebook(bits: int) -> Codebook:
    """The Lloyd-Max codebook of a unit Gaussian (Max 1960), the large-head_dim limit of `coordinate_codebook`
    scaled by sqrt(head_dim).

    Raises:
        ValueError: `bits` not in BITS.
    """
    _check(None, bits)
    centroids, boundaries, error = _lloyd(*_grid(None), 2**bits)
    return Codebook(bits, tuple(centroids.tolist()), tuple(boundaries.tolist()), float(error))


def lloyd_max_distortion(head_dim: int, bits: int) -> float:
    """Expected squared error ||u - û||² of a uniformly random unit vector u in R^head_dim whose coordinates
    are each quantized with `coordinate_codebook(head_dim, bits)`: head_dim times the per-coordinate error,
    close to MAX_1960_DISTORTION[bits] (the per-bit errors TurboQuant reports, arXiv 2504.19874).

    Raises:
        ValueError: `bits` not in BITS or `head_dim` below MIN_HEAD_DIM.
    """
    return coordinate_codebook(head_dim, bits).distortion
