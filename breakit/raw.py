"""Call a running gradio app's events the way its page does (any fn_index, private ones included), by raw HTTP.

    from raw import upload, call
    path = upload(base, "rec.json")
    messages = call(base, fn_index, [ {"path": path, "meta": {"_type": "gradio.FileData"}}, None ])
`call` returns the list of SSE messages (dicts) up to process_completed, or those seen before `timeout`.
`headers` may carry X-Forwarded-For to pose as another client behind the Space's proxy.
"""
import json
import secrets
import time

import httpx


def upload(base: str, path: str, headers: dict | None = None, name: str | None = None) -> str:
    with open(path, "rb") as fh:
        resp = httpx.post(f"{base}/gradio_api/upload", files={"files": (name or path.split("/")[-1], fh)},
                          headers=headers or {}, timeout=120)
    resp.raise_for_status()
    return resp.json()[0]


def file_data(path: str, name: str = "record.json") -> dict:
    return {"path": path, "orig_name": name, "meta": {"_type": "gradio.FileData"}}


def call(base: str, fn_index: int, data: list, headers: dict | None = None, timeout: float = 120,
         session: str | None = None, trigger_id: int | None = None, stop_after: float | None = None) -> list:
    session = session or secrets.token_hex(6)
    body = {"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None,
            "trigger_id": trigger_id}
    with httpx.Client(timeout=timeout, headers=headers or {}) as client:
        resp = client.post(f"{base}/gradio_api/queue/join", content=json.dumps(body).encode(),
                           headers={"content-type": "application/json"})
        if resp.status_code != 200:
            return [{"msg": "join_refused", "status": resp.status_code, "body": resp.text[:300]}]
        out, started = [], time.monotonic()
        with client.stream("GET", f"{base}/gradio_api/queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                msg = json.loads(line[5:])
                out.append(msg)
                if msg.get("msg") == "process_completed":
                    break
                if stop_after is not None and time.monotonic() - started > stop_after:
                    break
                if time.monotonic() - started > timeout:
                    break
        return out
