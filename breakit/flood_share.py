"""One visitor replays one 15 MiB record N times through Compare's replay event (fn 20, what the page's upload
box calls), each replay writing a kept shared result; prints the runs folder's size, the app's memory, and
whether an earlier share link still opens.

Usage: python breakit/flood_share.py BASE APP_PID RUNS_DIR RECORD N
"""
import json
import os
import sys
import time

import psutil

from raw import call, file_data, upload

BASE, PID, RUNS, REC, N = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])


def size(folder):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs)


proc = psutil.Process(PID)
first = sorted(os.listdir(RUNS))
print("before: runs", len(first), f"{size(RUNS) / 2**20:.0f} MiB", f"app rss {proc.memory_info().rss / 2**20:.0f} MiB")
path = upload(BASE, REC)
peak = 0
for n in range(N):
    started = time.monotonic()
    msgs = call(BASE, 20, [file_data(path), None])
    last = msgs[-1] if msgs else {}
    ok = last.get("success")
    rss = proc.memory_info().rss / 2**20
    peak = max(peak, rss)
    print(f"replay {n}: success={ok} {time.monotonic() - started:.1f}s runs={len(os.listdir(RUNS))} "
          f"{size(RUNS) / 2**20:.0f} MiB rss={rss:.0f} MiB")
    if not ok:
        print(json.dumps(last)[:400])
gone = [r for r in first if not os.path.exists(os.path.join(RUNS, r))]
print(f"earlier results evicted: {len(gone)} of {len(first)}; peak rss {peak:.0f} MiB")
