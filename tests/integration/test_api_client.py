"""The app on the real bundled model: the `compare` API through gradio_client, bad input
through the Compare tab's own handlers, and the "view code" snippet reproducing a column.

- `/compare` for the quickstart preset returns the same per-column token ids as
  `python -m kvlab compare --preset quickstart --json` (greedy, fp32: deterministic; 24 tokens).
- Bad input (empty prompt, max_new_tokens 0 / above the cap / emptied, no strategy,
  invalid knobs, a static cache too small, an unknown hub id, a folder that is not
  a model) gives a clear message where the user looks; nothing crashes and the
  other columns finish.
"""

import contextlib
import io
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import gradio as gr
import pytest

from app import create_app
from kvlab.generation import MAX_NEW_TOKENS_CAP
from kvlab.models.loading import ModelSpec, converted_bundled_folder
from kvlab.ui.shared.code import code_snippet
from kvlab.ui.compare.tab import build_compare_tab
from kvlab.ui.compare.form import RunRequest
from kvlab.ui.shared.knobs import NO_STRATEGY

REPO_ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 1800
SHORT = 4
MATCH_TOKENS = 24
"""Tokens the API and the CLI must agree on, every column (greedy, fp32)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def loaded_pool(pool):
    """The session pool with the app's default spec (bundled, auto device) loaded."""
    pool.get(ModelSpec())
    return pool


@pytest.fixture(scope="module")
def client(loaded_pool):
    from gradio_client import Client

    demo = create_app(loaded_pool, preload=False)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, show_error=True,
                quiet=True)
    try:
        yield Client(demo.local_url, verbose=False)
    finally:
        demo.close()


@pytest.fixture(scope="module")
def tab(loaded_pool):
    with gr.Blocks():
        return build_compare_tab(loaded_pool, preload=False)


def run_page(tab, session: dict | None = None, **fields) -> dict:
    """Drive the Run handler like the page does (`session`: the browser session's dict, which keeps the run's
    view for the PNG export); returns the last update of every component."""
    fields.setdefault("prompt", "Name three colours.")
    fields.setdefault("max_new_tokens", SHORT)
    fields.setdefault("slots", [("dynamic", [])])
    final = {}
    for updates in tab.stream(RunRequest(**fields), threading.Event(), session):
        assert set(updates) <= set(tab.run_outputs), "the run updated a component that is not its output"
        final.update(updates)
    return final


def value(update) -> str:
    return update["value"] if isinstance(update, dict) else update


# ----- the compare API -----

@pytest.mark.slow  # CI time: kept under 25 minutes; make test-slow runs it
def test_compare_api_matches_the_cli(client, tmp_path):
    record = client.predict("quickstart", None, MATCH_TOKENS, api_name="/compare")
    cli_json = tmp_path / "cli.json"
    # Fidelity scoring runs after generation and does not change token ids.
    subprocess.run([sys.executable, "-m", "kvlab", "compare", "--preset", "quickstart", "--json", str(cli_json),
                    "--max-new-tokens", str(MATCH_TOKENS), "--no-fidelity"], cwd=REPO_ROOT, check=True,
                   timeout=CLI_TIMEOUT_S, capture_output=True)
    cli = json.loads(cli_json.read_text())
    assert record["preset"] == "quickstart"
    assert [c["name"] for c in record["columns"]] == [c["name"] for c in cli["columns"]]
    for api_column, cli_column in zip(record["columns"], cli["columns"]):
        assert api_column["status"] == cli_column["status"], api_column["name"]
        assert api_column["token_ids"] == cli_column["token_ids"], api_column["name"]
    by_name = {c["name"]: c for c in record["columns"]}
    # no_cache makes fewer tokens (the preset's ceiling for it): its tokens are the others' first ones.
    exact = [by_name[name]["token_ids"] for name in ("dynamic", "static")]
    assert exact[0] == exact[1] and len(exact[0]) > 10
    no_cache = by_name["no_cache"]["token_ids"]
    assert 10 < len(no_cache) < len(exact[0]) and no_cache == exact[0][:len(no_cache)]
    assert by_name["dynamic"]["is_baseline"] and by_name["static"]["agreement"] == 1.0


def test_compare_api_overrides(client):
    record = client.predict("quickstart", "Say hello.", SHORT, api_name="/compare")
    assert record["prompt"]["text"] == "Say hello."
    assert record["settings"]["max_new_tokens"] == SHORT
    ok = [c for c in record["columns"] if c["status"] == "ok"]
    assert len(ok) >= 3 and all(1 <= len(c["token_ids"]) <= SHORT for c in ok)


