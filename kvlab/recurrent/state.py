"""A recurrent-state cache measured honestly: a tiny Mamba-2 (transformers' `Mamba2ForCausalLM`) built from its
config with seeded random weights, since no state-space weights ship offline. STRUCTURE_ONLY labels every figure:
structure only, random weights, the text means nothing.

transformers 5.2x keeps a Mamba-2's cache in a `DynamicCache` of `LinearAttentionLayer`s: per layer a
convolution state (the last `conv_kernel` inputs) and an SSM state (heads × head_dim × state_size), both of fixed
size, so `state_bytes` is the same after 64 tokens as after 4,096, where a KV cache grows by the same bytes per
token. `crop_error` asks whether `Cache.crop(-n)` rolls that state back: it feeds a sequence token by token with
the layers recording their past (`activate_past_recording`), crops `n` tokens, feeds the next one and compares
its logits with a fresh run's. On transformers 5.24 the crop rolls back only the convolution states and leaves
the SSM state as it was, so the logits differ (`crop_reason` says so with the figure); 5.25 made these layers
croppable. This module measures; it renders nothing.
"""

from __future__ import annotations

import torch

STRUCTURE_ONLY = "structure only: random weights, the text means nothing"
"""The label every figure of the tiny recurrent model carries."""
SEED = 0
CROP_TOLERANCE = 1e-6
"""Largest |logit difference| between a cropped and a fresh run for the crop to count as a rollback."""
TINY_VOCAB = 1000


def tiny_mamba2(seed: int = SEED):
    """A 2-layer Mamba-2 (hidden 64, 4 heads of 32, state 16, conv kernel 4) with weights drawn from `seed`, in
    eval mode, float32 on CPU. STRUCTURE_ONLY."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    config = Mamba2Config(vocab_size=TINY_VOCAB, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32,
                          state_size=16, expand=2, n_groups=1, chunk_size=32, conv_kernel=4)
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return Mamba2ForCausalLM(config).eval()
    finally:
        torch.random.set_rng_state(generator_state)


def _ids(tokens: int, seed: int = SEED) -> torch.Tensor:
    return torch.randint(0, TINY_VOCAB, (1, tokens), generator=torch.Generator().manual_seed(seed))


def state_bytes(model, tokens: int) -> int:
    """Bytes the model's cache holds after a prefill of `tokens` random ids, counted from its tensors
    (`kvlab.accounting.cache_bytes`)."""
    from ..accounting import cache_bytes

    with torch.inference_mode():
        return cache_bytes(model(_ids(tokens), use_cache=True).cache)


def crop_error(model, tokens: int = 16, crop: int = 3) -> float:
    """Max |logit difference| between (feed `tokens` ids one after another into a recording cache, crop the last
    `crop`, feed the next id) and a fresh run over the same ids: 0 when the crop rolls the state back exactly.

    Raises:
        RuntimeError: this transformers cannot crop the cache at all (its message).
    """
    from transformers import DynamicCache

    ids = _ids(tokens + 1, seed=1)
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        for layer in cache.layers:
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()
        model(ids[:, :1], cache=cache, use_cache=True)
        for t in range(1, tokens):
            model(ids[:, t:t + 1], cache=cache, use_cache=True)
        cache.crop(-crop)
        kept = tokens - crop
        cropped = model(ids[:, kept:kept + 1], cache=cache, use_cache=True).logits[0, -1]
        fresh = model(ids[:, :kept + 1], use_cache=False).logits[0, -1]
    return float((cropped - fresh).abs().max())


def crop_reason(model, crop: int = 3) -> str | None:
    """None when a crop of `crop` tokens reproduces a fresh run's logits to CROP_TOLERANCE on this transformers,
    else one line saying why not (with the measured difference)."""
    import transformers

    try:
        error = crop_error(model, crop=crop)
    except RuntimeError as err:
        return f"transformers {transformers.__version__} cannot crop this cache: {err}"
    if error <= CROP_TOLERANCE:
        return None
    return (f"transformers {transformers.__version__} crops only the convolution states of a linear-attention layer, "
            f"not its SSM state: a crop of {crop} tokens is off a fresh run by {error:.2g} in the logits "
            f"(transformers 5.25 made these layers croppable)")
