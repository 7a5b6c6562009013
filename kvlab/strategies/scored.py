"""The shared part of the scored-eviction strategies (kvpress's `ScorerPress`, kvpress `presses/scorer_press.py`).

A scored-eviction strategy prefills the prompt into a `DynamicCache` while `kvlab.eviction.prefill` hooks prune
each layer to the positions its scoring function ranks highest, per KV head; decode then grows the pruned cache
one token at a time, as dynamic does. Later forwards pass each token's true index as `position_ids`, since the
pruned cache counts fewer tokens than went through it (kvpress keeps the rotary positions counting the same way).

Budget knobs (one of them): `compression_ratio` (fraction of the prompt's pairs removed, kvpress's meaning),
`target_tokens` (positions each head keeps), `target_mib` (MiB the pruned prompt may hold, summed over the pruned
layers). `query_aware: false` with `question_tokens: N` compresses the prompt without its last N tokens (the
question) and feeds them afterwards, as kvpress's pipeline does; `query_aware: true` compresses the whole prompt.
Sliding-window layers (Gemma 3) are not pruned, as kvpress leaves them: they keep their window.

`compress_every: N` (0: off) compresses each layer back to its prefill budget every N tokens fed after the
prompt (kvpress's DecodingPress, `kvlab.eviction.decoding`), so a long run stays near its budget; at N = 1 a
layer evicts one position per step, as TOVA's and H2O's papers do.

`quantize` (`none` by default; `quanto4`, `hqq4`, `fp8`, `rotation_k4v2`, ... see
`kvlab.strategies.quantize_knob`) composes the eviction with quantization, as kvpress composes a press with
transformers' `QuantizedCache`: each full-attention layer is pruned at prefill while dense, then what it kept is
quantized (`kvlab.eviction.cache.PrunedCache.quantize_layer`); decoded tokens wait in full precision until
`residual_length` of them have gathered. Not with `compress_every`.

Not done here: batches of several rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..engines import ServingSetting
from ..engines.settings import (LLAMA_VERSION, SGLANG_VERSION, TRT_TRIATTENTION, TRT_TRIATTENTION_VERSION,
                                VLLM_VERSION)
from .base import Strategy, StrategyError, require_int
from .knob_yaml import shown
from .quantize_knob import describe as describe_quantize

MIB = 1 << 20
DEFAULT_RESIDUAL_LENGTH = 128
"""The quantized layers' full-precision residual with `quantize` (transformers' default)."""

DEFAULT_COMPRESSION_RATIO = 0.5
"""kvlab's default (kvpress's presses default to 0.0, which keeps everything)."""


def pruned_cache(config, quantized_layer=None):
    """A fresh `kvlab.eviction.cache.PrunedCache(config, quantized_layer)`: a `DynamicCache` with an `eviction`
    record slot whose full-attention layers track the positions they hold (and are quantized once pruned when
    `quantized_layer` makes their quantized layers)."""
    from ..eviction.cache import PrunedCache

    return PrunedCache(config, quantized_layer)


EVICTION_REASON = ("no token eviction by a score in its options (checked in {}): the paged cache keeps every token "
                   "of a request (kvpress and the papers' code run on transformers)")
SGLANG_SPARSE = ("; its --enable-hisparse selects top-k tokens per step for DeepSeek-sparse-attention models only, "
                 "keeping them all in host memory")
TRIATTENTION_NOTE = ("the only score-based eviction TensorRT-LLM ships, the nearest: TriAttention's calibrated score "
                     "instead of this method's, over decoded tokens only, every beta tokens (the prompt is never "
                     "evicted, where kvlab's methods prune it at prefill); per_layer_perhead selects per layer and KV "
                     "head as kvlab does; kvlab's triattention column runs it")
FEW_KEPT = 0.1
"""A budget keeping at most this fraction of the prunable prompt positions gets a warning (`warning_on`)."""


@dataclass
class ScoredEviction(Strategy):
    """Base of the scored-eviction strategies; a subclass sets `name`, `scorer_name` and `score`; its module
    docstring cites the paper and kvpress's file."""

    lossy = True
    is_evicting = True
    scorer_name: ClassVar[str] = ""
    title_knobs = ("compression_ratio", "target_tokens", "target_mib", "compress_every", "quantize")
    compression_ratio: float = DEFAULT_COMPRESSION_RATIO
    target_tokens: int = 0
    target_mib: float = 0.0
    query_aware: bool = True
    question_tokens: int = 0
    compress_every: int = 0
    quantize: str = "none"
    residual_length: int = DEFAULT_RESIDUAL_LENGTH

    def __post_init__(self):
        ratio = self.compression_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
            raise StrategyError(f"compression_ratio must be a number in [0, 1) (fraction of the prompt's pairs "
                                f"removed), got {shown(ratio)}")
        require_int("target_tokens", self.target_tokens, 0)
        mib = self.target_mib
        if isinstance(mib, bool) or not isinstance(mib, (int, float)) or mib < 0:
            raise StrategyError(f"target_mib must be a number >= 0 (0: use compression_ratio), got {shown(mib)}")
        if self.target_tokens and mib:
            raise StrategyError("give target_tokens or target_mib, not both (0 turns one off)")
        if not isinstance(self.query_aware, bool):
            raise StrategyError(f"query_aware must be true or false, got {shown(self.query_aware)}")
        require_int("question_tokens", self.question_tokens, 0)
        if not self.query_aware and not self.question_tokens:
            raise StrategyError("query_aware: false needs question_tokens >= 1 (the prompt's last tokens that "
                                "are fed after compression)")
        require_int("compress_every", self.compress_every, 0)
        quantized = bool(describe_quantize(self.quantize))
        require_int("residual_length", self.residual_length, 0)
        if not quantized and self.residual_length != DEFAULT_RESIDUAL_LENGTH:
            raise StrategyError("residual_length is the quantized layers' residual: it needs quantize (e.g. quanto4)")
        if quantized and self.compress_every:
            raise StrategyError("quantize cannot be combined with compress_every: a quantized layer is not "
                                "pruned again while decoding")

    def title(self) -> str:
        if self.target_tokens:
            budget = f"{self.target_tokens} tok"
        elif self.target_mib:
            budget = f"{self.target_mib:g} MiB"
        else:
            budget = f"{self.compression_ratio:g}"
        quantized = describe_quantize(self.quantize)
        return (f"{self.name} {budget}" + (f" every {self.compress_every}" if self.compress_every else "")
                + (f" + {quantized}" if quantized else ""))

    def caveat(self) -> str:
        decode = (f"every {self.compress_every} tokens fed after the prompt, each layer was compressed back to its "
                  "budget (kvpress's DecodingPress)" if self.compress_every else "decoded tokens are all kept")
        quantized = (f"; what each full-attention layer kept was then quantized ({describe_quantize(self.quantize)}), "
                     f"the newest residual_length={self.residual_length} tokens in full precision"
                     if describe_quantize(self.quantize) else "")
        return ("the prompt's keys/values were pruned per layer and head after prefill; " + decode
                + ("" if self.query_aware else f"; the last {self.question_tokens} prompt tokens were fed afterwards")
                + quantized)

    def caveat_for(self, prompt_tokens: int) -> str:
        from ..eviction.scoring import kept_tokens

        compressed = prompt_tokens - (0 if self.query_aware else self.question_tokens)
        if self.target_tokens:
            whole = self.target_tokens >= compressed
            why = f"target_tokens={self.target_tokens} keeps all {compressed} prompt tokens it could prune"
        else:
            whole = not self.target_mib and kept_tokens(compressed, self.compression_ratio) >= compressed
            why = f"compression_ratio={self.compression_ratio:g} of {compressed} prompt tokens removes none"
        if not whole:
            return self.caveat()
        if self.compress_every:
            return (f"nothing was pruned at prefill: {why}; every {self.compress_every} tokens fed after the prompt, "
                    "each layer was compressed back to its budget (kvpress's DecodingPress)")
        return f"nothing was pruned: {why} (the cache is dynamic's)"

    def warning_on(self, loaded, prompt_tokens: int) -> str:
        """'⚠ kept K of N prompt positions ...' when the budget keeps under `FEW_KEPT` of the positions it could
        prune on some layer (`target_mib=0.0001` keeps 1 of 154), else ''."""
        config = getattr(loaded, "config", None)
        model = getattr(loaded, "model", None)
        if config is None or model is None:
            return ""
        compressed = prompt_tokens - (0 if self.query_aware else self.question_tokens)
        if compressed < 2:
            return ""
        layers = range(getattr(config, "num_hidden_layers", 1) or 1)
        kept = min(self.kept_tokens(compressed, layer, config, model.dtype) for layer in layers)
        if kept >= compressed or kept > FEW_KEPT * compressed:
            return ""
        return (f"⚠ kept {kept} of {compressed} prompt positions per KV head ({kept / compressed:.0%}): the budget "
                "throws almost the whole prompt away")

    def growth_text(self) -> str:
        """How a pruned layer's cache grows, in words (Plan's explanation)."""
        if self.target_tokens:
            budget = f"keep {self.target_tokens:,} of the prompt's positions per KV head (target_tokens)"
        elif self.target_mib:
            budget = f"keep the prompt's positions that fit {self.target_mib:g} MiB (target_mib)"
        else:
            budget = (f"keep {1 - self.compression_ratio:.0%} of the prompt's positions per KV head "
                      f"(compression_ratio {self.compression_ratio:g})")
        question = "" if self.query_aware else f", plus the {self.question_tokens} question tokens"
        after = (f"then grow by each token fed and go back to the budget every {self.compress_every} tokens"
                 if self.compress_every else "then keep every token fed after it")
        return f"{budget}{question}, {after}"

    def unavailable_reason(self, loaded) -> str | None:
        from ..eviction.prefill import decoder_of

        model = getattr(loaded, "model", None)
        if model is None:  # a config alone (no weights): the modules are checked once a model is loaded
            return None
        from .quantize_knob import unavailable_reason

        quantize = unavailable_reason(self.quantize, loaded.config)
        if quantize:
            return quantize
        layers = getattr(decoder_of(model), "layers", None)
        if not layers or not hasattr(layers[0].self_attn, "q_proj"):
            return "needs Llama-style attention modules (a q_proj projection) to score positions"
        return None

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        if self.question_tokens and self.question_tokens >= prompt_tokens:
            raise StrategyError(f"question_tokens ({self.question_tokens}) must be less than the prompt's "
                                f"{prompt_tokens} tokens")

    def score(self, inputs):
        """(batch, kv_heads, seq) scores of one layer's prompt positions (`kvlab.eviction.scoring.LayerInputs`)."""
        raise NotImplementedError

    def target_ratio(self, seq: int, config, dtype) -> float:
        """The compression ratio the budget knobs give for a compressed part of `seq` tokens."""
        if not (self.target_tokens or self.target_mib):
            return float(self.compression_ratio)
        return 1.0 - self.budget_tokens(seq, config, dtype) / seq

    def budget_tokens(self, seq: int, config, dtype) -> int:
        """Positions per head `target_tokens` or `target_mib` allow out of `seq` (at least 1, at most seq)."""
        return max(1, min(seq, self.absolute_budget(config, dtype)))

    def kept_tokens(self, seq: int, layer_idx: int, config, dtype) -> int:
        """Positions each KV head of layer `layer_idx` keeps out of `seq` (uniform across layers here)."""
        from ..eviction.scoring import kept_tokens

        if self.target_tokens or self.target_mib:
            return self.budget_tokens(seq, config, dtype)
        return kept_tokens(seq, self.compression_ratio)

    def absolute_budget(self, config, dtype) -> int:
        """Positions per head `target_tokens` or `target_mib` ask for, not capped by a prompt (0 for a ratio);
        `target_mib` counts the full-attention layers only (the ones pruned)."""
        if self.target_tokens:
            return self.target_tokens
        if not self.target_mib:
            return 0
        from ..accounting import bytes_per_token, layer_windows

        windows = layer_windows(config)
        per_layer = bytes_per_token(config, dtype) // max(len(windows), 1)
        pruned_layers = max(1, sum(1 for w in windows if not w))
        return int(self.target_mib * MIB) // (per_layer * pruned_layers)

    def compress_target(self, compressed_tokens: int, layer_idx: int, config, dtype) -> int:
        """Positions layer `layer_idx` keeps after a compression while decoding, after a prefill that compressed
        `compressed_tokens`: the prefill's budget for a ratio; `target_tokens`/`target_mib` as asked, also when
        the prompt was shorter."""
        return self.kept_tokens(max(compressed_tokens, self.absolute_budget(config, dtype)), layer_idx, config,
                                dtype)

    def held_tokens_after(self, prompt_tokens: int, fed_after: int, layer_idx: int, config, dtype) -> int:
        """Positions a pruned layer holds after a prompt of `prompt_tokens` and `fed_after` tokens fed after it
        (one per forward, as decoding feeds them)."""
        from ..eviction.decoding import held_after

        question = 0 if self.query_aware else self.question_tokens
        compressed = prompt_tokens - question
        kept = self.kept_tokens(compressed, layer_idx, config, dtype)
        if not self.compress_every:
            return kept + question + fed_after
        target = self.compress_target(compressed, layer_idx, config, dtype)
        return held_after(kept, question + fed_after, self.compress_every, target)

    def held_tokens_now_and_next(self, config, dtype, cache, seen_tokens: int, next_seen_tokens: int,
                                 max_total_tokens: int) -> tuple[list[int], list[int]]:
        """Per layer, positions held now and after the next step: a pruned layer by `held_tokens_after`
        (the next step on an empty cache is a prefill of `next_seen_tokens`), a sliding layer as dynamic's."""
        from ..accounting import layer_windows

        record = getattr(cache, "eviction", None)
        prompt = None if record is None else record.prompt_tokens + (0 if self.query_aware else self.question_tokens)
        dense_now = self.held_tokens_by_layer(config, seen_tokens, max_total_tokens)
        dense_next = self.held_tokens_by_layer(config, next_seen_tokens, max_total_tokens)
        now, after = [], []
        for index, window in enumerate(layer_windows(config)):
            if window:
                now.append(dense_now[index])
                after.append(dense_next[index])
            elif prompt is None:
                now.append(0)
                after.append(self.held_tokens_after(next_seen_tokens, 0, index, config, dtype))
            else:
                now.append(self.held_tokens_after(prompt, seen_tokens - prompt, index, config, dtype))
                after.append(self.held_tokens_after(prompt, next_seen_tokens - prompt, index, config, dtype))
        return now, after

    def build_cache(self, loaded, max_total_tokens: int):
        from .quantize_knob import layer_factory

        return pruned_cache(loaded.config, layer_factory(self.quantize, loaded.config, self.residual_length))

    def forward(self, loaded, cache, sequence, new_tokens: int):
        """Prefill (cache empty) under the pruning hooks, the question after it when not `query_aware`; any later
        forward at the tokens' true positions. Returns (1, vocab) logits."""
        from ..eviction.kept import EvictionRecord
        from ..eviction.prefill import prune_at_prefill, true_position_ids

        total = sequence.shape[1]
        if cache.get_seq_length() > 0:
            return self._feed(loaded, cache, sequence, new_tokens)
        compressed = total if self.query_aware else total - self.question_tokens
        config, dtype = loaded.config, loaded.model.dtype
        record = EvictionRecord()
        with prune_at_prefill(loaded.model, self.score,
                              lambda seq, layer: self.kept_tokens(seq, layer, config, dtype), record):
            out = loaded.model(input_ids=sequence[:, :compressed], cache=cache, use_cache=True,
                               position_ids=true_position_ids(compressed, compressed, sequence.device),
                               logits_to_keep=1)
        cache.eviction = record
        if compressed == total:
            return out.logits[:, -1, :]
        return self._feed(loaded, cache, sequence, total - compressed)

    def _feed(self, loaded, cache, sequence, new_tokens: int):
        """Feed the last `new_tokens` after pruning, compressing while decoding when `compress_every` is set."""
        record = getattr(cache, "eviction", None)
        if not self.compress_every or record is None:
            return self._feed_tokens(loaded, cache, sequence, new_tokens)
        from ..eviction.prefill import prune_at_prefill

        config, dtype = loaded.config, loaded.model.dtype
        with prune_at_prefill(loaded.model, self.score, lambda seq, layer: self.kept_tokens(seq, layer, config, dtype),
                              record, self.compress_every,
                              lambda seq, layer: self.compress_target(seq, layer, config, dtype)):
            return self._feed_tokens(loaded, cache, sequence, new_tokens)

    def _feed_tokens(self, loaded, cache, sequence, new_tokens: int):
        """Feed the last `new_tokens`; one token per forward when the layers hold different lengths (PyramidKV),
        because transformers builds one causal mask from layer 0's length, and with `compress_every`, so every
        N-th token fed compresses as in decoding."""
        from ..eviction.prefill import true_position_ids

        total = sequence.shape[1]
        lengths = {layer.get_seq_length() if getattr(layer, "_quantized_keys", None) is not None
                   else layer.keys.shape[2] for layer in cache.layers if getattr(layer, "keys", None) is not None}
        step = new_tokens if len(lengths) <= 1 and not self.compress_every else 1
        out = None
        for end in range(total - new_tokens + step, total + 1, step):
            out = loaded.model(input_ids=sequence[:, end - step:end], cache=cache, use_cache=True,
                               position_ids=true_position_ids(end, step, sequence.device), logits_to_keep=1)
        return out.logits[:, -1, :]

    def scorer_code(self) -> str:
        """The call of this method's scoring function in the reproduce-it snippets, on `inputs`."""
        return f"{self.scorer_name}(inputs)"

    def absolute_code(self) -> str:
        """The expression of `absolute_budget` in the snippets ('' for a ratio)."""
        if self.target_tokens:
            return str(self.target_tokens)
        if self.target_mib:
            full = ('sum(kind == "full_attention" for kind in (getattr(model.config, "layer_types", None) or '
                    '["full_attention"] * model.config.num_hidden_layers))')
            return (f"int({self.target_mib} * 2**20) // (2 * model.config.num_key_value_heads * model.config.head_dim"
                    f" * model.dtype.itemsize * {full})")
        return ""

    def kept_code(self, seq: str = "seq") -> str:
        """The expression of the positions a layer keeps out of `seq` (an expression), of `layer`, in the snippets."""
        if self.target_tokens or self.target_mib:
            return f"max(1, min({seq}, {self.absolute_code()}))"
        return f"max(1, int({seq} * (1 - {self.compression_ratio})))"

    def prune_code(self) -> tuple[list[str], str]:
        """(imports, the `prune_at_prefill(...)` call) of the snippets."""
        extra = ""
        if self.compress_every:
            extra = f", compress_every={self.compress_every}"
            if self.target_tokens or self.target_mib:  # back to the asked-for budget, also after a shorter prompt
                extra += f", compress_to=lambda seq, layer: {self.kept_code(f'max(seq, {self.absolute_code()})')}"
        return ([f"from kvlab.eviction.scoring import {self.scorer_name}",
                 "from kvlab.eviction.prefill import prune_at_prefill"],
                f"prune_at_prefill(model, lambda inputs: {self.scorer_code()}, lambda seq, layer: {self.kept_code()}"
                f"{extra})")

    def cache_code(self):
        if describe_quantize(self.quantize):
            from .quantize_knob import cache_code

            return cache_code(self.quantize, self.residual_length)
        if self.compress_every:  # the layers track the positions they hold (Expected Attention's future positions)
            return (["from kvlab.eviction.cache import PrunedCache"],
                    "cache = PrunedCache(model.config)  # a DynamicCache whose layers know the positions they hold")
        return ["from transformers import DynamicCache"], "cache = DynamicCache(config=model.config)"

    def generate_context(self, loaded):
        """`prune_at_prefill` with this method's scorer and budget (and `compress_every`), for a bare
        `model.generate()`: the question is pruned with the prompt (generate feeds them together)."""
        from ..eviction.prefill import prune_at_prefill

        config, dtype = loaded.config, loaded.model.dtype
        return prune_at_prefill(loaded.model, self.score, lambda seq, layer: self.kept_tokens(seq, layer, config, dtype),
                                None, self.compress_every,
                                lambda seq, layer: self.compress_target(seq, layer, config, dtype))

    def generate_context_code(self) -> tuple[list[str], str]:
        imports, call = self.prune_code()
        note = "" if self.query_aware else (f"  # kvlab feeds the last {self.question_tokens} prompt tokens after "
                                            "the pruning; generate() prunes the whole prompt")
        return imports, f"with {call}:  # the prefill prunes each layer per KV head{note}"

    def forward_code(self) -> tuple[list[str], list[str]]:
        imports, call = self.prune_code()
        positions = ("position_ids = torch.arange(sequence.shape[1] - input_ids.shape[1], sequence.shape[1])[None]  "
                     "# true positions: the pruned cache counts fewer tokens")
        forward = ("out = model(input_ids=input_ids, cache=cache, use_cache=True, position_ids=position_ids, "
                   "logits_to_keep=1)")
        if self.compress_every:
            return imports, [positions, f"with {call}:  # prunes at prefill, then every {self.compress_every} "
                             "tokens fed (the buffer lives on the cache)", f"    {forward}"]
        return imports, [
            positions,
            "if cache.get_seq_length() == 0:  # prefill: prune each layer's cache per KV head by the method's score",
            f"    with {call}:",
            f"        {forward}",
            "else:",
            f"    {forward}"]

    def serving_settings(self) -> list:
        """No engine evicts by this method's score (`EVICTION_REASON`); TensorRT-LLM's TriAttention is the nearest
        it ships; with `quantize`, its backend's settings are added for the quantized part only."""
        from .quantize_knob import parse

        settings = [ServingSetting("vLLM", None, note=EVICTION_REASON.format(f"vLLM {VLLM_VERSION}")),
                    ServingSetting("SGLang", None, note=EVICTION_REASON.format(f"SGLang {SGLANG_VERSION}") +
                                   SGLANG_SPARSE),
                    ServingSetting("TensorRT-LLM", "TriAttentionKvCacheCompressionConfig(budget=N, beta=128, "
                                   "eviction_mode=\"per_layer_perhead\", calibration_path=...)",
                                   TRT_TRIATTENTION_VERSION, TRT_TRIATTENTION, TRIATTENTION_NOTE),
                    ServingSetting("llama.cpp", None, note=EVICTION_REASON.format(f"llama.cpp {LLAMA_VERSION}"))]
        parsed = parse(self.quantize)
        if parsed is not None:
            backend, layer = parsed
            part = f"for the quantize={self.quantize} part only"
            settings += [ServingSetting(s.engine, s.setting, s.version, s.source, part + (f"; {s.note}" if s.note else ""),
                                        s.measured)
                         for s in backend.serving(layer) if s.setting is not None]
        return settings

        settings = no_equivalent(EVICTION_REASON)
        parsed = parse(self.quantize)
        if parsed is not None:
            backend, layer = parsed
            part = f"for the quantize={self.quantize} part only"
            settings += [ServingSetting(s.engine, s.setting, s.version, s.source, part + (f"; {s.note}" if s.note else ""))
                         for s in backend.serving(layer) if s.setting is not None]
        return settings
