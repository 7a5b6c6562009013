"""Hostile model sources, as a visitor of a public server types them (no model is loaded).

On a Space (SPACE_ID set) or with KVLAB_PUBLIC=1 local files and folders are off by default: every source that is
not a bundled name or a well-formed hub id gets one refusal line, the same whether the path exists or not, before
anything touches the file system. A hub id that names a folder on the server reads like a missing hub id. With
local sources on (a desktop), a file's bytes are still never quoted. A visitor's upload is never a model.
"""

import builtins
import io
import os
from pathlib import Path

import numpy as np
import pytest

from kvlab.models.bundled import MODELS
from kvlab.models.loading import ModelLoadError, ModelSpec, allow_local_folders, load_model
from kvlab.models import loading
from kvlab.models.sources import UPLOAD_REFUSAL, hub_not_found, local_refusal, public_mode, safe_line

SETTINGS = ("SPACE_ID", "KVLAB_PUBLIC", "KVLAB_ALLOW_LOCAL", "KVLAB_ALLOW_HUB")
SECRET = b"root:$6$kvlabsecret$abcdefgh:19000:0:99999:7:::\n"


@pytest.fixture
def settings(monkeypatch):
    """A clean environment for the source settings; returns monkeypatch to set some."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout_s=0: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return monkeypatch


@pytest.fixture
def space(settings):
    """A Hugging Face Space's defaults: SPACE_ID set, nothing else."""
    settings.setenv("SPACE_ID", "someone/kvlab")
    return settings


@pytest.fixture
def desktop(settings):
    """Local sources on (a desktop user, or an operator who turned them on)."""
    settings.setenv("KVLAB_ALLOW_LOCAL", "1")
    return settings


@pytest.fixture
def secret_file(tmp_path):
    """An /etc/shadow-like file: a secret's first bytes, mode 000 (root reads it anyway)."""
    path = tmp_path / "shadow"
    path.write_bytes(SECRET)
    path.chmod(0)
    yield path
    path.chmod(0o600)


def refusal(source: str) -> str:
    with pytest.raises(ModelLoadError) as refused:
        load_model(ModelSpec(source, device="cpu"))
    return str(refused.value)


@pytest.fixture
def touched(monkeypatch):
    """Every path the code under test hands to the OS's file functions, recorded (the calls still happen)."""
    import transformers  # noqa: F401 - imported before recording: importing reads files of its own

    seen = []

    def recording(original):
        def call(path, *args, **kwargs):
            seen.append(os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path))
            return original(path, *args, **kwargs)
        return call

    for module, name in [(os, "stat"), (os, "lstat"), (os, "open"), (os, "listdir"), (os, "scandir"),
                         (os, "access"), (os.path, "exists"), (os.path, "lexists"), (os.path, "isdir"),
                         (os.path, "isfile"), (builtins, "open"), (io, "open")]:
        monkeypatch.setattr(module, name, recording(getattr(module, name)))
    return seen


def test_a_space_is_public_and_refuses_local_sources_by_default(settings):
    assert not public_mode() and allow_local_folders()
    settings.setenv("SPACE_ID", "someone/kvlab")
    assert public_mode() and not allow_local_folders()
    settings.setenv("KVLAB_ALLOW_LOCAL", "1")
    assert allow_local_folders()
    settings.delenv("SPACE_ID")
    settings.delenv("KVLAB_ALLOW_LOCAL")
    settings.setenv("KVLAB_PUBLIC", "1")
    assert public_mode() and not allow_local_folders()
    settings.setenv("KVLAB_PUBLIC", "maybe")  # an unreadable value errs on the safe side
    assert not allow_local_folders()
    settings.setenv("KVLAB_PUBLIC", "0")
    settings.setenv("KVLAB_ALLOW_LOCAL", "sure")
    assert not allow_local_folders()


HOSTILE = ["/etc/shadow", "/etc/passwd", "/proc/self/environ", "/no/such/file", "file:///etc/passwd",
           "~", "~/.ssh/id_rsa", "..", "../../etc/passwd", "presets/../../etc", "presets\\models",
           "C:\\Windows\\win.ini", "model.gguf", "owner/model.gguf", "/tmp/gradio/0123abcd/record.json", "gpt2",
           "a/b/c", "owner/.hidden", "ownér/model", ""]


