"""kvlab's MCP tools through a real MCP client (the `mcp` package, streamable HTTP) against the running app
launched with `mcp_server=True`: the tools are listed with their typed schemas, `plan` answers for a catalog
model (no weights), `compare_strategies` runs on the bundled model (2 columns, 4 tokens), and bad input comes
back as the tool's error with one line saying why."""

import asyncio
import json
import socket

import pytest

from app import create_app
from kvlab.models.loading import ModelSpec
from kvlab.ui.shared.tools import TOOL_NAMES


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
