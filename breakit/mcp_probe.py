"""kvlab's MCP tools with wrong, oversized and hostile arguments, over gradio's streamable-HTTP MCP endpoint.

Usage: python breakit/mcp_probe.py BASE [list]
"""
import asyncio
import json
import sys
import time

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7911"
CASES = [
    ("kvlab_compare", {"preset": "../../../../etc/passwd"}),
    ("kvlab_compare", {"preset": "/etc/passwd"}),
    ("kvlab_compare", {"preset": "../presets/quickstart"}),
    ("kvlab_compare", {"preset": "quickstart.yaml"}),
    ("kvlab_compare", {"preset": "<img src=x onerror=alert(1)>"}),
    ("kvlab_compare", {"preset": "quickstart", "max_new_tokens": 10**6}),
    ("kvlab_compare", {"preset": "quickstart", "max_new_tokens": -3}),
    ("plan", {"model": "bundled", "contexts": "1k", "strategies": "dynamic", "budget_gib": 1e308}),
    ("plan", {"model": "bundled", "contexts": "1k", "strategies": "dynamic", "budget_gib": -5}),
    ("plan", {"model": "bundled", "contexts": "1k", "strategies": "dynamic", "batch": 1.5}),
    ("compare_strategies", {"strategies": ",".join(["dynamic"] * 9), "prompt": "hi", "max_new_tokens": 1}),
    ("compare_strategies", {"strategies": "dynamic", "prompt": "hi", "max_new_tokens": 4097}),
    ("compare_strategies", {"strategies": "dynamic", "prompt": "hi", "max_new_tokens": 2049}),
    ("compare_strategies", {"strategies": "dynamic", "prompt": "hi " * 200000, "max_new_tokens": 1}),
    ("compare_strategies", {"strategies": "dynamic", "prompt": "hi", "max_new_tokens": 1, "model": "/etc"}),
    ("compare_strategies", {"strategies": "dynamic:<b>x</b>=1", "prompt": "hi", "max_new_tokens": 1}),
    ("needle", {"strategies": "dynamic", "lengths": "1000000", "depths": "0.5", "seeds": "0"}),
    ("needle", {"strategies": "dynamic", "lengths": "512", "depths": ",".join(["0.5"] * 5000), "seeds": "0"}),
    ("needle", {"strategies": "dynamic", "lengths": "512", "depths": "0.5", "seeds": ",".join(map(str, range(5000)))}),
    ("needle", {"strategies": "dynamic", "lengths": "512", "depths": "0.5", "seeds": "0", "new_tokens": 10**9}),
    ("diverge", {"strategy": "sink", "prompt": "hi", "steps": 10**6}),
    ("diverge", {"strategy": "sink", "prompt": "hi", "steps": 16, "reference": "no_cache"}),
]


async def main():
    async with streamablehttp_client(f"{BASE}/gradio_api/mcp/") as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            if "list" in sys.argv:
                for tool in tools.tools:
                    print(tool.name, json.dumps(tool.inputSchema)[:900])
                return
            names = {t.name: t.name for t in tools.tools}
            for name, args in CASES:
                tool = name if name in names else next((t for t in names if t.endswith("_" + name)), name)
                started = time.monotonic()
                try:
                    res = await asyncio.wait_for(session.call_tool(tool, args), 120)
                    text = " | ".join(getattr(c, "text", str(c)) for c in res.content)
                    out = f"isError={res.isError} {text}"
                except Exception as err:  # noqa: BLE001
                    out = f"EXC {type(err).__name__}: {err}"
                short = {k: (v[:30] + "…" if isinstance(v, str) and len(v) > 30 else v) for k, v in args.items()}
                print(f"{time.monotonic() - started:6.1f}s {tool} {short} -> {out[:400]!r}")


asyncio.run(main())
