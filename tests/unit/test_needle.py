"""The needle wing on the tiny model: prompt building, grid limits, one cell's scores, the grid runner, records."""

import dataclasses
import functools
import json
import threading

import pytest
import torch

from kvlab.engine import Decoder, score_continuation
from kvlab.generation import GenerationSettings
from kvlab.needle.cell import run_cell
from kvlab.needle.grid import MAX_CELLS, GridError, parse_grid, parse_tokens
from kvlab.needle.prompt import (ANSWER_PREFIX, INSTRUCTION, build_passkey_prompt, key_tokens, min_context_tokens,
                                 passkey_for)
from kvlab.needle.record import (CSV_FIELDS, CellRecord, load_record, records_to_csv, reproduce_snippet,
                                 summarize)
from kvlab.needle.runner import NeedleCell, run_needle
from kvlab.protocol import ColumnFailed, RunDone, RunStarted
from kvlab.strategies import make_strategy


def test_prompt_fits_its_length_puts_the_needle_at_its_depth_and_tokenizes_the_key_after_it(tiny_tokenizer):
    shallow = build_passkey_prompt(tiny_tokenizer, 300, 0.0, seed=1)
    deep = build_passkey_prompt(tiny_tokenizer, 300, 1.0, seed=1)
    assert 250 < shallow.context_tokens <= 300 and 250 < deep.context_tokens <= 300
    instruction = len(tiny_tokenizer(INSTRUCTION, add_special_tokens=False)["input_ids"])
    assert shallow.key_position == instruction and deep.tokens_after_key < 60 < deep.key_position - instruction
    assert shallow.text.endswith(ANSWER_PREFIX) and f"The pass key is {shallow.key}." in shallow.text
    ids = tiny_tokenizer(shallow.text + " " + shallow.key, add_special_tokens=False)["input_ids"]
    assert ids == [*shallow.prompt_ids, *shallow.key_ids]
    assert tiny_tokenizer.decode(list(shallow.key_ids)).strip() == shallow.key


def test_seeds_change_the_key_and_the_filler_and_bad_depths_or_lengths_are_refused(tiny_tokenizer):
    assert passkey_for(0) != passkey_for(1) and passkey_for(3) == passkey_for(3)
    a, b = (build_passkey_prompt(tiny_tokenizer, 200, 0.5, seed) for seed in (0, 1))
    assert a.key != b.key and a.text.replace(a.key, "") != b.text.replace(b.key, "")
    with pytest.raises(ValueError, match=r"depth must be in \[0, 1\]"):
        build_passkey_prompt(tiny_tokenizer, 200, 1.5, 0)
    with pytest.raises(ValueError, match="needs at least"):
        build_passkey_prompt(tiny_tokenizer, 10, 0.5, 0)


def test_grid_parses_lengths_and_leaves_out_bad_values_with_a_line_each():
    assert [parse_tokens(t) for t in ("512", "1k", "1.5K")] == [512, 1024, 1536]
    grid = parse_grid("512,1k,9k,abc", "0, 0.5, 2", "0 1", 8, max_positions=8192, min_tokens=100)
    assert grid.lengths == [512, 1024] and grid.depths == [0.0, 0.5] and grid.seeds == [0, 1]
    assert len(grid.cells) == 8 and len(grid.problems) == 3
    assert any("max_position_embeddings" in p for p in grid.problems)
    assert any("outside [0, 1]" in p for p in grid.problems)
    with pytest.raises(GridError, match="the grid is empty: no valid length"):
        parse_grid("", "0.5")
    with pytest.raises(GridError, match=f"more than the {MAX_CELLS}"):
        parse_grid("100", [i / 1000 for i in range(MAX_CELLS + 1)])
    with pytest.raises(GridError, match="new tokens"):
        parse_grid("100", "0", "0", 0)


