"""llama.cpp in this process, through llama-cpp-python (the binding its Python users use), as a Compare column.

- `open_llama`: a `llama_cpp.Llama` on a GGUF file with llama.cpp's KV-cache types (`type_k`/`type_v` as
  `llama-server -ctk/-ctv`), flash attention, and its Hadamard rotation of quantized K/V on or off. llama.cpp
  reads `LLAMA_ATTN_ROT_DISABLE` once, when it builds a context's KV cache (src/llama-kv-cache.cpp at the
  commit llama-cpp-python 0.3.36 vendors), so the variable is set to the knob's value for that moment only,
  under a lock, and restored in `finally`.
- `LlamaCppRun`: the column's run, one `kvlab.engines.run.EngineStep` per token from `Llama.generate` (the binding's own
  eval-then-sample loop, so greedy tokens are what a plain `create_completion(temperature=0)` gives). Its
  `per_token_s` is that step's eval and sampling (the first: prefill and first token, the TTFT), its
  `cache_bytes` what llama.cpp itself reports for the sequence (`llama_state_seq_get_size`: the K and V rows of
  the cells it holds in its cache types, plus 12 bytes of position and sequence id per cell and a small header).
- `score_continuation`: llama.cpp's log-probabilities for a given continuation (the fidelity pass).
- `LlamaCppScorer`: a text teacher-forced through llama.cpp as the quality report feeds kvlab's columns (the
  context in one eval, then one token per eval), each step's last-position logits read with
  `llama_get_logits_ith` (not `logits_all`, which keeps every position's logits: about 0.8 GB for SmolLM2's
  49,152-token vocabulary at 4,096 tokens, 4.3 GB for Gemma 3's 262,144).

It does not choose the GGUF file (`kvlab.engines.gguf`) or turn steps into Compare's events
(`kvlab.compare.engine_steps`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import time
from dataclasses import dataclass, field

from ..models.gguf_cache import ModelLoadError
from .gguf import gguf_file
from .run import EngineError, EngineRun, EngineStep, stopping
from .settings import LLAMA_FLOAT_TYPES as FLOAT_TYPES
from .settings import LLAMA_KV_TYPES as KV_TYPES
ROTATION_HEAD_MULTIPLE = 64
"""llama.cpp rotates a quantized K (V) cache when the head size is a multiple of this."""
ROT_ENV = "LLAMA_ATTN_ROT_DISABLE"
CONTEXT_STEP = 256
"""A run's context holds its prompt and new tokens, rounded up to a multiple of this."""
BINDING = "llama-cpp-python"
BINDING_PIN = "llama-cpp-python==0.3.36"

_context_lock = threading.Lock()


