"""Crafted record files, as a visitor of a public Space may upload them, through every record reader: Compare's
replay (the tab's status line and `kvlab compare --replay`), the Report tab's saved records and `kvlab report
--from`. Each is refused in one line (one status line, one stderr line with exit status 2); none reaches a
raw Python error. A replayed record is written back (its export, and so its share link) with the fields kvlab
knows only."""

import copy
import json
from html import unescape

import gradio as gr
import pytest
import torch

from kvlab.cli import main
from kvlab.compare.replay import RecordError, load_record
from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.generation import GenerationSettings
from kvlab.models.loading import ModelPool
from kvlab.compare.preset import parse_preset
from kvlab.ui.compare.tab import CompareTab
from kvlab.ui.report.tab import ReportTab
from kvlab.ui.report.view import rows_from_files


@pytest.fixture(scope="module")
def record(tiny):
    """A real Compare record of two columns on the tiny model."""
    preset = parse_preset({"name": "t", "prompt": {"text": "hi"}, "columns": [{"strategy": "dynamic"}]})
    settings = GenerationSettings(max_new_tokens=4, stop_at_eos=False)
    done = collect(run_compare(tiny, torch.tensor([[1, 400, 401]]),
                               [{"strategy": "dynamic"}, {"strategy": "static"}], settings, preset=preset))
    return json.loads(json.dumps(done.record))


def with_(record: dict, change) -> dict:
    crafted = copy.deepcopy(record)
    change(crafted)
    return crafted


def crafted_files(record: dict) -> dict[str, tuple[str, str]]:
    """name -> (file text, a phrase its refusal says)."""
    column = {"index": 0, "name": "c", "strategy": "dynamic", "knobs": {}}
    cases = {
        "nested 10,000 deep": ('{"format": "kvlab.compare", "format_version": 3, "columns": ' + "[" * 10_000
                               + "]" * 10_000 + "}", "nests 10001 levels deep"),
        "NaN": (json.dumps(with_(record, lambda r: r.update(wall_s=float("nan")))), "holds NaN"),
        "Infinity in a column": (json.dumps(with_(record, lambda r: r["columns"][0].update(mean_kl=float("inf")))),
                                 "holds Infinity"),
        "a column that is not an object": (json.dumps(with_(record, lambda r: r.update(columns=[1, "x"]))),
                                           "column 1 of the record is not an object"),
        "a name that is not a string": (json.dumps(with_(record, lambda r: r["columns"][0].update(name=5))),
                                        "field columns[0].name should be a valid string"),
        "a number that is a string": (json.dumps(with_(record, lambda r: r["columns"][1].update(ttft_s="0.5"))),
                                      "field columns[1].ttft_s should be a valid number"),
        "an environment that is a list": (json.dumps(with_(record, lambda r: r.update(environment=["cpu"]))),
                                          "field environment should be a valid dictionary"),
        "5,000 columns": (json.dumps({**record, "columns": [column] * 5_000}), "5,000 columns"),
        "another tool's JSON": (json.dumps({"name": "left-pad", "version": "1.3.0", "dependencies": {}}),
                                "not a report, Compare or Needle record"),
        "version 99": (json.dumps({**record, "version": 99}), "Compare record version 99 cannot be read by this kvlab"),
        "a huge integer": (json.dumps(record).replace('"prompt_tokens": 3', '"prompt_tokens": 3' + "0" * 4_999, 1),
                           "integer of 5000 digits"),
        "a huge number": (json.dumps(record).replace('"wall_s": ', '"wall_s": 1e999, "x": ', 1), "too large"),
    }
    return cases


CASES = list(crafted_files({"columns": [{}, {}]}))


@pytest.fixture(scope="module")
def files(record, tmp_path_factory):
    folder = tmp_path_factory.mktemp("crafted")
    paths = {}
    for number, (name, (text, said)) in enumerate(crafted_files(record).items()):
        path = folder / f"crafted-{number}.json"
        path.write_text(text)
        paths[name] = (path, said)
    return paths


def one_line(text: str) -> str:
    assert text.count("\n") == 0 and "Traceback" not in text and "Error:" not in text, text
    return text


@pytest.mark.parametrize("name", CASES)
def test_every_reader_refuses_a_crafted_record_in_one_line(name, files):
    path, said = files[name]
    with pytest.raises(ValueError) as compare:
        load_record(path)
    if name != "another tool's JSON":
        assert isinstance(compare.value, RecordError) and said in one_line(str(compare.value))
    rows, problems = rows_from_files([path])
    assert rows == [] and len(problems) == 1 and said in one_line(problems[0])
    assert str(path.parent) not in problems[0], "a server path reached the page"


