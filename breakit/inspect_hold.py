"""How much memory Inspect runs keep after they end: N runs, each from a new session hash (an API client has
no page to close, so no `unload`), of a prompt near KVLAB_MAX_PROMPT_TOKENS, with the default `sink` beside a `dynamic` reference;
prints the app's resident memory after each.

    python breakit/inspect_hold.py BASE PID N [WORDS] [STEPS]
"""
import sys
import time

sys.path.insert(0, "breakit")
from defaults import event_inputs  # noqa: E402
from raw import call  # noqa: E402

BASE, PID, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
WORDS = int(sys.argv[4]) if len(sys.argv) > 4 else 7000
STEPS = int(sys.argv[5]) if len(sys.argv) > 5 else 16
RUN = 53


def rss_mib() -> float:
    with open(f"/proc/{PID}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


data, _ = event_inputs(BASE, RUN)
data[1], data[4], data[21] = "word " * WORDS, STEPS, "dynamic"  # sink beside a dynamic reference
print(f"before: {rss_mib():.0f} MiB", flush=True)
for run in range(N):
    started = time.monotonic()
    msgs = call(BASE, RUN, data, timeout=600, headers={"X-Forwarded-For": f"10.1.0.{run}"})
    done = next((m for m in msgs if m.get("msg") == "process_completed"), {})
    err = (done.get("output") or {}).get("error") or str((done.get("output") or {}).get("data"))[:300]
    print(f"run {run + 1}: {time.monotonic() - started:.0f}s success={done.get('success')} {str(err)[:120] if err else ''}"
          f" app {rss_mib():.0f} MiB", flush=True)
