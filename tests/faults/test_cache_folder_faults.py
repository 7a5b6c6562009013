"""Fault catalogue: a cache folder that cannot take the converted model at the app's first launch, for real: a
read-only and a full filesystem (a small tmpfs in the app's own mount namespace, which root cannot write past
either). Right: the model load fails in ONE log line naming the folder, the reason and KVLAB_CACHE_DIR, before
any slow conversion, with no traceback; the app keeps serving."""

import pytest

from tests.faults.conftest import MOUNT_NAMESPACE, unshare_allows

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not unshare_allows(*MOUNT_NAMESPACE), reason="needs `unshare --mount` (root) for a tmpfs"),
]


@pytest.mark.parametrize("mount, reason", [
    ("ro,size=1m", "Read-only file system"),
    ("size=64k", "No space left on device"),
])
def test_a_cache_folder_that_cannot_take_the_model_is_one_line_at_first_launch(launch_app, tmp_path, mount, reason):
    cache = tmp_path / "cache"
    cache.mkdir()
    app = launch_app("app", mount=mount, KVLAB_CACHE_DIR=str(cache)).start()
    announced = app.wait_announced()
    assert announced["state"] == "error", app.log()[-2000:]
    app.client()  # still serving
    log = app.log()
    lines = [line for line in log.splitlines() if line.startswith("kvlab: ")]
    assert len(lines) == 1, log[-3000:]
    assert f"cannot write the model cache folder {cache} ({reason}" in lines[0], lines[0]
    assert lines[0].endswith("set KVLAB_CACHE_DIR to a writable folder"), lines[0]
    assert "Traceback" not in log and "de-quantizing" not in log, log[-3000:]
