"""Per-client caps against one client that mints gradio session hashes (what a page run counts as its client).

Starts K Perplexity runs (fn 33, the page's default: 3 columns x 1,024 tokens) from ONE address, each under a
fresh session hash (or all under one session with --same), reads each event stream for a few seconds, prints
the status line each got (refused, waiting at position N, running), then disconnects all of them and checks
whether the slot frees: a probe run from a new session says what it sees right after, and again 20 s later.

Usage: python breakit/session_bypass.py BASE K [--same]
"""
import json
import re
import secrets
import sys
import threading
import time

from defaults import event_inputs
from raw import call

BASE = sys.argv[1]
data, _ = event_inputs(BASE, 33)
STATUS = re.compile(r"(✖[^\"<]*|waiting: position \d+[^\"<]*|token \d+ of \d+|loading the model…)")


def summary(msgs):
    text = json.dumps(msgs, ensure_ascii=False)
    found = STATUS.findall(text)
    return found[-1][:160] if found else (json.dumps(msgs[-1])[:300] if msgs else "nothing")


def run(n, results, session, stop_after):
    results[n] = summary(call(BASE, 33, list(data), session=session, stop_after=stop_after, timeout=60))


def main():
    shared = secrets.token_hex(6)
    results = {}
    threads = []
    for n in range(K):
        t = threading.Thread(target=run, args=(n, results, shared if SAME else None, 8))
        t.start()
        threads.append(t)
        time.sleep(0.5)
    for t in threads:
        t.join()
    for n in range(K):
        print(f"run {n} ({'one session' if SAME else 'own session'}): {results[n]}")
    print("all streams closed; probe from a new session:")
    for wait in (1, 20):
        time.sleep(wait)
        probe = {}
        run(0, probe, None, 4)
        print(f"  after +{wait}s: {probe[0]}")


if __name__ == "__main__":
    K = int(sys.argv[2])
    SAME = "--same" in sys.argv
    main()
