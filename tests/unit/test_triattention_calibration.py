"""TriAttention's calibration (`kvlab.eviction.calibration`): the query centres are the means of the layer's own
pre-RoPE queries over the shipped text, cached per model in memory and in one file per model under kvlab's cache
folder, written atomically; a damaged file or another model's weights are computed again; the cost is in the
column's note and the report's record."""

import copy
import os
from pathlib import Path

import pytest
import torch

from kvlab.eviction import calibration
from kvlab.eviction.calibration import calibrate, calibration_file, clear_memory, model_key, query_centres
from kvlab.models import atomic

TOKENS = 300


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """kvlab's cache folder in a test folder, short calibrations and no calibration held in memory."""
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibration, "CALIBRATION_TOKENS", TOKENS)
    monkeypatch.setattr(calibration, "CHUNK_TOKENS", 128)
    clear_memory()
    yield tmp_path / calibration.FOLDER
    clear_memory()


@pytest.fixture
def counted(monkeypatch):
    """How many times a calibration was computed."""
    calls = []
    real = calibration.calibrate

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(calibration, "calibrate", counting)
    return calls


def test_the_centres_are_the_mean_pre_rope_queries_of_the_text(tiny, folder):
    """By hand: one forward over the text's last tokens, q_proj's output per head split into complex pairs, averaged (the
    calibration feeds them in chunks of 128 through a cache; the queries are the same)."""
    ids = tiny.tokenizer(calibration.calibration_text()[1], return_tensors="pt").input_ids[:, -TOKENS:]
    captured = {}
    layers = tiny.model.model.layers
    handles = [layer.self_attn.q_proj.register_forward_hook(
        lambda module, args, out, i=i: captured.__setitem__(i, out.detach())) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            tiny.model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    centres = calibrate(tiny.model, tiny.tokenizer)
    assert centres.tokens == TOKENS and centres.seconds > 0 and centres.text == "python_reference.txt"
    heads, head_dim = tiny.config.num_attention_heads, tiny.config.head_dim
    for i, layer in centres.layers.items():
        q = captured[i][0].double().view(TOKENS, heads, head_dim)
        pairs = torch.complex(q[..., :head_dim // 2], q[..., head_dim // 2:])
        torch.testing.assert_close(layer.q_mean, pairs.mean(0), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(layer.q_abs_mean, pairs.abs().mean(0), rtol=1e-4, atol=1e-6)
        assert torch.equal(layer.omega, tiny.model.model.rotary_emb.inv_freq.double())
        assert layer.scale_sq.tolist() == [1.0] * (head_dim // 2)
    assert sorted(centres.layers) == [0, 1]


def test_a_calibration_is_computed_once_then_read_from_memory_then_from_its_file(tiny, folder, counted):
    first = query_centres(tiny.model, tiny.tokenizer)
    assert first.origin == "computed" and first.saved == "" and len(counted) == 1
    path = calibration_file(first.key)
    assert path.parent == folder and path.is_file()
    assert sorted(p.name for p in folder.iterdir()) == [path.name]  # no temporary file left behind
    again = query_centres(tiny.model, tiny.tokenizer)
    assert again.origin == "memory" and len(counted) == 1
    clear_memory()
    read = query_centres(tiny.model, tiny.tokenizer)
    assert read.origin == "disk" and len(counted) == 1
    assert (read.tokens, read.seconds, read.key) == (first.tokens, first.seconds, first.key)
    for i, layer in first.layers.items():
        assert torch.equal(read.layers[i].q_mean, layer.q_mean) and torch.equal(read.layers[i].omega, layer.omega)
    assert "300 tokens of python_reference.txt" in read.note() and "read from kvlab's cache folder" in read.note()
    assert f"{first.seconds:.1f} s to compute" in first.note()


def test_another_models_weights_get_their_own_calibration(tiny, folder, counted):
    assert model_key(copy.deepcopy(tiny.model)) == model_key(tiny.model)  # the same weights: the same key
    other = copy.deepcopy(tiny.model)
    with torch.no_grad():
        other.model.layers[1].mlp.down_proj.weight.mul_(1.5)  # layer 1's queries do not change, the model does
    assert model_key(other) != model_key(tiny.model)
    query_centres(tiny.model, tiny.tokenizer)
    query_centres(other, tiny.tokenizer)
    assert len(counted) == 2 and len(list(folder.iterdir())) == 2


def test_a_damaged_file_is_computed_again_and_replaced(tiny, folder, counted):
    key = query_centres(tiny.model, tiny.tokenizer).key
    calibration_file(key).write_bytes(b"not a torch file")
    clear_memory()
    again = query_centres(tiny.model, tiny.tokenizer)
    assert again.origin == "computed" and len(counted) == 2
    clear_memory()
    assert query_centres(tiny.model, tiny.tokenizer).origin == "disk"


def test_the_file_is_written_atomically(tiny, folder, monkeypatch):
    """A write that fails half-way leaves the previous file whole and no temporary file; the calibration is kept in
    memory and its note says it was not saved."""
    first = query_centres(tiny.model, tiny.tokenizer)
    path = calibration_file(first.key)
    before = path.read_bytes()

    def disk_full(handle):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", disk_full)  # the temporary file is written, then its flush fails
    assert calibration.save(first) == "No space left on device"
    assert path.read_bytes() == before and sorted(p.name for p in folder.iterdir()) == [path.name]
    clear_memory()
    path.unlink()
    unsaved = query_centres(tiny.model, tiny.tokenizer)
    assert unsaved.origin == "computed" and unsaved.saved == "No space left on device"
    assert "(not saved: No space left on device)" in unsaved.note() and not path.exists()
    assert query_centres(tiny.model, tiny.tokenizer).origin == "memory"


def test_a_cache_folder_that_cannot_be_written_keeps_the_calibration_in_memory(tiny, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(blocker))
    monkeypatch.setattr(calibration, "CALIBRATION_TOKENS", TOKENS)
    clear_memory()
    try:
        centres = query_centres(tiny.model, tiny.tokenizer)
    finally:
        clear_memory()
    assert centres.saved and "not saved" in centres.note() and os.path.isfile(blocker)


def test_the_column_note_and_the_report_record_show_the_calibrations_cost(tiny, folder):
    from kvlab.protocol import RunDone
    from kvlab.quality.report import run_report
    from kvlab.strategies import make_strategy

    strategy = make_strategy({"strategy": "triattention", "budget": 4, "beta": 2})
    assert strategy.runtime_note() == ""
    strategy.build_cache(tiny, 64)
    assert "300 tokens of python_reference.txt" in strategy.runtime_note() and " s to compute" in strategy.runtime_note()
    ids = torch.arange(10, 50)
    events = list(run_report(tiny, ids, "triattention:budget=4:beta=2,knorm", scored_tokens=16, warm_up=False))
    record = next(e for e in events if isinstance(e, RunDone)).record
    tri, knorm = record["columns"]
    assert tri["status"] == "ok" and "300 tokens of python_reference.txt" in tri["note"] and "note" not in knorm


def test_the_folder_unit_tests_may_write_is_the_calibrations():
    """tests/conftest.py lets unit tests leave calibration files in their cache folder, and names that folder
    without importing kvlab: the two names must agree."""
    conftest = (Path(__file__).resolve().parents[1] / "conftest.py").read_text(encoding="utf-8")
    assert f'CALIBRATION_FOLDER = "{calibration.FOLDER}"' in conftest
