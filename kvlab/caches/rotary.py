"""Rotary position embedding (RoPE) helpers for caches that move cached keys between positions.

`KeyRerotator` moves RoPE-rotated keys by a position delta (a pure rotation,
RoPE rotations compose); `inv_freq_from_config` gives a config's inverse
frequencies with transformers' own initialisation; `unsupported_reason` says
why a model's attention layout cannot be re-rotated this way (used by kvlab's
sink cache, `kvlab.caches.sink`). This module computes; it holds no cache.
"""

from __future__ import annotations

import torch

from ..models.loading import head_dim

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""Model families whose attention applies rotate-half RoPE to the whole head after `k_proj`."""

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
"""RoPE types whose inverse frequencies do not depend on the sequence length."""


def unsupported_reason(config) -> str | None:
    """One sentence saying why a sink cache cannot serve the model of `config`, or None if it can.

    Checks that every layer is full attention (`config.layer_types`, or no
    `config.sliding_window`), `config.model_type` against `SUPPORTED_MODEL_TYPES`, that
    `config.rope_parameters['rope_type']` is in `SUPPORTED_ROPE_TYPES` and that the
    rotary embedding covers the whole head.
    """
    cfg = config.get_text_config(decoder=True)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        other = sorted(set(layer_types) - {"full_attention"})
        if other:
            return (
                f"config.layer_types has layers other than full attention ({', '.join(other)}); "
                "the sink cache needs every layer to be full attention"
            )
    elif getattr(cfg, "sliding_window", None) is not None:
        return (
            f"config.sliding_window is {cfg.sliding_window}: the model's own attention mask is sliding, "
            "the sink cache needs every layer to be full attention"
        )
    model_type = getattr(cfg, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (
            f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}: the sink cache re-rotates cached "
            "keys and only knows those families' rotary layout"
        )
    rope = getattr(cfg, "rope_parameters", None)
    if not isinstance(rope, dict) or "rope_type" not in rope:
        return ("config.rope_parameters has no single 'rope_type': "
                "the sink cache needs one rotary embedding for all layers")
    if rope["rope_type"] not in SUPPORTED_ROPE_TYPES:
        return (
            f"rope_type {rope['rope_type']!r} is not one of {SUPPORTED_ROPE_TYPES}: its frequencies change with "
            "the sequence length, so cached keys cannot be re-rotated"
        )
    partial = rope.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0):
        return f"partial_rotary_factor is {partial}: the sink cache re-rotates the whole head only"
    return None


def inv_freq_from_config(config) -> torch.Tensor:
    """The RoPE inverse frequencies of `config`, shape (head_dim // 2,), float32, radians per position.

    Uses transformers' own initialisation functions, so it matches the model's
    `rotary_emb.inv_freq` for every type in `SUPPORTED_ROPE_TYPES`.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = config.get_text_config(decoder=True)
    rope_type = cfg.rope_parameters["rope_type"]
    if rope_type == "default":
        dim = head_dim(cfg)
        base = cfg.rope_parameters["rope_theta"]
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    inv_freq, _ = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
    return inv_freq.float()


class KeyRerotator:
    """Moves RoPE-rotated keys from one position to another.

    RoPE rotates each pair of channels (i, i + head_dim/2) by `position * inv_freq[i]`;
    rotations compose, so a key rotated at position p becomes the key at p + shift by
    one more rotation of `shift * inv_freq`. The angles are computed in float64 and
    the product in float32 whatever the keys' dtype.

    Args:
        inv_freq: shape (head_dim // 2,), radians per position (a model's
            `rotary_emb.inv_freq`).
    """

    def __init__(self, inv_freq: torch.Tensor):
        self.inv_freq = inv_freq.detach().to("cpu", torch.float64).flatten()
        self._table: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def head_dim(self) -> int:
        """Channels the rotation covers (2 * len(inv_freq))."""
        return 2 * self.inv_freq.numel()

    def _cos_sin(self, shift: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = (shift, device)
        if key not in self._table:
            if len(self._table) > 64:
                self._table.clear()
            angles = shift * self.inv_freq
            sin = angles.sin()
            # rotate_half(k) * sin == roll(k, half) * [-sin, sin]: the sign is folded into the table.
            self._table[key] = (torch.cat([angles.cos(), angles.cos()]).float().to(device),
                                torch.cat([-sin, sin]).float().to(device))
        return self._table[key]

    def rotate(self, keys: torch.Tensor, shift: int) -> torch.Tensor:
        """Keys moved by `shift` positions (negative moves them earlier).

        Args:
            keys: (batch, kv_heads, seq, head_dim), rotated at some positions p.
            shift: position delta in tokens, the same for every key.

        Returns:
            A new tensor like `keys`, rotated at p + shift (`keys` itself when
            `shift` is 0 or `seq` is 0).

        Raises:
            ValueError: `head_dim` differs from 2 * len(inv_freq).
        """
        if keys.shape[-1] != self.head_dim:
            raise ValueError(
                f"keys have head_dim {keys.shape[-1]} but the rotary embedding covers {self.head_dim} channels"
            )
        if shift == 0 or keys.shape[-2] == 0:
            return keys
        cos, signed_sin = self._cos_sin(int(shift), keys.device)
        work = keys.float()
        rotated = (work * cos).addcmul_(work.roll(work.shape[-1] // 2, dims=-1), signed_sin)
        return rotated.to(keys.dtype)
