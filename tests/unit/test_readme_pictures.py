"""The README pictures' refusal rules (scripts/readme_pictures.py): a quickstart record the app marked busy or whose
summary came later than 1.5x the quiet figure is not a picture; a picture taken while the machine got busy is
not copied into docs/; the wait for a quiet machine gives up with the other processes' cores in its reason; the
script's own app and browser are not other processes. The pictures themselves are taken by running the script on
a quiet machine."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "readme_pictures.py"
spec = importlib.util.spec_from_file_location("readme_pictures", SCRIPT)
pictures = importlib.util.module_from_spec(spec)
sys.modules["readme_pictures"] = pictures
spec.loader.exec_module(pictures)

QUIET = {"summary_s": 33.0, "wall_s": 40.2, "timing": {"busy": False, "note": ""}}


def test_a_quiet_run_near_the_quiet_figure_is_a_picture():
    assert pictures.compare_refusal(QUIET, 32.0) is None


def test_a_run_the_app_marked_busy_is_refused_with_its_reason():
    note = "⚠ the machine was too busy for a fair comparison (decode steps varied by ±27% within a column)"
    reason = pictures.compare_refusal({**QUIET, "timing": {"busy": True, "note": note}}, 32.0)
    assert "too busy" in reason and "±27%" in reason


def test_a_summary_later_than_one_and_a_half_times_the_quiet_figure_is_refused():
    reason = pictures.compare_refusal({**QUIET, "summary_s": 680.3}, 32.0)
    assert "680.3 s" in reason and "1.5" in reason
    assert pictures.compare_refusal({**QUIET, "summary_s": 48.0}, 32.0) is None  # 1.5 x 32 is the edge
    assert pictures.compare_refusal({**QUIET, "summary_s": 48.1}, 32.0) is not None


def test_a_run_without_a_summary_is_refused():
    assert "no summary" in pictures.compare_refusal({"timing": {}, "stopped": True}, 32.0)


class Outside:
    """An `OutsideWork` stand-in with the reasons given."""

    def __init__(self, reasons):
        self._reasons = reasons

    def reasons(self):
        return self._reasons


def test_a_picture_taken_while_the_machine_got_busy_is_not_copied(tmp_path, monkeypatch):
    shot = tmp_path / "needle.png"
    shot.write_bytes(b"png")
    docs = tmp_path / "docs"
    docs.mkdir()
    monkeypatch.setattr(pictures, "DOCS", docs)
    with pytest.raises(pictures.Refused, match="took 1.6 of 2 cores"):
        pictures.keep(shot, Outside(["other processes took 1.6 of 2 cores during the run"]))
    assert not (docs / "needle.png").exists()
    pictures.keep(shot, Outside([]))
    assert (docs / "needle.png").read_bytes() == b"png"


def test_the_busy_rule_is_the_apps_own(monkeypatch):
    import kvlab.measure.environment as environment

    class Others:
        cores_now = 1.6

        def cores(self):
            return Others.cores_now

    monkeypatch.setattr(environment, "OtherWork", Others)
    monkeypatch.setattr(environment, "cores_available", lambda: 2)
    monkeypatch.setattr(pictures.time, "sleep", lambda s: None)
    assert pictures.busy_now() == ["other processes took 1.6 of 2 cores during the run"]  # 1.6 > 0.5 x 2
    Others.cores_now = 0.9
    assert pictures.busy_now() == []


def test_the_scripts_own_app_and_browser_are_not_outside_work():
    """A process under the script (here a child spinning half a second of CPU, as the app or the browser does)
    adds to the tree's seconds, so `OutsideWork` does not count it as other work."""
    import subprocess

    spin = ("import time\nt = time.process_time() + 0.5\nwhile time.process_time() < t: pass\n"
            "print('spun', flush=True)\ninput()")
    tree0 = pictures.tree_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "spun\n"
        assert pictures.tree_cpu_s() - tree0 >= 0.5
    finally:
        child.communicate("")


def test_waiting_for_quiet_gives_up_with_the_reason(monkeypatch):
    monkeypatch.setattr(pictures, "busy_now", lambda: ["other processes took 1.8 of 2 cores during the run"])
    with pytest.raises(pictures.Refused, match="stayed busy.*took 1.8 of 2"):
        pictures.wait_for_quiet(timeout_s=0)
