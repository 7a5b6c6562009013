"""A hybrid model (Gemma 3 layout: sliding and full-attention layers alternating) built tiny and random in the
test: a sliding layer's window is never mistaken for the cache's capacity, and what kvlab reads from a cache
(capacity, length, croppability) is read per layer type."""

import dataclasses

import pytest
import torch

from kvlab.chat.reuse import held_tokens
from kvlab.chat.session import ChatSession, ChatTurnDone
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.generation import GenerationSettings
from kvlab.strategies import make_strategy

WINDOW = 16
SETTINGS = GenerationSettings(max_new_tokens=6, stop_at_eos=False, fidelity=False)


@pytest.fixture
def hybrid(tiny_hybrid):
    return tiny_hybrid


def chat(loaded, spec):
    return ChatSession(loaded, make_strategy(spec), dataclasses.replace(SETTINGS))


def test_a_sliding_window_chat_has_no_capacity_limit_and_replies_like_dynamic(hybrid):
    sliding, dynamic = chat(hybrid, {"strategy": "sliding_window"}), chat(hybrid, {"strategy": "dynamic"})
    assert sliding.capacity() is None
    for text in ["Tell me a long story about a garden and its compost heap", "And then?", "Go on, please"]:
        replies = []
        for session in (sliding, dynamic):
            events = list(session.send(text, baseline=False))
            done = [e.stats for e in events if isinstance(e, ChatTurnDone)]
            assert done, events[-1]
            replies.append(done[0].reply_ids)
        assert replies[0] == replies[1]
        assert held_tokens(sliding.cache) == len(sliding.cached_ids) > WINDOW
    sliding_layers = [layer for layer in sliding.cache.layers if layer.is_sliding]
    assert sliding_layers and all(layer.keys.shape[-2] < WINDOW for layer in sliding_layers)


def test_a_static_cache_on_a_hybrid_model_is_as_large_as_its_full_layers(hybrid):
    static = make_strategy({"strategy": "static", "max_cache_len": 40})
    cache = static.build_cache(hybrid, 40)
    assert static.capacity(40) == 40 and int(cache.get_max_length()) == 40
    session = chat(hybrid, {"strategy": "static", "max_cache_len": 40})
    assert session.capacity() == 40


def test_compare_on_a_hybrid_model_gives_the_same_tokens_for_exact_caches(hybrid):
    prompt = torch.randint(5, 1000, (1, 2 * WINDOW), generator=torch.Generator().manual_seed(3))
    columns = [{"strategy": "dynamic"}, {"strategy": "sliding_window"}, {"strategy": "static"},
               {"strategy": "no_cache"}, {"strategy": "dynamic", "layer_types": "full"}]
    results = collect(run_compare(hybrid, prompt, columns, SETTINGS)).results
    assert [r.status for r in results] == ["ok"] * 5, [r.message for r in results]
    assert len({tuple(r.token_ids) for r in results}) == 1
    dynamic, sliding, _, _, all_full = results
    assert dynamic.cache_bytes == sliding.cache_bytes
    assert sliding.peak_cache_bytes < all_full.peak_cache_bytes
    assert [r.keeps_everything for r in results] == [False, False, False, False, True]


