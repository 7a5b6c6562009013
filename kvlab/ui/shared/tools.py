"""kvlab as tools for agents: compare, plan, needle and diverge as typed API endpoints, which gradio's MCP server
(`demo.launch(mcp_server=True)`, https://www.gradio.app/guides/building-mcp-server-with-gradio) lists as tools.

Gradio builds each tool's schema from the function's type hints and its docstring's `Args:` lines, so those are
the contract: every tool takes plain strings, numbers and booleans (strategies in compare syntax,
`quantized:backend=quanto:nbits=4,sink:window_length=64`) and returns the JSON record the matching CLI
subcommand writes with `--json`, as JSON text (gradio's MCP server hands a tool's result to the client as
text, and `str()` of a dict is not JSON). Bad input raises `gr.Error` with one line saying what to change (an MCP
client sees it as the tool's error result), before any model loads where it can be checked without one.

`register_tools(pool)` adds the four endpoints to the Blocks being built; `mcp_enabled()` reads the switch
(`KVLAB_MCP=1|0`, on by default on a Hugging Face Space).
"""

from __future__ import annotations

import json
import math
import os
import threading

import gradio as gr

from kvlab.models.loading import ModelLoadError, ModelSpec

from .loader import CONCURRENCY, MODEL_CONCURRENCY_ID

MCP_ENV = "KVLAB_MCP"
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


def _refuse(err: Exception) -> gr.Error:
    return gr.Error(str(err).splitlines()[0] if str(err) else type(err).__name__)


