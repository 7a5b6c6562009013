"""Any OpenAI-compatible server (vLLM, SGLang, llama-server, a fleet behind one URL) as a Compare column.

`OpenAIRun` sends the prompt to the server's `/completions` (the prompt as kvlab's columns see it: the chat
template applied, as text, or as its token ids for a server that serves the same model) with `stream: true`,
and yields one `kvlab.engines.run.EngineStep` per streamed chunk that carries text. Times follow vLLM's serving benchmark
(`vllm bench serve`): TTFT from sending the request to the first chunk with text, ITL the gap between one such
chunk and the next (a chunk holding several tokens counts once). The server's `/metrics` (beside the API root)
is read before the request, once while it streams and after it (`kvlab.engines.metrics`).

Written on httpx (already installed with gradio) rather than the `openai` package, which kvlab does not depend
on: the column needs one streamed POST, one GET of the model list and the metrics page. Every failure is one
line (`EngineError`): a refused connection, a timeout, a model the server does not serve, an HTTP error, a
stream that is not OpenAI's format; a server without `/metrics` runs and says so in a note. The API key goes in
the `Authorization` header only and appears in no message, figure or record; URLs are shown without any
user:password part. This module does not decide whether a URL may be reached (`endpoint_refusal` does, from
`KVLAB_ALLOW_ENDPOINTS`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from urllib.parse import urlsplit, urlunsplit

from ..models.sources import FALSE_WORDS, TRUE_WORDS, public_mode, safe_line
from .metrics import MAX_METRICS_CHARS, MetricsError, figures_line, parse_metrics, server_figures
from .run import EngineError, EngineRun, EngineStep, stopping

ALLOW_ENV = "KVLAB_ALLOW_ENDPOINTS"
DEFAULT_TIMEOUT_S = 30.0
"""Seconds to wait for a connection, or for the next bytes of an answer (the `timeout_s` knob's default)."""
METRICS_TIMEOUT_S = 5.0
API_SUFFIX = "/v1"


def endpoint_refusal() -> str | None:
    """Why this server may not send requests to a URL a user typed (one line), or None. On a public server
    (`KVLAB_PUBLIC`) endpoint columns are off unless `KVLAB_ALLOW_ENDPOINTS=1`; elsewhere on unless it is 0."""
    value = os.environ.get(ALLOW_ENV, "").strip().lower()
    allowed = value in TRUE_WORDS or (value not in FALSE_WORDS and not public_mode())
    if allowed:
        return None
    return f"endpoint columns are off on this server ({ALLOW_ENV}=1 turns them on: the server then sends requests " \
           "to any URL a visitor types)"


def shown_url(url: str) -> str:
    """`url` without a user:password part, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def metrics_url(base_url: str) -> str:
    """The `/metrics` page beside an API root: `http://h:8000/v1` -> `http://h:8000/metrics`."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    path = path[:-len(API_SUFFIX)] if path.endswith(API_SUFFIX) else path
    return urlunsplit((parts.scheme, parts.netloc, path + "/metrics", "", ""))


def request_body(model: str, prompt, settings) -> dict:
    """The `/completions` body for kvlab's `GenerationSettings`: greedy is temperature 0; `ignore_eos` (vLLM's and
    llama-server's extension) when the run keeps going past the end-of-sequence token."""
    body = {"model": model, "prompt": prompt, "max_tokens": settings.max_new_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}
    if settings.do_sample:
        body.update(temperature=settings.temperature, top_p=settings.top_p, seed=settings.seed)
        if settings.top_k:
            body["top_k"] = settings.top_k
    if settings.repetition_penalty != 1.0:
        body.update(repetition_penalty=settings.repetition_penalty, repeat_penalty=settings.repetition_penalty)
    if not settings.stop_at_eos:
        body["ignore_eos"] = True
    return body


class OpenAIRun(EngineRun):
    """One request to an OpenAI-compatible server, streamed; see the module docstring.

    Args:
        knobs: base_url, model ('' = the server's first listed model), api_key, send (`text` or `ids`),
            timeout_s, metrics (read `/metrics`).
        prompt_text / prompt_ids: the prompt as text (chat template applied) and as ids.
        retokenize: text -> token ids (the loaded model's tokenizer), for the column's ids at the end.

    Raises:
        EngineError: no connection, a timeout, an HTTP error, or a model the server does not serve (one line).
    """

    is_local = False

    def __init__(self, knobs: dict, prompt_text: str, prompt_ids: list[int], settings, stop, retokenize):
        import httpx

        super().__init__()
        self.httpx, self.stop, self.settings, self.retokenize = httpx, stop, settings, retokenize
        self.base = knobs["base_url"].rstrip("/")
        self.shown = shown_url(self.base)
        headers = {"Authorization": f"Bearer {knobs['api_key']}"} if knobs.get("api_key") else {}
        self.client = httpx.Client(timeout=httpx.Timeout(knobs["timeout_s"]), headers=headers)
        self.timeout_s, self.read_metrics = knobs["timeout_s"], knobs["metrics"]
        self._metrics: dict = {}
        self._during: threading.Thread | None = None
        self.text = ""
        try:
            self.model = self._checked_model(knobs["model"])
            self._metrics["before"] = self._metrics_page() if self.read_metrics else None
            prompt = prompt_ids if knobs["send"] == "ids" else prompt_text
            self._response = self._post(request_body(self.model, prompt, settings))
        except BaseException:
            self.client.close()
            raise
        self._lines = self._response.iter_lines()
        self.figures = {"engine": "OpenAI-compatible server", "url": self.shown, "model": self.model,
                        "send": knobs["send"]}

    def _failure(self, err: Exception, what: str) -> EngineError:
        """One line for an httpx failure while `what` (e.g. `listing its models`)."""
        httpx = self.httpx
        if isinstance(err, httpx.TimeoutException):
            return EngineError(f"{self.shown} did not answer within {self.timeout_s:g} s while {what} (timeout_s)")
        if isinstance(err, httpx.ConnectError):
            return EngineError(f"could not connect to {self.shown}: {safe_line(str(err)) or 'connection refused'}")
        return EngineError(f"{self.shown} failed while {what}: {type(err).__name__}: {safe_line(str(err))}")

    def _get(self, url: str, what: str, timeout: float | None = None):
        try:
            return self.client.get(url, timeout=timeout or self.timeout_s)
        except self.httpx.HTTPError as err:
            raise self._failure(err, what) from None

    def _checked_model(self, model: str) -> str:
        """`model`, after checking the server lists it (the first listed one when '')."""
        response = self._get(f"{self.base}/models", "listing its models")
        served = []
        if response.status_code == 200:
            try:
                served = [str(item["id"]) for item in response.json().get("data", [])]
            except (ValueError, KeyError, TypeError, AttributeError):
                served = []
        if not model:
            if not served:
                raise EngineError(f"{self.shown} lists no model (GET /models answered {response.status_code}): "
                                  "give model=NAME")
            return served[0]
        if served and model not in served:
            raise EngineError(f"{self.shown} does not serve model {model!r}; it serves: {', '.join(served[:8])}")
        return model

    def _metrics_page(self) -> dict | None:
        """The server's `/metrics` samples, or None (with one note) when it has none or they do not parse."""
        url = metrics_url(self.base)
        try:
            response = self.client.get(url, timeout=min(self.timeout_s, METRICS_TIMEOUT_S))
        except self.httpx.HTTPError as err:
            self._note_metrics(f"could not be read ({type(err).__name__})")
            return None
        if response.status_code != 200:
            self._note_metrics(f"answered HTTP {response.status_code}")
            return None
        if len(response.text) > MAX_METRICS_CHARS:
            self._note_metrics(f"is over {MAX_METRICS_CHARS:,} characters")
            return None
        try:
            return parse_metrics(response.text)
        except MetricsError as err:
            self._note_metrics(f"is not Prometheus text ({err})")
            return None

    def _note_metrics(self, why: str) -> None:
        if not any(note.startswith("no server metrics") for note in self.notes):
            self.notes.append(f"no server metrics: {metrics_url(self.shown)} {why}")
        self.read_metrics = False

    def _post(self, body: dict):
        request = self.client.build_request("POST", f"{self.base}/completions", json=body)
        self._last = time.perf_counter()  # the TTFT runs from here, as `vllm bench serve` times it
        try:
            response = self.client.send(request, stream=True)
        except self.httpx.HTTPError as err:
            raise self._failure(err, "sending the prompt") from None
        if response.status_code != 200:
            try:
                response.read()
                detail = _error_message(response)
            except self.httpx.HTTPError:
                detail = ""
            finally:
                response.close()
            raise EngineError(f"{self.shown} answered HTTP {response.status_code}"
                              + (f": {detail}" if detail else ""))
        return response

    def __next__(self) -> EngineStep:
        while True:
            if self.stop_reason is None and stopping(self.stop):
                self.stop_reason = "stopped"
            if self.stop_reason is not None:
                raise StopIteration
            text = self._next_text()
            if text is None:
                continue
            now = time.perf_counter()
            elapsed, self._last = now - self._last, now
            index = len(self.texts)
            self.texts.append(text)
            self.text += text
            if index == 0 and self.read_metrics:
                self._during = threading.Thread(target=self._sample_during, daemon=True, name="kvlab-metrics")
                self._during.start()
            return EngineStep(index, -1, elapsed, (), 0, None)

    def _next_text(self) -> str | None:
        """The text of the next stream line that carries some, None for a line that carries none; ends the run
        (StopIteration) at the stream's end."""
        try:
            line = next(self._lines, None)
        except self.httpx.HTTPError as err:
            raise self._failure(err, "streaming its answer") from None
        if line is None or line.strip() == "data: [DONE]":
            self._finish()
            raise StopIteration
        if not line.startswith("data:"):
            return None
        try:
            chunk = json.loads(line[len("data:"):])
        except ValueError:
            raise EngineError(f"{self.shown} streamed a line that is not JSON: {line[:60]!r}") from None
        if not isinstance(chunk, dict):
            raise EngineError(f"{self.shown} streamed {type(chunk).__name__} where OpenAI's format has an object")
        if "error" in chunk:
            raise EngineError(f"{self.shown} reported an error mid-stream: {_error_text(chunk)}")
        if isinstance(chunk.get("usage"), dict):
            self.figures["completion_tokens"] = chunk["usage"].get("completion_tokens")
        choice = (chunk.get("choices") or [None])[0]
        if not isinstance(choice, dict):
            return None
        if choice.get("finish_reason"):
            self.figures["finish_reason"] = choice["finish_reason"]
        text = choice.get("text")
        return text if isinstance(text, str) and text else None

    def _sample_during(self) -> None:
        self._metrics["during"] = self._metrics_page()

    def _finish(self) -> None:
        reason = self.figures.get("finish_reason")
        self.stop_reason = "length" if reason == "length" else "eos"
        self.token_ids = list(self.retokenize(self.text)) if self.text else []
        if self._during is not None:
            self._during.join(METRICS_TIMEOUT_S)
        if self.read_metrics and self._metrics.get("before") is not None:
            after = self._metrics_page()
            if after is not None:
                server = server_figures(self._metrics["before"], self._metrics.get("during"), after)
                self.figures["server"] = server
                self.notes.append(figures_line(server) or "server metrics: none of the KV-cache series kvlab "
                                                          "knows (vLLM, SGLang, llama-server)")

    def close(self) -> None:
        if self._during is not None:
            self._during.join(METRICS_TIMEOUT_S)
        response = getattr(self, "_response", None)
        if response is not None:
            response.close()
        self.client.close()


def _error_text(payload: dict) -> str:
    error = payload.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return safe_line(str(message or payload))


def _error_message(response) -> str:
    """The server's error message from an error answer's JSON body ('' when it has none)."""
    try:
        payload = response.json()
    except ValueError:
        return safe_line(response.text)
    return _error_text(payload) if isinstance(payload, dict) else safe_line(str(payload))
