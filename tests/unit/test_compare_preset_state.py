"""The Compare form carries its preset's per-column `generation:` overrides: Run uses what the form took when
the preset was applied, not the preset file as it is on disk at Run time; a slot changed by hand, or a preset
that failed to apply, carries nothing."""

import threading

import pytest

gr = pytest.importorskip("gradio")

from kvlab.ui.compare.form import plan_run  # noqa: E402
from kvlab.ui.compare.tab import CompareTab  # noqa: E402

pytestmark = pytest.mark.unit

PRESET = """name: carried
model: {{source: bundled}}
prompt: {{text: Hello, chat: false}}
generation: {{max_new_tokens: 6, stop_at_eos: false, fidelity: false}}
columns:
  - strategy: dynamic
  - strategy: no_cache
    generation: {{max_new_tokens: {tokens}}}
"""


def shown(component, updates: dict):
    """The value `component` has after `updates` (its initial value when they leave it alone)."""
    update = updates.get(component, component.value)
    if isinstance(update, dict) and update.get("__type__") == "update":
        return update.get("value", component.value)
    return update


@pytest.fixture
def applied(tiny_pool, tmp_path):
    """A tab whose preset `carried` (no_cache limited to 3 tokens) was applied, then edited on disk to 5:
    (tab, the Run event's inputs as the page holds them)."""
    path = tmp_path / "carried.yaml"
    path.write_text(PRESET.format(tokens=3))
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\ncolumns: not a list\n")
    with gr.Blocks():
        tab = CompareTab(tiny_pool, preload=False, presets={"carried": path, "broken": broken}).build()
    updates = tab.apply_preset("carried", "bundled", "float32", "auto")
    path.write_text(PRESET.format(tokens=5))
    data = {component: shown(component, updates) for component in tab.run_inputs}
    data[tab.session] = {}
    return tab, data


def test_run_uses_the_overrides_the_form_carries_not_the_edited_file(applied):
    tab, data = applied
    columns = plan_run(tab.request_from(data)).run_columns()
    assert [(column.strategy.name, column.overrides) for column in columns] == [
        ("dynamic", {}), ("no_cache", {"max_new_tokens": 3})]
    session = {}
    for _ in tab.stream(tab.request_from(data), threading.Event(), session):
        pass
    results = {column.result.strategy: column.result for column in session["view"].columns}
    assert len(results["no_cache"].token_ids) == 3 and len(results["dynamic"].token_ids) == 6


def test_a_slot_changed_by_hand_runs_with_the_run_settings(applied):
    tab, data = applied
    data[tab.cards[1].strategy] = "static"
    columns = plan_run(tab.request_from(data)).run_columns()
    assert [(column.strategy.name, column.overrides) for column in columns] == [("dynamic", {}), ("static", {})]


def test_a_preset_that_fails_to_apply_carries_nothing(applied):
    tab, _ = applied
    assert tab.apply_preset("carried", "bundled", "float32", "auto")[tab.preset_state]
    updates = tab.apply_preset("broken", "bundled", "float32", "auto")
    assert "✖" in updates[tab.run_status] and updates[tab.preset_state] == {}
