"""`engine:openai` columns against a stand-in OpenAI-compatible server on 127.0.0.1 (in this process): the stream,
TTFT/ITL and `/metrics` reach the column, and a refused connection, a timeout, a wrong model name and a server
without `/metrics` each answer in one line in their own column while the other columns finish. The real servers
(llama-cpp-python's and llama-server) are tests/integration/test_engine_columns_real.py and tests/slow."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvlab.columns import Column
from kvlab.compare.runner import run_compare
from kvlab.generation import GenerationSettings
from kvlab.protocol import collect

pytestmark = pytest.mark.unit

PROMPT_IDS = [[5, 6, 7, 8]]
CHUNKS = ["Hello", ",", " world"]
KEY = "sk-kvlab-secret-9876"


class StubServer(ThreadingHTTPServer):
    """Serves `/v1/models`, a streamed `/v1/completions` and (unless `metrics` is False) a vLLM-style `/metrics`
    whose prefix-cache counters grow by one request's prompt each time; `delay_s` before each chunk."""

    daemon_threads = True

    def __init__(self, metrics: bool = True, delay_s: float = 0.0):
        super().__init__(("127.0.0.1", 0), Handler)
        self.metrics, self.delay_s = metrics, delay_s
        self.requests: list[dict] = []
        self.auth: list[str] = []
        self.queries = 0

    def handle_error(self, request, client_address):
        pass  # a client that hangs up mid-stream (the timeout case) is expected

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _json(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        server = self.server
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})
        elif self.path == "/metrics" and server.metrics:
            page = (f"vllm:kv_cache_usage_perc{{model_name=\"stub-model\"}} 0.125\n"
                    f"vllm:prefix_cache_queries_total{{model_name=\"stub-model\"}} {server.queries}.0\n"
                    f"vllm:prefix_cache_hits_total{{model_name=\"stub-model\"}} {server.queries // 2}.0\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.requests.append(body)
        server.auth.append(self.headers.get("Authorization", ""))
        if body["model"] != "stub-model":
            self._json(404, {"error": {"message": f"The model `{body['model']}` does not exist."}})
            return
        server.queries += 4
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for text in CHUNKS:
            time.sleep(server.delay_s)
            chunk = {"choices": [{"index": 0, "text": text, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        final = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": len(CHUNKS)}}
        self.wfile.write(f"data: {json.dumps(final)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture
def servers():
    started = {"ok": StubServer(), "bare": StubServer(metrics=False), "slow": StubServer(delay_s=2.0)}
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in started.values()]
    for thread in threads:
        thread.start()
    try:
        yield started
    finally:
        for server in started.values():
            server.shutdown()
            server.server_close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(tiny, columns):
    import torch

    settings = GenerationSettings(max_new_tokens=4, fidelity=True)
    return collect(run_compare(tiny, torch.tensor(PROMPT_IDS), [Column.from_text(c) for c in columns], settings))


def test_the_stream_and_the_servers_metrics_reach_the_column(tiny, servers, monkeypatch):
    monkeypatch.setenv("KVLAB_PUBLIC", "0")
    ok = servers["ok"]
    done = run(tiny, ["dynamic", f"engine:openai:base_url={ok.url}:api_key={KEY}:send=ids"])
    dynamic, column = done.results
    assert dynamic.status == column.status == "ok"
    assert column.text == "Hello, world" and len(column.per_token_s) == len(CHUNKS)
    assert column.ttft_s == column.per_token_s[0] > 0 and column.itl_ms_p50 is not None
    assert column.token_ids == tiny.tokenizer.encode("Hello, world", add_special_tokens=False)
    assert ok.requests[0]["prompt"] == PROMPT_IDS[0] and ok.requests[0]["max_tokens"] == 4
    assert ok.requests[0]["model"] == "stub-model" and ok.auth == [f"Bearer {KEY}"]
    server = column.engine["server"]
    assert server["kv_cache_usage"] == 0.125 and (server["prefix_cache_hits"], server["prefix_cache_queries"]) == (
        2.0, 4.0)
    assert "server: KV cache 12.5% used · prefix cache 2 of 4 prompt tokens hit" in column.message
    assert column.engine["completion_tokens"] == 3 and column.cache_bytes == []
    assert column.fidelity_status == "not scored: a server streams text, not its distributions"
    assert KEY not in json.dumps([r.to_json() for r in done.results])


def test_each_failure_is_one_line_in_its_own_column(tiny, servers, monkeypatch):
    monkeypatch.setenv("KVLAB_PUBLIC", "0")
    closed = f"http://127.0.0.1:{free_port()}/v1"
    columns = ["dynamic",
               f"engine:openai:base_url={closed}",
               f"engine:openai:base_url={servers['ok'].url}:model=no-such-model",
               f"engine:openai:base_url={servers['slow'].url}:timeout_s=0.5",
               f"engine:openai:base_url={servers['bare'].url}",
               "static"]
    done = run(tiny, columns)
    results = {column: result for column, result in zip(["dynamic", "refused", "model", "slow", "bare", "static"],
                                                         done.results)}
    assert results["dynamic"].status == results["static"].status == results["bare"].status == "ok"
    lines = {name: results[name].message for name in ("refused", "model", "slow")}
    assert {results[name].status for name in lines} == {"error"}
    assert lines["refused"].startswith(f"could not connect to {closed}: ")
    assert lines["model"] == (f"{servers['ok'].url} does not serve model 'no-such-model'; it serves: stub-model")
    assert lines["slow"] == f"{servers['slow'].url} did not answer within 0.5 s while streaming its answer (timeout_s)"
    assert results["bare"].text == "Hello, world"
    assert results["bare"].message == f"no server metrics: {servers['bare'].url[:-3]}/metrics answered HTTP 404"
    for line in [*lines.values(), results["bare"].message]:
        assert "\n" not in line and "Traceback" not in line and "Error:" not in line


def test_a_public_server_refuses_endpoint_columns_unless_allowed(tiny, servers, monkeypatch):
    monkeypatch.setenv("KVLAB_PUBLIC", "1")
    monkeypatch.delenv("KVLAB_ALLOW_ENDPOINTS", raising=False)
    done = run(tiny, ["dynamic", f"engine:openai:base_url={servers['ok'].url}"])
    assert done.results[1].status == "unavailable" and servers["ok"].requests == []
    assert done.results[1].message.startswith("endpoint columns are off on this server (KVLAB_ALLOW_ENDPOINTS=1")
