"""`torch.compile` for the static strategy's decode forward.

A static cache keeps tensor shapes fixed, so one compiled forward serves every
decode step of every run on the same model. The compiled function is built once
per loaded model (under the model's lock) and reused; prefill runs eagerly,
as transformers recommends, because its length changes from prompt to prompt.
"""

from __future__ import annotations

import torch

_ATTRIBUTE = "_kvlab_compiled_decode"


def compiled_forward(loaded):
    """A drop-in for `kvlab.runner.forward_step` that compiles single-token decode steps."""
    from .runner import forward_step

    with loaded.lock:
        decode = getattr(loaded, _ATTRIBUTE, None)
        if decode is None:
            decode = torch.compile(loaded.model.forward, dynamic=False, fullgraph=False)
            setattr(loaded, _ATTRIBUTE, decode)

    def step(loaded_, strategy, cache, sequence, new_tokens):
        if new_tokens != 1:
            return forward_step(loaded_, strategy, cache, sequence, new_tokens)
        out = decode(input_ids=sequence[:, -1:], cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    return step