@pytest.mark.parametrize("name", CASES)
def test_the_command_line_says_one_line_and_exits_2(name, files, capsys):
    path, said = files[name]
    assert main(["compare", "--replay", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("kvlab compare: ")
    assert main(["report", "--from", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("kvlab report: ") and said in err[0]


def test_a_record_over_the_size_cap_is_refused_in_one_line_everywhere(record, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVLAB_MAX_RECORD_MB", "1")
    big = tmp_path / "big.json"
    big.write_text(json.dumps(with_(record, lambda r: r["columns"][0].update(text="x" * 2**20))))
    said = "more than the 1 MiB a kvlab record may be (KVLAB_MAX_RECORD_MB)"
    with pytest.raises(RecordError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_record(big)
    assert said in one_line(rows_from_files([big])[1][0])
    assert main(["compare", "--replay", str(big)]) == 2 and said in capsys.readouterr().err


@pytest.fixture(scope="module")
def compare_tab():
    with gr.Blocks():
        return CompareTab(ModelPool(), preload=False).build()


@pytest.fixture(scope="module")
def report_tab(tiny):
    pool = type("Pool", (), {"get": lambda self, spec, progress=None: tiny, "loaded": lambda self, spec: tiny})()
    with gr.Blocks():
        return ReportTab(pool).build()


@pytest.mark.parametrize("name", CASES)
def test_the_pages_status_line_is_one_line_for_a_crafted_record(name, files, compare_tab, report_tab):
    path, said = files[name]
    session = {}
    updates = compare_tab.replay(str(path), session)
    status = one_line(unescape(updates[compare_tab.run_status]))
    assert "✖ cannot replay this file: " in status and "kv-line-error" in status and "view" not in session
    (report,) = list(report_tab.replay({}, [str(path)], "mean KL"))
    assert list(report) == [report_tab.status] and said in one_line(unescape(report[report_tab.status]))


def test_the_report_tab_refuses_a_future_version_as_compare_does(record, tmp_path, report_tab):
    path = tmp_path / "v99.json"
    path.write_text(json.dumps({**record, "version": 99}))
    (report,) = list(report_tab.replay({}, [str(path)], "mean KL"))
    assert "Compare record version 99 cannot be read by this kvlab" in unescape(report[report_tab.status])
    for kind in ("kvlab.report", "kvlab.needle"):
        path.write_text(json.dumps({"kind": kind, "version": 99, "columns": [], "summary": []}))
        (report,) = list(report_tab.replay({}, [str(path)], "mean KL"))
        assert "record version 99 cannot be read by this kvlab, which reads version 1" in unescape(
            report[report_tab.status])


def walk_keys(value):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from walk_keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk_keys(item)


def test_a_replayed_record_is_written_back_with_known_fields_only(record, tmp_path, compare_tab):
    crafted = with_(record, lambda r: r.update(payload="<form><input type=password></form>"))
    crafted["columns"][0]["injected"] = {"script": "<img src=x onerror=alert(1)>"}
    crafted["environment"]["extra"] = "served to every visitor"
    crafted["model"]["evil"] = [1, 2, 3]
    crafted["settings"]["unknown_knob"] = True
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(crafted))
    updates = compare_tab.replay(str(path), {})
    assert "replayed: measured on" in updates[compare_tab.run_status]
    written = next(p for p in updates[compare_tab.exports] if p.endswith(".json"))
    served = json.loads(open(written).read())
    keys = set(walk_keys(served))
    assert not keys & {"payload", "injected", "script", "extra", "evil", "unknown_knob"}
    assert "served to every visitor" not in open(written).read()
    assert [c["text"] for c in served["columns"]] == [c["text"] for c in record["columns"]]
    assert served["columns"][0].keys() == record["columns"][0].keys()  # what kvlab writes, prefill_s included
    assert served["environment"] == record["environment"] and served["settings"] == record["settings"]
    assert load_record(written).record == served


def test_a_recorded_form_value_the_page_would_refuse_is_not_put_in_the_form(record, tmp_path, compare_tab):
    crafted = with_(record, lambda r: r.update(mode="evil", preset="../../etc/passwd"))
    crafted["settings"].update(timing_policy="sometimes")
    path = tmp_path / "odd-values.json"
    path.write_text(json.dumps(crafted))
    updates = compare_tab.replay(str(path), {})
    assert "replayed: measured on" in updates[compare_tab.run_status]
    for component in (compare_tab.mode, compare_tab.preset, compare_tab.timing_policy):
        assert component not in updates
    assert updates[compare_tab.prompt] == "hi"
