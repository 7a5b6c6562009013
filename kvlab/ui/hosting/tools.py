"""kvlab as tools for agents: compare, plan, needle and diverge as typed API endpoints, which gradio's MCP server
(`demo.launch(mcp_server=True)`, https://www.gradio.app/guides/building-mcp-server-with-gradio) lists as tools.

Gradio builds each tool's schema from the function's type hints and its docstring's `Args:` lines, so those are
the contract: every tool takes plain strings, numbers and booleans (strategies in compare syntax,
`quantized:backend=quanto:nbits=4,sink:window_length=64`) and returns the JSON record the matching CLI
subcommand writes with `--json`, as JSON text (gradio's MCP server hands a tool's result to the client as
text, and `str()` of a dict is not JSON). Bad input raises `ToolError` (a `gr.Error`) with one line saying what
to change (an MCP client sees it, unquoted, as the tool's error result), before any model loads where it can be
checked without one.

The model-bound tools are held to their own schema (TOOL_MAX_NEW_TOKENS, MAX_COLUMNS, the needle grid's and
diverge's caps) and to the same caps as the page: each is costed (`kvlab.ui.hosting.costs`) and admitted by
kvlab's scheduler before it is queued, or refused in one line naming the setting (`kvlab.ui.hosting.turns`).
They run as async functions outside gradio's queue, inside the agent's own request, so an agent that
disconnects stops its run and frees its place within a step.

`register_tools(pool)` adds the four endpoints to the Blocks being built; `mcp_enabled()` reads the switch
(`KVLAB_MCP=1|0`, on by default on a Hugging Face Space).
"""

from __future__ import annotations

import json
import os
import threading

import gradio as gr

from kvlab.columns import MAX_COLUMNS
from kvlab.models.loading import ModelLoadError, ModelSpec
from kvlab.sharing.cost import RunCost, prompt_tokens
from kvlab.strategies.base import split_strategy_list
from kvlab.strategies.knob_yaml import shown

from .costs import compare_cost, needle_cost
from .turns import ToolError, tool_turn

MCP_ENV = "KVLAB_MCP"
TOOL_MAX_NEW_TOKENS = 2048
"""Tokens per column `compare_strategies` generates at most (its schema says so)."""
TOOL_NAMES = ("compare_strategies", "plan", "needle", "diverge")
"""The MCP tools kvlab adds, named after their functions (gradio also lists the preset-based `compare` API and
the tabs' public event handlers). Their HTTP API names are the same except `plan`, served as `/plan_memory`."""


def mcp_enabled(flag: bool | None = None) -> bool:
    """Whether to serve gradio's MCP server: `flag` (the `--mcp` / `--no-mcp` switch) when given, else
    KVLAB_MCP (1/true/yes or 0/false/no), else on exactly when running on a Hugging Face Space (SPACE_ID set).

    Raises:
        ValueError: KVLAB_MCP is set to something else; the message names it and its value.
    """
    if flag is not None:
        return flag
    text = os.environ.get(MCP_ENV, "").strip().lower()
    if not text:
        return bool(os.environ.get("SPACE_ID"))
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{MCP_ENV} must be 1 or 0, got {text!r}")


def _refuse(err: Exception) -> ToolError:
    return ToolError(str(err) or type(err).__name__)


def _strategy_items(strategies: str, example: str) -> list[str]:
    """The items of a comma list of strategies, 1 to MAX_COLUMNS of them; else `gr.Error`."""
    items = split_strategy_list(strategies or "")
    if not items:
        raise ToolError(f"strategies is empty: name at least one, e.g. {example}")
    if len(items) > MAX_COLUMNS:
        raise ToolError(f"strategies names {len(items)} columns; at most {MAX_COLUMNS} run side by side")
    return items


def _whole_in(name: str, value, least: int, most: int) -> int:
    """`value` as a whole number in least..most (the tool's schema); else `gr.Error` naming `name`."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or number != value or not least <= number <= most:
        raise ToolError(f"{name} must be between {least} and {most}, got {shown(value)}")
    return number


def _diverge_steps(steps) -> int:
    """`steps` checked against diverge's schema (1 to MAX_DIVERGE_STEPS); else `gr.Error`."""
    from kvlab.inspect.diverge import MAX_DIVERGE_STEPS

    try:
        count = int(steps)
    except (TypeError, ValueError, OverflowError):
        count = 0
    if count != steps or not 1 <= count <= MAX_DIVERGE_STEPS:
        raise ToolError(f"steps must be from 1 to {MAX_DIVERGE_STEPS}, got {shown(steps)}")
    return count


