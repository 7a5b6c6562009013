"""Send every event of a running kvlab (private ones included) its page's default inputs with one input at a
time replaced by a hostile value of the wrong type or size; print each reply that is not one clean line.

    python breakit/event_fuzz.py BASE [FIRST_FN [LAST_FN [SKIP,SKIP... [lite]]]]
(`lite`: two values per input, for the events that run the model.)
A reply is flagged when it is gradio's generic error (an exception kvlab did not turn into one line), an
error line that is not printable or longer than 400 characters, a stream that breaks, an event that takes more
than 30 s, or (with APP_PID=the app's process id) one after which the app holds 200 MiB more.
"""
import json
import os
import sys
import time

sys.path.insert(0, "breakit")
import httpx  # noqa: E402
from raw import call  # noqa: E402

BASE = sys.argv[1]
FIRST = int(sys.argv[2]) if len(sys.argv) > 2 else 0
LAST = int(sys.argv[3]) if len(sys.argv) > 3 else 10**6
SKIP = {int(x) for x in sys.argv[4].split(",") if x} if len(sys.argv) > 4 else set()
HOSTILE = {
    "text": ["<img src=x onerror=alert(1)>\n\x1b[2J\ud800" + "y" * 200_000, {"a": 1}, 1e308, None],
    "number": [1e308, -1, "abc", [1], None, 10**30],
    "bool": ["yes", 2, None],
    "choice": [7, None],  # a string outside the choices is gradio's own refusal
    "state": [{"x": 1}, "s", 5],
}
if len(sys.argv) > 5 and sys.argv[5] == "lite":
    HOSTILE = {"text": [HOSTILE["text"][0], 1e308], "number": [1e308, "abc"], "bool": ["yes"], "choice": [7]}
PID = os.environ.get("APP_PID")


def rss_mib() -> float:
    """The app's resident memory (MiB) when APP_PID names its process, else 0."""
    if not PID:
        return 0.0
    with open(f"/proc/{PID}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


KIND = {"textbox": "text", "number": "number", "slider": "number", "checkbox": "bool", "dropdown": "choice",
        "radio": "choice", "checkboxgroup": "choice", "state": "state"}

config = httpx.get(f"{BASE}/config", timeout=30).json()
comps = {c["id"]: c for c in config["components"]}
for dep in config["dependencies"]:
    fn = dep["id"]
    if not FIRST <= fn <= LAST or fn in SKIP or not dep.get("backend_fn") or not dep["inputs"]:
        continue
    base = [None if comps[c]["type"] == "state" else comps[c].get("props", {}).get("value") for c in dep["inputs"]]
    for slot, cid in enumerate(dep["inputs"]):
        kind = KIND.get(comps[cid]["type"])
        for value in HOSTILE.get(kind, []):
            data = list(base)
            data[slot] = value
            started = time.monotonic()
            before = rss_mib()
            try:
                msgs = call(BASE, fn, data, timeout=30)
            except Exception as err:  # noqa: BLE001 - the stream itself broke: the worst kind of reply
                msgs = [{"msg": "stream_broke", "error": type(err).__name__}]
            took = time.monotonic() - started
            done = next((m for m in msgs if m.get("msg") == "process_completed"), None)
            flag = ""
            if done is None:
                flag = f"no completion in {took:.0f}s ({[m.get('msg') for m in msgs][-3:]})"
            elif not done.get("success"):
                err = done.get("output", {}).get("error")
                if err is None or "exception" in str(err).lower():
                    flag = f"generic error: {str(err)[:120]!r}"
                elif len(str(err)) > 400 or not str(err).isprintable():
                    flag = f"bad error line ({len(str(err))} chars): {str(err)[:120]!r}"
            grew = rss_mib() - before
            if grew > 200:
                flag += f" app memory +{grew:.0f} MiB"
            if flag or took > 30:
                print(f"fn {fn} {dep.get('api_name')} input {slot} {comps[cid]['type']}:"
                      f"{comps[cid].get('props', {}).get('label')} <- {json.dumps(value)[:40]}: {flag} ({took:.1f}s)",
                      flush=True)
print("done", flush=True)
