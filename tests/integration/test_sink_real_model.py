"""The attention-sink cache on the real bundled model (SmolLM2-135M-Instruct, fp32, CPU).

Checks: exact agreement with the dense cache while everything fits the window;
constant cache bytes over a long generation; and the paper's finding (Xiao et
al. 2023, arXiv:2309.17453) that keeping 4 sink tokens keeps perplexity low once
the window slides, where plain window attention degrades.
"""

import math

import pytest
import torch
from transformers import DynamicCache

from kvlab.accounting import bytes_per_token, cache_bytes
from kvlab.caches.sink import SinkCache
from kvlab.quality.defaults import shipped_text
from kvlab.quality.perplexity import perplexity_columns, ppl_by_segment, run_perplexity
from kvlab.quality.report import TokenScored

PPL_TOKENS = 320
PPL_WINDOW = 64
SINKS = 4
CURVE_TOKENS = 96
CURVE_WINDOW = 32


@pytest.fixture(scope="module")
def real(bundled):
    return bundled.model, bundled.tokenizer


def prompt_ids(tokenizer, text):
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                         return_dict=True)["input_ids"]


def greedy(model, prompt, new_tokens, cache, after_step=None):
    """Manual greedy decode with the model's default positions; returns the new token ids."""
    logits = model(input_ids=prompt, cache=cache, use_cache=True).logits[:, -1]
    tokens = []
    for _ in range(new_tokens):
        tokens.append(int(logits.argmax(-1)))
        if after_step is not None:
            after_step(cache)
        logits = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True).logits[:, -1]
    return tokens


@torch.inference_mode()
def test_sink_equals_dynamic_while_under_window(real):
    model, tokenizer = real
    prompt = prompt_ids(tokenizer, "Name three uses of a paperclip.")
    new_tokens, window = 40, 128
    assert prompt.shape[-1] + new_tokens < window

    dense = greedy(model, prompt, new_tokens, DynamicCache(config=model.config))
    sink = greedy(model, prompt, new_tokens, SinkCache.from_model(model, window, SINKS))

    print(f"\n{tokenizer.decode(sink)!r}")
    assert sink == dense


@torch.inference_mode()
def test_long_generation_keeps_cache_bytes_constant(real):
    model, tokenizer = real
    window, new_tokens = 64, 200
    prompt = prompt_ids(tokenizer, "Write a long story about a lighthouse keeper.")
    cache = SinkCache.from_model(model, window, SINKS)
    sizes = []

    tokens = greedy(model, prompt, new_tokens, cache,
                    after_step=lambda c: sizes.append((c.get_seq_length(), cache_bytes(c))))

    full = bytes_per_token(model.config, torch.float32) * window
    first_full = window - prompt.shape[-1]
    assert sizes[first_full - 1][0] < window
    assert set(sizes[first_full:]) == {(window, full)}
    assert cache.seen_tokens == prompt.shape[-1] + new_tokens
    assert cache.evicted_tokens == cache.seen_tokens - window
    assert len(set(tokens)) > 20, "the continuation should be text, not a stuck token"
    print(f"\ncache bytes held from token {first_full}: {full:,} (window {window}, {SINKS} sinks)")


@torch.inference_mode()
@pytest.mark.slow  # a long check: `make test-slow` runs it, CI leaves it out (its time budget)
def test_sinks_keep_perplexity_low_after_the_window_slides(bundled):
    model, tokenizer = bundled.model, bundled.tokenizer
    from pydoc_data.topics import topics

    text = "\n".join(topics.values())
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :PPL_TOKENS]
    assert ids.shape[-1] == PPL_TOKENS

    log_probs = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
    dense = (-log_probs.gather(-1, ids[0, 1:, None])[:, 0]).tolist()
    curves = nll_curves(bundled, ids, "window,sink", PPL_WINDOW)
    window, sink = curves[f"window {PPL_WINDOW}"], curves[f"sink {SINKS}+{PPL_WINDOW - SINKS}"]

    # Until the window is full nothing is evicted: all three score the same tokens alike.
    assert sink[:PPL_WINDOW - 1] == pytest.approx(dense[:PPL_WINDOW - 1], abs=2e-3)
    assert window[:PPL_WINDOW - 1] == pytest.approx(dense[:PPL_WINDOW - 1], abs=2e-3)

    late = slice(2 * PPL_WINDOW, None)
    means = {name: sum(nll[late]) / len(nll[late]) for name, nll in
             (("dense", dense), ("window", window), ("sink", sink))}
    print(f"\nmean NLL (nats) over tokens {2 * PPL_WINDOW + 1}..{PPL_TOKENS - 1}, window {PPL_WINDOW}: "
          + ", ".join(f"{k} {v:.3f} (ppl {math.exp(v):.2f})" for k, v in means.items()))
    for name, nll in (("dense", dense), ("window", window), ("sink", sink)):
        print(f"{name:>6} ppl by {PPL_WINDOW}-token segment: "
              + " ".join(f"{s['ppl']:.2f}" for s in ppl_by_segment(nll, PPL_WINDOW)))

    assert means["sink"] < means["window"]


def nll_curves(loaded, ids, specs: str, window: int) -> dict[str, list[float]]:
    """Each column's per-token NLL curve from the Perplexity view (`run_perplexity`)."""
    columns = perplexity_columns(specs, window, SINKS)
    names = [column.describe() for column in columns]
    curves = {name: [] for name in names}
    for event in run_perplexity(loaded, ids, columns):
        if isinstance(event, TokenScored):
            curves[names[event.column]].append(event.nll)
    return curves


@torch.inference_mode()
def streamed_by_hand(loaded, ids, strategy) -> list[float]:
    """The StreamingLLM loop written out: token p predicted from a fresh cache fed tokens 0..p-1 one at a time."""
    cache, nll = strategy.build_cache(loaded, ids.shape[1]), []
    for position in range(1, ids.shape[1]):
        logits = strategy.forward(loaded, cache, ids[:, :position], 1)
        nll.append(-float(torch.log_softmax(logits[0].float(), dim=-1)[ids[0, position]]))
    return nll


@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_the_perplexity_view_is_the_streaming_loop_token_for_token_on_the_real_model(bundled):
    """The report with a one-token context gives, bit for bit, the NLL the token-by-token loop gives (it replaced
    one that did exactly that), for dense, window attention and attention sinks."""
    ids = bundled.tokenizer(shipped_text()[:CURVE_TOKENS * 12], return_tensors="pt")["input_ids"][:, :CURVE_TOKENS]
    assert ids.shape[1] == CURVE_TOKENS
    columns = perplexity_columns("dynamic,window,sink", CURVE_WINDOW, SINKS)
    curves = nll_curves(bundled, ids, "dynamic,window,sink", CURVE_WINDOW)
    for column in columns:
        assert curves[column.describe()] == streamed_by_hand(bundled, ids, column.strategy), column.describe()
    late = slice(2 * CURVE_WINDOW, None)
    assert curves[f"window {CURVE_WINDOW}"][late] != curves["dynamic"][late]  # the window did slide
