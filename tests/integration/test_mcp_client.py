"""kvlab's MCP tools through a real MCP client (the `mcp` package, streamable HTTP) against the running app
launched with `mcp_server=True`: the tools are listed with their typed schemas, `plan` answers for a catalog
model (no weights), `compare_strategies` runs on the bundled model (2 columns, 4 tokens), and bad input comes
back as the tool's error with one line saying why. The model-bound tools are held to their own schema and to
the page's per-run cap, refused before anything is queued; an agent killed in the middle of a long `needle`
call frees the model slot within a cell, its run stopped rather than finished."""

import asyncio
import json
import socket
import subprocess
import sys
import time

import pytest

from app import create_app
from kvlab.models.loading import ModelSpec
from kvlab.ui.hosting import turns
from kvlab.ui.hosting.tools import TOOL_NAMES


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def mcp_url(pool):
    pool.get(ModelSpec())
    demo = create_app(pool, preload=False)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                mcp_server=True)
    try:
        yield demo.local_url.rstrip("/") + "/gradio_api/mcp/"
    finally:
        demo.close()


def session_run(url: str, work):
    """Open an MCP client session on `url`, run `await work(session)` and return its result."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def main():
        async with streamablehttp_client(url) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)

    return asyncio.run(main())


def test_an_mcp_client_lists_the_tools_and_calls_plan_and_compare(mcp_url):
    async def work(session):
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        plan = await session.call_tool("plan", {"model": "meta-llama/Llama-3.1-8B-Instruct", "contexts": "1k,32k",
                                                "strategies": "dynamic,quantized:backend=quanto:nbits=4"})
        compare = await session.call_tool("compare_strategies", {
            "strategies": "dynamic,quantized:backend=quanto:nbits=4", "prompt": "Name three colours.",
            "max_new_tokens": 4})
        bad = await session.call_tool("plan", {"strategies": "no_such_strategy"})
        return tools, plan, compare, bad

    tools, plan, compare, bad = session_run(mcp_url, work)
    assert set(TOOL_NAMES) <= set(tools)
    schema = tools["compare_strategies"].inputSchema["properties"]
    assert schema["max_new_tokens"]["type"] == "integer" and schema["fidelity"]["type"] == "boolean"
    assert "comma list of strategies" in schema["strategies"]["description"]
    assert "KV-cache" in tools["diverge"].description and "Returns" in tools["needle"].description

    assert not plan.isError
    planned = json.loads(plan.content[0].text)
    assert planned["model"]["name"] == "meta-llama/Llama-3.1-8B-Instruct"
    dense, int4 = (strategy["contexts"] for strategy in planned["strategies"])
    assert [c["context"] for c in dense] == [1024, 32768]
    assert dense[1]["cache_bytes"] == 32768 * 32 * 8 * 128 * 2 * 2  # tokens x layers x KV heads x head_dim x (K, V) x bf16
    assert int4[1]["cache_bytes"] < dense[1]["cache_bytes"] / 2

    assert not compare.isError
    record = json.loads(compare.content[0].text)
    assert [c["strategy"] for c in record["columns"]] == ["dynamic", "quantized"]
    assert all(c["status"] == "ok" and 1 <= len(c["token_ids"]) <= 4 for c in record["columns"])

    assert bad.isError and "no_such_strategy" in bad.content[0].text


# ----- held to the schema and the caps; an agent that disconnects frees the model -----

AGENT_SCRIPT = """
import asyncio, json, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

async def main():
    async with streamablehttp_client(sys.argv[1]) as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        await session.call_tool(sys.argv[2], json.loads(sys.argv[3]))

asyncio.run(main())
"""
LONG_NEEDLE = {"strategies": "dynamic,static", "lengths": "2k", "depths": "0,0.5,1", "seeds": "0,1,2",
               "new_tokens": 8}
"""18 cells of a 2k-token prefill each: minutes of work on a CPU, stopped between two cells."""
START_GUARD_S = 120
GONE_GUARD_S = 60
"""Guards only: the slot frees within one cell (seconds) of the agent's going; the run would take minutes."""


def until(condition, guard_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


@pytest.mark.parametrize("tool, arguments, message", [
    ("compare_strategies", {"strategies": "dynamic,static", "prompt": "hi", "max_new_tokens": 4096},
     "max_new_tokens must be between 1 and 2048, got 4096"),
    ("compare_strategies", {"strategies": ",".join(["dynamic"] * 9), "prompt": "hi", "max_new_tokens": 4},
     "strategies names 9 columns; at most 8"),
    ("compare_strategies", {"strategies": ",".join(["dynamic"] * 8), "prompt": "hi", "max_new_tokens": 2048},
     "the limit per run here is 4,096 (KVLAB_MAX_RUN_STEPS)"),
    ("needle", {"new_tokens": 64}, "new_tokens must be between 1 and 32"),
    ("needle", {"lengths": "1k,2k,4k,8k,16k,32k", "depths": "0,0.2,0.4,0.6,0.8,1", "seeds": "0,1,2,3,4"},
     "180 cells"),
    ("diverge", {"strategy": "quantized", "prompt": "hi", "steps": 100000}, "steps must be from 1 to 512"),
])
def test_the_model_bound_tools_are_held_to_their_schema_and_the_caps(mcp_url, tool, arguments, message):
    result = session_run(mcp_url, lambda session: session.call_tool(tool, arguments))
    text = result.content[0].text
    assert result.isError and message in text and "\n" not in text
    assert turns.scheduler().counts() == (0, 0)  # refused before anything was queued


def test_an_agent_that_disconnects_mid_call_frees_the_model_slot(mcp_url):
    scheduler = turns.scheduler()
    measured = scheduler.rate.measured()
    agent = subprocess.Popen([sys.executable, "-c", AGENT_SCRIPT, mcp_url, "needle", json.dumps(LONG_NEEDLE)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert until(lambda: scheduler.counts() == (1, 0), START_GUARD_S), "the agent's run never started"
        time.sleep(2)  # well into its first cells
        assert scheduler.counts() == (1, 0)
    finally:
        agent.kill()
        agent.wait()
    assert until(lambda: scheduler.counts() == (0, 0), GONE_GUARD_S), "the run kept the slot after its agent went"
    assert scheduler.rate.measured() == measured, "the run went on to its end instead of stopping"
