"""`engine:llamacpp`: the loaded model's own GGUF file run by llama.cpp in this process, as a Compare column and
as a quality-report column scored against llama.cpp's own f16 run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..engines.llamacpp import FLOAT_TYPES, KV_TYPES, is_quantized, rotated
from .base import StrategyError, register_engine, require_int
from .engine_column import EngineColumn
from .knob_yaml import shown


@register_engine
@dataclass
class LlamaCppEngine(EngineColumn):
    """type_k / type_v: llama.cpp's cache types, as `llama-server -ctk/-ctv` (f32, f16, bf16, q8_0, q4_0, q4_1,
    iq4_nl, q5_0, q5_1; blocks of 32 values with a float16 scale). flash_attn: llama.cpp's flash attention, which
    it needs to quantize V. rotation: llama.cpp Hadamard-rotates a quantized cache when the head size is a
    multiple of 64; false turns it off (as LLAMA_ATTN_ROT_DISABLE=1). n_threads: CPU threads (empty: as many as
    kvlab's own columns use)."""

    name = "engine:llamacpp"
    engine_name = "llama.cpp"
    summary = ("llama.cpp (llama-cpp-python) runs the model's own GGUF weights with its KV-cache types: its tokens, "
               "TTFT/ITL and the cache bytes llama.cpp itself reports")
    title_knobs = ("type_k", "type_v")

    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True
    rotation: bool = True
    n_threads: int | None = None

    def __post_init__(self):
        for knob in ("type_k", "type_v"):
            if getattr(self, knob) not in KV_TYPES:
                raise StrategyError(f"{knob} must be one of {', '.join(KV_TYPES)}, got {shown(getattr(self, knob))}")
        for knob, value in dict(flash_attn=self.flash_attn, rotation=self.rotation).items():
            if not isinstance(value, bool):
                raise StrategyError(f"{knob} must be true or false, got {shown(value)}")
        if self.type_v not in FLOAT_TYPES and not self.flash_attn:
            raise StrategyError(f"type_v={self.type_v} needs flash_attn=true: llama.cpp quantizes V only with "
                                "flash attention")
        if self.n_threads is not None:
            require_int("n_threads", self.n_threads, 1, 256)

    def title(self) -> str:
        types = self.type_k if self.type_k == self.type_v else f"K {self.type_k} V {self.type_v}"
        return f"{self.name} {types}"

    def engine_knobs(self) -> dict:
        """The knobs `kvlab.engines.llamacpp.open_llama` takes."""
        return dict(type_k=self.type_k, type_v=self.type_v, flash_attn=self.flash_attn, rotation=self.rotation)

    def caveat(self) -> str:
        return ("llama.cpp's kernels on the GGUF's quantized weights: even its f16 cache is not dynamic's numerics, "
                "so a llama.cpp f16 column is its floor")

    def unavailable_reason(self, loaded) -> str | None:
        from ..engines.gguf import gguf_refusal
        from ..engines.llamacpp import binding_reason

        return binding_reason() or gguf_refusal(loaded.spec.source)

    def threads(self, default: int) -> int:
        return self.n_threads or default

    def open_run(self, loaded, prompt_ids: list[int], settings, stop, threads: int):
        from ..engines.llamacpp import LlamaCppRun
        from ..generation import eos_token_ids

        run = LlamaCppRun(loaded.spec.source, prompt_ids, settings, stop, eos_token_ids(loaded), self.engine_knobs(),
                          self.threads(threads))
        run.notes.extend(self.rotation_notes(loaded))
        return run

    def rotation_notes(self, loaded) -> list[str]:
        """One line saying which caches llama.cpp rotates on this model ([] when neither is quantized)."""
        from ..caches.hybrid import head_dim_of

        if not (is_quantized(self.type_k) or is_quantized(self.type_v)):
            return []
        size = head_dim_of(loaded.config) or 0
        which = [name for name, kind in (("K", self.type_k), ("V", self.type_v)) if rotated(kind, size, self.rotation)]
        if which:
            return [f"llama.cpp Hadamard-rotates {' and '.join(which)} before quantizing (head size {size})"]
        return [f"no rotation ({'turned off' if not self.rotation else f'head size {size} is not a multiple of 64'})"]

    def warm_up(self, loaded, input_tokens: int = 8) -> None:
        """Load the GGUF into llama.cpp and decode a few tokens once, so the first run's TTFT holds no file reads
        or thread start-up."""
        from ..generation import GenerationSettings

        import torch

        settings = GenerationSettings(max_new_tokens=4, stop_at_eos=False, fidelity=False)
        run = self.open_run(loaded, list(range(1, max(1, input_tokens) + 1)), settings, None,
                            self.threads(torch.get_num_threads()))
        try:
            for _ in run:
                pass
        finally:
            run.close()

    def score_continuation(self, loaded, prompt_ids: list[int], continuation: list[int], stop, threads: int):
        from ..engines.llamacpp import score_continuation

        return score_continuation(loaded.spec.source, prompt_ids, continuation, self.engine_knobs(),
                                  self.threads(threads))


    def report_reference(self) -> "LlamaCppEngine":
        """llama.cpp's f16 cache (K and V) with this column's flash attention, rotation and threads: what
        `llama-perplexity --kl-divergence` scores a quantized cache against."""
        return dataclasses.replace(self, type_k="f16", type_v="f16", label="")

    def score_text(self, loaded, ids: list[int], context_tokens: int, stop, threads: int):
        from ..engines.llamacpp import LlamaCppScorer

        return LlamaCppScorer(loaded.spec.source, ids, context_tokens, self.engine_knobs(), self.threads(threads),
                              stop)

    def engine_code(self, settings, model_source: str) -> tuple[list[str], list[str]]:
        from ..models.bundled import bundled_model
        from ..models.gguf_cache import ModelLoadError

        try:
            bundled = bundled_model(model_source)
        except ModelLoadError:
            bundled = None
        where = (f"# {bundled.gguf_file} ships in the {bundled.pip.split()[0]} package (pip show -f it)"
                 if bundled else "")
        path = bundled.gguf_file if bundled else model_source
        types = f"type_k=llama_cpp.GGML_TYPE_{self.type_k.upper()}, type_v=llama_cpp.GGML_TYPE_{self.type_v.upper()}"
        rotation = ["os.environ[\"LLAMA_ATTN_ROT_DISABLE\"] = \"1\"  # rotation off (read when the context is built)"
                    ] if not self.rotation else []
        sampling = (f"temperature={settings.temperature}, top_p={settings.top_p}, top_k={settings.top_k}, "
                    f"min_p=0.0, seed={settings.seed}" if settings.do_sample else "temperature=0.0")
        lines = [*rotation, *([where] if where else []),
                 f"llm = Llama({path!r}, n_ctx=len(prompt_ids) + max_new_tokens, {types}, "
                 f"flash_attn={self.flash_attn}, verbose=False)",
                 f"out = llm.create_completion(prompt_ids, max_tokens=max_new_tokens, {sampling})",
                 "print(out[\"choices\"][0][\"text\"])"]
        return [*(["import os"] if rotation else []), "import llama_cpp", "from llama_cpp import Llama"], lines
