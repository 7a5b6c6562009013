"""The bundled recurrent model: a tiny Mamba-2 built from its config with seeded random weights.

`bundled:mamba2-tiny-random` is no trained model (no state-space weights ship offline): it is
`tiny_mamba2`, 2 Mamba-2 layers of hidden size 64, with transformers' byte-level
`ByT5Tokenizer` (no files needed), so it exists to show the structure of a recurrent-state cache, never its
text: every line that shows the model says STRUCTURE_ONLY. Nothing is downloaded or converted; building it takes
well under a second. `attention_reference` is a Llama as wide and deep, the KV side of Compare's
comparison. This module knows the list and builds the models; measuring their caches is `kvlab.recurrent.state`'s,
running them `kvlab.recurrent.runner`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .shipped import ShippedModel

STRUCTURE_ONLY = "structure only: random weights, the text means nothing"
"""The label every figure of the tiny recurrent model carries."""
SEED = 0
TINY_VOCAB = 384
"""The tiny models' vocabulary: transformers' byte-level `ByT5Tokenizer` (256 bytes, 3 specials, 125 extra ids),
which needs no files."""
TINY_HIDDEN, TINY_LAYERS = 64, 2


def _seeded(seed: int, build):
    """`build()` with torch's global generator seeded by `seed`, the generator's state restored afterwards."""
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return build().eval()
    finally:
        torch.random.set_rng_state(generator_state)


def tiny_mamba2(seed: int = SEED, vocab_size: int = TINY_VOCAB):
    """A 2-layer Mamba-2 (hidden 64, 4 heads of 32, state 16, conv kernel 4) with weights drawn from `seed`, in
    eval mode, float32 on CPU. STRUCTURE_ONLY."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    config = Mamba2Config(vocab_size=vocab_size, hidden_size=TINY_HIDDEN, num_hidden_layers=TINY_LAYERS,
                          num_heads=4, head_dim=32, state_size=16, expand=2, n_groups=1, chunk_size=32,
                          conv_kernel=4, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return _seeded(seed, lambda: Mamba2ForCausalLM(config))


def attention_reference(seed: int = SEED, vocab_size: int = TINY_VOCAB):
    """The KV side of the comparison: a Llama as wide and deep as `tiny_mamba2` (hidden 64, 2 layers, 4 heads of
    16, no grouped-query sharing), weights drawn from `seed`, eval mode, float32 on CPU. Its dense cache holds
    2 × 2 layers × 4 heads × 16 × 4 bytes = 1,024 bytes per token. STRUCTURE_ONLY."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=TINY_HIDDEN, intermediate_size=4 * TINY_HIDDEN,
                         num_hidden_layers=TINY_LAYERS, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=4096, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return _seeded(seed, lambda: LlamaForCausalLM(config))



RECURRENT_KEY = "bundled:mamba2-tiny-random"


@dataclass(frozen=True)
class RecurrentModel(ShippedModel):
    """One bundled recurrent model (`kvlab.models.shipped.ShippedModel`'s fields; its summary carries
    STRUCTURE_ONLY, its license is the architecture code's: the weights are random)."""


RECURRENT_MODELS: dict[str, RecurrentModel] = {
    RECURRENT_KEY: RecurrentModel(
        key=RECURRENT_KEY, name="mamba2-tiny-random",
        summary=f"Mamba-2 state-space model, 2 layers, hidden 64, byte tokens; {STRUCTURE_ONLY}",
        license="random weights (transformers' Mamba2 code, Apache-2.0)"),
}
"""The bundled recurrent models by source key."""


def recurrent_model(source: str) -> RecurrentModel | None:
    """The bundled recurrent model a source names, or None."""
    return RECURRENT_MODELS.get((source or "").strip())


def load_recurrent_model(key: str):
    """(model, tokenizer) of bundled recurrent model `key`: the seeded tiny Mamba-2 in float32 on the CPU, eval
    mode, and a `ByT5Tokenizer` whose vocabulary the model's embedding matches.

    Raises:
        KeyError: `key` is not a bundled recurrent model.
    """
    from transformers import ByT5Tokenizer

    RECURRENT_MODELS[key]  # noqa: B018 - raises KeyError for an unknown key
    tokenizer = ByT5Tokenizer()
    return tiny_mamba2(vocab_size=len(tokenizer)), tokenizer
