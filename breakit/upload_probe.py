"""gradio's upload route on kvlab: the size cap (KVLAB_MAX_RECORD_MB -> max_file_size) and what N unique
uploads just under it cost the server's disk, and how fast one client can send them (no model, no event).

Usage: python breakit/upload_probe.py BASE N
"""
import os
import sys
import tempfile
import time

import httpx

BASE, N = sys.argv[1], int(sys.argv[2])
MIB = 2**20
UPLOADS = os.path.join(os.environ.get("GRADIO_TEMP_DIR") or tempfile.gettempdir(), "gradio")


def du(folder):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs)


with httpx.Client(timeout=60) as client:
    for size in (16 * MIB + 1, 17 * MIB):
        resp = client.post(f"{BASE}/gradio_api/upload", files={"files": ("big.json", b"x" * size)})
        print(f"upload of {size} bytes: {resp.status_code} {resp.text[:200]!r}")
    before = du(UPLOADS)
    started = time.monotonic()
    for n in range(N):
        body = os.urandom(16) + b"x" * (16 * MIB - 32)
        resp = client.post(f"{BASE}/gradio_api/upload", files={"files": (f"r{n}.json", body)})
        assert resp.status_code == 200, resp.text[:200]
    took = time.monotonic() - started
    added = du(UPLOADS) - before
    print(f"{N} uploads of 16 MiB in {took:.1f}s: upload folder grew {added / MIB:.0f} MiB "
          f"({added / MIB / took:.0f} MiB/s from one client)")
