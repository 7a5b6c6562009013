"""Gradio's own upload limit: `app.launch()` passes the record cap (KVLAB_MAX_RECORD_MB, 16 MiB) to
`launch(max_file_size=...)`, so gradio refuses a larger upload before storing it; a bad setting stops the app
in one line naming it; the upload boxes say the limit and the setting. A text pasted into the Report or
Perplexity tab is capped too (MAX_TEXT_CHARS, refused before it is tokenized), and Perplexity tokenizes only
the part it scores."""

import dataclasses
import sys

import pytest

gr = pytest.importorskip("gradio")

import app  # noqa: E402
from kvlab.models.loading import ModelPool  # noqa: E402
from kvlab.ui.compare.tab import CompareTab  # noqa: E402
from kvlab.ui.report.tab import ReportTab  # noqa: E402


class Demo:
    """Stands in for the built app: records what `launch` was given (and that `launch()` closed it after)."""

    def __init__(self):
        self.launched = {}
        self.closed = False

    def launch(self, **kwargs):
        self.launched = kwargs

    def close(self, verbose=True):
        self.closed = True


@pytest.fixture
def demo(monkeypatch):
    built = Demo()
    monkeypatch.setattr(app, "create_app", lambda loader=None: built)
    monkeypatch.setattr(sys, "argv", ["app.py"])
    return built


def test_the_app_launches_with_gradios_upload_limit_at_the_record_cap(demo, monkeypatch):
    monkeypatch.delenv("KVLAB_MAX_RECORD_MB", raising=False)
    app.launch()
    assert demo.launched["max_file_size"] == 16 * 2**20 and demo.closed
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


class Tokenizer:
    """Stands in for a tokenizer: records the length of each text it is given (one token per character)."""

    def __init__(self):
        self.lengths = []

    def __call__(self, text, return_tensors=None):
        import torch

        self.lengths.append(len(text))
        return {"input_ids": torch.ones(1, len(text), dtype=torch.long)}


def test_a_pasted_text_over_the_cap_is_refused_in_one_line_before_it_is_tokenized(tiny):
    from kvlab.ui.perplexity.view import PASTED as PPL_PASTED
    from kvlab.ui.perplexity.view import PerplexityRequest, plan_perplexity
    from kvlab.ui.report.view import PASTED, ReportRequest, plan_report

    tokenizer = Tokenizer()
    loaded = dataclasses.replace(tiny, tokenizer=tokenizer)
    huge = "word " * (2**20 // 5 + 1)  # MAX_TEXT_CHARS is 2**20
    for plan, request in ((plan_report, ReportRequest(text_choice=PASTED, pasted=huge, columns="dynamic")),
                          (plan_perplexity, PerplexityRequest(text_choice=PPL_PASTED, pasted=huge))):
        with pytest.raises(ValueError) as refused:
            plan(request, loaded)
        assert "more than the 1,048,576 this tab reads" in str(refused.value)
        assert "\n" not in str(refused.value) and tokenizer.lengths == []


def test_perplexity_tokenizes_only_the_part_of_a_long_text_it_scores(tiny):
    from kvlab.ui.perplexity.view import PASTED, PerplexityRequest, plan_perplexity

    tokenizer = Tokenizer()
    loaded = dataclasses.replace(tiny, tokenizer=tokenizer)
    plan = plan_perplexity(PerplexityRequest(text_choice=PASTED, pasted="x" * 900_000, tokens=64,
                                             choices=["dynamic"]), loaded)
    assert tokenizer.lengths == [64 * 12] and plan.input_ids.shape == (1, 64)  # CHARS_PER_TOKEN is 12
