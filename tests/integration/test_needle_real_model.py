"""The needle grid on the real bundled model (SmolLM2-135M-Instruct, fp32, CPU), with few short cells.

Checks: a record's cells re-run with plain transformers (`generate()`, greedy, the recorded prompt text) give
the recorded answers; a sink cache with a 128-token window finds the key when the needle lies inside its
window and loses a key that lies outside it, where the dense cache finds it.
"""

import json

import pytest
import torch
from transformers import AutoTokenizer

from kvlab.models.loading import converted_bundled_folder
from kvlab.needle.grid import parse_grid
from kvlab.needle.record import load_record
from kvlab.needle.runner import run_needle
from kvlab.protocol import RunDone

LENGTH = 320
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def record(bundled, tmp_path_factory):
    grid = parse_grid(str(LENGTH), "0,0.9", "0", NEW_TOKENS)
    specs = [{"strategy": "dynamic"}, {"strategy": "sink", "window_length": 128, "num_sink_tokens": 4}]
    done = [e for e in run_needle(bundled, specs, grid)][-1]
    assert isinstance(done, RunDone)
    path = tmp_path_factory.mktemp("needle") / "record.json"
    path.write_text(json.dumps(done.record))
    return path


def test_two_cells_rerun_with_plain_transformers_give_the_recorded_answers(bundled, record):
    data, cells = load_record(record)
    tokenizer = AutoTokenizer.from_pretrained(converted_bundled_folder())
    dense = [c for c in cells if c.column == 0]
    assert len(dense) == 2
    for cell in dense:
        ids = tokenizer(cell.prompt_text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        assert ids[0].tolist() == cell.prompt_ids and ids.shape[1] == cell.context_tokens
        with torch.inference_mode():
            out = bundled.model.generate(ids, max_new_tokens=data["grid"]["new_tokens"], do_sample=False)
        answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        assert answer == cell.answer_text and (cell.key in answer) == cell.hit


def test_sink_window_keeps_a_key_inside_it_and_loses_one_outside(record):
    _, cells = load_record(record)
    by = {(c.column, c.depth): c for c in cells}
    assert by[(0, 0.0)].hit and by[(0, 0.9)].hit
    inside, outside = by[(1, 0.9)], by[(1, 0.0)]
    assert inside.context_tokens - inside.key_position < 124 < outside.context_tokens - outside.key_position
    assert inside.hit and not outside.hit
    assert outside.key_logprob < inside.key_logprob
    assert by[(1, 0.0)].cache_bytes < by[(0, 0.0)].cache_bytes
