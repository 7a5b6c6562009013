"""TriAttention on the real bundled model (SmolLM2-135M-Instruct, fp32, CPU): a Compare column runs beside dynamic,
agrees with it token for token until its first eviction, holds the prompt + budget (+ the tokens since the last
round) to the byte, and names its calibration; Inspect shows what each layer's KV heads kept. The calibration is
shortened to CALIBRATION_TOKENS here (its own cache entry: the token count is part of the key)."""

import pytest
import torch

from kvlab.accounting import bytes_per_token
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.eviction import calibration
from kvlab.eviction.decoding import held_after
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.compare.preset import load_preset
from kvlab.strategies import make_strategy

CALIBRATION_TOKENS = 512
BUDGET, BETA, NEW_TOKENS = 8, 4, 24


@pytest.fixture(scope="module")
def short_calibration():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calibration, "CALIBRATION_TOKENS", CALIBRATION_TOKENS)
        calibration.clear_memory()
        yield
    calibration.clear_memory()


@pytest.fixture(scope="module")
def prompt(bundled):
    return encode_prompt(bundled.tokenizer, load_preset("eviction").prompt.text, chat=False)


def test_a_compare_column_runs_and_holds_the_prompt_plus_budget(bundled, prompt, short_calibration):
    columns = [{"strategy": "dynamic"}, {"strategy": "triattention", "budget": BUDGET, "beta": BETA}]
    settings = GenerationSettings(max_new_tokens=NEW_TOKENS, stop_at_eos=False, fidelity=False)
    dense, tri = collect(run_compare(bundled, prompt, columns, settings, mode="sequential")).results
    assert dense.status == tri.status == "ok", tri.message
    assert f"{CALIBRATION_TOKENS} tokens of python_reference.txt" in tri.message and "s to compute" in tri.message
    per_token = bytes_per_token(bundled.config, bundled.model.dtype)
    prompt_tokens = prompt.shape[1]
    assert tri.cache_bytes == [held_after(prompt_tokens, fed, BETA, prompt_tokens + BUDGET) * per_token
                               for fed in range(NEW_TOKENS)]
    # the first eviction ends the forward that fed the 12th token (12 decoded > 8): every token before it is dense's
    assert tri.token_ids[:13] == dense.token_ids[:13]
    assert tri.cache_bytes[-1] < dense.cache_bytes[-1]


def test_inspect_shows_the_positions_each_kv_head_kept(bundled, prompt, short_calibration):
    from kvlab.inspect.inspector import InspectSession
    from kvlab.ui.inspect.view import strip_html

    settings = GenerationSettings(max_new_tokens=16, stop_at_eos=False, fidelity=False)
    strategy = make_strategy({"strategy": "triattention", "budget": BUDGET, "beta": BETA,
                              "eviction_mode": "per_layer_perhead"})
    session = InspectSession(bundled, strategy, prompt, settings)
    for _ in range(13):  # the prefill, then 12 tokens fed: one eviction of 12 decoded to 8
        record = session.step()
    prompt_tokens = prompt.shape[1]
    kept = set()
    for row in record.layers:
        assert len(row.head_strips) == bundled.config.num_key_value_heads == 3
        for head, runs in enumerate(row.head_strips):
            assert runs[0][:2] == ("held", 0) and runs[0][2] >= prompt_tokens
            assert sum(stop - start for state, start, stop in runs if state == "evicted") == 4
            assert all(value is not None for value in row.head_scores[head][prompt_tokens:prompt_tokens + 12])
            kept.add(tuple(start for state, start, stop in runs if state == "evicted"))
    assert len(kept) > 1  # per layer and KV head, not one set for all
    page = strip_html(record)
    assert 'data-layers="0-0/2"' in page and "score " in page
    held = session.cache.layers[0].held_positions()
    assert held.shape == (3, prompt_tokens + BUDGET) and torch.equal(held[:, :prompt_tokens],
                                                                      torch.arange(prompt_tokens).expand(3, -1))


@pytest.mark.slow
def test_the_report_scores_triattention_beside_snapkv_at_the_same_bytes(bundled, short_calibration):
    """The Done-when comparison at CI size (docs/strategies.md has the full size, tests/slow the check): SnapKV
    compressing back to context + budget every beta tokens holds exactly TriAttention's bytes at every scored
    token, so their mean KL compares at the same mean bytes; TriAttention is lossy only once it has evicted."""
    from kvlab.quality.defaults import shipped_text
    from kvlab.protocol import RunDone
    from kvlab.quality.report import run_report

    context, scored, budget, beta = 32, 128, 32, 16
    ids = bundled.tokenizer(shipped_text(), return_tensors="pt")["input_ids"][:, :context + scored]
    columns = (f"triattention:budget={budget}:beta={beta},"
               f"snapkv:target_tokens={context + budget}:compress_every={beta}:window_size=8")
    events = list(run_report(bundled, ids, columns, scored_tokens=scored, context_tokens=context, warm_up=False))
    tri, snap = next(e for e in events if isinstance(e, RunDone)).record["columns"]
    assert tri["status"] == snap["status"] == "ok", (tri["message"], snap["message"])
    per_token = bytes_per_token(bundled.config, bundled.model.dtype)
    held = [held_after(context, fed, beta, context + budget) for fed in range(scored)]
    assert tri["figures"]["cache_bytes_mean"] == snap["figures"]["cache_bytes_mean"] == per_token * sum(held) / scored
    assert tri["figures"]["cache_bytes_end"] == per_token * (context + budget + (scored - 1) % beta)
    assert 0 < tri["figures"]["bytes_vs_dense"] < 1 and tri["figures"]["kld_mean"] > 0
    assert "tokens of python_reference.txt" in tri["note"]
