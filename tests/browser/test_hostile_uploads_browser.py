"""Hostile uploads against the running app: a crafted record (nested 10,000 deep, NaN, format_version 99, wrong
field types, 5,000 columns, a huge number) dropped in Compare's replay box or the Report tab's saved records
gets one status line and no error pop-up; gradio itself refuses an upload over the record cap (16 MiB,
KVLAB_MAX_RECORD_MB) before storing it, over HTTP (413) and in the page (its own one-line notice naming the
limit); the exports folder is not served by gradio's file route; a malformed share link is one status line."""

import json
import urllib.error
import urllib.request
import uuid

import pytest

from pagekit import open_page

CAP = 16 * 2**20
REFUSED_TIMEOUT_MS = 60_000
STATUS_JS = "document.querySelector('#kv-run-status').innerText"
TOASTS_JS = "Array.from(document.querySelectorAll('.toast-body')).map(e => e.innerText)"
COLUMN = {"index": 0, "name": "dynamic", "strategy": "dynamic", "knobs": {}}


def crafted() -> dict[str, tuple[str, str]]:
    """file name -> (text, a phrase its refusal says)."""
    record = {"format": "kvlab.compare", "format_version": 3, "columns": [COLUMN]}
    return {
        "nested.json": ('{"format": "kvlab.compare", "format_version": 3, "columns": ' + "[" * 10_000
                        + "]" * 10_000 + "}", "nests 10001 levels deep"),
        "nan.json": (json.dumps({**record, "wall_s": float("nan")}), "holds NaN"),
        "v99.json": (json.dumps({**record, "format_version": 99}), "format_version 99 cannot be read"),
        "types.json": (json.dumps({**record, "columns": [{**COLUMN, "ttft_s": "0.5"}]}),
                       "columns[0].ttft_s should be a valid number"),
        "wide.json": (json.dumps({**record, "columns": [COLUMN] * 5_000}), "5,000 columns"),
        "huge.json": (json.dumps(record)[:-1] + ', "wall_s": 1e999}', "too large"),
    }


@pytest.fixture
def files(tmp_path):
    paths = {}
    for name, (text, said) in crafted().items():
        (tmp_path / name).write_text(text)
        paths[name] = (tmp_path / name, said)
    return paths


def upload(app_url: str, size: int) -> tuple[int, str]:
    """POST a file of `size` bytes to gradio's upload route, as an API client does: (status, body)."""
    boundary = uuid.uuid4().hex
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="r.json"\r\n'
            "Content-Type: application/json\r\n\r\n").encode() + b"{" + b" " * (size - 2) + b"}" + \
        f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(app_url + "gradio_api/upload", data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_gradio_refuses_an_upload_over_the_record_cap_before_storing_it(app_url):
    status, body = upload(app_url, CAP + 1)
    assert status == 413 and f"maximum allowed size of {CAP} bytes" in body
    status, body = upload(app_url, 1024)
    assert status == 200 and json.loads(body)[0].endswith("r.json")


def one_status_line(page, said: str) -> str:
    page.wait_for_function(f"{STATUS_JS}.includes({json.dumps(said)})", timeout=REFUSED_TIMEOUT_MS)
    text = page.evaluate(STATUS_JS)
    assert text.startswith("✖ cannot replay this file: ") and "\n" not in text.strip(), text
    assert page.evaluate(TOASTS_JS) == [], "an error pop-up showed"
    return text


def test_crafted_records_get_one_status_line_in_compare_and_report(page, files):
    page.locator("#kv-replay-box").click()
    for path, said in files.values():
        page.locator("#kv-replay input[type=file]").set_input_files(str(path))
        one_status_line(page, said)
        page.locator("#kv-replay button[aria-label=Clear]").click()
    page.get_by_role("tab", name="Report").click()
    page.locator("#report-saved input[type=file]").set_input_files([str(path) for path, _ in files.values()])
    status = page.locator("#report-status")
    status.filter(has_text="5,000 columns").wait_for(timeout=REFUSED_TIMEOUT_MS)
    lines = [line for line in status.inner_text().splitlines() if line.strip()]
    assert len(lines) == len(files) and all(line.startswith("⚠️") for line in lines), lines
    for (path, said), line in zip(files.values(), lines):
        assert said in line and str(path.parent) not in line
    assert page.evaluate(TOASTS_JS) == []
    assert "Error" not in status.inner_text()


def test_the_page_refuses_an_upload_over_the_cap_with_gradios_notice_naming_the_limit(page, tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b"{" + b" " * CAP + b"}")
    page.locator("#kv-replay-box").click()
    assert "at most 16 MiB (KVLAB_MAX_RECORD_MB)" in page.locator("#kv-replay").inner_text()
    before = page.evaluate(STATUS_JS)
    page.locator("#kv-replay input[type=file]").set_input_files(str(big))
    page.wait_for_function(f"{TOASTS_JS}.length > 0", timeout=REFUSED_TIMEOUT_MS)
    (notice,) = page.evaluate(TOASTS_JS)
    assert "exceed the maximum allowed size of 16.0" in notice and "big.json" in notice
    assert page.evaluate(STATUS_JS) == before  # nothing reached the server, nothing was parsed


def test_the_exports_folder_is_not_served_and_a_malformed_share_link_is_one_line(app_url, browser):
    import shutil

    from kvlab.ui.compare.kept_runs import new_run_folder

    folder = new_run_folder("run-")  # the app runs on this machine: a kept result as it writes one
    try:
        (folder / "kvlab-run.json").write_text("{}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{app_url}gradio_api/file={folder / 'kvlab-run.json'}", timeout=30)
        assert refused.value.code == 403
    finally:
        shutil.rmtree(folder)
    shared = open_page(browser, app_url + "?run=../../etc/passwd")
    try:
        shared.wait_for_function(f"{STATUS_JS}.includes('does not name a shared result')",
                                 timeout=REFUSED_TIMEOUT_MS)
        assert "passwd" not in shared.evaluate(STATUS_JS) and shared.evaluate(TOASTS_JS) == []
    finally:
        shared.context.close()
