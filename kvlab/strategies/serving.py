"""From the lab to the serving engine: for each strategy (and its knobs) the nearest setting in vLLM, SGLang,
TensorRT-LLM and llama.cpp, with the version it was checked in and the source, or why there is none.

The fact lives beside the method (kvpress-style): each strategy class answers `serving_settings()` for its own
knobs, a quantized one through its backend's note (`kvlab.caches.quant.QuantBackend.serving`), and the
vocabulary (`ServingSetting`, the engines, the sources) is `kvlab.engines`'. This module gathers them: the "view
code" snippet (`kvlab.ui.shared.code.code_snippet`) prints `serving_comment` under the code, and docs/serving.md
is `serving_table()` for each strategy's default knobs. A registered strategy class without its own answer raises
`KeyError` naming it (tests/unit/test_serving_map.py fails the same way, so a new strategy cannot ship without
its row). "Nearest" is said plainly: where an engine's setting does not do what kvlab's strategy does, the note
says how it differs.
"""

from __future__ import annotations

import re

from ..engines import ENGINES, ServingSetting
from .base import STRATEGIES, make_strategy

__all__ = ["ENGINES", "ServingSetting", "serving_comment", "serving_settings", "serving_table"]


def serving_settings(name: str, knobs: dict | None = None) -> list[ServingSetting]:
    """The nearest serving-engine settings of strategy `name` with `knobs` (`Strategy.knobs()`; missing ones at
    their defaults): the class's own `serving_settings()`.

    Raises:
        KeyError: `name` is not a registered strategy, or its class has no entry; the message names it and where
            to add it.
        StrategyError: a knob value the strategy refuses.
    """
    if name not in STRATEGIES:
        raise KeyError(f"strategy {name!r} has no serving-engine entry: register it and give its class a "
                       "serving_settings() method (kvlab/strategies/serving.py) and a row to docs/serving.md")
    return make_strategy({"strategy": name, **dict(knobs or {})}).serving_settings()


def serving_comment(strategy) -> list[str]:
    """The "view code" lines for `strategy` (a `kvlab.strategies.Strategy`): a header and one `# ` line per
    engine; no lines for a strategy without an entry (the unit test catches that, not the page)."""
    try:
        settings = strategy.serving_settings()
    except KeyError:
        return []
    return ["", "# ── the nearest setting in a serving engine (kvlab docs/serving.md) ──",
            *(f"# {setting.line()}" for setting in settings)]


def _doc_links(text: str) -> str:
    """`docs/x.md#a` paths in `text` as links relative to docs/serving.md (`[x.md#a](x.md#a)`)."""
    return re.sub(r"docs/([\w.-]+\.md(?:#[\w-]+)?)", r"[\1](\1)", text)


def serving_table() -> str:
    """docs/serving.md's table: one row per registered strategy at its default knobs, one cell per engine
    (`setting` — version (note) [n]; measured: where kvlab measured it, or no serving equivalent: why), and the
    numbered sources after it."""
    sources: list[str] = []
    rows = ["| strategy (default knobs) | " + " | ".join(ENGINES) + " |", "|---" * (len(ENGINES) + 1) + "|"]
    for name in STRATEGIES:
        cells = []
        for setting in make_strategy({"strategy": name}).serving_settings():
            if setting.setting is None:
                cells.append(f"no serving equivalent: {setting.note}")
                continue
            if setting.source not in sources:
                sources.append(setting.source)
            note = f" ({setting.note})" if setting.note else ""
            measured = f"; measured: {_doc_links(setting.measured)}" if setting.measured else ""
            cells.append(f"`{setting.setting}` — {setting.version}{note} [{sources.index(setting.source) + 1}]"
                         f"{measured}")
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(rows + [""] + [f"{n}. <{source}>" for n, source in enumerate(sources, 1)])
