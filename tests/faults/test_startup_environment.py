"""Fault catalogue: the environment at start-up — a port already taken, a required package missing, a bad
KVLAB_QUEUE_MAX_SIZE or shared-runs setting. Right: one line naming what is wrong and the setting or command
that fixes it, no traceback."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
HIDE_TRANSFORMERS = ("import runpy, sys; sys.modules['transformers'] = None; "
                     "sys.argv = ['kvlab', 'compare', '--prompt', 'hi', '--strategies', 'dynamic']; "
                     "runpy.run_module('kvlab', run_name='__main__')")


def one_kvlab_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("kvlab: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-2000:]
    return lines[0]


def test_a_port_in_use_names_the_setting(tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "PYTHONPATH": str(REPO),
               "KVLAB_CACHE_DIR": str(tmp_path / "cache")}
        proc = subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
    assert proc.returncode == 1
    line = one_kvlab_line(proc.stderr)
    assert f"cannot serve on port {port}" in line and "GRADIO_SERVER_PORT" in line
    # Said before anything loads: no model load, no planner warm-up, nothing converted into the cache folder.
    assert "model" not in proc.stderr and "warm-up" not in proc.stderr
    assert not any((tmp_path / "cache").rglob("*"))


def test_a_bad_port_setting_is_named(tmp_path):
    env = {**os.environ, "GRADIO_SERVER_PORT": "http", "PYTHONPATH": str(REPO),
           "KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "GRADIO_SERVER_PORT (or PORT) must be a port number, got 'http'" in one_kvlab_line(proc.stderr)


def test_a_missing_package_is_named_with_the_setup_command():
    proc = subprocess.run([sys.executable, "-c", HIDE_TRANSFORMERS], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert proc.returncode == 2
    line = one_kvlab_line(proc.stderr)
    assert "the package transformers is not installed here" in line and "scripts/setup.sh" in line


@pytest.mark.parametrize("bad", ["lots", "-1", "2.5"])
def test_a_bad_queue_size_is_said_before_anything_loads(bad, tmp_path):
    env = {**os.environ, "KVLAB_QUEUE_MAX_SIZE": bad, "PYTHONPATH": str(REPO),
           "KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    line = one_kvlab_line(proc.stderr)
    assert "KVLAB_QUEUE_MAX_SIZE must be a whole number >= 0" in line and repr(bad) in line
    assert "model ready" not in proc.stderr and "Loading weights" not in proc.stderr


@pytest.mark.parametrize("env,value,said", [
    ("KVLAB_RUNS_KEEP_DAYS", "0", "KVLAB_RUNS_KEEP_DAYS must be a whole number >= 1, got '0'"),
    ("KVLAB_RUNS_MAX_MB", "lots", "KVLAB_RUNS_MAX_MB must be a whole number >= 1, got 'lots'"),
    ("KVLAB_RUNS_DIR", "{blocked}/runs", "KVLAB_RUNS_DIR must be a folder the app can write"),
    ("KVLAB_STATE_SESSIONS", "0", "KVLAB_STATE_SESSIONS must be a whole number >= 1, got '0'"),
    ("KVLAB_PROXY_HOPS", "9", "KVLAB_PROXY_HOPS must be a whole number from 0 to 8, got 9"),
    ("KVLAB_MAX_MODEL_MB", "-5", "KVLAB_MAX_MODEL_MB must be a whole number >= 0 (0 = no cap), got '-5'"),
])
def test_a_bad_shared_runs_setting_is_said_before_anything_loads(env, value, said, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    env_vars = {**os.environ, env: value.format(blocked=blocked), "PYTHONPATH": str(REPO),
                "KVLAB_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "app.py"], cwd=REPO, env=env_vars, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert said in one_kvlab_line(proc.stderr)
    assert "model ready" not in proc.stderr and "Loading weights" not in proc.stderr
