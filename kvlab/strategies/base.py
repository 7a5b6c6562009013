"""The contract every cache strategy follows, and the registry that lists them.

One strategy = one small dataclass in its own module: its fields are its knobs,
`__post_init__` validates them (messages list the allowed values), `build_cache`
makes the transformers cache, `forward` feeds tokens through it (the engine,
`kvlab.engine`, calls it), `unavailable_reason` says in one sentence why it
cannot run here (or None), `serving_settings` gives the nearest setting in each
serving engine (the fact beside the method). Its capabilities are class attributes named in
transformers' style (`is_croppable`, `is_sliding`, `is_compileable`, ...);
every tab, the report and the bench ask them instead of keeping their own
lists. Adding a strategy: write the module, register it with `@register`,
import it in `kvlab/strategies/__init__.py`, add it to the test matrix in
`tests/unit/test_strategies.py`, add its README line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

from ..accounting import layer_windows
from .knob_yaml import brief, load_knob_value, shown, typed_knob

STRATEGIES: dict[str, type["Strategy"]] = {}
ENGINE_COLUMNS: dict[str, type["Strategy"]] = {}
"""The engine columns (`kvlab.strategies.engine_column`), by name: Compare columns that run a serving engine
instead of a transformers cache. Apart from `STRATEGIES`, so no other tab lists them."""
ENGINE_PREFIX = "engine:"
"""An engine column's name starts with it (`engine:llamacpp`, `engine:openai`)."""
WARM_UP_INPUT_TOKENS = 8
WARM_UP_NEW_TOKENS = 4
"""The short decode `Strategy.warm_up` runs: ids fed at prefill, then tokens chosen."""


class StrategyError(ValueError):
    """A strategy's knobs are invalid or it cannot serve this run; the message says why."""


def register(cls: type["Strategy"]) -> type["Strategy"]:
    """Class decorator adding a strategy to `STRATEGIES` under its `name`."""
    STRATEGIES[cls.name] = cls
    return cls


def register_engine(cls: type["Strategy"]) -> type["Strategy"]:
    """Class decorator adding an engine column to `ENGINE_COLUMNS` under its `name` (`engine:<engine>`)."""
    ENGINE_COLUMNS[cls.name] = cls
    return cls


