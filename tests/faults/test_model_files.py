"""Fault catalogue: a model file that cannot become a model — not GGUF, truncated, an architecture transformers
cannot convert, a missing path, a folder without config.json. Right: exit status 2 and one line on stderr naming
the file and what is wrong, no traceback, nothing half-written in the cache folder."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def write_unknown_architecture(path: Path) -> None:
    """A well-formed GGUF file whose architecture transformers has no converter for."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "unknownarch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make_source(kind: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{kind}.gguf"
    if kind == "not-gguf":
        path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
    elif kind == "truncated":
        path.write_bytes(b"GGUF\x03\x00\x00\x00")
    elif kind == "unknown-architecture":
        write_unknown_architecture(path)
    elif kind == "folder":
        path = tmp_path / "folder"
        path.mkdir()
    return path


@pytest.mark.parametrize("kind,expected", [
    ("not-gguf", "is not a GGUF file"),
    ("truncated", "is not a complete GGUF file"),
    ("unknown-architecture", "could not convert unknown-architecture.gguf: ValueError: GGUF model with architecture "
                             "unknownarch is not supported yet"),
    ("missing", "no such file"),
    ("folder", "is a folder but not a model: it has no config.json"),
])
def test_a_model_file_that_cannot_load_gets_one_line(tmp_path, kind, expected):
    source = make_source(kind, tmp_path)
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVLAB_ALLOW_LOCAL": "1", "KVLAB_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--model", str(source), "--prompt", "hi",
                           "--strategies", "dynamic", "--max-new-tokens", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("kvlab compare: ")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert expected in lines[0]
    leftovers = [p for p in cache.rglob("*") if p.is_file() and p.suffix in {".safetensors", ".json"}]
    assert leftovers == [], f"a failed conversion left files behind: {leftovers}"
