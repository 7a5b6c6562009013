"""`pyramidkv`: PyramidKV (Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal
Information Funneling", arXiv:2406.02069), following kvpress `presses/pyramidkv_press.py`: SnapKV's scores,
with a per-layer budget that falls linearly from the first layer to the last (`beta` sets the slope) and
averages to the ratio's; a prompt too short for the pyramid gets SnapKV's uniform budget. kvpress always
applies the ratio, where the paper's code keeps short prompts whole; kvlab follows kvpress.
Layers hold different lengths, so tokens fed after the prefill go one per forward."""

from dataclasses import dataclass

from .base import register, require_int
from .snapkv import SnapKV


@register
@dataclass
class PyramidKV(SnapKV):
    """Knobs: SnapKV's, and `beta` (pyramid steepness, >= 1; kvpress 20)."""

    name = "pyramidkv"
    summary = ("SnapKV's scores with more positions kept in lower layers and fewer in higher ones, the same total. "
               "Lossy; the prompt's cache shrinks by compression_ratio overall.")
    beta: int = 20

    def __post_init__(self):
        super().__post_init__()
        require_int("beta", self.beta, 1)

    def kept_tokens(self, seq: int, layer_idx: int, config, dtype) -> int:
        from ..eviction.scoring import pyramid_kept_tokens

        layers = config.get_text_config(decoder=True).num_hidden_layers
        return pyramid_kept_tokens(seq, self.target_ratio(seq, config, dtype), layer_idx, layers,
                                   self.window_size, self.beta)

    def kept_code(self, seq: str = "seq") -> str:
        ratio = (f"1 - {super().kept_code(seq)} / {seq}" if self.target_tokens or self.target_mib
                 else self.compression_ratio)
        return (f"pyramid_kept_tokens({seq}, {ratio}, layer, model.config.num_hidden_layers, {self.window_size}, "
                f"{self.beta})")

    def prune_code(self):
        imports, call = super().prune_code()
        return [*imports, "from kvlab.eviction.scoring import pyramid_kept_tokens"], call
