"""`triattention`: TriAttention (Mao et al. 2026, arXiv:2604.04921) as TensorRT-LLM 1.3.0rc27 ships it,
`TriAttentionKvCacheCompressionConfig(budget, beta, eviction_mode, normalize_scores)`: the prompt is kept whole
(no context-phase work); every `beta` tokens fed after it, once more than `budget` decoded tokens are held,
each full-attention layer keeps the prompt and `budget` decoded positions chosen by TriAttention's
trigonometric score of the cached keys against calibrated pre-RoPE query centres, in one of three ways
(`eviction_mode`). The score, the keep sets and the sources (TensorRT-LLM's
`tensorrt_llm/_torch/kv_cache_compression/triattention/triattention.py` at
04a7ad556180c6b5b16978d0dc71b7b6cc32eba0 and `triattention_kernels.py` at
0b959b24bb7a40e4d54826022537dbcf3a97850f; the authors' github.com/WeianMao/triattention at
c3744ee6a50522a1559a577f85aef2b165a344f2) are in `kvlab.eviction.triattention`; the calibration, which
TensorRT-LLM leaves to the authors' script and kvlab runs itself once per model over a shipped text, is
`kvlab.eviction.calibration`. Decoding compresses through kvlab's `compress_every` hooks, all layers at once.

Sliding-window layers (Gemma 3) keep their window and are not scored, as TensorRT-LLM's kernel-masked sliding
layers keep theirs. Not done here: batches of several rows, speculative decoding, the official `.pt` file
(kvlab calibrates instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..engines import ServingSetting
from ..engines.settings import (LLAMA_VERSION, SGLANG_VERSION, TRT_TRIATTENTION, TRT_TRIATTENTION_VERSION,
                                VLLM_VERSION)
from .base import Strategy, StrategyError, register, require_int
from .knob_yaml import shown

PLUGIN_REASON = ("not in its options (checked in {}); TriAttention's authors ship an out-of-tree plugin for it "
                 "(github.com/WeianMao/triattention)")


def _modes() -> tuple[str, ...]:
    from ..eviction.triattention import EVICTION_MODES

    return EVICTION_MODES


@register
@dataclass
class TriAttention(Strategy):
    """Knobs, TensorRT-LLM's: `budget` (decoded tokens kept at each eviction; the prompt is kept on top; 2048),
    `beta` (the eviction period, tokens fed after the prompt; 128), `eviction_mode` (`union`, `per_head`,
    `per_layer_perhead`) and `normalize_scores` (z-normalize each head's scores; `union` always does)."""

    name = "triattention"
    summary = ("TensorRT-LLM's TriAttention: keeps the whole prompt; every beta tokens fed after it, keeps the "
               "budget decoded tokens whose keys score highest against calibrated pre-RoPE query centres. Lossy "
               "once more than budget tokens have been generated.")
    lossy = True
    is_evicting = True
    query_aware: ClassVar[bool] = True
    question_tokens: ClassVar[int] = 0
    title_knobs = ("budget", "beta", "eviction_mode")
    budget: int = 2048
    beta: int = 128
    eviction_mode: str = "union"
    normalize_scores: bool = True

    def __post_init__(self):
        require_int("budget", self.budget, 1)
        require_int("beta", self.beta, 1)
        if self.eviction_mode not in _modes():
            raise StrategyError(f"eviction_mode must be one of {', '.join(_modes())}, got {shown(self.eviction_mode)}")
        if not isinstance(self.normalize_scores, bool):
            raise StrategyError(f"normalize_scores must be true or false, got {shown(self.normalize_scores)}")
        if self.eviction_mode == "union" and not self.normalize_scores:
            raise StrategyError("normalize_scores: false needs eviction_mode per_head or per_layer_perhead: "
                                "TensorRT-LLM always z-normalizes union's scores")
        self._centres = None

    def title(self) -> str:
        mode = "" if self.eviction_mode == "union" else f" {self.eviction_mode}"
        return f"triattention {self.budget} tok every {self.beta}{mode}"

    def caveat(self) -> str:
        return (f"the prompt was kept whole; every {self.beta} tokens fed after it, each full-attention layer went "
                f"back to the prompt + {self.budget} decoded positions ({self.eviction_mode}), scored by "
                "TriAttention's calibrated query centres")

    def caveat_for(self, prompt_tokens: int) -> str:
        return f"{self.caveat()}; nothing is evicted before {self.budget} tokens are decoded past the prompt"

    def runtime_note(self) -> str:
        """The calibration's cost and origin (`kvlab.eviction.calibration.QueryCentres.note`), once built."""
        return self._centres.note() if self._centres is not None else ""

    def growth_text(self) -> str:
        """How a full-attention layer's cache grows, in words (Plan's explanation)."""
        return (f"keep the whole prompt, then grow by each token fed and go back to the prompt + {self.budget:,} "
                f"decoded positions every {self.beta} tokens fed once past it")

    def unavailable_reason(self, loaded) -> str | None:
        from ..eviction.calibration import full_attention_layers, rope_tables
        from ..eviction.prefill import decoder_of

        model = getattr(loaded, "model", None)
        if model is None or getattr(loaded, "tokenizer", None) is None:
            return None  # a config alone (Plan's stand-in): checked once a model is loaded
        decoder = decoder_of(model)
        layers = getattr(decoder, "layers", None)
        if not layers or not hasattr(layers[0].self_attn, "q_proj"):
            return "needs Llama-style attention modules (a q_proj projection) to calibrate query centres"
        full = full_attention_layers(model)
        if not full:
            return "TriAttention evicts from full-attention layers, and this model has none"
        attention = layers[full[0]].self_attn
        try:
            rope_tables(getattr(decoder, "rotary_emb", None), getattr(attention, "layer_type", None)
                        or "full_attention", attention.head_dim)
        except ValueError as err:
            return str(err)
        return None

    def calibration(self, loaded):
        """The model's `QueryCentres` (computed once per model, then from memory or kvlab's cache folder); this
        column keeps the copy it first got, so its note says where that came from."""
        from ..eviction.calibration import model_key, query_centres

        if self._centres is None or self._centres.key != model_key(loaded.model):
            self._centres = query_centres(loaded.model, loaded.tokenizer)
        return self._centres

    def kept_tokens(self, seq: int, layer_idx: int, config, dtype) -> int:
        """Positions a full-attention layer keeps of a `seq`-token prompt: all of them (the prompt is pinned)."""
        return seq

    def held_tokens_after(self, prompt_tokens: int, fed_after: int, layer_idx: int, config, dtype) -> int:
        """Positions a full-attention layer holds after a prompt of `prompt_tokens` and `fed_after` tokens fed one
        per forward: the prompt, then back to prompt + budget every `beta` tokens once past it."""
        from ..eviction.decoding import held_after

        return held_after(prompt_tokens, fed_after, self.beta, prompt_tokens + self.budget)

    def held_tokens_now_and_next(self, config, dtype, cache, seen_tokens: int, next_seen_tokens: int,
                                 max_total_tokens: int) -> tuple[list[int], list[int]]:
        """Per layer, positions held now and after the next step: a full-attention layer by `held_tokens_after`
        (the next step on an empty cache is a prefill), a sliding layer as dynamic's."""
        from ..accounting import layer_windows

        record = getattr(cache, "eviction", None)
        prompt = None if record is None else record.prompt_tokens
        dense_now = self.held_tokens_by_layer(config, seen_tokens, max_total_tokens)
        dense_next = self.held_tokens_by_layer(config, next_seen_tokens, max_total_tokens)
        now, after = [], []
        for index, window in enumerate(layer_windows(config)):
            if window:
                now.append(dense_now[index])
                after.append(dense_next[index])
            elif prompt is None:
                now.append(0)
                after.append(next_seen_tokens)
            else:
                now.append(self.held_tokens_after(prompt, seen_tokens - prompt, index, config, dtype))
                after.append(self.held_tokens_after(prompt, next_seen_tokens - prompt, index, config, dtype))
        return now, after

    def build_cache(self, loaded, max_total_tokens: int):
        """A `PrunedCache`; on a loaded model (not Plan's stand-in), the calibration is resolved here first."""
        from .scored import pruned_cache

        if getattr(loaded, "tokenizer", None) is not None:
            self.calibration(loaded)
        return pruned_cache(loaded.config)

    def hooks(self, loaded, record):
        """`kvlab.eviction.triattention.triattention_hooks` with this column's knobs and the model's calibration."""
        from ..eviction.triattention import triattention_hooks

        centres = self.calibration(loaded).layers
        return triattention_hooks(loaded.model, centres, self.budget, self.beta, self.eviction_mode,
                                  self.normalize_scores, record)

    def forward(self, loaded, cache, sequence, new_tokens: int):
        """Prefill (cache empty) under the hooks, which keep the prompt; any later tokens one per forward at their
        true positions, so every `beta`-th evicts as in decoding. Returns (1, vocab) logits."""
        from ..eviction.kept import EvictionRecord
        from ..eviction.prefill import true_position_ids

        total = sequence.shape[1]
        first = cache.get_seq_length() == 0
        record = EvictionRecord() if first else cache.eviction
        with self.hooks(loaded, record):
            for end in ([total] if first else range(total - new_tokens + 1, total + 1)):
                step = total if first else 1
                out = loaded.model(input_ids=sequence[:, end - step:end], cache=cache, use_cache=True,
                                   position_ids=true_position_ids(end, step, sequence.device), logits_to_keep=1)
        cache.eviction = record
        return out.logits[:, -1, :]

    def generate_context(self, loaded):
        """The hooks for a bare `model.generate()` (one block for the whole generation)."""
        return self.hooks(loaded, None)

    def _call(self, record: str) -> str:
        normalize = "" if self.normalize_scores else ", normalize_scores=False"
        return (f"triattention_hooks(model, query_centres(model, tokenizer).layers, budget={self.budget}, "
                f"beta={self.beta}, eviction_mode={self.eviction_mode!r}{normalize}, record={record})")

    def _imports(self) -> list[str]:
        return ["from kvlab.eviction.calibration import query_centres",
                "from kvlab.eviction.triattention import triattention_hooks"]

    def cache_code(self):
        return (["from kvlab.eviction.cache import PrunedCache"],
                "cache = PrunedCache(model.config)  # a DynamicCache whose layers know the positions they hold")

    def generate_context_code(self) -> tuple[list[str], str]:
        return self._imports(), f"with {self._call('None')}:  # keeps the prompt, evicts every {self.beta} tokens"

    def forward_code(self) -> tuple[list[str], list[str]]:
        positions = ("position_ids = torch.arange(sequence.shape[1] - input_ids.shape[1], sequence.shape[1])[None]  "
                     "# true positions: the pruned cache counts fewer tokens")
        forward = ("out = model(input_ids=input_ids, cache=cache, use_cache=True, position_ids=position_ids, "
                   "logits_to_keep=1)")
        held = "getattr(cache, 'eviction', None)"
        return self._imports(), [
            positions,
            f"with {self._call(held)} as record:  # evicts every {self.beta} tokens fed",
            f"    {forward}",
            "cache.eviction = record"]

    def serving_settings(self) -> list:
        """TensorRT-LLM's own config, with these knobs; the other three engines have no TriAttention."""
        normalize = "" if self.normalize_scores else ", normalize_scores=False"
        setting = (f"TriAttentionKvCacheCompressionConfig(budget={self.budget}, beta={self.beta}, "
                   f"eviction_mode=\"{self.eviction_mode}\"{normalize}, calibration_path=...)")
        note = ("with KvCacheConfig(use_kv_cache_manager_v2=True), PyTorch backend; it loads the authors' "
                "calibration .pt (kvlab calibrates itself); SM100/SM103 GPUs, BF16 GQA groups of 4 or 8, head "
                "size 64 or 128 only, which neither bundled model has")
        return [ServingSetting("vLLM", None, note="TriAttention is " + PLUGIN_REASON.format(f"vLLM {VLLM_VERSION}")),
                ServingSetting("SGLang", None,
                               note="TriAttention is " + PLUGIN_REASON.format(f"SGLang {SGLANG_VERSION}")),
                ServingSetting("TensorRT-LLM", setting, TRT_TRIATTENTION_VERSION, TRT_TRIATTENTION, note),
                ServingSetting("llama.cpp", None, note=f"TriAttention is not in its options (checked in "
                                                       f"{LLAMA_VERSION}); a community ggml port exists outside it")]
