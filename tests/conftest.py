"""Test tiers and shared fixtures.

Tiers: every test carries exactly one of the markers declared in pyproject.toml,
given by where it lives: tests/unit -> `unit`, tests/integration ->
`integration`, tests/browser -> `browser`, tests/gpu -> `gpu`, tests/slow ->
`slow` (deselected unless `-m slow` is given: `make test-slow`),
tests/test_setup_script.py -> `slow_install`. Collection stops with a message
for a test anywhere else or one that marks itself with a second tier. `gpu`
tests are skipped where torch has no CUDA.

A test of another tier may also be marked `slow` (`pytestmark = pytest.mark.slow` or on the test): a long
check of its tier, with that tier's fixtures, which `make test` and CI leave out and `make test-slow` runs
(`-m slow`), so CI stays under its time limit.

Fixtures: `tiny` is a 2-layer random Llama with a byte-level BPE tokenizer
trained here in-process (`tiny_tokenizer`), for tests that need many model calls
and no real weights. `bundled` is the real bundled model, loaded once per
session, `gemma` the bundled Gemma 3 270M (a hybrid sliding-window model) and `whisper` the bundled Whisper
tiny.en (an encoder-decoder speech model, converted from CTranslate2's format once); unit
tests may not request them, their `pool` or the `tokenizer`, and run
with an empty model cache folder that they must leave empty, so the unit tier
never converts the bundled GGUF.
"""

import os
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "browser", "gpu", "slow", "slow_install")
TIER_FOLDERS = ("unit", "integration", "browser", "gpu", "slow")
TIER_FILES = {"test_setup_script.py": "slow_install"}
MARKED_FOLDERS = ("faults",)
"""Folders whose test files name their own tier (`pytestmark`): the fault catalogue mixes unit and
integration cases."""
BUNDLED_MODEL_FIXTURES = frozenset({"pool", "bundled", "tokenizer", "gemma", "whisper"})
CALIBRATION_FOLDER = "triattention"
"""`kvlab.eviction.calibration.FOLDER`, spelled out: this file is also run where kvlab cannot be imported
(tests/unit/test_tiers.py); tests/unit/test_triattention_calibration.py checks the two agree."""

