"""The link from Compare's "first divergence" cell into Inspect: built by Compare, parsed by Inspect.

`divergence_links` gives each diverged column of a finished run the query `?inspect=1&strategy=...` that opens
Inspect on that strategy beside `dynamic`, with the run's prompt and settings, at the step of the first
divergence; `parse_inspect_query` reads it back. No gradio, no model work.
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


def divergence_links(request, plan, results) -> dict[int, str]:
    """Run column index -> the query opening Inspect at its first divergence, beside `dynamic`, with the run's
    prompt and settings; only for a greedy run and a column that diverged within Inspect's step limit.

    request / plan: Compare's `RunRequest` and `RunPlan`; results: the run's `ColumnResult`s, in run order.
    """
    from kvlab.inspect.inspector import MAX_INSPECT_STEPS

    if request.decoding != "greedy":
        return {}
    steps = min(int(plan.settings.max_new_tokens), MAX_INSPECT_STEPS)
    links = {}
    for index, (column, result) in enumerate(zip(plan.run_columns(), results)):
        step = getattr(result, "first_divergence", None)
        strategy = column.strategy
        if step is None or strategy is None or not strategy.use_cache or strategy.is_compileable or step >= steps:
            continue
        link = InspectLink(strategy=strategy_item(strategy), reference=DEFAULT_COMPARE, prompt=request.prompt,
                           system=request.system or "", chat=bool(request.chat), max_new_tokens=steps,
                           model=plan.spec.source, step=int(step))
        links[index] = inspect_query(link)
    return links
