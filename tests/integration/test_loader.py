"""The app's background loader: the log lines a server operator reads (model ready, load failed) and the
ready file a launching process watches (kvlab.models.readiness)."""

import logging

import pytest

from kvlab.models import readiness
from kvlab.models.loading import ModelLoadError, ModelPool, ModelSpec, prepare_bundled_model
from kvlab.ui.shared.loader import BackgroundLoader


def test_loader_logs_ready_and_failure(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="kvlab.ui.shared.loader")
    ready_file = tmp_path / "ready.jsonl"
    monkeypatch.setenv(readiness.READY_FILE_ENV, str(ready_file))
    loader = BackgroundLoader(ModelPool())
    good = ModelSpec(source=str(prepare_bundled_model()), device="cpu")
    bad = ModelSpec(source=str(tmp_path), device="cpu")
    loader.start(good)
    assert loader.get(good).model.config.num_hidden_layers == 30
    with pytest.raises(ModelLoadError, match="no config.json"):
        loader.get(bad)
    ready = [r for r in caplog.records if r.getMessage().startswith("model ready: ")]
    failed = [r for r in caplog.records if r.getMessage().startswith("model load failed: ")]
    assert len(ready) == 1 and ready[0].levelno == logging.INFO
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING
    assert "no config.json" in failed[0].getMessage()
    assert loader.status(good).state == "ready" and loader.status(bad).state == "error"
    announced = readiness.read_announcements(ready_file)
    assert [a["state"] for a in announced] == ["ready", "error"]
    assert announced[0]["name"] == loader.get(good).name and announced[0]["load_s"] > 0
    assert announced[1]["name"] == str(tmp_path) and "no config.json" in announced[1]["message"]
