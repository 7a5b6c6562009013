"""Slow tier: the newest releases kvlab's ranges admit, installed and tested (`make test-slow`; `make test` and CI
skip it).

`scripts/newest_check.py` installs requirements.txt and requirements-test.txt without the lock into a fresh
virtual environment (what a Space built from requirements.txt gets), runs the unit tier and the MCP client test
there, and calls the app's MCP tools from a second environment holding the newest `mcp` 2.x client. A release
that breaks kvlab fails this test with the check's report (one line per package, the failing tests and why), so
it is known before a Space rebuilds on it. Needs the package index pip is configured with and a few GB of disk;
takes tens of minutes.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK_TIMEOUT_S = 3 * 3600
REPORTED = ("torch", "transformers", "gradio", "mcp", "mcp (client env)")


def test_the_newest_releases_in_range_pass_the_unit_tier_and_the_mcp_client_checks():
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "newest_check.py")], cwd=REPO,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    report = check.stdout + check.stderr[-3000:]
    names = {line[:22].strip() for line in check.stdout.splitlines()}
    assert set(REPORTED) <= names, f"the report lacks a line for {set(REPORTED) - names}:\n{report}"
    assert check.returncode == 0 and "result: PASS" in check.stdout, report
