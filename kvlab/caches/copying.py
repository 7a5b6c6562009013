"""kvlab's one cache copier: an independent copy of a transformers `Cache` to feed other tokens into.

Prefix reuse (`kvlab.chat.prefix`) answers each prompt from a copy of a prefilled prefix; the Needle cell
(`kvlab.needle.cell`) teacher-forces the key through a copy of its cache while greedy decoding goes on. Both
use `copy_cache`. It works whatever the grad mode of the prefill was: a cache filled with grad enabled holds
non-leaf tensors that `copy.deepcopy` refuses ("Only Tensors created explicitly by the user (graph leaves)
support the deepcopy protocol"), and optimum-quanto's packed tensors refuse it in every mode; each tensor is
therefore detached and cloned (tensor subclasses part by part through `__tensor_flatten__`) before the rest
of the cache is deep-copied. A clone made outside inference mode is a normal tensor, so a copy of a cache
filled under `torch.inference_mode()` can be used under `torch.no_grad()` too. This module copies; it does
not run a model.
"""

from __future__ import annotations

import copy

import torch


def clone_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A detached copy of `tensor` with its own storage, outside any autograd graph.

    Plain tensors are `detach().clone()`d; tensor subclasses that implement
    `__tensor_flatten__` (optimum-quanto's `WeightQBitsTensor`, `PackedTensor`)
    are rebuilt from clones of their inner tensors.
    """
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        names, context = tensor.__tensor_flatten__()
        inner = {name: clone_tensor(getattr(tensor, name)) for name in names}
        return type(tensor).__tensor_unflatten__(inner, context, tensor.size(), tensor.stride())
    with torch.inference_mode(False):
        return tensor.detach().clone()


def _register_clones(obj, memo: dict) -> None:
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = clone_tensor(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _register_clones(item, memo)
    elif isinstance(obj, dict):
        for item in obj.values():
            _register_clones(item, memo)


def copy_cache(cache):
    """An independent deep copy of a transformers `Cache` (None for None).

    Every tensor held by the cache or its layers (directly, or inside lists,
    tuples and dicts such as HQQ's `meta`) is replaced by `clone_tensor` of it;
    everything else is `copy.deepcopy`'d. Works whether the cache was filled with
    grad enabled, under `torch.no_grad()` or under `torch.inference_mode()`.
    """
    if cache is None:
        return None
    memo: dict = {}
    for value in vars(cache).values():
        _register_clones(value, memo)
    for layer in getattr(cache, "layers", []):
        for value in vars(layer).values():
            _register_clones(value, memo)
    return copy.deepcopy(cache, memo)