TINY_VOCAB_SIZE = 1000
TINY_SPECIAL_TOKENS = {"unk": "<unk>", "bos": "<|im_start|>", "eos": "<|im_end|>", "pad": "<pad>"}
TINY_DEFAULT_SYSTEM = "You are a helpful assistant."
# ChatML, with a default system message when there is none (as SmolLM2's and Qwen's templates have).
TINY_CHAT_TEMPLATE = (
    "{% if messages and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + TINY_DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tier_of(path: Path, marked: list[str] | None = None) -> str | None:
    """The tier a test file belongs to, from its place under tests/ (in MARKED_FOLDERS: the one tier its
    tests are `marked` with); None outside the tier places."""
    path = path.resolve()
    if not path.is_relative_to(TESTS_DIR):
        return None
    relative = path.relative_to(TESTS_DIR)
    if len(relative.parts) == 1:
        return TIER_FILES.get(relative.name)
    if relative.parts[0] in MARKED_FOLDERS:
        named = [m for m in marked or [] if m != "slow"] or list(marked or [])  # `slow` beside its own tier
        return named[0] if len(named) == 1 else None
    return relative.parts[0] if relative.parts[0] in TIER_FOLDERS else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    problems = []
    for item in items:
        tier = tier_of(item.path, sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS}))
        if tier is None:
            problems.append(f"{item.nodeid}: not in a tier folder ({', '.join(TIER_FOLDERS)}), one of "
                            f"{', '.join(TIER_FILES)}, or marked with one tier in {', '.join(MARKED_FOLDERS)}/")
            continue
        item.add_marker(tier)
        marked = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
        if tier != "slow" and "slow" in marked:
            marked.remove("slow")  # a long check of its own tier, left to `make test-slow`
        if marked != [tier]:
            problems.append(f"{item.nodeid}: marked {', '.join(marked)}; a test carries exactly one tier ({tier})")
    if problems:
        raise pytest.UsageError("tests without exactly one tier:\n  " + "\n  ".join(problems))
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items:
        import torch

        if not torch.cuda.is_available():
            for item in gpu_items:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; this torch has no CUDA"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    requested = sorted(BUNDLED_MODEL_FIXTURES.intersection(item.fixturenames))
    if requested and item.get_closest_marker("unit"):
        pytest.fail(f"{item.nodeid} is a unit test but requests {', '.join(requested)} (the real bundled model); "
                    "unit tests run on `tiny` / `tiny_tokenizer`: use those, or move the test to tests/integration",
                    pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def shared_runs_in_a_folder_of_the_session(tmp_path_factory):
    """The shared runs every tier writes (`KVLAB_RUNS_DIR`, and so the apps the tests start) go to one folder of
    this session, never the user's data folder; a caller's own KVLAB_RUNS_DIR is kept."""
    with pytest.MonkeyPatch.context() as patch:
        if not os.environ.get("KVLAB_RUNS_DIR"):
            patch.setenv("KVLAB_RUNS_DIR", str(tmp_path_factory.mktemp("kvlab-runs")))
        yield


@pytest.fixture(autouse=True)
def unit_tests_leave_the_model_cache_empty(request, tmp_path_factory):
    """A unit test runs with `KVLAB_CACHE_DIR` set to a new empty folder and fails if it writes there, except
    TriAttention's calibration files (`triattention/`, a few KiB of query statistics of the tiny models that any
    run of the strategy writes; `kvlab.eviction.calibration`).

    The variable is set apart from the test's own `monkeypatch`, so a test that undoes its patches keeps it.
    """
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    folder = tmp_path_factory.mktemp("kvlab-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVLAB_CACHE_DIR", str(folder))
        yield
    written = sorted(str(path.relative_to(folder)) for path in folder.rglob("*")
                     if path.relative_to(folder).parts[0] != CALIBRATION_FOLDER)
    assert not written, (f"a unit test wrote into the model cache ({', '.join(written[:5])}): it converted or "
                         "loaded the bundled model; move it to tests/integration")


def train_tiny_tokenizer():
    """A real byte-level BPE tokenizer (TINY_VOCAB_SIZE tokens) trained on the text of Python's own help topics.

    `pydoc_data.topics` ships with every Python (about 460 KB of English prose
    and code), so this needs no download; training takes a fraction of a second.
    Special tokens: ids 0-3 are unk, bos (`<|im_start|>`), eos (`<|im_end|>`) and pad.
    """
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=TINY_SPECIAL_TOKENS["unk"]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB_SIZE, special_tokens=list(TINY_SPECIAL_TOKENS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(topics.values(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **{f"{role}_token": token
                                                                 for role, token in TINY_SPECIAL_TOKENS.items()})
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def build_tiny(tokenizer, device: str = "cpu"):
    """A 2-layer random Llama over `tokenizer`'s vocabulary, fp32 on `device`, wrapped as a LoadedModel."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvlab.models.loading import LoadedModel, ModelSpec

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval().to(device)
    return LoadedModel(ModelSpec(source="tiny-random-llama", device=device), model, tokenizer,
                       torch.device(device), 0.0, "tiny-random-llama")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The in-process BPE tokenizer with a ChatML chat template (see `train_tiny_tokenizer`)."""
    return train_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny(tiny_tokenizer):
    """A 2-layer random Llama on CPU with `tiny_tokenizer`."""
    return build_tiny(tiny_tokenizer)


TINY_HYBRID_WINDOW = 16
"""The sliding window of `tiny_hybrid`'s sliding layers."""


@pytest.fixture(scope="session")
def tiny_hybrid(tiny):
    """A 4-layer random Gemma 3 on CPU, sliding (window TINY_HYBRID_WINDOW) and full-attention layers alternating,
    with the tiny tokenizer."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from kvlab.models.loading import LoadedModel, ModelSpec

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(tiny.tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=TINY_HYBRID_WINDOW,
        layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=1024,
        eos_token_id=tiny.tokenizer.eos_token_id, bos_token_id=1, pad_token_id=2)
    model = Gemma3ForCausalLM(config).eval()
    return LoadedModel(ModelSpec(source="tiny-random-gemma3", device="cpu"), model, tiny.tokenizer,
                       torch.device("cpu"), 0.0, "tiny-random-gemma3")


class TinyPool:
    """Stands in for `kvlab.models.ModelPool` in a tab built in-process: every spec is one model."""

    def __init__(self, loaded):
        self.model = loaded

    def get(self, spec, progress=None):
        return self.model

    def loaded(self, spec):
        return self.model


@pytest.fixture
def tiny_pool(tiny):
    """A model pool whose every spec is the tiny model (for tabs built in-process)."""
    return TinyPool(tiny)


@pytest.fixture(scope="session")
def tiny_cuda(tiny_tokenizer):
    """The same tiny model on CUDA (for gpu tests)."""
    return build_tiny(tiny_tokenizer, "cuda")


@pytest.fixture(scope="session")
def pool():
    from kvlab.models.loading import ModelPool

    return ModelPool()


@pytest.fixture(scope="session")
def bundled(pool):
    """The real bundled SmolLM2-135M-Instruct, fp32 on CPU, loaded once."""
    from kvlab.models.loading import ModelSpec

    return pool.get(ModelSpec(device="cpu"))


@pytest.fixture(scope="session")
def gemma(pool):
    """The real bundled Gemma 3 270M (`bundled:gemma-3-270m`: 15 sliding layers, window 512, and 3 full ones),
    fp32 on CPU, loaded once (converted once into the cache folder, about 70 s cold)."""
    from kvlab.models.loading import ModelSpec

    return pool.get(ModelSpec("bundled:gemma-3-270m", device="cpu"))


@pytest.fixture(scope="session")
def tokenizer():
    """The bundled model's tokenizer (from the converted copy; no weights loaded)."""
    from transformers import AutoTokenizer

    from kvlab.models.loading import prepare_bundled_model

    return AutoTokenizer.from_pretrained(prepare_bundled_model())


@pytest.fixture(scope="session")
def whisper(pool):
    """The real bundled Whisper tiny.en, fp32 on CPU, loaded once (converted once into the cache folder)."""
    from kvlab.models.loading import ModelSpec

    return pool.get(ModelSpec("bundled:whisper-tiny.en", device="cpu"))