@pytest.mark.parametrize("args, message", [
    (("no-such-preset",), "unknown preset 'no-such-preset'"),
    (("quickstart", "   "), "the prompt is empty"),
    (("quickstart", None, 0), f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_CAP}"),
    (("quickstart", None, MAX_NEW_TOKENS_CAP + 1), f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_CAP}"),
])
def test_compare_api_bad_input(client, args, message):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/compare")


# ----- bad input on the page -----

@pytest.mark.parametrize("fields, message", [
    ({"prompt": "  "}, "the prompt is empty"),
    ({"max_new_tokens": 0}, f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_CAP}, got 0"),
    ({"max_new_tokens": MAX_NEW_TOKENS_CAP + 1}, f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_CAP}"),
    ({"max_new_tokens": None}, "max_new_tokens must be between 1"),
    ({"slots": [(NO_STRATEGY, []), (NO_STRATEGY, [])]}, "no strategy picked"),
    ({"slots": [("quantized", ["quanto", "5"])]}, "column 1: nbits=5 is not supported by the quanto backend"),
    ({"model_source": "no-such-org/no-such-model-kvlab"}, "could not load 'no-such-org/no-such-model-kvlab'"),
])
def test_bad_input_explains_itself_in_the_status_line(tab, fields, message):
    final = run_page(tab, **fields)
    status = value(final[tab.run_status])
    assert "kv-line-error" in status
    assert message in status.replace("&#x27;", "'")
    assert tab.summary not in final  # nothing ran


def test_folder_that_is_not_a_model(tab, tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    status = value(run_page(tab, model_source=str(tmp_path))[tab.run_status])
    assert "is a folder but not a model: it has no config.json" in status


def test_static_too_small_fails_its_column_and_the_others_finish(tab):
    final = run_page(tab, slots=[("dynamic", []), ("static", ["8", "false"]), ("quantized", ["quanto", "5"]),
                                 ("no_cache", [])])
    cards = tab.cards
    assert "kv-s-done" in value(final[cards[0].status]) and value(final[cards[0].text])
    static = value(final[cards[1].status])
    assert "kv-s-error" in static and "static cache too small: max_cache_len=8" in static
    assert "kv-s-error" in value(final[cards[2].status]) and "nbits=5" in value(final[cards[2].status])
    assert "kv-s-done" in value(final[cards[3].status]) and value(final[cards[3].text])
    status = value(final[tab.run_status])
    assert status.startswith('<div class="kv-line kv-line-error">finished')
    assert "not run: column 3" in status
    table = final[tab.summary]["value"]
    assert [row[1] for row in table] == ["ok", "error", "ok"]


def test_a_page_run_exports_its_record_and_code(tab):
    session = {}
    final = run_page(tab, session, slots=[("dynamic", []), ("static", ["", "false"])])
    paths = final[tab.exports]
    assert [Path(p).name for p in paths] == ["kvlab-run.json", "kvlab-summary.csv"], "no image work during a run"
    paths.append(tab.plots.export(session["view"])[tab.plots.png]["value"])  # the PNG only on Export PNG
    record = json.loads(Path(paths[0]).read_text())
    assert [c["strategy"] for c in record["columns"]] == ["dynamic", "static"]
    assert record["columns"][0]["token_ids"] == record["columns"][1]["token_ids"]
    assert Path(paths[1]).read_text().startswith("column,status,")
    assert Path(paths[2]).read_bytes()[:4] == b"\x89PNG"
    assert "# ── column 2: static" in final[tab.code] and "cache=cache" in final[tab.code]


def test_view_code_reproduces_the_column(tab):
    """The snippet, pointed at the converted bundled model folder, generates the column's text."""
    final = run_page(tab, slots=[("static", ["", "false"])], max_new_tokens=12, ignore_eos=True)
    text = value(final[tab.cards[0].text])
    from kvlab.generation import GenerationSettings
    from kvlab.strategies import make_strategy

    code = code_snippet(make_strategy({"strategy": "static"}),
                        GenerationSettings(max_new_tokens=12, stop_at_eos=False), "Name three colours.",
                        model_source=str(converted_bundled_folder()))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "<snippet>", "exec"), {})
    assert printed.getvalue().strip() == text.strip()
