"""Fault catalogue: long scripted chats. Every turn used to re-prefill the whole history to time a turn without
reuse, with no way to skip it, and the JSON was written only at the end, so an interrupt lost everything.
Right: the no-reuse measurement can be sampled or switched off, the JSON grows as turns finish, an interrupt
keeps what is done."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvlab.cli.chat import measured_turn

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_sampling_picks_every_nth_turn_and_zero_means_never():
    assert [measured_turn(t, 1) for t in range(1, 5)] == [True] * 4
    assert [t for t in range(1, 8) if measured_turn(t, 3)] == [1, 4, 7]
    assert not any(measured_turn(t, 0) for t in range(1, 20))


def run_chat(tmp_path, turns: list[str], *flags, **popen):
    script = tmp_path / "turns.yaml"
    script.write_text("".join(f"- {json.dumps(text)}\n" for text in turns))
    out = tmp_path / "chat.json"
    argv = [sys.executable, "-m", "kvlab", "chat", "--turns", str(script), "--max-new-tokens", "4", "--json",
            str(out), *flags]
    return argv, out


@pytest.mark.parametrize("every, measured", [("0", []), ("2", [1, 3, 5])])
def test_no_reuse_measurement_is_sampled(tmp_path, every, measured):
    argv, out = run_chat(tmp_path, [f"Say the number {n}." for n in range(1, 6)], "--no-reuse-every", every)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["finished"] is True and len(record["turns"]) == 5
    assert [t["turn"] for t in record["turns"] if t["no_reuse_ttft_s"] is not None] == measured


def test_an_interrupt_keeps_the_finished_turns(tmp_path):
    argv, out = run_chat(tmp_path, [f"Count to {n}." for n in range(1, 200)], "--no-reuse-every", "0")
    # A user's Ctrl-C, whatever this test runs under: a job started in the background by a shell without job
    # control inherits SIGINT ignored, and a Python started that way never raises KeyboardInterrupt.
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        rows = 0
        deadline = time.monotonic() + 300
        while rows < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            rows += line[:4].strip().isdigit()
        assert rows == 3, "the chat did not print three turns"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted after" in stderr and "Traceback" not in stderr
    record = json.loads(out.read_text())
    assert record["finished"] is False and len(record["turns"]) >= 3
    assert record["error"].startswith("interrupted after")
