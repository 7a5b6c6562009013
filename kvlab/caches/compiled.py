"""`torch.compile` for the static strategy's decode forward.

A static cache keeps tensor shapes fixed, so one compiled forward serves every
decode step of every run whose cache has the same size. Positions are passed
as tensors (`cache_position`, `position_ids`) and the input token as a
contiguous (1, 1) tensor: a Python int position or a slice of the growing
sequence (whose stride changes every step) would make `torch.compile`
compile again at every step until its recompile limit, then fall back to
eager code. Prefill runs eagerly, as transformers
recommends, because its length changes from prompt to prompt.

The compiled forward is built once per loaded model; calls go through one lock
per model, since compiling is not safe from two threads at once.
"""

from __future__ import annotations

import threading

import torch

_ATTRIBUTE = "_kvlab_compiled_decode"
_guard = threading.Lock()


def compiled_decode(loaded):
    """(forward wrapped in `torch.compile(dynamic=False)`, the lock its calls take), built once per loaded model."""
    with _guard:
        entry = getattr(loaded, _ATTRIBUTE, None)
        if entry is None:
            entry = (torch.compile(loaded.model.forward, dynamic=False), threading.Lock())
            setattr(loaded, _ATTRIBUTE, entry)
    return entry


def decode_step(loaded, cache, token_ids: torch.Tensor, position: int) -> torch.Tensor:
    """One compiled decode step: `token_ids` (1, 1) at absolute `position`; returns (1, vocab) logits.

    The first call for a cache size compiles (tens of seconds on a 2-core CPU); later ones reuse it.
    """
    forward, lock = compiled_decode(loaded)
    # A slice of the growing sequence has a stride that changes every step, and strides are guarded on too;
    # `.contiguous()` keeps it (a (1, 1) tensor counts as contiguous whatever its strides), a fresh copy does not.
    token_ids = token_ids.new_empty((1, 1)).copy_(token_ids)
    cache_position = torch.tensor([position], device=token_ids.device)
    with lock:
        out = forward(input_ids=token_ids, cache=cache, use_cache=True, cache_position=cache_position,
                      position_ids=cache_position[None], logits_to_keep=1)
    return out.logits[:, -1, :]
