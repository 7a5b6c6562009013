"""Replay in the Compare tab: a run's exported JSON record, uploaded into a fresh app (another tab object, no
model loaded), rebuilds the same summary table, plots, code and cards, labelled with where and when it was
measured; an old or foreign file is refused in the status line; the plots PNG is rendered only on request."""

import json
import threading
from pathlib import Path

import pytest

gr = pytest.importorskip("gradio")

from kvlab.models.loading import ModelPool  # noqa: E402
from kvlab.ui.compare.tab import CompareTab  # noqa: E402
from kvlab.ui.compare.form import RunRequest  # noqa: E402
from kvlab.ui.shared.knobs import NO_STRATEGY  # noqa: E402

pytestmark = pytest.mark.unit


def merged(stream) -> dict:
    final = {}
    for updates in stream:
        final.update(updates)
    return final


def value(update):
    return update["value"] if isinstance(update, dict) else update


@pytest.fixture(scope="module")
def measured(tiny):
    """A page run of two columns (slots 1 and 3) on the tiny model: (tab, final updates, session)."""
    pool = type("Pool", (), {"get": lambda self, spec, progress=None: tiny, "loaded": lambda self, spec: tiny})()
    with gr.Blocks():
        tab = CompareTab(pool, preload=False).build()
    request = RunRequest(prompt="Hello", max_new_tokens=6, ignore_eos=True, fidelity=False,
                         model_source=tiny.spec.source, slots=[(NO_STRATEGY, []), ("dynamic", []), (NO_STRATEGY, []), ("static", [])])
    session = {}
    final = merged(tab.stream(request, threading.Event(), session))
    return tab, final, session


@pytest.fixture
def fresh():
    with gr.Blocks():
        return CompareTab(ModelPool(), preload=False).build()


def test_the_exported_record_replays_in_a_fresh_app_into_the_same_summary(measured, fresh):
    tab, final, _ = measured
    record_path = next(path for path in final[tab.exports] if path.endswith(".json"))
    assert not any(path.endswith(".png") for path in final[tab.exports])  # no image work during the run
    record = json.loads(open(record_path).read())
    assert record["slots"] == [1, 3] and record["memory"]["rss_bytes"]
    session = {}
    replayed = fresh.replay(record_path, session)
    assert value(replayed[fresh.summary]) == value(final[tab.summary])
    assert replayed[fresh.summary]["headers"] == final[tab.summary]["headers"]
    status = replayed[fresh.run_status]
    assert "replayed: measured on " in status and record["measured_at"] in status
    assert f"finished in {record['wall_s']:.1f} s" in status  # the run's own figures, as it ended
    assert f"summary after {record['summary_s']:.1f} s" in status
    for plot in (fresh.plots.cache, fresh.plots.latency, fresh.plots.memory):
        original = final[getattr(tab.plots, plot.elem_id.split("-")[-1])]
        assert value(replayed[plot]).equals(value(original))
    assert replayed[fresh.code] == final[tab.code]
    assert [replayed[fresh.cards[slot].strategy] for slot in range(4)] == [NO_STRATEGY, "dynamic", NO_STRATEGY,
                                                                           "static"]
    assert value(replayed[fresh.cards[1].text]) == value(final[tab.cards[1].text])
    assert session["view"].done is not None


def test_the_png_is_rendered_only_when_asked(measured, fresh):
    tab, _, session = measured
    png = tab.plots.export(session["view"])[tab.plots.png]["value"]
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "nothing to export yet" in fresh.plots.export(None)[fresh.plots.notes]


@pytest.mark.parametrize("content, message", [
    ('{"model": {}, "columns": [{}]}', "column 1 of the record is incomplete"),
    ('{"format": "something.else", "format_version": 1}', "not a kvlab Compare run record"),
    ('{"format": "kvlab.compare", "format_version": 99, "columns": [{}]}', "format_version 99"),
    ("not json at all", "not a JSON file"),
])
def test_an_old_or_foreign_file_says_why_in_the_status_line(fresh, tmp_path, content, message):
    path = tmp_path / "record.json"
    path.write_text(content)
    updates = fresh.replay(str(path), {})
    assert set(updates) == {fresh.run_status}
    assert "cannot replay this file" in updates[fresh.run_status] and message in updates[fresh.run_status]


def test_a_share_link_opens_the_same_result_and_a_plain_page_load_changes_nothing(measured, fresh):
    tab, final, _ = measured
    link = final[tab.share]
    run_id = link.split("?run=")[1].split('"')[0]
    opened = fresh.open_shared({}, type("Request", (), {"query_params": {"run": run_id}})())
    assert value(opened[fresh.summary]) == value(final[tab.summary])
    assert opened[fresh.exports] == final[tab.exports] and run_id in opened[fresh.share]
    assert [opened[fresh.cards[slot].strategy] for slot in range(4)] == [NO_STRATEGY, "dynamic", NO_STRATEGY, "static"]
    assert value(opened[fresh.cards[1].text]) == value(final[tab.cards[1].text])
    plain = fresh.open_shared({}, type("Request", (), {"query_params": {}})())
    assert list(plain) == [fresh.run_status]  # a dict keyed by a component: gradio reads it as updates
    gone = fresh.open_shared({}, type("Request", (), {"query_params": {"run": "run-" + "0" * 32}})())
    assert "not kept on this server any more" in gone[fresh.run_status]


def test_a_command_line_record_says_its_process_memory_was_not_recorded(measured, fresh):
    tab, final, _ = measured
    assert "not recorded" not in final[tab.plots.notes]  # a page run samples process memory
    old_cli_record = Path(__file__).parents[1] / "fixtures" / "record_v2_quickstart.json"
    assert not json.loads(old_cli_record.read_text()).get("memory", {}).get("rss_bytes")
    replayed = fresh.replay(str(old_cli_record), {})
    assert "process memory not recorded" in replayed[fresh.plots.notes]


def test_a_share_link_restores_the_form_the_run_was_made_with_and_its_refused_cards(tiny, fresh):
    pool = type("Pool", (), {"get": lambda self, spec, progress=None: tiny, "loaded": lambda self, spec: tiny})()
    with gr.Blocks():
        page = CompareTab(pool, preload=False).build()
    request = RunRequest(prompt="What is the pass key?", system="Answer briefly.", chat=False, max_new_tokens=5,
                         ignore_eos=True, fidelity=False, seed=7, model_source=tiny.spec.source,
                         slots=[("dynamic", []), (NO_STRATEGY, []), ("sink", ["abc"])])
    final = merged(page.stream(request, threading.Event(), {}))
    run_id = final[page.share].split("?run=")[1].split('"')[0]
    opened = fresh.open_shared({}, type("Request", (), {"query_params": {"run": run_id}})())
    assert opened[fresh.prompt] == "What is the pass key?" and opened[fresh.system] == "Answer briefly."
    assert opened[fresh.chat] is False and opened[fresh.max_new_tokens] == 5 and opened[fresh.seed] == 7
    assert opened[fresh.fidelity] is False and opened[fresh.ignore_eos] is True
    assert opened[fresh.decoding] == "greedy" and opened[fresh.model_source] == tiny.spec.source
    assert opened[fresh.cards[2].strategy] == "sink" and value(opened[fresh.cards[2].knobs[0]]) == "abc"
    status = value(opened[fresh.cards[2].status])
    assert "invalid settings" in status and "abc" in status
