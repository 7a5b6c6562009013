"""The command lines refuse what they cannot finish before any model loads, and read what the tabs document.

Class 4 of the first-visit review: an output path that cannot be written is refused in one line (exit 2)
before the model loads, for every command that writes a file. Class 6: `plan --context` reads `1k, 32k, 128k`
as the Plan tab does, and a path to no folder says so. Catalog configs only; no model is loaded.
"""

import pytest

from kvlab.models import loading as models
from kvlab.cli import main
from kvlab.cli.outputs import OutputError, check_writable, write_text
from kvlab.ui.plan.view import parse_contexts

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: the refusal must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the output path was checked")
    monkeypatch.setattr(models, "load_model", refuse)


def commands(tmp_path):
    turns = tmp_path / "turns.yaml"
    turns.write_text("- hello\n")
    prefix, prompts = tmp_path / "prefix.txt", tmp_path / "prompts.yaml"
    prefix.write_text("A shared document.")
    prompts.write_text("- one\n")
    return {
        "compare": ["compare", "--preset", "quickstart"],
        "chat": ["chat", "--turns", str(turns)],
        "prefix": ["prefix", "--prefix", str(prefix), "--prompts", str(prompts)],
        "inspect": ["inspect", "--prompt", "hi"],
        "perplexity": ["perplexity"],
        "plan": ["plan", "--model", LLAMA],
        "needle": ["needle", "--preset", "needle_passkey"],
        "diverge": ["diverge", "--strategy", "sink", "--prompt", "hi"],
    }


@pytest.mark.parametrize("command", ["compare", "chat", "prefix", "inspect", "perplexity", "plan", "needle", "diverge"])
@pytest.mark.parametrize("where", ["/proc/forbidden.json", "no-such-folder/r.json", "."])
def test_an_unwritable_output_is_refused_in_one_line_before_the_model_loads(command, where, tmp_path,
                                                                         monkeypatch, capsys, no_model_load):
    monkeypatch.chdir(tmp_path)
    assert main(commands(tmp_path)[command] + ["--json", where]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvlab {command}: --json {where}"), err


@pytest.mark.parametrize("where", ["/proc/forbidden.csv", "no-such-folder/r.csv"])
def test_needle_refuses_an_unwritable_csv_before_the_model_loads(where, tmp_path, capsys, no_model_load):
    assert main(["needle", "--preset", "needle_passkey", "--csv", where]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvlab needle: --csv {where}"), err


def test_a_checked_path_is_left_as_it_was_and_written_whole(tmp_path):
    fresh, kept = tmp_path / "fresh.json", tmp_path / "kept.json"
    kept.write_text("old")
    check_writable(str(fresh))
    check_writable(str(kept))
    assert not fresh.exists() and kept.read_text() == "old"
    write_text(str(kept), "new")
    assert kept.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]
    with pytest.raises(OutputError, match="cannot be written"):
        write_text("/proc/forbidden.json", "{}")


def test_plan_reads_contexts_as_the_plan_tab_documents(capsys):
    for text in ("1k, 32k, 128k", "1k,2k", "1024;4k 2048"):
        assert main(["plan", "--model", LLAMA, "--context", text]) == 0
        out = capsys.readouterr().out
        for tokens in parse_contexts(text):
            assert f" {tokens:,} " in out
    assert main(["plan", "--model", LLAMA, "--context", "1.5k"]) == 2
    assert "--context: context lengths are whole numbers" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["plan"], ["compare", "--preset", "quickstart"]])
@pytest.mark.parametrize("path", ["/no/such/model", "./missing-model", "~/no-such-kvlab-model"])
def test_a_path_to_no_folder_says_no_such_folder(command, path, capsys):
    assert main(command + ["--model", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"kvlab {command[0]}: {path!r}: no such folder", err


@pytest.mark.parametrize("strategies", ["bogus", "static:max_cache_len=abc", "bogus,static:max_cache_len=abc"])
def test_compare_with_no_column_that_can_run_is_refused_before_the_model_loads(strategies, capsys, no_model_load):
    assert main(["compare", "--prompt", "hi", "--strategies", strategies]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvlab compare: ")
    assert all(item.split(":")[0] in err[0] for item in strategies.split(","))


def test_every_subcommand_writes_its_files_through_one_adapter(tmp_path, capsys):
    from kvlab.cli.outputs import write_outputs

    never = []
    good = tmp_path / "run.json"
    assert write_outputs("kvlab x", [(str(good), "--json", lambda: "{}"), (None, "--csv", lambda: never.append(1))],
                         " (stopped)") == 0
    assert good.read_text() == "{}" and not never and capsys.readouterr().err == f"wrote {good} (stopped)\n"
    bad = tmp_path / "missing" / "run.csv"
    assert write_outputs("kvlab x", [(str(bad), "--csv", lambda: "a")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvlab x: --csv {bad}: cannot be written") and err.count("\n") == 1
