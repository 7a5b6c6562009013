"""Engine columns: a Compare column that runs a serving engine (llama.cpp in this process, or any
OpenAI-compatible server) on the same prompt, beside the transformers strategies.

An engine column is a `Strategy` (its fields are its knobs, checked in `__post_init__`; it has a name, a
`describe()`, an `unavailable_reason`), so Compare's form, runner, record and summary take it like any column,
but it keeps no transformers cache: `open_run` starts the engine and returns its `kvlab.engines.EngineRun`,
whose steps Compare streams (`kvlab.compare.engine_steps`). The engines themselves live in `kvlab.engines`
(imported when a run starts, so listing the columns needs no engine package). Engine columns are registered in
`ENGINE_COLUMNS`, apart from `STRATEGIES`, so only Compare offers them; elsewhere (Chat, Perplexity, Needle) one
is refused in its column with ENGINE_ONLY. The quality report scores an engine that gives distributions
(`report_reference`, `score_text`) against the engine's own unquantized run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import Strategy, StrategyError

ENGINE_ONLY = "{name} runs a serving engine, not a transformers cache: it is a Compare column only"


@dataclass
class EngineColumn(Strategy):
    """Base of the engine columns. A subclass sets `name` (`engine:<engine>`), `engine_name`, `summary`, its
    knob fields and `open_run`.

    Its text is the engine's own: `lossy` (another engine's kernels, weights or server are not kvlab's dense
    run), never a fidelity baseline by default, and it cannot carry a cache budget.
    """

    lossy: ClassVar[bool] = True
    is_local: ClassVar[bool] = True
    """The engine computes in this process (its steps take turns with the other columns on kvlab's compute
    thread, so its step times are its own compute); False for a remote server."""

    @property
    def keeps_everything(self) -> bool:
        return False

    @property
    def usable_in_chat(self) -> bool:
        return False

    @property
    def usable_in_perplexity(self) -> bool:
        return False

    @property
    def usable_in_prefix(self) -> bool:
        return False

    def refusal(self) -> StrategyError:
        """The one line another wing gives when asked to run this column."""
        return StrategyError(ENGINE_ONLY.format(name=self.name))

    def build_cache(self, loaded, max_total_tokens: int):
        raise self.refusal()

    def forward(self, loaded, cache, sequence, new_tokens: int):
        raise self.refusal()

    def warm_up(self, loaded, input_tokens: int = 8) -> None:
        """The engine's one-time set-up (loading its library, reading its weights into the page cache): nothing
        by default."""

    def open_run(self, loaded, prompt_ids: list[int], settings, stop, threads: int):
        """Start the engine on `prompt_ids` (the ids kvlab's columns prefill) under `settings` (max_new_tokens,
        sampling, stop_at_eos); returns a `kvlab.engines.EngineRun` yielding one `kvlab.engine.Step` per token (or
        streamed chunk). `threads`: the CPU threads kvlab's own columns compute with.

        Raises:
            kvlab.engines.EngineError: the engine cannot start (one line).
        """
        raise NotImplementedError

    def score_continuation(self, loaded, prompt_ids: list[int], continuation: list[int], stop, threads: int):
        """The engine's log-probabilities (len(continuation), vocab) for the fidelity pass: row t predicts
        continuation[t] after the prompt and continuation[:t].

        Raises:
            StrategyError: the engine gives no distributions (the column is then not scored, and says why).
        """
        raise StrategyError(f"{self.engine_name} gives no distributions to score")

    def report_reference(self) -> "EngineColumn":
        """The engine's own unquantized run this column is scored against in the quality report (llama.cpp: its
        f16 cache with the column's other knobs).

        Raises:
            StrategyError: the engine gives no distributions to score (the report refuses the column with it).
        """
        raise StrategyError(f"{self.name} gives no distributions to score, so the report cannot score it (it "
                            "streams text only)")

    def score_text(self, loaded, ids: list[int], context_tokens: int, stop, threads: int):
        """The quality report's protocol inside the engine: `ids[:context_tokens]` at once, then one id per step;
        an iterator of steps with `index`, `per_token_s`, `cache_bytes` and `logits` ((vocab,) float32, CPU) whose
        `close()` frees the engine's resources.

        Raises:
            StrategyError: as `report_reference`. kvlab.engines.EngineError: the engine cannot start (one line).
        """
        self.report_reference()
        raise NotImplementedError

    def engine_code(self, settings, model_source: str) -> tuple[list[str], list[str]]:
        """(imports, lines) of the "view code" snippet that reproduce this column with the engine's own Python
        client, after lines that set `prompt_ids` (a list of ints), `tokenizer` and `max_new_tokens`."""
        raise NotImplementedError

    def serving_settings(self) -> list:
        return []
