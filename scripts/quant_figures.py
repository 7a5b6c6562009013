"""The figures of kvlab's KV-quantization note, measured on the bundled models (CPU, float32).

`kl`: teacher-forced mean KL(dense || column) of quantized caches on the bundled SmolLM2-135M, the text being
kvlab's default (Python's help topics): a `--prefill`-token prompt in one forward, then `--tokens` tokens fed one at
a time through each column's cache (so residuals fill and flush as in decoding), every next-token distribution
scored against the dense cache's with `kvlab.quality.stats` (llama.cpp's `--kl-divergence` figures). Prints
each column's mean KL, its standard error, top-1 agreement and its cache bytes after the last token.

`gemma`: cache bytes of quantized caches on the bundled Gemma 3 270M after one `--prompt-tokens` prefill, against
dynamic's, measured and as Plan predicts them.

`distortion`: what each quantized cache does to the real keys and values of `--tokens` tokens of the text (one
dense prefill, then every quantized layer fed those keys and values and read back): relative squared error
‖x̂ − x‖²/‖x‖² of keys and of values over the quantized layers, and the cache's bytes against float32 dense (the
bits-per-value trade-off behind the quality figures).

`vllm-bytes`: each `vllm_kv_cache` column's bytes per token as kvlab's accounting counts them (cache bytes after a
`--tokens` prefill minus those after half of it, over the difference; both below a sliding window, so every layer
grows) beside vLLM's page formula (`kvlab.caches.quant.vllm.vllm_bytes_per_token`) in the model's dtype, the
tables counted once, and the compression vLLM's cost figures speak of: one encoded layer's slot against bfloat16
(vLLM's "×" at this model's head_dim) and the whole model against bfloat16 dense, boundary layers included.

`axis`: the quantization axis table of docs/strategies.md: on both bundled models, transformers' own
`HQQQuantizedLayer` at axis 1 tried on the model's key shapes (its error, or that it runs), then `kvlab report`'s
run (`kvlab.quality.report.run_report`) of hqq and quanto int4 at each axis and `residual_length` 0 and 128,
printed as Markdown rows (a refused column's row gives its reason).

    python scripts/quant_figures.py kl --strategies "quantized:backend=quanto:nbits=4,rotation_quantized"
    python scripts/quant_figures.py gemma --prompt-tokens 4000
    python scripts/quant_figures.py distortion --tokens 2048
    python scripts/quant_figures.py vllm-bytes --model bundled:gemma-3-270m
    python scripts/quant_figures.py axis --context-tokens 768 --scored-tokens 256

Prints one line per column; not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from kvlab.accounting import cache_bytes, cache_bytes_by_layer_type
from kvlab.accounting import layer_types_and_windows
from kvlab.models.loading import ModelSpec, load_model
from kvlab.quality.stats import quality_figures, score_tokens
from kvlab.strategies import make_strategy
from kvlab.strategies.base import parse_strategy_list

KL_DEFAULT = ("quantized:backend=quanto:nbits=4,rotation_quantized,quantized:backend=quanto:nbits=2,"
              "rotation_quantized:key_bits=4:value_bits=2")


def measured_text() -> str:
    """The text docs/strategies.md's figures were measured on: every one of Python's help topics
    (`pydoc_data.topics`), joined."""
    from pydoc_data.topics import topics

    return "\n".join(topics.values())


def text_ids(loaded, count: int) -> torch.Tensor:
    ids = loaded.tokenizer(measured_text(), return_tensors="pt")["input_ids"][:, :count]
    if ids.shape[1] < count:
        raise SystemExit(f"the text has only {ids.shape[1]} tokens")
    return ids.to(loaded.device)


def teacher_forced(loaded, strategy, ids: torch.Tensor, prefill: int) -> tuple[torch.Tensor, int]:
    """(logits (T, vocab) predicting ids[prefill:], cache bytes after the last token fed)."""
    cache = strategy.build_cache(loaded, ids.shape[1])
    rows = []
    with torch.inference_mode():
        rows.append(strategy.forward(loaded, cache, ids[:, :prefill], prefill)[0].float())
        for end in range(prefill + 1, ids.shape[1]):
            rows.append(strategy.forward(loaded, cache, ids[:, :end], 1)[0].float())
    return torch.stack(rows), cache_bytes(cache)


def run_kl(args) -> None:
    loaded = load_model(ModelSpec(source=args.model))
    ids = text_ids(loaded, args.prefill + args.tokens)
    targets = ids[0, args.prefill:]
    started = time.perf_counter()
    base, base_bytes = teacher_forced(loaded, make_strategy({"strategy": "dynamic"}), ids, args.prefill)
    print(f"dynamic: {base_bytes:,} B ({time.perf_counter() - started:.0f} s)", flush=True)
    results = []
    for spec in parse_strategy_list(args.strategies):
        strategy = make_strategy(spec)
        started = time.perf_counter()
        logits, size = teacher_forced(loaded, strategy, ids, args.prefill)
        figures = quality_figures(*score_tokens(base, logits, targets))
        row = {"column": strategy.describe(), "cache_bytes": size, "bytes_vs_dynamic": size / base_bytes,
               "mean_kl": figures.kld_mean, "mean_kl_unc": figures.kld_mean_unc, "same_top": figures.same_top,
               "ppl_ratio": figures.ppl_ratio, "tokens": figures.n_tokens}
        results.append(row)
        print(f"{row['column']}: mean KL {row['mean_kl']:.5f} ± {row['mean_kl_unc']:.5f} nats, same top "
              f"{row['same_top']:.4f}, PPL ratio {row['ppl_ratio']:.4f}, {size:,} B "
              f"({row['bytes_vs_dynamic']:.3f} of dynamic) over {row['tokens']} tokens "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"model": args.model, "prefill": args.prefill, "tokens": args.tokens,
                       "dynamic_bytes": base_bytes, "columns": results}, handle, indent=2)


def run_gemma(args) -> None:
    from kvlab.plan.planner import PlanRequest, plan

    loaded = load_model(ModelSpec(source=args.model))
    ids = text_ids(loaded, args.prompt_tokens)
    types = layer_types_and_windows(loaded.config)[0]
    specs = [{"strategy": "dynamic"}, *parse_strategy_list(args.strategies)]
    planned = plan(PlanRequest(model=args.model, contexts=(args.prompt_tokens, args.plan_tokens), dtype="float32",
                               strategies=tuple(specs)))
    dense = None
    for spec, predicted in zip(specs, planned.strategies):
        strategy = make_strategy(spec)
        cache = strategy.build_cache(loaded, args.prompt_tokens)
        with torch.inference_mode():
            strategy.forward(loaded, cache, ids, args.prompt_tokens)
        size = cache_bytes(cache)
        dense = dense or size
        plan_now, plan_far = (cell.cache_bytes for cell in predicted.cells)
        dense_far = planned.strategies[0].cells[1].cache_bytes
        print(f"{strategy.describe()}: {size:,} B after {args.prompt_tokens} tokens ({size / dense:.4f} of dynamic; "
              f"by layer type {cache_bytes_by_layer_type(cache, types)}); Plan {plan_now:,} B "
              f"({'equal' if plan_now == size else 'DIFFERS'}), at {args.plan_tokens:,} tokens {plan_far:,} B "
              f"({plan_far / dense_far:.4f} of dynamic)", flush=True)


DISTORTION_DEFAULT = ",".join([
    "quantized:residual_length=0", "quantized:backend=hqq:residual_length=0", "quantized:backend=fp8",
    "rotation_quantized:residual_length=0", "rotation_quantized:key_bits=4:value_bits=2:residual_length=0",
    *(f"vllm_kv_cache:kv_cache_dtype={name}:boundary_layers=0" for name in (
        "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")),
    "vllm_kv_cache:kv_cache_dtype=int4_per_token_head",
    "vllm_kv_cache:kv_cache_dtype=turboquant_4bit_nc:boundary_layers=0:values=lloyd_max",
    "vllm_kv_cache:kv_cache_dtype=turboquant_4bit_nc:boundary_layers=0:norm_correction=false",
    "vllm_kv_cache:kv_cache_dtype=turboquant_4bit_nc:boundary_layers=0:qjl=true"])


def _relative_error(exact: torch.Tensor, decoded: torch.Tensor) -> float:
    return float(((decoded - exact) ** 2).sum() / (exact ** 2).sum())


def run_distortion(args) -> None:
    from transformers import DynamicCache

    from kvlab.caches.quant import backend_of_layer

    loaded = load_model(ModelSpec(source=args.model))
    ids = text_ids(loaded, args.tokens)
    dense = DynamicCache(config=loaded.config)
    with torch.inference_mode():
        loaded.model(input_ids=ids, cache=dense, use_cache=True)
    dense_bytes = cache_bytes(dense) * (args.tokens + 1) // args.tokens
    for spec in parse_strategy_list(args.strategies):
        strategy = make_strategy(spec)
        cache = strategy.build_cache(loaded, args.tokens + 1)
        keys, values = [], []
        with torch.inference_mode():
            for layer, source in zip(cache.layers, dense.layers):
                layer.update(source.keys, source.values)
                got_keys, got_values = layer.update(source.keys[..., -1:, :], source.values[..., -1:, :])
                if backend_of_layer(layer) is not None:
                    keys.append(_relative_error(source.keys, got_keys[..., :args.tokens, :]))
                    values.append(_relative_error(source.values, got_values[..., :args.tokens, :]))
        share = cache_bytes(cache) / dense_bytes
        print(f"{strategy.describe()}: {share:.4f} of float32 dense ({32 * share:.2f} bits per value), key error "
              f"{sum(keys) / len(keys):.5f}, value error {sum(values) / len(values):.5f} (mean over {len(keys)} "
              "layers)", flush=True)


VLLM_BYTES_DEFAULT = ",".join(
    [*(f"vllm_kv_cache:kv_cache_dtype={name}" for name in (
        "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "int4_per_token_head")),
     "vllm_kv_cache:kv_cache_dtype=turboquant_4bit_nc:values=lloyd_max",
     "vllm_kv_cache:kv_cache_dtype=turboquant_4bit_nc:qjl=true",
     "vllm_kv_cache:kv_cache_dtype=turboquant_3bit_nc:values=lloyd_max",
     "vllm_kv_cache:kv_cache_dtype=turboquant_3bit_nc:qjl=true"])


def _prefilled_bytes(loaded, strategy, ids: torch.Tensor) -> int:
    cache = strategy.build_cache(loaded, ids.shape[1])
    with torch.inference_mode():
        strategy.forward(loaded, cache, ids, ids.shape[1])
    return cache_bytes(cache)


def _per_token(loaded, strategy, ids: torch.Tensor) -> tuple[int, int]:
    """(bytes one token adds, bytes left over at zero tokens: the tables) from prefills of all and half of ids."""
    half = ids.shape[1] // 2
    small, large = _prefilled_bytes(loaded, strategy, ids[:, :half]), _prefilled_bytes(loaded, strategy, ids)
    per_token, rest = divmod(large - small, ids.shape[1] - half)
    if rest:
        raise SystemExit(f"{strategy.describe()}: {large - small} B over {ids.shape[1] - half} tokens is not whole")
    return per_token, small - half * per_token


def run_vllm_bytes(args) -> None:
    from kvlab.caches.quant.vllm import full_knobs, slot_format, vllm_bytes_per_token
    from kvlab.caches.vllm_int4 import KV_CACHE_DTYPE as INT4
    from kvlab.models.loading import head_dim

    loaded = load_model(ModelSpec(source=args.model))
    ids = text_ids(loaded, args.tokens)
    element = next(loaded.model.parameters()).element_size()
    dense, _ = _per_token(loaded, make_strategy({"strategy": "dynamic"}), ids)
    dense_bf16 = dense * 2 // element
    width = head_dim(loaded.config.get_text_config(decoder=True))
    print(f"{args.model}: dynamic {dense:,} B per token ({element} B per value); head_dim {width}")
    for spec in parse_strategy_list(args.strategies):
        strategy = make_strategy(spec)
        knobs = full_knobs(strategy.knobs())
        measured, tables = _per_token(loaded, strategy, ids)
        formula = vllm_bytes_per_token(loaded.config, knobs, element)
        slot = width + 8 if knobs["kv_cache_dtype"] == INT4 else slot_format(knobs, width).slot_size_aligned
        print(f"{strategy.describe()}: kvlab {measured:,} B per token, vLLM's formula {formula:,} B "
              f"({'equal' if measured == formula else 'DIFFERS'}), tables {tables:,} B once; slot {slot} B per token "
              f"and head = {4 * width / slot:.2f}x smaller than bfloat16; whole model {measured / dense:.4f} of "
              f"dynamic, {dense_bf16 / vllm_bytes_per_token(loaded.config, knobs, 2):.2f}x smaller than bfloat16 "
              "dense", flush=True)


AXES = {"hqq": (0, 1), "quanto": (0, -1)}
"""Each backend's quantization axes (transformers' `axis_key`/`axis_value`)."""


def upstream_axis1(loaded, steps: int = 8) -> str:
    """transformers' own `HQQQuantizedLayer` (int4, axis 1, residual 0) fed a 5-token prompt and `steps` single
    tokens of the model's (1, kv_heads, tokens, head_dim) shape: 'runs' or its error."""
    from transformers.cache_utils import HQQQuantizedLayer

    from kvlab.models.loading import head_dim

    cfg = loaded.config.get_text_config(decoder=True)
    shape = (1, cfg.num_key_value_heads, 1, head_dim(cfg))
    layer = HQQQuantizedLayer(nbits=4, axis_key=1, axis_value=1, residual_length=0)
    try:
        for tokens in (5, *[1] * steps):
            states = torch.randn(shape[0], shape[1], tokens, shape[3])
            layer.update(states, states.clone())
    except Exception as err:  # noqa: BLE001 - the failure is the answer
        return f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return "runs"


