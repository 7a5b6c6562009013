"""Inspect and resilient generation on the real bundled model (fp32, CPU), through the command line.

- `kvlab inspect` writes one record per step; a sink cache past its window shows its evictions, and the
  tokens equal a Compare column's for the same settings.
- The `budget_fallback` preset switches twice (dynamic -> quantized -> sink) under its 3 MiB budget, keeps
  the text before each switch, never holds more than the budget and is scored against the unbudgeted column.
"""

import json
import subprocess
import sys

import pytest

from kvlab.compare.runner import run_compare
from kvlab.protocol import collect
from kvlab.generation import GenerationSettings, encode_prompt
from kvlab.inspect.inspector import STRIP_STATES

PROMPT = "Tell me a story about a lighthouse keeper who befriends a whale."
WINDOW = 32
STEPS = 40
CLI_TIMEOUT_S = 1800


def test_cli_inspect_writes_one_record_per_step_and_matches_a_compare_column(tmp_path, bundled):
    out = tmp_path / "inspect.json"
    cmd = [sys.executable, "-m", "kvlab", "inspect", "--strategy", f"sink:window_length={WINDOW}", "--prompt", PROMPT,
           "--steps", str(STEPS), "--ignore-eos", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    document = json.loads(out.read_text())
    steps = document["steps"]
    assert len(steps) == STEPS and [s["index"] for s in steps] == list(range(STEPS))
    assert document["strategy"] == "sink 4+28" and document["stop_reason"] == "length"
    for step in steps:
        for key in ("input_ids_shape", "cache_position", "position_ids", "attention_mask_shape", "token_id",
                    "token_text", "top", "reference_top", "kl_nats", "layers", "cache_bytes", "forwards"):
            assert key in step
        assert len(step["top"]) == 5 and step["top"][0]["token_id"] == step["token_id"]  # greedy
        (row,) = step["layers"]  # 30 identical layers collapse into one row
        assert row["layers"] == [0, 29] and row["class_name"] == "SinkLayer" and row["held_tokens"] == WINDOW
        assert {run[0] for run in row["strip"]} <= set(STRIP_STATES)
    prompt_tokens = document["prompt_tokens"]
    assert prompt_tokens > WINDOW  # the prompt itself streams through the window in chunks
    assert [f["new_tokens"] for f in steps[0]["forwards"]][:1] == [WINDOW - 4]
    last = steps[-1]
    assert last["layers"][0]["strip"] == [["sink", 0, 4], ["evicted", 4, last["seen_tokens"] - 28],
                                          ["held", last["seen_tokens"] - 28, last["seen_tokens"]]]
    assert last["input_ids_shape"] == [1, 1] and last["attention_mask_shape"] == [1, 1, 1, WINDOW]
    assert all(s["position_ids"] == [WINDOW, WINDOW] for s in steps[1:])  # decode positions stay at the window
    assert "sink 4+28" in proc.stdout and f"wrote {out}" in proc.stderr

    prompt = encode_prompt(bundled.tokenizer, PROMPT)
    settings = GenerationSettings(max_new_tokens=STEPS, stop_at_eos=False, fidelity=False)
    column = collect(run_compare(bundled, prompt, [{"strategy": "sink", "window_length": WINDOW}], settings)).results[0]
    assert column.token_ids == document["token_ids"]


@pytest.mark.slow  # a long check (45 s): the fallback chain's switches run in CI on the tiny model (unit tests)
def test_the_budget_preset_switches_twice_and_keeps_the_text(tmp_path):
    out = tmp_path / "budget.json"
    # 180 tokens take both switches (the second comes near token 160); timing is not this test's subject.
    proc = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--preset", "budget_fallback", "--json", str(out),
                           "--max-new-tokens", "180"], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    free, column = json.loads(out.read_text())["columns"]
    budget = 3 * 1024 * 1024
    assert column["budget_bytes"] == budget and column["status"] == "ok"
    switches = column["fallbacks"]
    assert [(s["from"], s["to"]) for s in switches] == [("dynamic", "quantized hqq int4 r48"),
                                                       ("quantized hqq int4 r48", "sink 4+44")]
    first, second = (s["at_token"] for s in switches)
    assert 0 < first < second < len(column["token_ids"])
    for switch in switches:
        assert switch["bytes_before"] == column["cache_bytes"][switch["at_token"] - 1] <= budget
        assert switch["bytes_after"] == column["cache_bytes"][switch["at_token"]] < switch["bytes_before"]
        assert "> budget 3.00 MiB" in switch["reason"]
    assert max(column["cache_bytes"]) <= budget < max(free["cache_bytes"])
    assert column["token_ids"][:first] == free["token_ids"][:first]
    assert len(column["token_ids"]) == len(free["token_ids"])
    assert free["is_baseline"] and column["top1_agreement"] is not None and column["mean_kl"] is not None
    assert "switched to quantized hqq int4 r48 at token" in column["message"]
    assert "switched to sink 4+44 at token" in column["message"]
