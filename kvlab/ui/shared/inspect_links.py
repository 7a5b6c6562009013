"""The link from Compare's "first divergence" cell into Inspect: built by Compare, parsed by Inspect.

`divergence_links` gives each diverged column of a finished run the query `?inspect=1&strategy=...` that opens
Inspect on that strategy beside `dynamic`, with the run's prompt and settings, at the token of the first
divergence, and says why a diverged column has none; `record_divergence_links` does the same for a replayed
record; `parse_inspect_query` reads a link back. Tokens are counted from 0 everywhere (Compare, the CLI and
Inspect's `Token 8`). No gradio, no model work.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

DEFAULT_COMPARE = "dynamic"
"""The reference a link steps beside."""
QUERY_FLAG = "inspect"
"""The query parameter that marks a link into Inspect (`?inspect=1&...`)."""


def strategy_item(strategy) -> str:
    """A strategy in the command line's `name:knob=value` spelling, knobs that differ from their defaults only."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(strategy)}
    knobs = [f"{name}={'true' if value is True else 'false' if value is False else value}"
             for name, value in strategy.knobs().items() if value != defaults.get(name) and value is not None]
    return ":".join([strategy.name, *knobs])


@dataclass(frozen=True)
class InspectLink:
    """What a link into Inspect carries: the strategy (`name:knob=value`), the reference, the prompt and its
    settings, and the step to show (0-based)."""

    strategy: str
    reference: str
    prompt: str
    system: str
    chat: bool
    max_new_tokens: int
    model: str
    step: int


def inspect_query(link: InspectLink) -> str:
    """`?inspect=1&strategy=...`: the query that opens Inspect on `link`."""
    fields = {QUERY_FLAG: 1, "strategy": link.strategy, "compare": link.reference, "prompt": link.prompt,
              "system": link.system, "chat": int(link.chat), "steps": link.max_new_tokens, "model": link.model,
              "step": link.step}
    return "?" + urlencode(fields)


def parse_inspect_query(params: dict) -> InspectLink | None:
    """The `InspectLink` of a page's query parameters, None when they carry none.

    Raises:
        ValueError: a link whose numbers are not whole numbers (the message names the field).
    """
    if str(params.get(QUERY_FLAG, "")) != "1":
        return None
    numbers = {}
    for name in ("steps", "step", "chat"):
        try:
            numbers[name] = int(params.get(name, 0))
        except (TypeError, ValueError):
            raise ValueError(f"the link's {name} must be a whole number, got {params.get(name)!r}") from None
    return InspectLink(strategy=str(params.get("strategy", "")), reference=str(params.get("compare", DEFAULT_COMPARE)),
                       prompt=str(params.get("prompt", "")), system=str(params.get("system", "")),
                       chat=bool(numbers["chat"]), max_new_tokens=numbers["steps"],
                       model=str(params.get("model", "bundled")), step=numbers["step"])


def links_for(items, *, prompt: str, system: str, chat: bool, greedy: bool, max_new_tokens: int, model: str
              ) -> tuple[dict[int, str], dict[int, str]]:
    """(links, reasons) for the first-divergence cells of one run: run column index -> the query opening Inspect
    at that token beside `dynamic`, and run column index -> why a column that diverged has no link.

    items: (strategy or None, first divergence or None) per run column, in run order; a first divergence is a
    0-based token index, which is also what Inspect calls the token (`Token 8` is the ninth new token).
    """
    from kvlab.inspect.inspector import MAX_INSPECT_STEPS

    steps = min(int(max_new_tokens), MAX_INSPECT_STEPS)
    links, reasons = {}, {}
    for index, (strategy, step) in enumerate(items):
        if step is None:
            continue
        if not greedy:
            reasons[index] = "a sampled run has no single token path to step through (Inspect decodes greedily)"
        elif strategy is None:
            reasons[index] = "this kvlab cannot build the column's strategy"
        elif strategy.engine_name:
            reasons[index] = f"{strategy.engine_name} runs outside transformers: Inspect steps kvlab's own caches"
        elif not strategy.use_cache:
            reasons[index] = "no_cache keeps no cache to inspect"
        elif strategy.is_compileable:
            reasons[index] = "a compiled cache runs inside torch.compile, which Inspect cannot step"
        elif step >= steps:
            reasons[index] = f"token {step} is past Inspect's limit of {MAX_INSPECT_STEPS} tokens"
        else:
            link = InspectLink(strategy=strategy_item(strategy), reference=DEFAULT_COMPARE, prompt=prompt,
                               system=system, chat=chat, max_new_tokens=steps, model=model, step=int(step))
            links[index] = inspect_query(link)
    return links, reasons


def divergence_links(request, plan, results) -> tuple[dict[int, str], dict[int, str]]:
    """`links_for` a finished run of the page: request / plan are Compare's `RunRequest` and `RunPlan`;
    results: the run's `ColumnResult`s, in run order."""
    items = [(column.strategy, getattr(result, "first_divergence", None))
             for column, result in zip(plan.run_columns(), results)]
    return links_for(items, prompt=request.prompt, system=request.system or "", chat=bool(request.chat),
                     greedy=request.decoding == "greedy", max_new_tokens=int(plan.settings.max_new_tokens),
                     model=plan.spec.source)


def record_divergence_links(record: dict, results) -> tuple[dict[int, str], dict[int, str]]:
    """`links_for` a replayed run (a share link or an uploaded record): the prompt, settings and model come from
    the record, each column's strategy from its recorded name and knobs."""
    from kvlab.strategies import StrategyError, make_strategy

    items = []
    for result in results:
        try:
            strategy = make_strategy({"strategy": result.strategy, **dict(result.knobs or {})})
        except (StrategyError, ValueError, TypeError):
            strategy = None
        items.append((strategy, getattr(result, "first_divergence", None)))
    prompt, settings = record.get("prompt") or {}, record.get("settings") or {}
    return links_for(items, prompt=str(prompt.get("text", "")), system=str(prompt.get("system") or ""),
                     chat=bool(prompt.get("chat")), greedy=not settings.get("do_sample", False),
                     max_new_tokens=int(settings.get("max_new_tokens") or 0),
                     model=str((record.get("model") or {}).get("source") or "bundled"))
