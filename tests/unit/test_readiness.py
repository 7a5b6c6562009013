"""kvlab.models.readiness: the ready file a launching process watches (one JSON line per finished load)."""

import logging

import pytest

from kvlab.models import readiness


@pytest.fixture(autouse=True)
def fresh_failure_flag():
    readiness._write_failed.clear()
    yield
    readiness._write_failed.clear()


def test_nothing_is_written_without_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(readiness.READY_FILE_ENV, raising=False)
    assert readiness.ready_file() is None
    assert readiness.announce("ready", name="m", load_s=1.0) is False
    monkeypatch.setenv(readiness.READY_FILE_ENV, "")
    assert readiness.announce("ready", name="m") is False
    assert list(tmp_path.iterdir()) == []


def test_lines_are_appended_and_read_back(monkeypatch, tmp_path):
    path = tmp_path / "ready.jsonl"
    monkeypatch.setenv(readiness.READY_FILE_ENV, str(path))
    assert readiness.announce("ready", name="SmolLM2", load_s=2.5)
    assert readiness.announce("error", name="bad/model", message="no config.json")
    first, second = readiness.read_announcements(path)
    assert set(first) == {"state", "name", "load_s", "message", "time"}
    assert (first["state"], first["name"], first["load_s"], first["message"]) == ("ready", "SmolLM2", 2.5, "")
    assert (second["state"], second["name"], second["load_s"]) == ("error", "bad/model", None)
    assert second["message"] == "no config.json"
    assert first["time"] <= second["time"]


def test_partial_and_foreign_lines_are_skipped(tmp_path):
    path = tmp_path / "ready.jsonl"
    assert readiness.read_announcements(path) == []
    path.write_text('not json\n["a list"]\n{"state": "loading"}\n{"state": "ready", "name": "m"}\n{"state": "err')
    assert readiness.read_announcements(path) == [{"state": "ready", "name": "m"}]


def test_a_write_failure_is_logged_once_and_never_raised(monkeypatch, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kvlab.models.readiness")
    monkeypatch.setenv(readiness.READY_FILE_ENV, str(tmp_path / "missing-folder" / "ready.jsonl"))
    assert readiness.announce("ready", name="m") is False
    assert readiness.announce("error", name="m", message="x") is False
    warnings = [r for r in caplog.records if r.name == "kvlab.models.readiness"]
    assert len(warnings) == 1 and readiness.READY_FILE_ENV in warnings[0].getMessage()


def test_an_unknown_state_is_a_programming_error(monkeypatch, tmp_path):
    monkeypatch.setenv(readiness.READY_FILE_ENV, str(tmp_path / "ready.jsonl"))
    with pytest.raises(ValueError, match="state must be one of"):
        readiness.announce("loading")
    assert not (tmp_path / "ready.jsonl").exists()
