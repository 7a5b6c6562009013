"""Plan (/plan_memory) with hostile arguments: many contexts, huge contexts, many strategies, huge batch; times
each reply and the app's memory.

Usage: python breakit/plan_probe.py BASE APP_PID
"""
import sys
import time

import psutil
from gradio_client import Client

BASE, PID = sys.argv[1], int(sys.argv[2])
proc = psutil.Process(PID)
client = Client(BASE, verbose=False)
CASES = [
    dict(contexts="1k"),
    dict(contexts=",".join(str(n) for n in range(1, 2001))),
    dict(contexts="1" + "0" * 30),
    dict(contexts="99999999999"),
    dict(contexts="1e308"),
    dict(contexts="nan"),
    dict(contexts="1k," * 20000),
    dict(strategies=",".join(["dynamic"] * 500)),
    dict(strategies=",".join(f"sink:window_length={n}" for n in range(1, 300))),
    dict(batch=10**9),
    dict(batch=-1),
    dict(budget_gib=1e308),
    dict(budget_gib=float("nan")),
    dict(model="meta-llama/Llama-3.3-70B-Instruct", contexts="1k,2k,4k,8k,16k,32k,64k,128k",
         strategies="dynamic,static,quantized:backend=quanto:nbits=4,sink,snapkv,triattention"),
    dict(dtype="<b>x</b>"),
    dict(strategies="<img src=x onerror=alert(1)>"),
]
for case in CASES:
    started = time.monotonic()
    try:
        out = str(client.predict(api_name="/plan_memory", **case))
    except Exception as err:  # noqa: BLE001
        out = f"EXC {type(err).__name__}: {err}"
    took = time.monotonic() - started
    short = {k: (v[:40] + "…" if isinstance(v, str) and len(v) > 40 else v) for k, v in case.items()}
    print(f"{took:6.1f}s rss={proc.memory_info().rss / 2**20:.0f}MiB {short} -> {out[:300]!r}")