@dataclass
class Strategy:
    """Base of all strategies. `label` names the column (defaults to `describe()`).

    Capabilities (class attributes; a subclass overrides what differs):
        use_cache: keeps a KV cache at all (False only for `no_cache`).
        lossy: may change the model's output against a cache that keeps every token.
        is_croppable: `Cache.crop(-n)` works on its caches, so a chat turn can roll back.
        is_streaming: evicts tokens by its own rule and streams past its window (a sink
            cache), so the ids that went through it are not a prefix it holds.
        is_sliding: needs the model's own sliding-window layers (unavailable without them).
        is_evicting: prunes the prompt's keys/values at prefill by a score (the scored-eviction strategies), so the
            cache holds fewer positions than went through it and a copy of it does not hold the whole prefix.
        follows_layer_types: its cache is built from the model's config (`config.layer_types`), so on a hybrid
            model each sliding layer keeps only its window, as transformers' default cache does.
    Derived: `keeps_everything`, `is_compileable`, `usable_in_chat`,
    `usable_in_perplexity`, `usable_in_prefix`, and `capacity()` for fixed-size caches.
    Model-aware: `keeps_everything_on(loaded)`, `keeps_on(loaded)` and `held_tokens_by_layer(config, ...)`.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    lossy: ClassVar[bool] = False
    use_cache: ClassVar[bool] = True
    is_croppable: ClassVar[bool] = False
    is_streaming: ClassVar[bool] = False
    is_sliding: ClassVar[bool] = False
    is_evicting: ClassVar[bool] = False
    engine_name: ClassVar[str] = ""
    """The serving engine an engine column runs in (`llama.cpp`, an OpenAI-compatible server); '' for a strategy,
    which runs inside transformers on kvlab's own decode loop."""
    title_knobs: ClassVar[tuple[str, ...]] = ()
    label: str = ""

    @property
    def keeps_everything(self) -> bool:
        """Its cache holds every token's keys and values exactly (no eviction, no window, no quantization) on a
        model whose layers are all full attention; on a hybrid model ask `keeps_everything_on(loaded)`."""
        return self.use_cache and not self.lossy and not self.is_sliding and not self.is_streaming

    @property
    def follows_layer_types(self) -> bool:
        """Its cache is built from the model's config, so a sliding layer keeps only its window."""
        return self.is_sliding

    def keeps_everything_on(self, loaded) -> bool:
        """`keeps_everything`, and on a model with sliding layers only if its cache does not slide on them."""
        return self.keeps_everything and not (self.follows_layer_types and sliding_layer_types(loaded))

    def can_crop(self, loaded, cache, held_tokens: int) -> bool:
        """Whether `cache.crop(-n)` can roll `cache` back now, after `held_tokens` went through it: the strategy
        `is_croppable`, transformers' own `Cache.is_croppable` agrees (a static sliding layer larger than its
        window does not), and no sliding layer has filled its window (transformers refuses to crop a
        `DynamicSlidingWindowLayer` then: the tokens it dropped are gone)."""
        if not self.is_croppable or cache is None or not getattr(cache, "is_croppable", True):
            return False
        windows = [w for w in layer_windows(loaded.config) if w] if self.follows_layer_types else []
        return not windows or held_tokens < min(windows)

    def window_tokens(self, window: int) -> int:
        """Tokens a sliding layer of `window` keeps in this strategy's cache once full: `window - 1` for
        transformers' `DynamicSlidingWindowLayer` (the token being fed makes the window)."""
        return window - 1

    def warning_on(self, loaded, prompt_tokens: int) -> str:
        """A one-line warning shown as the column's status when its settings make the run misleading on this
        prompt (a budget that keeps almost none of the prompt); '' when none."""
        return ""

    def keeps_on(self, loaded) -> str:
        """What its cache keeps on `loaded`'s model, in one line, when the model has sliding layers ('' when all
        its layers are full attention, where the strategy's summary says it)."""
        if not sliding_layer_types(loaded):
            return ""
        if not self.use_cache:
            return "keeps nothing"
        windows = layer_windows(loaded.config)
        if self.follows_layer_types:
            window = min(w for w in windows if w)
            return (f"{sum(1 for w in windows if w)} sliding layers keep their last {self.window_tokens(window)} "
                    f"tokens (window {window}); {sum(1 for w in windows if not w)} full layers keep every token")
        if self.keeps_everything:
            return f"keeps every token on all {len(windows)} layers, the sliding ones too (built without the config)"
        return ""

    def held_tokens_by_layer(self, config, seen_tokens: int, max_total_tokens: int) -> list[int]:
        """`held_tokens` per decoder layer of `config`: a sliding layer of a cache that follows the layer types
        holds at most `window_tokens(window)` (for the prediction by layer type)."""
        held = self.held_tokens(seen_tokens, max_total_tokens)
        if not self.follows_layer_types:
            return [held] * len(layer_windows(config))
        return [min(held, self.window_tokens(w)) if w else held for w in layer_windows(config)]

    def held_tokens_now_and_next(self, config, dtype, cache, seen_tokens: int, next_seen_tokens: int,
                                 max_total_tokens: int) -> tuple[list[int], list[int]]:
        """Per decoder layer, the tokens `cache` holds after `seen_tokens` ids and will hold after the step that
        brings it to `next_seen_tokens` (what a column's budget predicts); `held_tokens_by_layer` of both here,
        a strategy that prunes by its own rule overrides it."""
        return (self.held_tokens_by_layer(config, seen_tokens, max_total_tokens),
                self.held_tokens_by_layer(config, next_seen_tokens, max_total_tokens))

    @property
    def is_compileable(self) -> bool:
        """Its decode steps run through `torch.compile` (static with `compile: true`)."""
        return False

    @property
    def usable_in_chat(self) -> bool:
        """A chat can keep its cache across turns (anything that keeps a cache)."""
        return self.use_cache

    @property
    def usable_in_perplexity(self) -> bool:
        """A long text can stream through it token by token (anything that keeps a cache)."""
        return self.use_cache

    @property
    def usable_in_prefix(self) -> bool:
        """A copy of its prefilled cache holds the whole prefix (keeps a cache and does not stream)."""
        return self.use_cache and not self.is_streaming and not self.is_evicting

    def capacity(self, max_total_tokens: int) -> int | None:
        """Most tokens its cache can hold for a run of at most `max_total_tokens` tokens, or None when it grows
        (dynamic, quantized) or streams (sink). Per layer type: a window on sliding layers is no limit."""
        return None

    def knobs(self) -> dict:
        """The strategy's settings (fields other than `label`)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "label"}

    def describe(self) -> str:
        """The column's name: `label` if set, else `title()` followed by every other knob that differs from its
        default, as the command line writes it (`quantized hqq int4 r128 q_group_size=32`, `query_aware=false`),
        so two columns differing in any knob differ in name."""
        if self.label:
            return self.label
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        extra = [f"{name}={str(value).lower() if isinstance(value, bool) else value}"
                 for name, value in self.knobs().items() if name not in self.title_knobs and value != defaults.get(name)]
        return " ".join([self.title(), *extra])

    def title(self) -> str:
        """The short part of `describe()` that shows the knobs in `title_knobs` its own way."""
        return self.name

    def caveat(self) -> str:
        """What to keep in mind when reading this column's numbers ('' if nothing)."""
        return ""

    def caveat_for(self, prompt_tokens: int) -> str:
        """`caveat()` for a run on a prompt of `prompt_tokens` tokens (a strategy whose caveat depends on the
        prompt's length overrides this)."""
        return self.caveat()

    def runtime_note(self) -> str:
        """One sentence about how this process runs the strategy, when that differs from the usual (e.g. a
        backend's slower fallback kernel); '' otherwise. Asked after `build_cache`."""
        return ""

    def unavailable_reason(self, loaded) -> str | None:
        """One sentence saying why this strategy cannot run on `loaded` here, or None."""
        return None

    def warm_up_key(self) -> tuple:
        """What one-time set-up depends on: two strategies with the same key share it, so `warm_up` runs once
        per process, model and key (`kvlab.measure.warmup.warm_up_columns`). Default: the registered name."""
        return (self.name,)

    def warm_up(self, loaded, input_tokens: int = WARM_UP_INPUT_TOKENS) -> None:
        """Pay this strategy's one-time set-up in this process before any timed step: a short greedy decode
        (`input_tokens` fed, the run's prompt length where known, so per-shape set-up such as kernel selection
        or a backend's compiled functions is paid for the shapes the run will use; then WARM_UP_NEW_TOKENS
        chosen) through a fresh cache of its own, which runs
        the backend's imports, kernel loading and first-call dispatch and the model's first forwards. A
        subclass of a registered strategy warms the registered one with the same knobs (its own forward may
        count calls or fail on purpose).

        Raises whatever building the cache or a forward raises (the caller logs it and goes on).
        """
        import torch

        from ..engine import Decoder
        from ..generation import GenerationSettings

        settings = GenerationSettings(max_new_tokens=WARM_UP_NEW_TOKENS, stop_at_eos=False, fidelity=False)
        ids = torch.arange(1, max(1, input_tokens) + 1)[None]
        strategy = self
        registered = STRATEGIES.get(self.name)
        if registered is not None and type(self) is not registered:
            try:
                strategy = registered(**self.knobs())
            except (TypeError, StrategyError):
                strategy = self
        cache = strategy.build_cache(loaded, ids.shape[1] + WARM_UP_NEW_TOKENS)
        Decoder(loaded, strategy, cache, ids, settings).run()

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise `StrategyError` before any compute when the run cannot fit this cache."""

    def build_cache(self, loaded, max_total_tokens: int):
        """A fresh transformers `Cache` for one run of at most `max_total_tokens` tokens, or None."""
        raise NotImplementedError

    def forward(self, loaded, cache, sequence, new_tokens: int):
        """One forward pass feeding the last `new_tokens` of `sequence` (1, seq) through `cache`.

        Returns the last position's logits, shape (1, vocab).
        """
        out = loaded.model(input_ids=sequence[:, -new_tokens:], cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    def held_tokens(self, seen_tokens: int, max_total_tokens: int) -> int:
        """Tokens whose K/V the cache holds (or has allocated) after `seen_tokens` of a run of at most
        `max_total_tokens`, for the analytical prediction."""
        return seen_tokens

    def cache_code(self) -> tuple[list[str], str]:
        """(imports, code building a variable `cache` or '' for none) for the reproduce-it snippet."""
        return [], ""

    def serving_settings(self) -> list:
        """The nearest setting of this strategy, with its knobs, in each serving engine: one
        `kvlab.engines.ServingSetting` per engine of `kvlab.engines.ENGINES` (the flag and the version it was
        checked in, or no serving equivalent and why). Every registered strategy class says its own, beside its
        method (kvpress-style); `docs/serving.md` is their table.

        Raises:
            KeyError: the class has none (tests/unit/test_serving_map.py fails the same way, naming it).
        """
        raise KeyError(f"strategy {self.name!r} has no serving-engine entry: give its class a serving_settings() "
                       "method (see kvlab/strategies/serving.py) and a row to docs/serving.md")

    def generate_context_code(self) -> tuple[list[str], str]:
        """(imports, a `with ...:` line the snippet's `generate()` call runs inside, or '') for a strategy that
        acts through hooks during the prefill (the scored-eviction strategies)."""
        return [], ""

    def generate_context(self, loaded):
        """The context manager a bare `model.generate()` with this strategy's cache runs inside (the prefill
        hooks of a pruning strategy; `generate_context_code` is its snippet); by default it does nothing."""
        return contextlib.nullcontext()

    def generate_kwargs_code(self) -> str:
        """Extra `generate()` keyword arguments in the snippet."""
        return "cache=cache"

    def forward_code(self) -> tuple[list[str], list[str]]:
        """(imports, lines) of a hand-written decode loop that do what `forward` does: the lines set `out` from
        `input_ids` (the step's new tokens), `sequence` (every id so far), `cache` and `position_ids`."""
        return [], ["out = model(input_ids=input_ids, cache=cache, use_cache=True, position_ids=position_ids, "
                "logits_to_keep=1)"]


def make_strategy(spec: dict | Strategy) -> Strategy:
    """Build a strategy from `{"strategy": name, **knobs}` (or return a Strategy as is).

    Raises:
        StrategyError: unknown name or knob, or an invalid knob value; the message (one line of at most
            MESSAGE_CHARS) lists the allowed names, knobs or values.
    """
    if isinstance(spec, Strategy):
        return spec
    spec = dict(spec)
    name = spec.pop("strategy", None) or spec.pop("name", None)
    cls = STRATEGIES.get(name) or ENGINE_COLUMNS.get(name) if isinstance(name, str) else None
    if cls is None:
        engines = f"; engine columns (Compare): {', '.join(ENGINE_COLUMNS)}" if ENGINE_COLUMNS else ""
        raise StrategyError(f"unknown strategy {shown(name)}; allowed: {', '.join(STRATEGIES)}{engines}")
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(spec) - set(allowed))
    if unknown:
        raise StrategyError(f"{name}: unknown setting(s) {shown(unknown)}; allowed: {allowed}")
    try:
        spec = {key: typed_knob(key, value) for key, value in spec.items()}
        return cls(**spec)
    except (TypeError, ValueError) as err:
        message = str(err) if isinstance(err, StrategyError) else f"{name}: {err}"
        if isinstance(err, StrategyError) and message == brief(message):
            raise
        raise StrategyError(brief(message)) from err


