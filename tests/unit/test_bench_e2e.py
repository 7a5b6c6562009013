"""The bench's e2e section on the tiny model: every condition is run against bare generate of the same
columns, each ratio is kvlab / bare of the same repeat (Run -> summary, and Run -> fidelity filled in), the
default's summary carries the 1.15x target, and the first Run (with its one-time warm-up) is its own ratio."""

import pytest

from kvlab.bench.e2e import CONDITIONS, E2E_TARGET, bench_e2e
from kvlab.bench.harness import SIZES, Context
from kvlab.bench.text import e2e_lines, status_of

pytestmark = pytest.mark.unit


def test_e2e_times_each_condition_against_bare_generate_of_the_same_columns(tiny):
    said = []
    section = bench_e2e(Context(tiny, SIZES["smoke"], None, said.append, None))
    assert section["preset"] == "quickstart" and section["new_tokens"] == SIZES["smoke"].new_tokens
    assert "offloaded" not in section["columns"] and "dynamic" in section["columns"]  # no CUDA here: skipped
    assert set(section["conditions"]) == set(CONDITIONS) == {"default", "quiet timing", "no fidelity"}
    bare = section["bare_s"]["values"]
    for condition in section["conditions"].values():
        seconds, ratios = condition["seconds"]["values"], condition["ratio"]["values"]
        assert len(seconds) == len(bare) == SIZES["smoke"].repeats
        assert ratios == pytest.approx([k / b for k, b in zip(seconds, bare)])
        done = condition["done_seconds"]["values"]
        assert all(d >= k for d, k in zip(done, seconds))  # the fidelity figures come after the summary
        assert condition["done_ratio"]["values"] == pytest.approx([d / b for d, b in zip(done, bare)])
    assert section["first_run"]["ratio"] == pytest.approx(section["first_run"]["seconds"] / section["bare_s"]["median"])
    names = [check["name"] for check in section["checks"]]
    assert any("fidelity filled in" in name for name in names) and any("first Run" in name for name in names)
    default = next(check for check in section["checks"] if "default" in check["name"])
    assert default["target"] == f"≤ {E2E_TARGET}" and default["met"] is (default["value"] <= E2E_TARGET)
    others = [check for check in section["checks"] if check is not default]
    assert others and all(status_of(check) == "reported" for check in others)
    lines = e2e_lines(section)
    assert lines[0].startswith("e2e (quickstart") and any(line.strip().startswith("quiet timing") for line in lines)
    assert any(line.strip().startswith("first Run") for line in lines)
    assert any("repeat 2, bare" in message for message in said)
