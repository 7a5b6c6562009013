"""The quality report's documented settings: the default columns, the leaderboard's columns and the shipped text.

Weight-free: names and a text file, no model. Columns are written in Compare's syntax
(`name:knob=value:...`, see docs/cli.md); `docs/report.md` lists them with the reason for each.
"""

from __future__ import annotations

from importlib import resources

MAX_TEXT_CHARS = 2**20
"""Longest text a visitor pastes into the Report or Perplexity tab, in characters (1 Mi; both tabs score at most
12,288 tokens, about 50,000 characters of prose): a longer one is refused before it is tokenized."""
CHARS_PER_TOKEN = 12
"""Characters of a text tokenized per token wanted (more than any tokenizer's average: prose and code run at
3-5 characters per token), so a long text is not tokenized whole for a short run."""


def pasted_text_refusal(text: str) -> str | None:
    """The one line refusing a pasted `text` longer than MAX_TEXT_CHARS, or None."""
    if len(text) <= MAX_TEXT_CHARS:
        return None
    return (f"your text is {len(text):,} characters, more than the {MAX_TEXT_CHARS:,} this tab reads: paste the "
            "part you want scored")


EVICTION_METHODS = ("snapkv", "pyramidkv", "tova", "observed_attention", "knorm", "expected_attention", "random")
"""The seven scored-eviction methods (kvpress's presses of the same names)."""
WINDOWS = (256, 1024)
"""The two window sizes of the sink (StreamingLLM, 4 sink tokens) and window-attention (0 sinks) columns."""
QUANTIZED = ("quantized:backend=quanto:nbits=2", "quantized:backend=quanto:nbits=4",
             "quantized:backend=hqq:nbits=2", "quantized:backend=hqq:nbits=4", "quantized:backend=fp8")
"""transformers' `QuantizedCache` backends, residual_length 128 and q_group_size 64 (transformers' defaults)."""


def _window_columns() -> list[str]:
    return [f"sink:window_length={w}:num_sink_tokens={s}" for w in WINDOWS for s in (4, 0)]


DEFAULT_COLUMNS = ",".join([*_window_columns(), *QUANTIZED,
                            *(f"{m}:compression_ratio=0.5" for m in EVICTION_METHODS)])
"""`kvlab report`'s default columns (16): sink and window at 256 and 1,024 tokens, quanto and hqq at 2 and 4
bits, fp8, and the seven eviction methods at compression ratio 0.5."""
ROTATION = ("rotation_quantized:key_bits=4:value_bits=4", "rotation_quantized:key_bits=4:value_bits=2")
"""Rotation quantization (TurboQuant-MSE) at k4/v4 and k4/v2, beside quanto int4 and int2."""
COMPOSED = ("snapkv:compression_ratio=0.5:quantize=quanto4",)
"""An eviction method composed with quantization: SnapKV 0.5, then quanto int4 on what it kept."""
LEADERBOARD_COLUMNS = ",".join([*_window_columns(), *QUANTIZED, *ROTATION, *COMPOSED,
                                *(f"{m}:compression_ratio={r}" for r in (0.5, 0.75) for m in EVICTION_METHODS)])
"""The reference leaderboard's columns (26): the default set, rotation quantization at k4/v4 and k4/v2, SnapKV
0.5 composed with quanto int4, and the eviction methods at 0.75 as well."""
LEADERBOARD_MODELS = ("bundled", "bundled:gemma-3-270m")
"""The two bundled models: SmolLM2-135M-Instruct (`bundled`) and Gemma 3 270M."""
SHIPPED_TEXT = "python_reference.txt"
SHIPPED_TEXT_INFO = {
    "name": "python_reference.txt",
    "title": "The Python Language Reference (3.11): execution model, import system, try, function and class "
             "definitions (pydoc_data.topics)",
    "licence": "PSF-2.0 (Python Software Foundation License Version 2)",
}
"""What a record says about the shipped text (kvlab/quality/texts/README.md has the full source note)."""


def shipped_text() -> str:
    """The shipped long text (about 8,500 SmolLM2 tokens, PSF-2.0), read from the installed package."""
    return resources.files("kvlab.quality").joinpath("texts", SHIPPED_TEXT).read_text(encoding="utf-8")
