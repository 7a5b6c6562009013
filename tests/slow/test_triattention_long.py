"""Slow tier: issue 44's TriAttention check at full size (`make test-slow`; on 2 busy cores about 80 minutes for
SmolLM2 and 2.5 hours for Gemma 3 270M). TriAttention at budget 512 / beta 128 and SnapKV compressing back to the
same size every 128 tokens, on both bundled models, over 4,096 teacher-forced tokens after a 96-token context,
with the needle grid: the command docs/strategies.md gives for its figures. Both columns hold the same bytes at
every scored token (so their mean KL compares at the same mean bytes), both are lossy, and TriAttention's needle
row equals dense's (a needle prompt is a prompt, which TriAttention keeps whole).
tests/integration/test_triattention_real_model.py checks the same at CI size."""

import json

import pytest

from kvlab.cli import main

CONTEXT, SCORED, BUDGET, BETA = 96, 4096, 512, 128
COLUMNS = (f"triattention:budget={BUDGET}:beta={BETA},"
           f"snapkv:target_tokens={CONTEXT + BUDGET}:compress_every={BETA}")


@pytest.mark.parametrize("model", ["bundled", "bundled:gemma-3-270m"])
def test_triattention_beside_snapkv_at_the_same_bytes_over_4k_tokens(model, tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(["report", "--model", model, "--columns", COLUMNS, "--context-tokens", str(CONTEXT),
                 "--scored-tokens", str(SCORED), "--max-tokens", str(CONTEXT + SCORED), "--progress-every", "512",
                 "--needle", "--json", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    record = json.loads(out.read_text())
    tri, snap = record["columns"]
    assert tri["status"] == snap["status"] == "ok", (tri["message"], snap["message"])
    assert tri["split"] == snap["split"] == {"context_tokens": CONTEXT, "scored_tokens": SCORED}
    for field in ("cache_bytes_mean", "cache_bytes_end", "bytes_vs_dense"):
        assert tri["figures"][field] == snap["figures"][field], field
    assert tri["figures"]["bytes_vs_dense"] < 0.5
    assert tri["figures"]["kld_mean"] > 0 and snap["figures"]["kld_mean"] > 0
    assert "4,096 tokens of python_reference.txt" in tri["note"]
    rows = {row["strategy"]: row for row in record["needle"]["summary"]}
    tri_row = rows[tri["name"]]
    assert tri_row["scored"] > 0 and tri_row["hits"] == tri_row["scored"]  # the cells dense hits, all of them
    assert rows[snap["name"]]["scored"] == tri_row["scored"]
