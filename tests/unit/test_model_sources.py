"""Model sources without loading a model: the bundled list, local .gguf files checked before anything slow runs
(a GGUF file written in-test with the `gguf` package), the local-path permission, and base-model prompts."""

import numpy as np
import pytest

from kvlab.models.bundled import MODELS, bundled_model, picker_choices
from kvlab.generation import encode_prompt, plain_conversation
from kvlab.models.gguf_cache import check_gguf, gguf_folder_name
from kvlab.models.loading import ModelLoadError, ModelSpec, load_model


@pytest.fixture
def small_gguf(tmp_path):
    """A complete GGUF file holding one 64x64 float32 tensor (about 16 KiB of data)."""
    from gguf import GGUFWriter

    path = tmp_path / "small.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("weight", np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_bundled_list_names_both_models_with_their_licences():
    assert list(MODELS) == ["bundled", "bundled:gemma-3-270m"]
    lines = dict((key, line) for line, key in picker_choices())
    assert "Apache-2.0" in lines["bundled"] and "chat model" in lines["bundled"]
    assert "Gemma Terms of Use" in lines["bundled:gemma-3-270m"] and "base model" in lines["bundled:gemma-3-270m"]
    assert "15 sliding-window (512) + 3 full attention" in lines["bundled:gemma-3-270m"]
    assert bundled_model("HuggingFaceTB/SmolLM2-135M-Instruct") is None
    with pytest.raises(ModelLoadError, match="unknown bundled model 'bundled:llama-70b'; bundled: bundled, bundled:gemma"):
        bundled_model("bundled:llama-70b")


def test_a_complete_gguf_passes_and_its_folder_is_keyed_by_content(small_gguf, tmp_path):
    check_gguf(small_gguf)
    name = gguf_folder_name(small_gguf)
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(small_gguf.read_bytes())
    assert name.startswith("small-") and gguf_folder_name(copy).split("-", 1)[1] == name.split("-", 1)[1]
    copy.write_bytes(small_gguf.read_bytes()[:-1] + b"\x01")
    assert gguf_folder_name(copy).split("-", 1)[1] != name.split("-", 1)[1]


def test_a_truncated_gguf_is_refused_with_a_clear_message(small_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small_gguf.read_bytes()[:-4000])
    with pytest.raises(ModelLoadError, match="cut.gguf is (truncated|not a complete GGUF file)"):
        check_gguf(cut)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(small_gguf.read_bytes()[:10])
    with pytest.raises(ModelLoadError, match="header.gguf is not a complete GGUF file"):
        check_gguf(header_only)


def test_a_file_that_is_not_gguf_is_refused_by_load_model_before_any_conversion(tmp_path):
    other = tmp_path / "notes.gguf"
    other.write_text("just some text\n")
    with pytest.raises(ModelLoadError, match=r"notes.gguf is not a GGUF file: it does not start with the GGUF "
                                             r"magic bytes") as refused:
        load_model(ModelSpec(str(other), device="cpu"))
    assert "just" not in str(refused.value)
    with pytest.raises(ModelLoadError, match="no such file"):
        load_model(ModelSpec(str(tmp_path / "missing.gguf"), device="cpu"))


def test_local_gguf_files_follow_the_local_path_permission(small_gguf, monkeypatch):
    monkeypatch.setenv("KVLAB_ALLOW_LOCAL", "0")
    with pytest.raises(ModelLoadError, match=r"KVLAB_ALLOW_LOCAL=0"):
        load_model(ModelSpec(str(small_gguf), device="cpu"))


def test_a_base_model_gets_plain_text_prompts_and_turn_joined_conversations(tiny_tokenizer):
    import copy

    base = copy.deepcopy(tiny_tokenizer)
    base.chat_template = None
    plain = encode_prompt(base, "Why is the sky blue?", chat=True)[0].tolist()
    assert plain == base("Why is the sky blue?")["input_ids"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    text = plain_conversation(messages)
    assert text == "Be brief.\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:"
    assert encode_prompt(base, messages)[0].tolist() == base(text)["input_ids"]
