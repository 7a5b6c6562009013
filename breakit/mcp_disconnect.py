"""An agent starts a long kvlab_compare_strategies run over MCP and disconnects after a few seconds; does the
model slot free? A probe page run (Perplexity, fresh session) says what it sees 2 s and 15 s after; the app's
CPU use over those seconds is printed too.

Usage: python breakit/mcp_disconnect.py BASE APP_PID
"""
import asyncio
import sys
import time

import psutil
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

sys.path.insert(0, "breakit")
from raw import call  # noqa: E402
from session_bypass import data, summary  # noqa: E402

BASE, PID = sys.argv[1], int(sys.argv[2])


async def agent():
    async with streamablehttp_client(f"{BASE}/gradio_api/mcp/") as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            res = await session.call_tool("kvlab_compare_strategies", {
                "strategies": "dynamic,sink,static", "prompt": "Tell me a long story.",
                "max_new_tokens": 1000, "fidelity": False})
            print("agent got an answer before it left:", str(res.content)[:300])


async def main():
    task = asyncio.create_task(agent())
    await asyncio.sleep(8)
    print("during the agent run, probe:", summary(call(BASE, 33, list(data), stop_after=3, timeout=30)))
    task.cancel()
    try:
        await task
    except BaseException as err:  # noqa: BLE001
        print("agent gone:", type(err).__name__)


asyncio.run(main())
proc = psutil.Process(PID)
for wait in (2, 15):
    time.sleep(wait)
    proc.cpu_percent(None)
    print(f"+{wait}s probe:", summary(call(BASE, 33, list(data), stop_after=4, timeout=30)),
          f"app cpu {proc.cpu_percent(None):.0f}%")
