"""Memory held per gradio session on kvlab: N cheap calls, each from a new session hash (what any anonymous
client can send), and the app's RSS before and after.

Usage: python breakit/session_growth.py BASE APP_PID N FN_INDEX
"""
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from raw import call

BASE, PID, N, FN = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
proc = psutil.Process(PID)
before = proc.memory_info().rss / 2**20
started = time.monotonic()
with ThreadPoolExecutor(4) as pool:
    results = list(pool.map(lambda n: call(BASE, FN, ["greedy"]), range(N)))
ok = sum(1 for r in results if r and r[-1].get("success"))
time.sleep(3)
after = proc.memory_info().rss / 2**20
print(f"{N} sessions ({ok} ok) in {time.monotonic() - started:.0f}s: rss {before:.0f} -> {after:.0f} MiB "
      f"({(after - before) / N * 1024:.0f} KiB per session)")
if results and not results[0][-1].get("success"):
    print(results[0][-1])
