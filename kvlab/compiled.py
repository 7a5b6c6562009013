"""`torch.compile` for the static strategy's decode forward.

A static cache keeps tensor shapes fixed, so one compiled forward serves every
decode step of every run on the same model. It is built once per loaded model
(under the model's lock) and reused; prefill runs eagerly, as transformers
recommends, because its length changes from prompt to prompt.
"""

from __future__ import annotations

import torch

_ATTRIBUTE = "_kvlab_compiled_decode"


def compiled_decode(loaded):
    """The model's forward wrapped in `torch.compile(dynamic=False)`, built once per loaded model."""
    with loaded.lock:
        decode = getattr(loaded, _ATTRIBUTE, None)
        if decode is None:
            decode = torch.compile(loaded.model.forward, dynamic=False)
            setattr(loaded, _ATTRIBUTE, decode)
    return decode
