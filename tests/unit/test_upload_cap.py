"""Gradio's own upload limit: `app.launch()` passes the record cap (KVLAB_MAX_RECORD_MB, 16 MiB) to
`launch(max_file_size=...)`, so gradio refuses a larger upload before storing it; a bad setting stops the app
in one line naming it; the upload boxes say the limit and the setting."""

import sys

import pytest

gr = pytest.importorskip("gradio")

import app  # noqa: E402
from kvlab.models.loading import ModelPool  # noqa: E402
from kvlab.ui.compare.tab import CompareTab  # noqa: E402
from kvlab.ui.report.tab import ReportTab  # noqa: E402


class Demo:
    """Stands in for the built app: records what `launch` was given."""

    def __init__(self):
        self.launched = {}

    def launch(self, **kwargs):
        self.launched = kwargs


@pytest.fixture
def demo(monkeypatch):
    built = Demo()
    monkeypatch.setattr(app, "create_app", lambda loader=None: built)
    monkeypatch.setattr(sys, "argv", ["app.py"])
    return built


def test_the_app_launches_with_gradios_upload_limit_at_the_record_cap(demo, monkeypatch):
    monkeypatch.delenv("KVLAB_MAX_RECORD_MB", raising=False)
    app.launch()
    assert demo.launched["max_file_size"] == 16 * 2**20
    monkeypatch.setenv("KVLAB_MAX_RECORD_MB", "2")
    app.launch()
    assert demo.launched["max_file_size"] == 2 * 2**20


@pytest.mark.parametrize("bad", ["0", "lots", "-1"])
def test_a_bad_record_cap_stops_the_app_in_one_line_naming_the_setting(bad, demo, monkeypatch):
    monkeypatch.setenv("KVLAB_MAX_RECORD_MB", bad)
    with pytest.raises(SystemExit) as stopped:
        app.launch()
    assert str(stopped.value) == f"kvlab: KVLAB_MAX_RECORD_MB must be a whole number of MiB >= 1, got {bad!r}"
    assert demo.launched == {}


def test_the_upload_boxes_name_the_limit_and_its_setting(tiny_pool, monkeypatch):
    monkeypatch.setenv("KVLAB_MAX_RECORD_MB", "3")
    with gr.Blocks():
        compare, report = CompareTab(ModelPool(), preload=False).build(), ReportTab(tiny_pool).build()
    for box in (compare.replay_file, report.saved):
        assert "at most 3 MiB (KVLAB_MAX_RECORD_MB)" in box.label
