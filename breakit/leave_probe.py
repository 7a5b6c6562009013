"""Does a page event keep the model after its client leaves? Client A starts a long chat turn and drops the
connection after 3 s; client B (another address) then sends "hi" and is timed.

    python breakit/leave_probe.py BASE [FN]
FN is the chat's send event (22). Poses as two addresses through X-Forwarded-For (KVLAB_PROXY_HOPS=1).
"""
import sys
import time

sys.path.insert(0, "breakit")
from defaults import event_inputs  # noqa: E402
from raw import call  # noqa: E402

BASE = sys.argv[1]
FN = int(sys.argv[2]) if len(sys.argv) > 2 else 22
data, _ = event_inputs(BASE, FN)
data[19], data[20], data[21] = "Write a very long story about a dragon.", 512, True
started = time.monotonic()
msgs = call(BASE, FN, data, headers={"X-Forwarded-For": "10.0.0.1"}, stop_after=3)
print(f"A left after {time.monotonic() - started:.1f}s ({[m.get('msg') for m in msgs][-2:]})", flush=True)
data[19], data[20], data[21] = "hi", 4, False
started = time.monotonic()
msgs = call(BASE, FN, data, headers={"X-Forwarded-For": "10.0.0.2"}, timeout=300)
done = next((m for m in msgs if m.get("msg") == "process_completed"), {})
print(f"B's 4-token turn: {time.monotonic() - started:.1f}s success={done.get('success')}", flush=True)
