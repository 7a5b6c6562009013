"""The shipped speech clips and the word error rate of a transcript against a clip's text.

The clips are short sentences kvlab ships elsewhere (a preset, the quality report's text), spoken once by
Debian's espeak-ng (`scripts/make_clips.py`) and committed as 16 kHz mono 16-bit WAV under `clips/` with
`clips.json` (name, file, text, the file the sentence comes from, seconds). They are read with the standard
library's `wave`: nothing here runs espeak-ng or needs an audio package.

`word_error_rate` is the usual WER, written here rather than imported (no `jiwer` dependency): the word-level
Levenshtein distance (substitutions + deletions + insertions) divided by the reference's word count, after both
texts are lower-cased and stripped of punctuation (apostrophes inside words kept). This module reads and
scores; it runs no model.
"""

from __future__ import annotations

import json
import re
import wave
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

CLIPS_DIR = Path(__file__).resolve().parent / "clips"
SAMPLE_RATE = 16_000
"""What every clip is recorded at and what Whisper's feature extractor takes, samples per second."""
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


@dataclass(frozen=True)
class Clip:
    """One shipped clip: its name, the sentence spoken (the reference for WER), the file the sentence comes
    from, its length in seconds and its WAV file."""

    name: str
    text: str
    source: str
    seconds: float
    path: Path

    def line(self) -> str:
        """One line for a picker: `name — "text" (seconds s)`."""
        return f'{self.name} — "{self.text}" ({self.seconds:.1f} s)'


@lru_cache(maxsize=1)
def list_clips() -> dict[str, Clip]:
    """The shipped clips by name, in `clips.json`'s order."""
    index = json.loads((CLIPS_DIR / "clips.json").read_text(encoding="utf-8"))
    return {item["name"]: Clip(item["name"], item["text"], item["source"], float(item["seconds"]),
                               CLIPS_DIR / item["file"]) for item in index["clips"]}


def get_clip(name: str) -> Clip:
    """The shipped clip `name`.

    Raises:
        ValueError: no such clip; the message lists the clips.
    """
    clips = list_clips()
    if name not in clips:
        raise ValueError(f"unknown clip {name!r}; clips: {', '.join(clips)}")
    return clips[name]


def read_samples(path: str | Path) -> np.ndarray:
    """A 16-bit mono WAV file's samples as float32 in [-1, 1), shape (samples,).

    Raises:
        ValueError: not a WAV file, or not mono 16-bit at SAMPLE_RATE (says which).
        OSError: the file cannot be read.
    """
    try:
        with wave.open(str(path), "rb") as audio:
            shape = (audio.getnchannels(), audio.getsampwidth(), audio.getframerate())
            frames = audio.readframes(audio.getnframes())
    except (wave.Error, EOFError) as err:
        raise ValueError(f"{Path(path).name} is not a WAV file ({err})") from None
    if shape != (1, 2, SAMPLE_RATE):
        raise ValueError(f"{Path(path).name}: {shape[0]} channel(s), {8 * shape[1]}-bit, {shape[2]} Hz; "
                         f"a clip must be mono 16-bit at {SAMPLE_RATE} Hz")
    return np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768


def words(text: str) -> list[str]:
    """`text` lower-cased, split into words, punctuation dropped (`It's blue.` -> `["it's", "blue"]`)."""
    return _WORD.findall(text.lower())


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference word count): the word-level Levenshtein distance."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, wanted in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, got in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (wanted != got))
    return row[-1], len(ref)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word errors over reference words (0.0 = exact; may exceed 1 with many insertions).

    Raises:
        ValueError: the reference has no words.
    """
    errors, total = word_errors(reference, hypothesis)
    if not total:
        raise ValueError("the reference text has no words")
    return errors / total