def names_with(capability: str) -> list[str]:
    """Registered strategy names, in registry order, whose instance with default knobs has `capability`
    (a boolean attribute such as `usable_in_chat`, `usable_in_perplexity`, `is_croppable`) true."""
    names = []
    for name, cls in STRATEGIES.items():
        try:
            if getattr(cls(), capability):
                names.append(name)
        except StrategyError:
            continue
    return names


def sliding_layer_types(loaded) -> list[str]:
    """The model's non-full-attention layer types (e.g. `sliding_attention`), if any, as transformers' caches
    see them (`kvlab.caches.hybrid.non_full_layer_types`)."""
    from ..caches.hybrid import non_full_layer_types

    return non_full_layer_types(loaded.config)


def cuda_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "needs a CUDA GPU: offloading moves each layer's cache between GPU and CPU memory, and this torch has no CUDA"
    return None


def require_int(name: str, value, low: int, high: int | None = None) -> None:
    """Raise StrategyError unless `low <= value (<= high)`, naming the allowed range."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"{low}..{high}"
        raise StrategyError(f"{name} must be an integer {allowed}, got {shown(value)}")


def parse_strategy_list(text: str) -> list[dict]:
    """Column specs from the command-line syntax `dynamic,quantized:backend=hqq:nbits=4,static:max_cache_len=128`.

    Knob values are read as YAML scalars (`4` -> int, `true` -> bool) by `knob_yaml.load_knob_value`; a `label`
    is the text as written.

    Raises:
        ValueError: a knob not written as key=value, with nothing after `=`, or whose value is too long or not
            YAML (anchors and aliases refused); one line naming the knob.
    """
    return [parse_strategy_item(item) for item in split_strategy_list(text)]


def split_strategy_list(text: str) -> list[str]:
    """The non-empty items of a comma list of strategies, stripped."""
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_strategy_item(item: str) -> dict:
    """One column spec from `name:knob=value:...`. An engine column's name is two parts
    (`engine:openai:base_url=http://127.0.0.1:8080/v1:model=m`) and its knobs split only at a colon that starts
    the next `key=`, so a URL's colons stay in its value.

    Raises:
        ValueError: a knob not written as key=value, with nothing after `=`, or whose value is too long or not
            YAML (`knob_yaml.load_knob_value`); one line naming the knob.
    """
    if item.startswith(ENGINE_PREFIX):
        engine, _, rest = item[len(ENGINE_PREFIX):].partition(":")
        name, pairs = ENGINE_PREFIX + engine, re.split(r":(?=[A-Za-z_]\w*=)", rest) if rest else []
    else:
        name, *pairs = item.split(":")
    spec: dict = {"strategy": name}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals:
            raise ValueError(f"bad knob {shown(pair)} in {shown(item)}: write key=value")
        if not value.strip():
            raise ValueError(f"bad knob {shown(pair)} in {shown(item)}: give a value after '='")
        spec[key] = load_knob_value(key, value)
    return spec