def test_bytes_by_layer_type_sum_to_the_total_and_sliding_layers_stop_at_their_window(hybrid):
    """Per step: the layer types add up to the total; full layers equal the dense prediction to the byte;
    sliding layers equal it plus transformers' 8-byte window tensor per layer, and are flat once full."""
    prompt = torch.randint(5, 1000, (1, WINDOW // 2), generator=torch.Generator().manual_seed(4))
    settings = dataclasses.replace(SETTINGS, max_new_tokens=2 * WINDOW)
    result = collect(run_compare(hybrid, prompt, [{"strategy": "dynamic"}], settings)).results[0]
    by_type, predicted = result.cache_bytes_by_layer_type, result.predicted_cache_bytes_by_layer_type
    assert set(by_type) == {"full_attention", "sliding_attention"}
    for step, total in enumerate(result.cache_bytes):
        assert by_type["full_attention"][step] + by_type["sliding_attention"][step] == total
        assert by_type["full_attention"][step] == predicted["full_attention"][step]
        assert by_type["sliding_attention"][step] == predicted["sliding_attention"][step] + 2 * 8
    per_token = 2 * 1 * 32 * 4  # K+V, 1 KV head, head_dim 32, float32: bytes per token per layer
    assert max(by_type["sliding_attention"]) == 2 * (per_token * (WINDOW - 1) + 8)
    assert by_type["sliding_attention"][-WINDOW:] == [max(by_type["sliding_attention"])] * WINDOW
    assert by_type["full_attention"][-1] == 2 * per_token * (WINDOW // 2 + 2 * WINDOW - 1)


def test_columns_say_what_they_keep_on_a_hybrid_model(hybrid, tiny):
    keeps = {spec: make_strategy({"strategy": spec}).keeps_on(hybrid) for spec in ("dynamic", "static", "no_cache")}
    assert keeps["dynamic"] == "2 sliding layers keep their last 15 tokens (window 16); 2 full layers keep every token"
    assert keeps["static"] == "2 sliding layers keep their last 16 tokens (window 16); 2 full layers keep every token"
    assert keeps["no_cache"] == "keeps nothing"
    assert "every token on all 4 layers" in make_strategy({"strategy": "dynamic", "layer_types": "full"}).keeps_on(hybrid)
    assert make_strategy({"strategy": "dynamic"}).keeps_on(tiny) == ""


def test_a_chat_past_the_window_rebuilds_instead_of_cropping_a_sliding_cache(hybrid):
    session = chat(hybrid, {"strategy": "dynamic"})
    list(session.send("Tell me a long story about a garden and its compost heap", baseline=False))
    assert len(session.cached_ids) >= WINDOW
    assert not session.strategy.can_crop(hybrid, session.cache, len(session.cached_ids))
    assert session.undo()
    events = list(session.send("A shorter question", baseline=False))
    done = [e.stats for e in events if isinstance(e, ChatTurnDone)]
    assert done and done[0].action == "rebuild" and "sliding layers" in done[0].note


def test_quantized_runs_on_the_full_layers_and_sink_is_refused_on_sliding_layers(hybrid):
    """transformers refuses QuantizedCache here; kvlab quantizes the full-attention layers and keeps the sliding
    layers' window, so after a prompt longer than the window the sliding layers hold what dynamic's do."""
    prompt = torch.randint(5, 1000, (1, 2 * WINDOW), generator=torch.Generator().manual_seed(6))
    columns = [{"strategy": "quantized", "q_group_size": 32, "residual_length": 4},
               {"strategy": "rotation_quantized", "residual_length": 4}, {"strategy": "sink"}, {"strategy": "dynamic"}]
    quantized, rotation, sink, dynamic = collect(run_compare(hybrid, prompt, columns, SETTINGS)).results
    assert [quantized.status, rotation.status, dynamic.status] == ["ok"] * 3, [quantized.message, rotation.message]
    assert sink.status == "unavailable" and "sliding_attention" in sink.message
    for result in (quantized, rotation):
        by_type = result.cache_bytes_by_layer_type
        assert by_type["sliding_attention"] == dynamic.cache_bytes_by_layer_type["sliding_attention"]
        assert by_type["full_attention"][-1] < dynamic.cache_bytes_by_layer_type["full_attention"][-1] / 2
        assert "2 sliding layers keep their last 15 tokens" in result.keeps


def test_the_summary_and_csv_split_the_cache_by_layer_type(hybrid):
    from kvlab.compare.summary import format_table, rows_to_csv, summary_rows

    settings = dataclasses.replace(SETTINGS, max_new_tokens=WINDOW)
    results = collect(run_compare(hybrid, torch.tensor([[1, 400, 401, 402]]), [{"strategy": "dynamic"}],
                                  settings)).results
    row = summary_rows(results)[0]
    assert row["cache_bytes_by_layer_type"] == {kind: values[-1]
                                                for kind, values in results[0].cache_bytes_by_layer_type.items()}
    assert "cache by layer type" in format_table([row]) and "sliding_attention" not in format_table([row])
    assert f"full={row['cache_bytes_by_layer_type']['full_attention']};sliding=" in rows_to_csv([row])
    assert "2 sliding layers keep their last 15 tokens" in row["note"]


def test_perplexity_with_the_models_own_window_equals_keeping_everything(hybrid):
    """The sliding layers never attend past their window, so dropping what lies beyond it changes nothing."""
    from kvlab.quality.perplexity import perplexity_columns, refusals, run_perplexity
    from kvlab.quality.report import TokenScored

    ids = torch.randint(5, 1000, (1, 3 * WINDOW), generator=torch.Generator().manual_seed(5))
    columns = perplexity_columns("dynamic:layer_types=full,sliding_window")
    assert refusals(hybrid, columns, ids.shape[1]) == {}
    names = [column.describe() for column in columns]
    nll, size = {name: [] for name in names}, {name: [] for name in names}
    for event in run_perplexity(hybrid, ids, columns):
        if isinstance(event, TokenScored):
            nll[names[event.column]].append(event.nll)
            size[names[event.column]].append(event.cache_bytes)
    assert nll["sliding_window"] == pytest.approx(nll["dynamic all-full"], abs=1e-5)
    per_layer_token = 2 * 1 * 32 * 4
    growth = {name: values[-1] - values[-2] for name, values in size.items()}
    assert growth == {"dynamic all-full": 4 * per_layer_token, "sliding_window": 2 * per_layer_token}


def test_a_base_model_chat_joins_the_turns_as_plain_text_and_says_so(hybrid):
    import copy

    base = dataclasses.replace(hybrid, tokenizer=copy.deepcopy(hybrid.tokenizer))
    base.tokenizer.chat_template = None
    session = chat(base, {"strategy": "dynamic"})
    for text in ("Hello there", "And then?"):
        done = [e.stats for e in session.send(text, baseline=False) if isinstance(e, ChatTurnDone)]
        assert done and done[0].note.startswith("base model (no chat template): the conversation is joined")
    assert session.input_ids()[:3] == base.tokenizer("User: Hello there")["input_ids"][:3]



def test_the_budget_check_predicts_every_step_of_a_hybrid_cache_to_the_byte(hybrid):
    """A dynamic cache built from the config stops growing on its sliding layers once their window is full;
    the budget check's prediction for the next step, made per layer, equals the bytes measured after it."""
    from kvlab.budget import ResilientSteps, parse_budget
    from kvlab.engine import Decoder

    strategy = make_strategy({"strategy": "dynamic"})
    settings = dataclasses.replace(SETTINGS, max_new_tokens=30)
    prompt = torch.tensor([[1] + list(range(400, 410))])
    max_total = prompt.shape[1] + settings.max_new_tokens
    decoder = Decoder(hybrid, strategy, strategy.build_cache(hybrid, max_total), prompt, settings,
                      measure_bytes=True)
    steps = ResilientSteps(hybrid, decoder, parse_budget(budget_mib=1024), max_total)
    predicted, measured = [], []
    for _ in range(settings.max_new_tokens):
        predicted.append(steps.predicted_bytes())
        measured.append(next(steps).cache_bytes)
    assert predicted == measured
    growth = [b - a for a, b in zip(measured, measured[1:])]
    assert growth[-1] < growth[1], "past the window only the full layers grow"


def test_a_budget_whose_fallbacks_cannot_run_here_says_so_when_the_column_starts(hybrid):
    """On a hybrid model the default chain's quantized and sink caches are refused: the page learns it from the
    column's first event, not only from the summary."""
    from kvlab.compare.events import ColumnStarted
    from kvlab.ui.compare.view import RunView

    events = list(run_compare(hybrid, torch.tensor([[1, 400, 401]]),
                              [{"strategy": "dynamic", "budget_mib": 1}, {"strategy": "dynamic"}], SETTINGS))
    started = {e.column: e for e in events if isinstance(e, ColumnStarted)}
    assert "quantized" in started[0].note and "left out of the fallback chain" in started[0].note
    assert "sink" in started[0].note and "no fallback can run on this model" in started[0].note
    assert started[1].note == ""  # no budget: nothing to say
    view = RunView(["dynamic budget", "dynamic"])
    view.apply(started[0])
    assert view.columns[0].status == "running" and "no fallback can run on this model" in view.columns[0].status_text()
    done = events[-1]
    assert done.results[0].status == "ok" and "no fallback can run on this model" in done.results[0].message
