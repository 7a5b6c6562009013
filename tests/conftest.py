"""Shared fixtures: the real bundled model (loaded once per session) and a tiny
random Llama model (built in-process, no download) for tests that need many calls."""


import pytest
import torch


def pytest_configure(config):
    for marker, text in (
        ("integration", "runs the real bundled model"),
        ("browser", "drives the running app in headless chromium"),
        ("gpu", "needs a CUDA GPU; skipped without one"),
        ("slow_install", "builds a fresh virtual environment"),
    ):
        config.addinivalue_line("markers", f"{marker}: {text}")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this torch has no CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pool():
    from kvlab.models import ModelPool

    return ModelPool()


@pytest.fixture(scope="session")
def bundled(pool):
    """The real bundled SmolLM2-135M-Instruct, fp32 on CPU, loaded once."""
    from kvlab.models import ModelSpec

    return pool.get(ModelSpec(device="cpu"))


@pytest.fixture(scope="session")
def tokenizer():
    """The bundled model's tokenizer (from the converted copy; no weights loaded)."""
    from transformers import AutoTokenizer

    from kvlab.models import prepare_bundled_model

    return AutoTokenizer.from_pretrained(prepare_bundled_model())


@pytest.fixture(scope="session")
def tiny(tokenizer):
    """A 2-layer random Llama (bundled tokenizer) wrapped as a LoadedModel."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.models import LoadedModel, ModelSpec

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=1, pad_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    return LoadedModel(ModelSpec(source="tiny-random-llama", device="cpu"), model, tokenizer,
                       torch.device("cpu"), 0.0, "tiny-random-llama")
