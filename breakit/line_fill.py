"""One address fills the whole waiting line with page runs, one fresh gradio session each, and an honest
visitor's run (another session, the same default Perplexity run) is refused while it holds them.

Usage: python breakit/line_fill.py BASE K   (K = KVLAB_MAX_WAITING + 1 = 17 by default settings)
"""
import sys
import threading
import time

from session_bypass import data, summary  # noqa: F401 - the default Perplexity run and its status reader
from raw import call

BASE, K = sys.argv[1], int(sys.argv[2])
results = {}


def run(n, hold):
    results[n] = summary(call(BASE, 33, list(data), stop_after=hold, timeout=90))


threads = [threading.Thread(target=run, args=(n, 25)) for n in range(K)]
for t in threads:
    t.start()
    time.sleep(0.3)
time.sleep(6)
run("visitor", 4)
print("honest visitor's run while the line is held:", results["visitor"])
for t in threads:
    t.join()
print("the flooding client's runs:", sorted({v[:60] for k, v in results.items() if k != "visitor"}))