def test_new_tokens_fewer_than_the_key_takes_are_raised_to_it_with_a_problem_line(tiny_tokenizer):
    prompts = [build_passkey_prompt(tiny_tokenizer, 200, 0.5, seed) for seed in (0, 1, 2)]
    needed = key_tokens(tiny_tokenizer, [0, 1, 2])
    assert needed == max(len(p.key_ids) for p in prompts) > 1
    count = functools.partial(key_tokens, tiny_tokenizer)
    grid = parse_grid("200", "0", "0 1 2", 1, key_tokens=count)
    assert grid.new_tokens == needed
    assert grid.problems == [f"new tokens 1 is fewer than the {needed} tokens the key takes (no cell could hit); "
                             f"raised to {needed}"]
    assert parse_grid("200", "0", "0 1 2", needed, key_tokens=count).problems == []
    with pytest.raises(GridError, match="the key takes 40 tokens"):
        parse_grid("200", "0", "0", 1, key_tokens=lambda seeds: 40)


def _scored(tiny, strategy, prompt):
    rows = score_continuation(tiny, strategy, torch.tensor([list(prompt.prompt_ids)]), list(prompt.key_ids))
    return float(sum(rows[i, t] for i, t in enumerate(prompt.key_ids)))


@pytest.mark.parametrize("spec", [{"strategy": "dynamic"}, {"strategy": "sink", "window_length": 64},
                                  {"strategy": "quantized", "backend": "quanto", "nbits": 2, "residual_length": 2}])
def test_cell_key_logprob_matches_teacher_forced_scoring_whether_or_not_greedy_follows_the_key(tiny, spec):
    strategy = make_strategy(spec)
    prompt = build_passkey_prompt(tiny.tokenizer, 160, 0.5, seed=2)
    missed = run_cell(tiny, strategy, prompt, new_tokens=4)
    assert not missed.hit and missed.key_rank > 1
    settings = GenerationSettings(max_new_tokens=4, stop_at_eos=False, fidelity=False)
    cache = strategy.build_cache(tiny, len(prompt.prompt_ids) + 4)
    decoded = Decoder(tiny, strategy, cache, list(prompt.prompt_ids), settings).run().token_ids
    assert list(missed.answer_ids) == decoded  # the fork left the decoding cache as it was
    assert missed.key_logprob == pytest.approx(_scored(tiny, strategy, prompt), abs=1e-3)
    # A key made of the model's own greedy tokens: the decode's logits are the teacher-forced ones.
    greedy = run_cell(tiny, strategy, prompt, new_tokens=3).answer_ids
    followed = dataclasses.replace(prompt, key_ids=greedy, key=tiny.tokenizer.decode(list(greedy)).strip() or "x")
    for new_tokens in (3, 2):
        outcome = run_cell(tiny, strategy, followed, new_tokens=new_tokens)
        assert outcome.key_logprob == pytest.approx(_scored(tiny, strategy, followed), abs=1e-3)
    assert run_cell(tiny, strategy, followed, new_tokens=3).key_rank == 1
    assert missed.cache_bytes > 0 and missed.prefill_s > 0


def _events(tiny, specs, grid, stop=None):
    return list(run_needle(tiny, specs, grid, stop))


def test_runner_reports_bad_columns_in_their_place_gates_dense_misses_and_records_every_cell(tiny):
    grid = parse_grid("120,160", "0,1", "0", 2, min_tokens=min_context_tokens(tiny.tokenizer))
    specs = [{"strategy": "sink", "window_length": 64}, {"strategy": "dynamic"}, {"strategy": "nope"},
             {"strategy": "offloaded"}]
    events = _events(tiny, specs, grid)
    started, done = events[0], events[-1]
    assert isinstance(started, RunStarted) and started.plan.dense_columns == [1] and isinstance(done, RunDone)
    errors = {e.column: e for e in events if isinstance(e, ColumnFailed)}
    assert set(errors) == {2, 3} and "unknown strategy" in errors[2].message and errors[3].status == "unavailable"
    assert errors[3].name == started.columns[3] == "offloaded"
    cells = [e.record for e in events if isinstance(e, NeedleCell)]
    assert len(cells) == 2 * len(grid.cells) and cells[0].column == 1  # the dense column runs first in a cell
    assert all(r.gated == (not next(d.hit for d in cells if d.column == 1 and d.cell == r.cell)) for r in cells)
    summary = {row["column"]: row for row in done.record["summary"]}
    assert summary[1]["gated"] + summary[1]["hits"] == len(grid.cells)
    assert summary[1]["bytes_vs_dense"] == 1.0 and summary[0]["bytes_vs_dense"] < 1.0
    assert [c["status"] for c in done.record["columns"]] == ["ok", "ok", "error", "unavailable"]