def axis_columns() -> str:
    return ",".join(f"quantized:backend={backend}:nbits=4:residual_length={residual}:axis_key={axis}:axis_value={axis}"
                    for backend, axes in AXES.items() for residual in (0, 128) for axis in axes)


def run_axis(args) -> None:
    from kvlab.protocol import RunDone
    from kvlab.quality.report import run_report

    print("| model | backend | residual_length | axis | mean KL | top-1 | PPL ratio | cache vs dense |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        loaded = load_model(ModelSpec(source=model))
        name = loaded.name
        print(f"{name}: transformers' HQQQuantizedLayer, int4, axis 1, residual 0: {upstream_axis1(loaded)}",
              file=sys.stderr, flush=True)
        ids = text_ids(loaded, args.context_tokens + args.scored_tokens)
        events = run_report(loaded, ids, axis_columns(), scored_tokens=args.scored_tokens,
                            context_tokens=args.context_tokens, progress_every=args.scored_tokens)
        record = next(event.record for event in events if isinstance(event, RunDone))
        for column in record["columns"]:
            spec, figures = column["spec"], column["figures"]
            head = f"| {name} | {spec['backend']} | {spec['residual_length']} | {spec['axis_key']} |"
            if column["status"] == "error":
                print(f"{head} refused: {column['message']} | | | |", flush=True)
                continue
            print(f"{head} {figures['kld_mean']:.4f} | {figures['same_top']:.3f} | {figures['ppl_ratio']:.3f} | "
                  f"{figures['bytes_vs_dense']:.3f} |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    kl = sub.add_parser("kl")
    kl.add_argument("--model", default="bundled")
    kl.add_argument("--strategies", default=KL_DEFAULT)
    kl.add_argument("--prefill", type=int, default=64)
    kl.add_argument("--tokens", type=int, default=1000)
    kl.add_argument("--json")
    gemma = sub.add_parser("gemma")
    gemma.add_argument("--model", default="bundled:gemma-3-270m")
    gemma.add_argument("--strategies", default="quantized:backend=quanto:nbits=4,rotation_quantized,"
                                               "rotation_quantized:key_bits=4:value_bits=2,quantized:backend=fp8")
    gemma.add_argument("--prompt-tokens", type=int, default=4000)
    gemma.add_argument("--plan-tokens", type=int, default=32768)
    distortion = sub.add_parser("distortion")
    distortion.add_argument("--model", default="bundled")
    distortion.add_argument("--strategies", default=DISTORTION_DEFAULT)
    distortion.add_argument("--tokens", type=int, default=2048)
    vllm_bytes = sub.add_parser("vllm-bytes")
    vllm_bytes.add_argument("--model", default="bundled")
    vllm_bytes.add_argument("--strategies", default=VLLM_BYTES_DEFAULT)
    vllm_bytes.add_argument("--tokens", type=int, default=400)
    axis = sub.add_parser("axis")
    axis.add_argument("--models", default="bundled,bundled:gemma-3-270m")
    axis.add_argument("--context-tokens", type=int, default=768)
    axis.add_argument("--scored-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    {"kl": run_kl, "gemma": run_gemma, "distortion": run_distortion, "vllm-bytes": run_vllm_bytes,
     "axis": run_axis}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