class AgentTools:
    """The four tools on one shared `kvlab.models.loading.ModelPool` (weights loaded once for every tab). Each
    model-bound tool has a `*_cost` sibling with the same arguments: it checks them against the tool's schema
    (`gr.Error` otherwise) and returns the run's cost, before anything is queued."""

    def __init__(self, pool):
        self.pool = pool

    def _load(self, model: str, dtype: str = "float32"):
        try:
            return self.pool.get(ModelSpec(model, dtype, "auto"))
        except (ModelLoadError, ValueError) as err:
            raise _refuse(err) from None

    def compare_cost(self, strategies: str, prompt: str, max_new_tokens: int = 32, model: str = "bundled",
                     fidelity: bool = True) -> RunCost:
        items = _strategy_items(strategies, "dynamic,static")
        tokens = _whole_in("max_new_tokens", max_new_tokens, 1, TOOL_MAX_NEW_TOKENS)
        return compare_cost(items, tokens, prompt)

    def compare_strategies(self, strategies: str, prompt: str, max_new_tokens: int = 32, model: str = "bundled",
                           fidelity: bool = True, *, stop: threading.Event | None = None) -> str:
        """Run one prompt under several KV-cache strategies side by side (greedy, fp32) and return the run record:
        per column the generated text and tokens, cache bytes, prefill time, TTFT and TPOT, and, for lossy caches,
        top-1 agreement and KL against the dense baseline (teacher-forced).

        Args:
            strategies: comma list of strategies (1 to 8) with knobs after colons, e.g. "dynamic,quantized:backend=quanto:nbits=4,sink:window_length=64"; the first exact one is the baseline.
            prompt: the user message (the model's chat template is applied).
            max_new_tokens: tokens to generate per column (1 to 2048).
            model: "bundled" (SmolLM2-135M-Instruct), "bundled:gemma-3-270m", or a Hugging Face hub id where the hub is reachable.
            fidelity: score each lossy column against the baseline's continuation (top-1 agreement, KL in nats).
        Returns:
            the run record, as JSON text, that `python -m kvlab compare --json` writes.
        """
        from kvlab.compare.preset import PresetError, strategies_preset, strategy_columns
        from kvlab.compare.runner import run_preset
        from kvlab.protocol import collect
        from kvlab.recurrent.runner import run_recurrent_preset

        self.compare_cost(strategies, prompt, max_new_tokens, model, fidelity)  # the schema holds for every caller
        items = split_strategy_list(strategies)
        try:
            preset = strategies_preset(prompt, items, "mcp", model={"source": model},
                                       generation={"max_new_tokens": int(max_new_tokens), "fidelity": bool(fidelity)})
            columns = strategy_columns(items)
            preset.settings().check()
        except (PresetError, ValueError) as err:
            raise _refuse(err) from None
        loaded = self._load(model)
        runner = run_recurrent_preset if loaded.is_recurrent else run_preset  # a recurrent model's own runner
        return json.dumps(collect(runner(loaded, preset, stop or threading.Event(), columns)).record)

    def plan(self, model: str = "bundled", contexts: str = "1k,32k,128k", strategies: str = "dynamic",
             batch: int = 1, dtype: str = "bfloat16", budget_gib: float = 0.0) -> str:
        """Plan the exact KV-cache memory of a model at several context lengths without loading its weights: per
        strategy and context the cache, weights and total bytes, whether they fit the budget, and the longest
        context that does.

        Args:
            model: "bundled", "bundled:gemma-3-270m", a catalog hub id such as "meta-llama/Llama-3.1-8B" (see `python -m kvlab plan --list-models`), or another hub id whose config.json is at most 1 MiB with at most 1024 layers.
            contexts: comma list of context lengths in tokens, k = 1024, e.g. "1k,32k,128k".
            strategies: comma list as compare takes it, e.g. "dynamic,quantized:backend=quanto:nbits=4,sink:window_length=1024".
            batch: sequences in the batch (1 to 1048576).
            dtype: "float32", "bfloat16" or "float16".
            budget_gib: accelerator memory for weights + cache in GiB (2^30 bytes), at most 1048576; 0 means no budget.
        Returns:
            the plan, as JSON text, that `python -m kvlab plan --json` writes.
        """
        from kvlab.plan.budget_input import budget_bytes
        from kvlab.plan.planner import MAX_BATCH, PlanError, PlanRequest, plan
        from kvlab.plan.token_counts import parse_token_counts
        from kvlab.strategies.base import parse_strategy_list

        try:
            count = _whole_in("batch", batch, 1, MAX_BATCH)
            budget = None if budget_gib in (None, 0) else budget_bytes(budget_gib, "budget_gib", zero_means_none=True)
            specs = parse_strategy_list(strategies or "")
            if not specs:
                raise ValueError("strategies is empty: name at least one, e.g. dynamic")
            request = PlanRequest(model=model, contexts=parse_token_counts(contexts), batch=count, dtype=dtype,
                                  strategies=tuple(specs), budget_bytes=budget, prefill_tokens=None)
            return json.dumps(plan(request).to_json())
        except (PlanError, ValueError) as err:
            raise _refuse(err) from None

    def needle_cost(self, strategies: str = "dynamic,sink:window_length=128", lengths: str = "512",
                    depths: str = "0,0.5,1", seeds: str = "0", new_tokens: int = 8, model: str = "bundled") -> RunCost:
        from kvlab.needle.grid import MAX_CELLS, MAX_NEW_TOKENS, split_items

        items = _strategy_items(strategies, "dynamic,sink:window_length=128")
        tokens = _whole_in("new_tokens", new_tokens, 1, MAX_NEW_TOKENS)
        cells = len(split_items(lengths)) * len(split_items(depths)) * len(split_items(seeds))
        if cells > MAX_CELLS:
            raise ToolError(f"{cells} cells (lengths x depths x seeds) is more than the {MAX_CELLS} a run may hold")
        return needle_cost(items, lengths, depths, seeds, tokens)

    def needle(self, strategies: str = "dynamic,sink:window_length=128", lengths: str = "512",
               depths: str = "0,0.5,1", seeds: str = "0", new_tokens: int = 8, model: str = "bundled", *,
               stop: threading.Event | None = None) -> str:
        """Passkey retrieval per KV-cache strategy: a key hidden at each depth of a filler text of each length,
        the model asked for it greedily; returns every cell (prompt, answer, hit) and the summary per column.

        Args:
            strategies: comma list of strategies (1 to 8) with knobs after colons, e.g. "dynamic,snapkv:compression_ratio=0.5".
            lengths: context lengths in tokens, k = 1024, e.g. "512,1k".
            depths: needle depths in [0, 1], e.g. "0,0.5,1".
            seeds: seeds (each a different key and filler offset), e.g. "0,1".
            new_tokens: greedy tokens per answer (1 to 32).
            model: "bundled", "bundled:gemma-3-270m", or a hub id where the hub is reachable.
        Returns:
            the record, as JSON text, that `python -m kvlab needle --json` writes.
        """
        import functools

        from kvlab.columns import Column
        from kvlab.needle.grid import GridError, parse_grid
        from kvlab.needle.prompt import key_tokens, min_context_tokens
        from kvlab.needle.runner import max_positions, run_needle
        from kvlab.protocol import collect

        self.needle_cost(strategies, lengths, depths, seeds, new_tokens, model)  # the schema holds for every caller
        items = split_strategy_list(strategies)
        loaded = self._load(model)
        try:
            grid = parse_grid(lengths, depths, seeds, int(new_tokens), max_positions=max_positions(loaded),
                              min_tokens=min_context_tokens(loaded.tokenizer),
                              key_tokens=functools.partial(key_tokens, loaded.tokenizer))
            done = collect(run_needle(loaded, [Column.from_text(item) for item in items], grid,
                                      stop or threading.Event()))
        except (GridError, ValueError) as err:
            raise _refuse(err) from None
        return json.dumps(done.record)

    def diverge_cost(self, strategy: str, prompt: str, steps: int = 16, reference: str = "dynamic",
                     model: str = "bundled") -> RunCost:
        return RunCost(columns=2, new_tokens=_diverge_steps(steps), prompt_tokens=prompt_tokens(prompt))

    def diverge(self, strategy: str, prompt: str, steps: int = 16, reference: str = "dynamic",
                model: str = "bundled", *, stop: threading.Event | None = None) -> str:
        """Step a lossy KV-cache strategy beside a dense reference, greedy, and record per step and per layer
        where the two runs part: the token, the reference's top-1, KL (nats), each layer's KV error, attention
        lost and hidden-state drift, and the first divergent step.

        Args:
            strategy: the strategy under study with knobs after colons, e.g. "quantized:backend=quanto:nbits=2", or a decode-loop mistake: "loop:full_sequence", "loop:positions_from_zero".
            prompt: the user message (the model's chat template is applied).
            steps: tokens to generate, one lockstep step each (1 to 512).
            reference: an exact strategy to compare with ("dynamic" or "static").
            model: "bundled", "bundled:gemma-3-270m", or a hub id where the hub is reachable.
        Returns:
            the record, as JSON text, that `python -m kvlab diverge --json` writes.
        """
        from kvlab.inspect.diverge_run import DivergeRequest, run_diverge

        request = DivergeRequest(strategy=strategy, prompt=prompt, steps=_diverge_steps(steps), reference=reference)
        try:
            request.check()
        except ValueError as err:
            raise _refuse(err) from None
        loaded = self._load(model)
        try:
            return json.dumps(run_diverge(loaded, request, stop))
        except ValueError as err:  # InspectError: a strategy that cannot run here, a model it cannot step
            raise _refuse(err) from None


def register_tools(pool) -> AgentTools:
    """Add compare_strategies, plan, needle and diverge as API endpoints of the Blocks being built (call inside
    `with gr.Blocks()`); the model-bound ones take their turn in kvlab's scheduler (`kvlab.ui.hosting.turns`)
    and run outside gradio's queue, in the MCP request that calls them."""
    tools = AgentTools(pool)
    outside_queue = {"queue": False, "concurrency_limit": None}
    gr.api(tool_turn(tools.compare_strategies, tools.compare_cost), api_name="compare_strategies", **outside_queue)
    # "plan" is already the Plan tab's (private) handler's name; the MCP tool keeps the function's name, `plan`.
    gr.api(tools.plan, api_name="plan_memory", concurrency_limit=None)
    gr.api(tool_turn(tools.needle, tools.needle_cost), api_name="needle", **outside_queue)
    gr.api(tool_turn(tools.diverge, tools.diverge_cost), api_name="diverge", **outside_queue)
    return tools