def binding_reason() -> str | None:
    """Why llama.cpp cannot run here (its binding is not installed), or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return (f"needs {BINDING} (`pip install {BINDING_PIN}`; scripts/setup.sh installs it, building it once "
                "from source)")
    return None


def is_quantized(kv_type: str) -> bool:
    return kv_type not in FLOAT_TYPES


def rotated(kv_type: str, head_dim: int, rotation: bool) -> bool:
    """Whether llama.cpp Hadamard-rotates a cache of `kv_type` for heads of `head_dim` (llama-kv-cache.cpp:
    quantized type, head size a multiple of 64, not disabled)."""
    return rotation and is_quantized(kv_type) and head_dim % ROTATION_HEAD_MULTIPLE == 0


@contextlib.contextmanager
def _rotation(on: bool):
    """`LLAMA_ATTN_ROT_DISABLE` as the knob says while a context is built, restored after."""
    before = os.environ.get(ROT_ENV)
    try:
        if on:
            os.environ.pop(ROT_ENV, None)
        else:
            os.environ[ROT_ENV] = "1"
        yield
    finally:
        if before is None:
            os.environ.pop(ROT_ENV, None)
        else:
            os.environ[ROT_ENV] = before


def open_llama(path, *, n_ctx: int, type_k: str, type_v: str, flash_attn: bool, rotation: bool, n_threads: int,
               logits_all: bool = False):
    """A `llama_cpp.Llama` on the GGUF file `path` with these cache settings (quiet: llama.cpp's own log off). A
    sliding-window layer's cache holds its window, as `llama-server` keeps it (`--swa-full` off), not every
    token (llama.cpp's context default, which llama-cpp-python keeps).

    Raises:
        EngineError: the binding is missing, or llama.cpp refused the file or the context (one line).
    """
    reason = binding_reason()
    if reason:
        raise EngineError(reason)
    import llama_cpp

    kinds = {name: getattr(llama_cpp, f"GGML_TYPE_{name.upper()}") for name in (type_k, type_v)}
    with _context_lock, _rotation(rotation):
        try:
            return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=min(n_ctx, 512), n_threads=n_threads,
                                   n_threads_batch=n_threads, type_k=kinds[type_k], type_v=kinds[type_v],
                                   flash_attn=flash_attn, swa_full=False, logits_all=logits_all, verbose=False)
        except (ValueError, RuntimeError) as err:
            raise EngineError(f"llama.cpp refused the model or its context (type_k={type_k}, type_v={type_v}, "
                              f"flash_attn={str(flash_attn).lower()}): {err}") from None


@contextlib.contextmanager
def _gguf(source: str):
    """`kvlab.engines.gguf.gguf_file`, its failure an `EngineError`."""
    try:
        with gguf_file(source) as path:
            yield path
    except ModelLoadError as err:
        raise EngineError(str(err)) from None


def context_size(tokens: int) -> int:
    """Cells a context needs for `tokens` tokens, rounded up to CONTEXT_STEP."""
    return -(-max(1, tokens) // CONTEXT_STEP) * CONTEXT_STEP


def sampling(settings) -> dict:
    """`Llama.generate` keyword arguments for kvlab's `GenerationSettings`: greedy is temperature 0 (llama.cpp's
    greedy sampler); sampling keeps top-k (0 = off), top-p and the temperature, with min-p and typical-p off."""
    common = {"repeat_penalty": float(settings.repetition_penalty)}
    if not settings.do_sample:
        return {**common, "temp": 0.0}
    return {**common, "temp": float(settings.temperature), "top_k": int(settings.top_k), "top_p": float(settings.top_p),
            "min_p": 0.0, "typical_p": 1.0}


def state_bytes(llm) -> int:
    """What llama.cpp reports the sequence's cache state takes (`llama_state_seq_get_size`), bytes."""
    import llama_cpp

    return int(llama_cpp.llama_state_seq_get_size(llm.ctx, 0))


class LlamaCppRun(EngineRun):
    """One llama.cpp column run over `prompt_ids`; see the module docstring.

    Args:
        source: the loaded model's source (its GGUF file is found by `kvlab.engines.gguf.gguf_file`).
        prompt_ids: the prompt's token ids (kvlab's tokenizer, read from the same GGUF).
        settings: kvlab's `GenerationSettings` (max_new_tokens, sampling, seed).
        stop: ends the run before the next step once set.
        eos: token ids that end it (with `settings.stop_at_eos`), the same as kvlab's decoder stops at.
        knobs: type_k, type_v, flash_attn, rotation.
        threads: CPU threads for llama.cpp's prefill and decode.

    Raises:
        EngineError: no GGUF file, or llama.cpp refused it (one line).
    """

    def __init__(self, source: str, prompt_ids: list[int], settings, stop, eos: set[int], knobs: dict,
                 threads: int):
        super().__init__()
        self.prompt, self.settings, self.stop = list(prompt_ids), settings, stop
        self.eos = set(eos) if settings.stop_at_eos else set()
        with _gguf(source) as path:
            self.llm = open_llama(path, n_ctx=context_size(len(self.prompt) + settings.max_new_tokens),
                                  n_threads=threads, **knobs)
            name = path.name
        if settings.do_sample:
            self.llm.set_seed(int(settings.seed))
        self._tokens = self.llm.generate(self.prompt, reset=True, **sampling(settings))
        self.figures = {"engine": "llama.cpp", "binding": BINDING_PIN, "gguf": name, "n_ctx": self.llm.n_ctx(),
                        "n_threads": threads, **knobs}

    def __next__(self) -> EngineStep:
        if self.stop_reason is None and stopping(self.stop):
            self.stop_reason = "stopped"
        if self.stop_reason is not None:
            raise StopIteration
        index = len(self.token_ids)
        started = time.perf_counter()
        token = next(self._tokens, None)
        elapsed = time.perf_counter() - started
        if token is None:
            self.stop_reason = "eos"
            raise StopIteration
        fed = tuple(self.prompt) if index == 0 else (self.token_ids[-1],)
        self.token_ids.append(int(token))
        self.texts.append("")
        if token in self.eos:
            self.stop_reason = "eos"
        elif len(self.token_ids) >= self.settings.max_new_tokens:
            self.stop_reason = "length"
        return EngineStep(index, int(token), elapsed, fed, len(self.prompt) + index, state_bytes(self.llm))

    def close(self) -> None:
        self._tokens.close()
        self.llm.close()


def score_continuation(source: str, prompt_ids: list[int], continuation: list[int], knobs: dict, threads: int):
    """llama.cpp's log-probabilities (len(continuation), vocab), float32 torch: row t predicts continuation[t]
    after the prompt and continuation[:t], every position attending through the cache of the knobs' types (one
    batched eval: llama.cpp writes each position's K/V into its cache and attends to the cache, so a batch reads
    the quantized values as decoding would).

    Raises:
        EngineError: as `LlamaCppRun`.
    """
    import torch

    ids = list(prompt_ids) + list(continuation[:-1])
    with _gguf(source) as path:
        llm = open_llama(path, n_ctx=context_size(len(ids)), n_threads=threads, logits_all=True, **knobs)
    try:
        llm.eval(ids)
        logits = torch.from_numpy(llm.scores[len(prompt_ids) - 1:len(ids)].copy())
    finally:
        llm.close()
    return torch.log_softmax(logits.float(), dim=-1)


@dataclass(frozen=True)
class ScoreStep:
    """One teacher-forced llama.cpp step, with the fields of `kvlab.engine.Step` the quality report reads.

    index: 0 for the context's eval (it predicts the first scored token). per_token_s: the eval's seconds.
    cache_bytes: `state_bytes` after it. logits: the last position's logits, (vocab,) float32 torch on the CPU.
    """

    index: int
    per_token_s: float
    cache_bytes: int
    logits: "torch.Tensor" = field(repr=False)  # noqa: F821 - torch is imported where a step is made


class LlamaCppScorer:
    """`ids` teacher-forced through llama.cpp with the knobs' cache types, as the quality report scores kvlab's
    columns: step 0 evaluates `ids[:context_tokens]` at once (n_batch 512) and predicts `ids[context_tokens]`;
    step t evaluates `ids[context_tokens + t - 1]` alone and predicts `ids[context_tokens + t]`; the run ends after
    `len(ids) - context_tokens` steps or once `stop` is set. Iterate it for `ScoreStep`s; `close()` frees the
    context (call it whatever happened; closing twice is harmless).

    Raises:
        EngineError: no GGUF file, or llama.cpp refused it or an eval failed (one line).
    """

    def __init__(self, source: str, ids: list[int], context_tokens: int, knobs: dict, threads: int, stop=None):
        if not 1 <= context_tokens < len(ids):
            raise ValueError(f"need 1 <= context_tokens < len(ids), got {context_tokens} of {len(ids)}")
        self.ids, self.context, self.stop, self.index = list(ids), context_tokens, stop, 0
        with _gguf(source) as path:
            self.llm = open_llama(path, n_ctx=context_size(len(self.ids)), n_threads=threads, **knobs)
        self.n_vocab = self.llm.n_vocab()

    def __iter__(self):
        return self

    def __next__(self) -> ScoreStep:
        import llama_cpp
        import numpy as np
        import torch

        if self.index >= len(self.ids) - self.context or stopping(self.stop):
            raise StopIteration
        fed = self.ids[:self.context] if self.index == 0 else [self.ids[self.context + self.index - 1]]
        started = time.perf_counter()
        try:
            self.llm.eval(fed)
        except RuntimeError as err:
            raise EngineError(f"llama.cpp failed to evaluate token {self.context + self.index}: {err}") from None
        pointer = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        logits = torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy())
        elapsed = time.perf_counter() - started
        step = ScoreStep(self.index, elapsed, state_bytes(self.llm), logits)
        self.index += 1
        return step

    def close(self) -> None:
        self.llm.close()
