"""Forward hooks that record, for the last position of a forward, each decoder layer's output (the residual
stream after the layer) and what its attention module was given (normed input, rotary cos/sin), and the
recomputation of that position's attention from those inputs and a cache's keys.

Attention is recomputed, not read from the kernel: the step's query is rebuilt from the attention module's own
`q_proj` (and `q_norm` where the model has one), rotated with the rotary embedding the model passed to the
layer through the model family's own `apply_rotary_pos_emb`, scaled by the module's `scaling` (and soft-capped
by `config.attn_logit_softcapping` where set), then soft-maxed over the keys given (Vaswani et al. 2017,
arXiv:1706.03762; RoPE: Su et al. 2021, arXiv:2104.09864). The model keeps running its own attention kernel
(SDPA), so the run itself is unchanged.

Hooks are removed on exit. This module does not decide what to compare (`kvlab.inspect.diverge`).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

import torch


def decoder_parts(model):
    """(decoder layers, final norm, LM head) of a causal LM; raises ValueError when it has no `layers` list."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(decoder, "layers", None)
    norm = getattr(decoder, "norm", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if layers is None or norm is None or head is None:
        raise ValueError("the model has no decoder `layers` list, final `norm` and LM head to probe")
    return layers, norm, head


@dataclass
class Probe:
    """Per decoder layer, for the last position of the latest forward: `hidden` (hidden_size,) the layer's
    output; `attention_input` (normed input (1, 1, hidden_size), cos (1, 1, head_dim), sin (1, 1, head_dim))
    when attention inputs are recorded."""

    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    attention_input: dict[int, tuple] = field(default_factory=dict)

    def hidden_stack(self, count: int) -> torch.Tensor:
        """(layers, hidden_size) float32, layer order."""
        return torch.stack([self.hidden[i] for i in range(count)])


@contextlib.contextmanager
def probe(model, attention: bool = False):
    """While open, every forward of `model` refreshes a `Probe` (yielded) with each layer's last-position output
    and, when `attention`, its attention module's inputs. Hooks are removed on exit."""
    layers, _, _ = decoder_parts(model)
    record = Probe()
    handles = []

    def on_output(index):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            record.hidden[index] = hidden[0, -1].detach().float().clone()
        return hook

    def on_attention(index):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            cos, sin = kwargs["position_embeddings"]
            record.attention_input[index] = (hidden[:, -1:].detach().clone(), cos[:, -1:].detach().clone(),
                                             sin[:, -1:].detach().clone())
        return hook

    try:
        for index, layer in enumerate(layers):
            handles.append(layer.register_forward_hook(on_output(index)))
            if attention:
                handles.append(layer.self_attn.register_forward_pre_hook(on_attention(index), with_kwargs=True))
        yield record
    finally:
        for handle in handles:
            handle.remove()


def attention_unsupported_reason(model) -> str | None:
    """Why the attention of `model` cannot be recomputed here, or None."""
    layers, _, _ = decoder_parts(model)
    attention = getattr(layers[0], "self_attn", None)
    if attention is None or not hasattr(attention, "q_proj") or not hasattr(attention, "scaling"):
        return "its attention module has no `q_proj` and `scaling` to rebuild the query from"
    if getattr(sys.modules[type(attention).__module__], "apply_rotary_pos_emb", None) is None:
        return "its modeling file has no `apply_rotary_pos_emb` to rotate the query with"
    return None


def attention_probs(model, layer_index: int, attention_input: tuple, keys: torch.Tensor) -> torch.Tensor:
    """Attention probabilities of the probed position over `keys`, (heads, keys).

    Args:
        layer_index: the decoder layer.
        attention_input: the `Probe.attention_input` entry of that layer.
        keys: (kv_heads, seq, head_dim) keys rotated at their positions, every one visible to the query.
    """
    layers, _, _ = decoder_parts(model)
    attention = layers[layer_index].self_attn
    hidden, cos, sin = attention_input
    head_dim = keys.shape[-1]
    with torch.inference_mode():
        query = attention.q_proj(hidden).view(1, 1, -1, head_dim)
        if getattr(attention, "q_norm", None) is not None:
            query = attention.q_norm(query)
        query = query.transpose(1, 2)
        rotate = sys.modules[type(attention).__module__].apply_rotary_pos_emb
        query, _ = rotate(query, query, cos, sin)
        query = query[0, :, 0].float()
        groups = query.shape[0] // keys.shape[0]
        expanded = keys.float().repeat_interleave(groups, dim=0)
        scores = torch.einsum("hd,hsd->hs", query, expanded) * float(attention.scaling)
        cap = getattr(model.config.get_text_config(decoder=True), "attn_logit_softcapping", None)
        if cap:
            scores = torch.tanh(scores / cap) * cap
        return torch.softmax(scores, dim=-1)
