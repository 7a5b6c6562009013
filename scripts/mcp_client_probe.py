"""Call kvlab's MCP tools through the `mcp` package's client, whichever major version is installed (1.x from 1.24
on, or 2.x), against an app already serving with its MCP switch on.

This is the client half of the first test in tests/integration/test_mcp_client.py as a script, so that an
environment holding a different `mcp` can run it: `mcp` 2.x cannot sit beside gradio's MCP server (gradio pins
`mcp<2` for it), so scripts/newest_check.py serves the app from one environment and runs this probe from a second
one holding the newest `mcp` 2.x. It does not start or stop the app and imports nothing from kvlab.

    python scripts/mcp_client_probe.py URL     # URL: the app's streamable-HTTP endpoint, .../gradio_api/mcp/

Prints one line per check ("ok: ..." or "FAILED: ...") and exits 0 when every check passed, 1 otherwise. It uses
the transport name both major versions have (`mcp.client.streamable_http.streamable_http_client`; 1.x yields a
session-id callback as a third item, 2.x does not) and reads results in their wire form
(`model_dump(by_alias=True)`: `isError`, `inputSchema`), which 2.x's snake_case attributes share.
"""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

EXPECTED_TOOLS = ("compare_strategies", "plan", "needle", "diverge")
"""kvlab's MCP tools (`kvlab.ui.hosting.tools.TOOL_NAMES`; a unit test keeps the two equal)."""
PLAN_ARGS = {"model": "meta-llama/Llama-3.1-8B-Instruct", "contexts": "1k,32k",
             "strategies": "dynamic,quantized:backend=quanto:nbits=4"}
PLAN_DENSE_32K_BYTES = 32768 * 32 * 8 * 128 * 2 * 2
"""Llama-3.1-8B's dense cache at 32k tokens: tokens x layers x KV heads x head_dim x (K, V) x bf16 bytes."""
COMPARE_ARGS = {"strategies": "dynamic,quantized:backend=quanto:nbits=4", "prompt": "Name three colours.",
                "max_new_tokens": 4}
BAD_PLAN_ARGS = {"strategies": "no_such_strategy"}


async def call_tools(url: str) -> dict:
    """List the tools and call plan, compare_strategies and a bad plan; every result in its wire form (dicts)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with streamable_http_client(url) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
            results = {"tools": [tool.model_dump(mode="json", by_alias=True) for tool in listed.tools]}
            for name, tool, arguments in (("plan", "plan", PLAN_ARGS), ("compare", "compare_strategies", COMPARE_ARGS),
                                          ("bad", "plan", BAD_PLAN_ARGS)):
                result = await session.call_tool(tool, arguments)
                results[name] = result.model_dump(mode="json", by_alias=True)
            return results


def text_of(result: dict) -> str:
    return result["content"][0]["text"]


def plan_checks(plan: dict) -> list[tuple[str, bool]]:
    if plan.get("isError"):
        return [(f"plan answered for a catalog model (it returned the error {text_of(plan)!r})", False)]
    planned = json.loads(text_of(plan))
    dense, int4 = (strategy["contexts"] for strategy in planned["strategies"])
    return [("plan answered for a catalog model", planned["model"]["name"] == PLAN_ARGS["model"]),
            ("plan's contexts are 1k and 32k", [c["context"] for c in dense] == [1024, 32768]),
            ("plan's dense 32k cache bytes", dense[1]["cache_bytes"] == PLAN_DENSE_32K_BYTES),
            ("plan's int4 cache is under half the dense one", int4[1]["cache_bytes"] < dense[1]["cache_bytes"] / 2)]


def compare_checks(compare: dict) -> list[tuple[str, bool]]:
    if compare.get("isError"):
        return [(f"compare_strategies ran (it returned the error {text_of(compare)!r})", False)]
    columns = json.loads(text_of(compare))["columns"]
    return [("compare_strategies ran dynamic and quantized",
             [c["strategy"] for c in columns] == ["dynamic", "quantized"]),
            ("every column ok with 1-4 tokens",
             all(c["status"] == "ok" and 1 <= len(c["token_ids"]) <= 4 for c in columns))]


def checks(results: dict) -> list[tuple[str, bool]]:
    """(what was checked, whether it held) for the results of `call_tools`."""
    tools = {tool["name"]: tool for tool in results["tools"]}
    listed = [("the four tools are listed", set(EXPECTED_TOOLS) <= set(tools))]
    if "compare_strategies" in tools:
        schema = tools["compare_strategies"]["inputSchema"]["properties"]
        listed.append(("compare_strategies' schema types its arguments",
                       schema["max_new_tokens"]["type"] == "integer" and schema["fidelity"]["type"] == "boolean"))
    bad = results["bad"]
    refused = [("a bad strategy comes back as the tool's error naming it",
                bool(bad.get("isError")) and "no_such_strategy" in text_of(bad))]
    return listed + plan_checks(results["plan"]) + compare_checks(results["compare"]) + refused


def first_leaf(err: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups, such as anyio's task groups raise."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/mcp_client_probe.py URL", file=sys.stderr)
        return 2
    print(f"mcp client {version('mcp')}")
    try:
        results = asyncio.run(call_tools(argv[0]))
    except Exception as group:  # one line for the report: the failure is the finding
        err = first_leaf(group)
        first = str(err).splitlines()[0] if str(err) else ""
        print(f"FAILED: the client session ({type(err).__name__}: {first})")
        return 1
    try:
        outcome = checks(results)
    except (KeyError, IndexError, TypeError, ValueError) as err:
        print(f"FAILED: reading the tools' results ({type(err).__name__}: {err})")
        return 1
    for what, held in outcome:
        print(f"{'ok' if held else 'FAILED'}: {what}")
    return 0 if all(held for _, held in outcome) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
