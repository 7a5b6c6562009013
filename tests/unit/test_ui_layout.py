"""The UI layout's promises: only `kvlab/ui/` (and `app.py`) import gradio, `kvlab.ui`'s pure modules import
without it, and the shared strategy-card form lists choices by capability."""

import ast
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from kvlab.strategies import STRATEGIES
from kvlab.strategies.base import names_with
from kvlab.ui.shared.knobs import (NO_STRATEGY, UNAVAILABLE_MARK, card_form, knob_index, strategy_choices,
                                   strategy_from_card)

ROOT = Path(__file__).resolve().parents[2]
PURE = ["kvlab.ui", "kvlab.ui.shared.loader", "kvlab.ui.shared.knobs", "kvlab.ui.shared.theme",
        "kvlab.ui.shared.figures", "kvlab.ui.shared.code", "kvlab.ui.shared.exports", "kvlab.ui.shared.inspect_links",
        "kvlab.ui.compare.view", "kvlab.ui.compare.records", "kvlab.ui.chat.view", "kvlab.ui.perplexity.view",
        "kvlab.ui.plan.view", "kvlab.ui.inspect.view", "kvlab.ui.shared.plot_frames", "kvlab.ui.compare.replay",
        "kvlab.ui.shared.redraw"]


def imports_gradio(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(name == "gradio" or name.startswith("gradio.") for name in names):
            return True
    return False


def test_only_the_ui_package_imports_gradio():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "kvlab").rglob("*.py")
                 if imports_gradio(p) and (ROOT / "kvlab" / "ui") not in p.parents]
    assert offenders == []
    assert not list(ROOT.glob("kvlab_ui/*.py")) and not (ROOT / "kvlab" / "view.py").exists()


def test_pure_ui_modules_import_without_gradio():
    code = f"import sys\nfor m in {PURE!r}: __import__(m)\nprint('gradio' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


class Loaded:
    """Just enough of a LoadedModel for `unavailable_reason`: a full-attention config, no CUDA."""

    class config:
        @staticmethod
        def get_text_config(decoder=True):
            return type("cfg", (), {"layer_types": ["full_attention"]})()


def test_choices_filter_by_capability_and_mark_what_cannot_run():
    assert [v for _, v in strategy_choices(None)] == [NO_STRATEGY, *STRATEGIES]
    chat = strategy_choices(Loaded(), "usable_in_chat", none_choice=False)
    assert [v for _, v in chat] == names_with("usable_in_chat")
    labels = dict((v, label) for label, v in chat)
    assert labels["sliding_window"] == "sliding_window" + UNAVAILABLE_MARK and labels["dynamic"] == "dynamic"


def test_card_form_and_strategy_from_card():
    unknown = card_form("nonsense", {}, None, 3)
    assert unescape(unknown["about"]["value"]) == "unknown strategy 'nonsense'" and not unknown["status"]["visible"]
    static = card_form("static", {"max_cache_len": 64}, None, 3)
    assert [f["value"] for f in static["knobs"]] == ["64", "false", ""] and static["knobs"][0]["placeholder"] == "auto"
    assert "kv-s-ready" in static["status"]["value"]
    assert strategy_from_card("static", ["64"]).max_cache_len == 64
    with pytest.raises(ValueError, match="unknown strategy 'static'; allowed: dynamic"):
        strategy_from_card("static", [], allowed=["dynamic"])
    assert knob_index("sink", "num_sink_tokens") == 1
    with pytest.raises(KeyError, match="no knob 'nbits'"):
        knob_index("static", "nbits")
