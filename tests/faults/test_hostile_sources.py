"""Fault catalogue: hostile model sources sent to the running app by an API client, as on a public Space.

The app is launched in-process on an empty model pool with a Space's environment (SPACE_ID set, nothing else),
and `gradio_client` calls the agent tools `/compare_strategies` and `/plan_memory` with local paths, `file://`,
`~`, `..`, a file the visitor uploaded through gradio's own upload route (its server path comes back in the
upload's answer), and a secret file. Right: every one is refused with the same one line, which quotes no
file's bytes and no server path, and no model loads (the unit tier's model cache stays empty). With local
sources turned on (KVLAB_ALLOW_LOCAL=1) an upload is still refused.
"""

import socket

import httpx
import pytest

from app import create_app
from kvlab.models.bundled import MODELS
from kvlab.models.loading import ModelPool
from kvlab.models.sources import UPLOAD_REFUSAL, local_refusal

pytestmark = pytest.mark.unit
SECRET = "root:$6$kvlabsecret$abcdefgh:19000:0:99999:7:::\n"
HOSTILE = ["/etc/shadow", "/proc/self/environ", "/no/such/file", "file:///etc/passwd", "~/.ssh/id_rsa",
           "../../../etc/passwd", "model.gguf"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def app():
    """The app on an empty pool (uploads go where gradio puts them); yields (client, base url)."""
    from gradio_client import Client

    demo = create_app(ModelPool(), preload=False)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, show_error=True,
                quiet=True)
    try:
        yield Client(demo.local_url, verbose=False), demo.local_url.rstrip("/")
    finally:
        demo.close()


@pytest.fixture
def space(monkeypatch):
    for name in ("KVLAB_PUBLIC", "KVLAB_ALLOW_LOCAL", "KVLAB_ALLOW_HUB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPACE_ID", "someone/kvlab")
    return monkeypatch


def refused(client, tool: str, model: str) -> str:
    """The one-line error `tool` answers for `model`."""
    from gradio_client.exceptions import AppError

    arguments = {"strategies": "dynamic", "prompt": "hi", "max_new_tokens": 2} if tool == "compare_strategies" \
        else {"contexts": "1k"}
    with pytest.raises(AppError) as error:
        client.predict(model=model, api_name=f"/{tool}", **arguments)
    message = str(error.value)
    assert "\n" not in message.strip() and "Traceback" not in message
    return message


def uploaded(base: str, tmp_path, name: str, text: str) -> str:
    """Upload a file through gradio's own route, as any visitor can; returns its path on the server."""
    path = tmp_path / name
    path.write_text(text)
    with path.open("rb") as handle:
        answer = httpx.post(f"{base}/gradio_api/upload", files={"files": (name, handle)}, timeout=30)
    answer.raise_for_status()
    return answer.json()[0]


@pytest.mark.parametrize("tool", ["compare_strategies", "plan_memory"])
def test_every_hostile_source_gets_the_same_line_on_a_space(app, space, tmp_path, tool):
    client, base = app
    upload = uploaded(base, tmp_path, "shadow.gguf", SECRET)
    messages = {refused(client, tool, source) for source in HOSTILE + [upload, upload.rsplit("/", 1)[0]]}
    assert len(messages) == 1
    message = messages.pop()
    assert local_refusal(MODELS) in message
    assert "root" not in message and "kvlabsecret" not in message
    assert all(part not in message for part in ("/etc", "/proc", "/tmp", "gradio", "shadow", "passwd", "~"))


def test_an_upload_is_refused_even_with_local_sources_on(app, space, tmp_path):
    client, base = app
    space.setenv("KVLAB_ALLOW_LOCAL", "1")
    upload = uploaded(base, tmp_path, "shadow.gguf", SECRET)
    message = refused(client, "compare_strategies", upload)
    assert UPLOAD_REFUSAL in message and "root" not in message
    assert UPLOAD_REFUSAL in refused(client, "plan_memory", upload.rsplit("/", 1)[0])
