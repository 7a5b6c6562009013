"""Slow tier: the Docker image, built and served for real (`make test-slow`; `make test` and CI skip it).

`scripts/build_image.sh` builds the Dockerfile with podman (making the base
with mmdebstrap where no registry is reachable: a few minutes, then about
ten for the build itself), and `scripts/serve_image_check.sh` serves the
image's file system as uid 1000 with its ENV, WORKDIR and CMD and calls
`/compare` on the quickstart preset through gradio_client: every column must
be ok, and the quanto column must run on the C++ kernel built at image build,
not on the pure-PyTorch unpack. Skipped, with the reason, where the tools or
root are missing.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGE_TAG = "kvlab:slow-test"
BUILD_TIMEOUT_S = 3600
SERVE_TIMEOUT_S = 1200
BASE_REF = "docker.io/library/python:3.11-slim"
TOOLS_HINT = "apt-get install podman buildah mmdebstrap"


def missing_prerequisite() -> str | None:
    """Why the image cannot be built and served here, or None."""
    if os.geteuid() != 0:
        return "the serve check mounts and chroots: it needs root"
    for tool in ("podman", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is missing ({TOOLS_HINT})"
    has_base = subprocess.run(["podman", "image", "exists", BASE_REF], capture_output=True).returncode == 0
    if not has_base and shutil.which("mmdebstrap") is None:
        return f"no stored {BASE_REF} and mmdebstrap is missing to make it ({TOOLS_HINT})"
    return None


@pytest.fixture(scope="module")
def built_image():
    reason = missing_prerequisite()
    if reason:
        pytest.skip(reason)
    build = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "build_image.sh"), "--tag", IMAGE_TAG],
                           cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT_S)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    return IMAGE_TAG


def test_the_image_serves_compare_with_quanto_s_kernel_built(built_image, tmp_path):
    record_file = tmp_path / "record.json"
    check = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "serve_image_check.sh"), "--image", built_image,
                            "--python", sys.executable, "--record", str(record_file)],
                           cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=SERVE_TIMEOUT_S)
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-4000:]
    assert "quanto kernel built in the image: yes" in check.stdout
    record = json.loads(record_file.read_text())
    columns = {column["name"]: column for column in record["columns"]}
    quanto = [column for name, column in columns.items() if "quanto" in name]
    assert quanto and all(column["status"] == "ok" and "pure-PyTorch" not in (column.get("message") or "")
                          for column in quanto)
    assert all(column["status"] == "ok" for column in columns.values())
