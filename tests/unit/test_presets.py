"""The preset schema: every shipped preset validates; bad ones name the field and the allowed values.
Where the preset folder is found: the environment, the source checkout, the installed copy."""

import sys
from pathlib import Path

import pytest
import yaml

from kvlab import presets
from kvlab.presets import PRESETS_DIR_ENV, presets_dir
from kvlab.compare.preset import PresetError, list_presets, load_preset, parse_preset

MINIMAL = {"name": "t", "prompt": {"text": "hi"}, "columns": [{"strategy": "dynamic"}]}


def test_every_shipped_preset_validates():
    presets = list_presets()
    assert "quickstart" in presets
    for name, path in presets.items():
        preset = load_preset(path)
        assert preset.name and preset.columns and preset.build_columns()


def test_quickstart_has_the_promised_columns(tiny):
    preset = load_preset("quickstart")
    assert preset.model.source == "bundled" and preset.generation.max_new_tokens == 64
    assert not preset.generation.do_sample
    names = [(c["strategy"], c.get("backend")) for c in preset.columns]
    assert names == [("dynamic", None), ("static", None), ("quantized", "quanto"), ("quantized", "hqq"),
                     ("sink", None), ("no_cache", None)]
    # no_cache (a full forward per token) comes last and makes fewer tokens, so the first comparison finishes soon
    assert preset.columns[-1]["generation"] == {"max_new_tokens": 16}
    # every column runs where there is no GPU (a first visitor on a CPU machine sees no "unavailable" column)
    assert [column.strategy.unavailable_reason(tiny) for column in preset.build_columns()] == [None] * 6


@pytest.mark.parametrize("change,message", [
    ({"mode": "turbo"}, "mode: Input should be 'fair', 'parallel' or 'sequential'"),
    ({"columns": []}, "columns: List should have at least 1 item"),
    ({"columns": [{"strategy": "paged"}]}, "unknown strategy 'paged'; allowed: no_cache, dynamic"),
    ({"columns": [{"strategy": "quantized", "backend": "quanto", "nbits": 3}]}, "column 1: nbits=3 is not supported by the quanto backend (optimum-quanto"),
    ({"columns": [{"backend": "hqq"}]}, "column 1 needs a `strategy:`"),
    ({"generation": {"max_new_tokens": 0}}, "generation: max_new_tokens must be between 1 and 4096, got 0"),
    ({"generation": {"max_new_tokenz": 5}}, "generation.max_new_tokenz: Unexpected keyword argument"),
    ({"generation": {"do_sample": True, "top_p": 0}}, "generation: top_p must be in (0, 1] (1 = off), got 0"),
    ({"model": {"dtype": "float8"}}, "model.dtype: Input should be 'float32', 'bfloat16' or 'float16'"),
    ({"colums": []}, "colums: Extra inputs are not permitted"),
    ({"prompt": {"text": ""}}, "prompt.text: String should have at least 1 character"),
    ({"baseline": 5}, "baseline must be a column index 0..0, got 5"),
    ({"columns": [{"strategy": "dynamic", "generation": {"top": 1}}]}, "unknown generation setting(s) ['top']"),
])
def test_bad_presets_name_the_field_and_allowed_values(change, message):
    with pytest.raises(PresetError) as err:
        parse_preset({**MINIMAL, **change}, "bad.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("bad.yaml: ")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(PresetError, match="preset file not found"):
        load_preset(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(PresetError, match="broken.yaml: not valid YAML"):
        load_preset(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text(yaml.safe_dump(["a", "b"]))
    with pytest.raises(PresetError, match="expected a YAML mapping"):
        load_preset(listed)


@pytest.mark.parametrize("argv,message", [
    (["compare", "--prompt", "", "--strategies", "dynamic"], "the prompt is empty"),
    (["compare", "--prompt", "hi", "--strategies", ","], "--strategies is empty"),
    (["compare", "--prompt", "hi"], "give --preset FILE, or both --prompt and --strategies"),
    (["perplexity", "--strategies", ","], "--strategies is empty: give at least one item"),
        (["perplexity", "--strategies", "no_cache"], "no_cache keeps no cache"),
    (["perplexity", "--segment", "-5"], "--segment must be at least 1 token, got -5"),
])
def test_cli_refuses_bad_input_before_loading_a_model(argv, message, capsys):
    from kvlab.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


REPO_ROOT = Path(__file__).resolve().parents[2]


def test_presets_dir_is_the_repositorys_in_a_source_checkout(monkeypatch):
    monkeypatch.delenv(PRESETS_DIR_ENV, raising=False)
    assert presets_dir() == REPO_ROOT / "presets"


def test_presets_dir_env_comes_first(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(MINIMAL))
    monkeypatch.setenv(PRESETS_DIR_ENV, str(tmp_path))
    assert presets_dir() == tmp_path
    assert list(list_presets()) == ["mine"]
    assert load_preset("mine").name == "t"


@pytest.mark.parametrize("source_files", [[], ["presets/"], ["pyproject.toml"]])
def test_presets_dir_falls_back_to_the_installed_copy(tmp_path, monkeypatch, source_files):
    """Outside a source checkout (no `pyproject.toml` and `presets/` beside the package) it is sys.prefix's share/."""
    monkeypatch.delenv(PRESETS_DIR_ENV, raising=False)
    site = tmp_path / "site-packages"
    site.mkdir()
    for name in source_files:
        if name.endswith("/"):
            (site / name).mkdir()
        else:
            (site / name).write_text("")
    prefix = tmp_path / "prefix"
    installed = prefix / "share" / "kvlab" / "presets"
    installed.mkdir(parents=True)
    (installed / "shipped.yaml").write_text(yaml.safe_dump(MINIMAL))
    monkeypatch.setattr(presets, "SOURCE_ROOT", site)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    assert presets_dir() == installed
    assert list(list_presets()) == ["shipped"]
