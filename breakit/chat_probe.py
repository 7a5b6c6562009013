"""Chat tab turns with a huge message, a huge system prompt and many turns, timed, against a running kvlab.

    python breakit/chat_probe.py BASE PID
Prints each event's time, its last status line (first 200 characters) and the app's resident memory after it.
"""
import sys
import time

sys.path.insert(0, "breakit")
from defaults import event_inputs  # noqa: E402
from raw import call  # noqa: E402

BASE, PID = sys.argv[1], sys.argv[2]
SEND = 22


def rss_mib() -> float:
    with open(f"/proc/{PID}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def turn(label, message, system=None, tokens=8, session=None):
    data, _ = event_inputs(BASE, SEND)
    data[18], data[19], data[20], data[21] = system, message, tokens, False
    started = time.monotonic()
    msgs = call(BASE, SEND, data, timeout=300, session=session)
    done = next((m for m in msgs if m.get("msg") == "process_completed"), {})
    out = done.get("output", {})
    text = str(out.get("error") or out.get("data", [""])[:3])[:200]
    print(f"{label}: {time.monotonic() - started:.1f}s success={done.get('success')} rss={rss_mib():.0f}MiB {text}",
          flush=True)


turn("baseline", "hi")
turn("message 2 MB", "word " * 400_000)
turn("system 2 MB", "hi", system="word " * 400_000)
turn("message 20 MB", "w" * 20_000_000)
