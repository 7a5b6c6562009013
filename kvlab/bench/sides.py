"""The bench's two timed sides: kvlab's runner and bare transformers, on the same strategy's cache.

`run_kvlab` times one `kvlab.compare.runner.run_compare`; `bare_generate` / `run_bare` / `run_bare_together`
time plain `model.generate` with a fresh cache built by the strategy registry
(`kvlab.strategies.make_strategy(spec).build_cache`), inside the strategy's `generate_context` (the prefill
hooks of a pruning strategy, as its view-code snippet runs them), so any registered strategy is measured on
both sides. Timed model work runs on kvlab's compute thread (`kvlab.compute`), never in the caller's thread.
This module measures; it formats no text and draws nothing.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

from ..compute import compute


def settings_for(new_tokens: int):
    """Greedy settings making exactly `new_tokens` tokens, fidelity scoring off, the default (`live`) timing
    policy: the bench times one generation of each column its own way."""
    from ..generation import GenerationSettings

    return GenerationSettings(max_new_tokens=new_tokens, stop_at_eos=False, fidelity=False)


def run_kvlab(loaded, prompt_ids, specs: list, new_tokens: int, mode: str = "fair") -> dict:
    """One run_compare, events consumed. Returns elapsed_s (wall seconds), cpu_s (process CPU seconds) and the
    column results.

    Raises RuntimeError when a column did not finish ok (its message says why).
    """
    from ..compare.runner import run_compare
    from ..protocol import collect

    gc.collect()
    cpu = time.process_time()
    started = time.perf_counter()
    done = collect(run_compare(loaded, prompt_ids, list(specs), settings_for(new_tokens), mode))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    for result in done.results:
        if result.status != "ok":
            raise RuntimeError(f"{result.name}: {result.status}: {result.message}")
    return {"elapsed_s": elapsed, "cpu_s": cpu, "results": done.results}


def bare_generate(loaded, prompt_ids, spec: dict, new_tokens: int) -> Callable[[], float]:
    """A callable that runs `model.generate` once and returns its wall seconds.

    The cache comes from the registry: `make_strategy(spec).build_cache(loaded, prompt + new_tokens)`, built
    fresh inside the timed call and passed as `cache=`, and generate runs inside `generate_context(loaded)`
    (a pruning strategy's prefill hooks); a strategy without a cache (`use_cache` False) runs with
    `use_cache=False`. The call raises RuntimeError if generate made another number of tokens.
    """
    import torch

    from ..strategies import make_strategy

    strategy = make_strategy(spec)
    ids = prompt_ids.to(loaded.device)

    def generate() -> float:
        started = time.perf_counter()
        if strategy.use_cache:
            cache_kwargs = {"cache": strategy.build_cache(loaded, ids.shape[1] + new_tokens)}
        else:
            cache_kwargs = {"use_cache": False}
        with torch.inference_mode(), strategy.generate_context(loaded):
            out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                        min_new_tokens=new_tokens, do_sample=False,
                                        pad_token_id=loaded.tokenizer.eos_token_id, **cache_kwargs)
        elapsed = time.perf_counter() - started
        if out.shape[1] - ids.shape[1] != new_tokens:
            raise RuntimeError(f"generate made {out.shape[1] - ids.shape[1]} tokens, not {new_tokens}")
        return elapsed

    return generate


def run_bare(loaded, prompt_ids, spec: dict, new_tokens: int) -> float:
    """Wall seconds for `model.generate` with a fresh cache of `spec`'s strategy, on the compute thread."""
    gc.collect()
    return compute(bare_generate(loaded, prompt_ids, spec, new_tokens))


def run_bare_together(loaded, prompt_ids, spec: dict, new_tokens: int, columns: int, torch_threads: int) -> float:
    """Wall seconds for `columns` bare generate calls at once, each in its own thread limited to `torch_threads`
    intra-op threads (the thread count is restored for later threads in `finally`).

    Raises the first error a thread met.
    """
    import torch

    generate = bare_generate(loaded, prompt_ids, spec, new_tokens)
    errors: list[BaseException] = []

    def column():
        torch.set_num_threads(torch_threads)
        try:
            generate()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread below
            errors.append(err)

    default_threads = torch.get_num_threads()
    gc.collect()
    workers = [threading.Thread(target=column, name=f"kvlab-bench-{i}") for i in range(columns)]
    started = time.perf_counter()
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        torch.set_num_threads(default_threads)
    if errors:
        raise errors[0]
    return time.perf_counter() - started
