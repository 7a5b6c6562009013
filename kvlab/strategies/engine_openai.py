"""`engine:openai`: any OpenAI-compatible server (vLLM, SGLang, llama-server, a fleet behind one URL) as a
Compare column."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .base import StrategyError, register_engine
from .engine_column import EngineColumn
from .knob_yaml import shown

SEND = ("text", "ids")
MAX_TIMEOUT_S = 600.0
KEY_SHOWN = "(set)"
"""What `knobs()` and every record show for an API key."""


@register_engine
@dataclass
class OpenAIEngine(EngineColumn):
    """base_url: the server's API root (`http://127.0.0.1:8080/v1`). model: the name it serves the model under
    (empty: the first it lists). api_key: sent as `Authorization: Bearer`, never shown (empty: none). send: the
    prompt as `text` (chat template applied, any server) or as its token `ids` (a server serving the same model
    sees exactly kvlab's ids). timeout_s: seconds to wait for a connection or the next streamed bytes. metrics:
    read the server's `/metrics` (KV-cache usage, prefix-cache hits) before, during and after the request."""

    name = "engine:openai"
    engine_name = "OpenAI-compatible server"
    is_local = False
    summary = ("any OpenAI-compatible server (vLLM, SGLang, llama-server) on the same prompt: its streamed text, "
               "TTFT/ITL as vLLM's benchmark times them, and its /metrics KV-cache usage and prefix-cache hits")
    title_knobs = ("base_url", "model", "api_key")

    base_url: str = ""
    model: str = ""
    api_key: str = field(default="", repr=False)
    send: str = "text"
    timeout_s: float = 30.0
    metrics: bool = True

    def __post_init__(self):
        parts = urlsplit(self.base_url) if isinstance(self.base_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise StrategyError("base_url must be the server's http(s) API root, e.g. http://127.0.0.1:8080/v1")
        for knob in ("model", "api_key"):
            if not isinstance(getattr(self, knob), str):
                raise StrategyError(f"{knob} must be text" + (f", got {shown(self.model)}" if knob == "model" else ""))
        if self.send not in SEND:
            raise StrategyError(f"send must be one of {', '.join(SEND)}, got {shown(self.send)}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise StrategyError(f"timeout_s must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got "
                                f"{shown(self.timeout_s)}")
        if not isinstance(self.metrics, bool):
            raise StrategyError(f"metrics must be true or false, got {shown(self.metrics)}")

    def knobs(self) -> dict:
        """The knobs, the API key shown as KEY_SHOWN when set."""
        knobs = super().knobs()
        knobs["api_key"] = KEY_SHOWN if self.api_key else ""
        return knobs

    def title(self) -> str:
        parts = urlsplit(self.base_url)
        host = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
        return f"{self.name} {self.model or 'its model'} @ {host}"

    def caveat(self) -> str:
        return ("another process serves this column: its times include the network and the server's own queue, "
                "its token ids are its text re-tokenized by the loaded model's tokenizer")

    def unavailable_reason(self, loaded) -> str | None:
        from ..engines.openai import endpoint_refusal

        return endpoint_refusal()

    def open_run(self, loaded, prompt_ids: list[int], settings, stop, threads: int):
        from ..engines.openai import OpenAIRun

        tokenizer = loaded.tokenizer
        prompt_text = tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        knobs = {**super().knobs(), "timeout_s": float(self.timeout_s)}
        return OpenAIRun(knobs, prompt_text, list(prompt_ids), settings, stop,
                         lambda text: tokenizer.encode(text, add_special_tokens=False))

    def score_continuation(self, loaded, prompt_ids, continuation, stop, threads: int):
        raise StrategyError("a server streams text, not its distributions")

    def engine_code(self, settings, model_source: str) -> tuple[list[str], list[str]]:
        prompt = "prompt_ids" if self.send == "ids" else "tokenizer.decode(prompt_ids)"
        sampling = (f"temperature={settings.temperature}, top_p={settings.top_p}, seed={settings.seed}"
                    if settings.do_sample else "temperature=0.0")
        key = ", api_key=os.environ[\"OPENAI_API_KEY\"]" if self.api_key else ", api_key=\"none\""
        lines = [f"client = OpenAI(base_url={self.base_url!r}{key})",
                 f"stream = client.completions.create(model={repr(self.model) if self.model else 'client.models.list().data[0].id'}, "
                 f"prompt={prompt}, max_tokens=max_new_tokens, {sampling}, stream=True)",
                 "for chunk in stream:",
                 "    if chunk.choices:",
                 "        print(chunk.choices[0].text, end=\"\", flush=True)"]
        return ["import os", "from openai import OpenAI"], lines
