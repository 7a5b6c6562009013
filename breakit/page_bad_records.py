"""Hostile records through the page's two upload events (Compare's replay, fn 20; Report's load, fn 68), by raw
HTTP as the page sends them: prints whether each ended in an unexpected error (gradio's generic one, since
show_error is off) or a kvlab line, any multi-line or traceback-like text, time, and the app's memory.

Usage: python breakit/page_bad_records.py BASE APP_PID DIR
"""
import json
import os
import re
import sys
import time

import psutil

from raw import call, file_data, upload

BASE, PID, DIR = sys.argv[1], int(sys.argv[2]), sys.argv[3]
proc = psutil.Process(PID)
BAD = re.compile(r"Traceback|File \"|Error\(|\w+Error:|<class |object at 0x")
LINES = re.compile(r"(⚠️[^\"]*|✖[^\"]*|cannot read[^\"]*|not a [^\"]*)")


def describe(msgs):
    last = msgs[-1] if msgs else {}
    if last.get("msg") != "process_completed":
        return f"no completion ({last.get('msg')})"
    if not last.get("success"):
        return f"FAILED: {json.dumps(last.get('output'))[:200]}"
    text = json.dumps(last.get("output"), ensure_ascii=False)
    lines = LINES.findall(text)
    bad = BAD.findall(text)
    return f"ok; says: {lines[0][:150] if lines else '(no refusal line)'}" + (f"  SUSPECT {bad[:3]}" if bad else "")


for name in sorted(os.listdir(DIR)):
    path = upload(BASE, os.path.join(DIR, name))
    for fn, data in ((20, [file_data(path, name), None]), (68, [None, [file_data(path, name)], "mean KL"])):
        started = time.monotonic()
        msgs = call(BASE, fn, data, timeout=120)
        print(f"{name:22} fn{fn:<3} {time.monotonic() - started:5.1f}s rss={proc.memory_info().rss / 2**20:.0f}MiB "
              f"{describe(msgs)}")