def test_stop_mid_grid_keeps_every_finished_cell(tiny):
    grid = parse_grid("120,160", "0,0.5,1", "0", 2)
    stop = threading.Event()
    seen = []
    for event in run_needle(tiny, [{"strategy": "dynamic"}], grid, stop):
        if isinstance(event, NeedleCell):
            seen.append(event.record)
            if len(seen) == 2:
                stop.set()
    assert isinstance(event, RunDone) and event.stopped
    assert len(event.results) == 2 and [c["seed"] for c in event.record["cells"]] == [0, 0]


def test_record_round_trips_through_json_and_csv_and_its_snippet_names_the_cell(tiny, tmp_path):
    grid = parse_grid("120", "0.5", "0,1", 2)
    done = _events(tiny, [{"strategy": "dynamic"}, {"strategy": "quantized", "backend": "fp8"}], grid)[-1]
    path = tmp_path / "needle.json"
    path.write_text(json.dumps(done.record))
    record, cells = load_record(path)
    assert [c.to_json() for c in cells] == [c.to_json() for c in done.results]
    rows = records_to_csv(cells).splitlines()
    assert rows[0].split(",") == list(CSV_FIELDS) and len(rows) == 1 + len(cells)
    snippet = reproduce_snippet(record, 1, str(path))
    assert "generate(" in snippet and 'record["cells"][1]' in snippet
    compile(snippet, "snippet", "exec")
    with pytest.raises(ValueError, match="not a needle record"):
        (tmp_path / "other.json").write_text("{}")
        load_record(tmp_path / "other.json")


def test_summary_counts_hits_among_cells_not_gated_and_bytes_against_dense():
    def cell(column, depth, hit, size):
        return CellRecord(column, f"c{column}", 100, 100, depth, 0, "12345", 10, "t", [1], hit=hit,
                          key_logprob=-1.0, cache_bytes=size, gated=depth == 1.0)

    records = [cell(0, 0.0, True, 100), cell(0, 1.0, False, 100), cell(1, 0.0, False, 25), cell(1, 1.0, True, 25)]
    rows = summarize(records, ["c0", "c1"], [0])
    assert (rows[0]["hits"], rows[0]["scored"], rows[0]["gated"]) == (1, 1, 1)
    assert (rows[1]["hits"], rows[1]["scored"], rows[1]["bytes_vs_dense"]) == (0, 1, 0.25)


def test_bench_needle_section_times_kvlab_and_bare_generate_on_the_same_cells(tiny):
    from kvlab.bench.harness import SIZES, Context
    from kvlab.bench.needle import bench_needle, needle_lines

    size = dataclasses.replace(next(iter(SIZES.values())), repeats=1)
    section = bench_needle(Context(tiny, size, torch.tensor([[1, 2]]), lambda message: None, None))
    assert section["cells"] == 6 and section["kvlab_s"]["n"] == section["bare_s"]["n"] == 1
    assert section["ratio"]["median"] > 0 and section["checks"][0]["target"] == "<= 1.2"
    assert 0 < section["where_kvlab_time_goes"]["prefill_s"] < section["kvlab_s"]["median"]
    assert "ratio" in needle_lines(section)[1]