class AgentTools:
    """The four tools on one shared `kvlab.models.loading.ModelPool` (weights loaded once for every tab)."""

    def __init__(self, pool):
        self.pool = pool

    def _load(self, model: str, dtype: str = "float32"):
        try:
            return self.pool.get(ModelSpec(model, dtype, "auto"))
        except (ModelLoadError, ValueError) as err:
            raise _refuse(err) from None

    def compare_strategies(self, strategies: str, prompt: str, max_new_tokens: int = 32, model: str = "bundled",
                           fidelity: bool = True) -> str:
        """Run one prompt under several KV-cache strategies side by side (greedy, fp32) and return the run record:
        per column the generated text and tokens, cache bytes, prefill time, TTFT and TPOT, and, for lossy caches,
        top-1 agreement and KL against the dense baseline (teacher-forced).

        Args:
            strategies: comma list of strategies with knobs after colons, e.g. "dynamic,quantized:backend=quanto:nbits=4,sink:window_length=64"; the first exact one is the baseline.
            prompt: the user message (the model's chat template is applied).
            max_new_tokens: tokens to generate per column (1 to 2048).
            model: "bundled" (SmolLM2-135M-Instruct), "bundled:gemma-3-270m", or a Hugging Face hub id where the hub is reachable.
            fidelity: score each lossy column against the baseline's continuation (top-1 agreement, KL in nats).
        Returns:
            the run record, as JSON text, that `python -m kvlab compare --json` writes.
        """
        from kvlab.columns import Column
        from kvlab.compare.runner import run_preset
        from kvlab.presets import PresetError, parse_preset
        from kvlab.protocol import collect
        from kvlab.strategies.base import split_strategy_list

        try:
            items = split_strategy_list(strategies or "")
            if not items:
                raise ValueError("strategies is empty: name at least one, e.g. dynamic,static")
            if not (prompt or "").strip():
                raise ValueError("the prompt is empty: type something to generate from")
            preset = parse_preset({"name": "mcp", "prompt": {"text": prompt}, "model": {"source": model},
                                   "generation": {"max_new_tokens": int(max_new_tokens), "fidelity": bool(fidelity)},
                                   "columns": [{"strategy": item.split(":")[0]} for item in items]},
                                  "mcp", lenient_columns=True)
            columns = [Column.from_text(item) for item in items]
            if all(column.strategy is None for column in columns):
                raise ValueError("; ".join(f"{column.title}: {column.rejected}" for column in columns))
            preset.settings().check()
        except (PresetError, ValueError) as err:
            raise _refuse(err) from None
        loaded = self._load(model)
        return json.dumps(collect(run_preset(loaded, preset, threading.Event(), columns)).record)

    def plan(self, model: str = "bundled", contexts: str = "1k,32k,128k", strategies: str = "dynamic",
             batch: int = 1, dtype: str = "bfloat16", budget_gib: float = 0.0) -> str:
        """Plan the exact KV-cache memory of a model at several context lengths without loading its weights: per
        strategy and context the cache, weights and total bytes, whether they fit the budget, and the longest
        context that does.

        Args:
            model: "bundled", "bundled:gemma-3-270m", a catalog hub id such as "meta-llama/Llama-3.1-8B" (see `python -m kvlab plan --list-models`), or another hub id whose config.json is at most 1 MiB with at most 1024 layers.
            contexts: comma list of context lengths in tokens, k = 1024, e.g. "1k,32k,128k".
            strategies: comma list as compare takes it, e.g. "dynamic,quantized:backend=quanto:nbits=4,sink:window_length=1024".
            batch: sequences in the batch (1 or more).
            dtype: "float32", "bfloat16" or "float16".
            budget_gib: accelerator memory for weights + cache in GiB (2^30 bytes); 0 means no budget.
        Returns:
            the plan, as JSON text, that `python -m kvlab plan --json` writes.
        """
        from kvlab.plan.planner import GIB, PlanError, PlanRequest, plan
        from kvlab.plan.token_counts import parse_token_counts
        from kvlab.strategies.base import parse_strategy_list

        try:
            if int(batch) < 1:
                raise ValueError(f"batch must be 1 or more, got {batch}")
            if budget_gib is not None and not (math.isfinite(budget_gib) and budget_gib >= 0):
                raise ValueError(f"budget_gib must be 0 (no budget) or a finite number of GiB above it, got "
                                 f"{budget_gib}")
            specs = parse_strategy_list(strategies or "")
            if not specs:
                raise ValueError("strategies is empty: name at least one, e.g. dynamic")
            request = PlanRequest(model=model, contexts=parse_token_counts(contexts), batch=int(batch), dtype=dtype,
                                  strategies=tuple(specs),
                                  budget_bytes=int(budget_gib * GIB) if budget_gib else None, prefill_tokens=None)
            return json.dumps(plan(request).to_json())
        except (PlanError, ValueError) as err:
            raise _refuse(err) from None

    def needle(self, strategies: str = "dynamic,sink:window_length=128", lengths: str = "512",
               depths: str = "0,0.5,1", seeds: str = "0", new_tokens: int = 8, model: str = "bundled") -> str:
        """Passkey retrieval per KV-cache strategy: a key hidden at each depth of a filler text of each length,
        the model asked for it greedily; returns every cell (prompt, answer, hit) and the summary per column.

        Args:
            strategies: comma list of strategies with knobs after colons, e.g. "dynamic,snapkv:compression_ratio=0.5".
            lengths: context lengths in tokens, k = 1024, e.g. "512,1k".
            depths: needle depths in [0, 1], e.g. "0,0.5,1".
            seeds: seeds (each a different key and filler offset), e.g. "0,1".
            new_tokens: greedy tokens per answer.
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
        from kvlab.strategies.base import split_strategy_list

        items = split_strategy_list(strategies or "")
        if not items:
            raise gr.Error("strategies is empty: name at least one, e.g. dynamic,sink:window_length=128")
        loaded = self._load(model)
        try:
            grid = parse_grid(lengths, depths, seeds, int(new_tokens), max_positions=max_positions(loaded),
                              min_tokens=min_context_tokens(loaded.tokenizer),
                              key_tokens=functools.partial(key_tokens, loaded.tokenizer))
            done = collect(run_needle(loaded, [Column.from_text(item) for item in items], grid, threading.Event()))
        except (GridError, ValueError) as err:
            raise _refuse(err) from None
        return json.dumps(done.record)

    def diverge(self, strategy: str, prompt: str, steps: int = 16, reference: str = "dynamic",
                model: str = "bundled") -> str:
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
        from kvlab.cli.diverge import document, parse_strategy
        from kvlab.compute import compute_iter
        from kvlab.generation import GenerationSettings, encode_prompt
        from kvlab.inspect.diverge import MAX_DIVERGE_STEPS, DivergeSession

        try:
            if not (prompt or "").strip():
                raise ValueError("the prompt is empty: type something to generate from")
            if not 1 <= int(steps) <= MAX_DIVERGE_STEPS:
                raise ValueError(f"steps must be from 1 to {MAX_DIVERGE_STEPS}, got {steps}")
            chosen, dense = parse_strategy(strategy), parse_strategy(reference)
            if dense.lossy or not dense.use_cache:
                raise ValueError(f"reference must be an exact cache (dynamic, static), got {dense.describe()}")
            settings = GenerationSettings(max_new_tokens=int(steps), fidelity=False)
            settings.check()
        except ValueError as err:
            raise _refuse(err) from None
        loaded = self._load(model)
        prompt_ids = encode_prompt(loaded.tokenizer, prompt, "", True)
        session = DivergeSession(loaded, chosen, prompt_ids, settings, dense)
        list(compute_iter(session.steps(int(steps))))
        return json.dumps(document(session, {"text": prompt, "system": "", "chat": True}, loaded.info()))


def register_tools(pool) -> AgentTools:
    """Add compare_strategies, plan, needle and diverge as API endpoints of the Blocks being built (call inside
    `with gr.Blocks()`); the model-bound ones share the tabs' one model queue."""
    tools = AgentTools(pool)
    model_queue = {"concurrency_limit": CONCURRENCY, "concurrency_id": MODEL_CONCURRENCY_ID}
    gr.api(tools.compare_strategies, api_name="compare_strategies", **model_queue)
    # "plan" is already the Plan tab's (private) handler's name; the MCP tool keeps the function's name, `plan`.
    gr.api(tools.plan, api_name="plan_memory", concurrency_limit=None)
    gr.api(tools.needle, api_name="needle", **model_queue)
    gr.api(tools.diverge, api_name="diverge", **model_queue)
    return tools