@pytest.mark.parametrize("source", HOSTILE[:-1])
def test_every_local_source_gets_one_line_on_a_space_before_the_file_system_is_touched(space, touched, source):
    assert refusal(source) == local_refusal(MODELS)
    wanted = {Path(source).name, source.strip("~/.")} - {"", ".", ".."}
    assert [path for path in touched if any(part in path for part in wanted)] == []


def test_an_existing_and_a_missing_path_read_alike(space, secret_file, tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text("{}")
    messages = {refusal(str(path)) for path in (secret_file, tmp_path / "missing", tmp_path / "folder",
                                                 tmp_path / "folder" / "config.json", f"file://{secret_file}")}
    assert messages == {local_refusal(MODELS)}
    assert "KVLAB_ALLOW_LOCAL=0" in messages.pop()


def test_a_hub_id_naming_a_folder_here_reads_like_a_missing_hub_id(space, tmp_path):
    space.chdir(tmp_path)
    (tmp_path / "acme" / "model").mkdir(parents=True)
    (tmp_path / "acme" / "model" / "config.json").write_text('{"model_type": "llama"}')
    assert refusal("acme/model") == hub_not_found("acme/model")
    assert refusal("acme/absent") == hub_not_found("acme/absent")


def test_a_hub_error_quotes_no_path_of_the_server(space, tmp_path):
    """A broken config.json in the local Hugging Face cache: transformers names the file's full path."""
    repo = tmp_path / "hub" / "models--acme--broken"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{not json")
    space.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    message = refusal("acme/broken")
    assert str(tmp_path) not in message and "/" not in message.replace("acme/broken", "")


def test_an_upload_is_never_a_model_even_with_local_sources_on(desktop, tmp_path):
    from gguf import GGUFWriter

    uploads = tmp_path / "gradio"
    (uploads / "0123abcd").mkdir(parents=True)
    desktop.setenv("GRADIO_TEMP_DIR", str(uploads))
    upload = uploads / "0123abcd" / "model.gguf"
    writer = GGUFWriter(str(upload), "llama")
    writer.add_tensor("weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert refusal(str(upload)) == UPLOAD_REFUSAL
    assert refusal(str(uploads / "0123abcd")) == UPLOAD_REFUSAL
    desktop.delenv("KVLAB_ALLOW_LOCAL")
    desktop.setenv("KVLAB_PUBLIC", "1")
    assert refusal(str(upload)) == local_refusal(MODELS)


def test_a_secret_files_bytes_are_never_quoted_with_local_sources_on(desktop, secret_file):
    message = refusal(str(secret_file))
    assert "\n" not in message and "root" not in message and "kvlabsecret" not in message and "b'" not in message
    assert message.startswith("shadow ")


@pytest.mark.parametrize("path", ["/etc/shadow", "/proc/self/environ"])
def test_the_systems_own_secrets_are_never_quoted_with_local_sources_on(desktop, path):
    if not os.path.exists(path):
        pytest.skip(f"{path} is not on this system")
    message = refusal(path)
    assert "\n" not in message and "b'" not in message and "root" not in message
    try:
        head = Path(path).read_bytes()[:16]
    except OSError:
        head = b""
    assert all(chunk not in message for chunk in head.decode("latin-1").split("=") if len(chunk) >= 3)


def test_a_missing_local_path_still_says_so_on_a_desktop(desktop, tmp_path):
    assert refusal(str(tmp_path / "absent.gguf")) == f"{str(tmp_path / 'absent.gguf')!r}: no such file"


def test_safe_line_keeps_one_line_without_server_paths():
    text = ("[Errno 13] Permission denied: '/etc/shadow' (see ~/.cache/kvlab, file:///srv/x, C:\\Users\\me)"
            " at https://huggingface.co/owner/name\nsecond line")
    line = safe_line(text)
    assert line == ("[Errno 13] Permission denied: '<path>' (see <path>, <path>, <path>) at "
                    "https://huggingface.co/owner/name")
    assert len(safe_line("x" * 5000)) == 300
