"""Presets as tested data: every comparison preset in `presets/` runs on the tiny in-process model.

Found by globbing the folder (a new preset is covered without naming it here), as
optimum-benchmark's example tests do. Each runs with 4 new tokens (unless a column sets its own) and
no quiet re-timing; the real-model checks of the quickstart stay in tests/integration.
"""

from pathlib import Path

import pytest
import yaml

from kvlab.protocol import RunDone
from kvlab.compare.runner import run_compare
from kvlab.generation import encode_prompt
from kvlab.compare.preset import load_preset

PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"
PRESET_FILES = [path for path in sorted(PRESETS_DIR.glob("*.yaml"))
                if isinstance(yaml.safe_load(path.read_text()), dict) and "task" not in yaml.safe_load(path.read_text())]
"""Comparison presets: not YAML lists (inputs of other commands) nor another tab's (`task: needle`)."""
NEW_TOKENS = 4
FINISHED = {"ok", "unavailable"}
"""`unavailable`: a strategy this machine or model cannot run (offloading without CUDA), reported with a reason."""


def test_the_preset_folder_holds_presets():
    assert {"quickstart", "budget_fallback", "hybrid_sliding"} <= {path.stem for path in PRESET_FILES}


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda path: path.stem)
def test_every_preset_runs_on_the_tiny_model(tiny, path):
    preset = load_preset(path)
    columns = preset.build_columns()
    settings = preset.settings().with_overrides({"max_new_tokens": NEW_TOKENS})
    prompt_ids = encode_prompt(tiny.tokenizer, preset.prompt.text, preset.prompt.system, preset.prompt.chat)
    events = list(run_compare(tiny, prompt_ids, columns, settings, preset.mode, baseline=preset.baseline))
    done = events[-1]
    assert isinstance(done, RunDone)
    assert len(done.results) == len(columns)
    for result in done.results:
        assert result.status in FINISHED, f"{path.name} column {result.index + 1} ({result.name}): {result.message}"
        if result.status == "ok":
            limit = min(columns[result.index].overrides.get("max_new_tokens", NEW_TOKENS), NEW_TOKENS)
            assert 1 <= len(result.token_ids) <= limit
        else:
            assert result.message
    assert any(result.status == "ok" for result in done.results)
    assert all(result.status == "ok" for result in done.results if result.is_baseline)


def test_a_columns_max_new_tokens_is_a_ceiling_never_a_raise():
    from kvlab.generation import GenerationSettings

    run = GenerationSettings(max_new_tokens=4)
    assert run.with_overrides({"max_new_tokens": 16}).max_new_tokens == 4
    assert run.with_overrides({"max_new_tokens": 2}).max_new_tokens == 2
    assert GenerationSettings(max_new_tokens=64).with_overrides({"max_new_tokens": 16}).max_new_tokens == 16
    with pytest.raises(ValueError, match="unknown generation setting"):
        run.with_overrides({"max_tokens": 3})
