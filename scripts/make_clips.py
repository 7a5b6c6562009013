"""Make kvlab's shipped speech clips once with Debian's espeak-ng (`apt-get install espeak-ng`).

    python scripts/make_clips.py            # writes kvlab/speech/clips/<name>.wav and clips.json

Each sentence comes from a file kvlab ships (a preset, the quality report's text); espeak-ng speaks it (voice
`en-us+m1`, 130 words per minute, 40 ms between words) at 22,050 Hz; leading and trailing silence is trimmed
to 0.1 s, the samples are resampled to 16 kHz by band-limited FFT resampling and written as 16-bit mono WAV. The clips are committed: kvlab, its tests and its app read them with the standard library's `wave`
and never run espeak-ng. This script is not imported by kvlab.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "kvlab" / "speech" / "clips"
RATE = 16_000
VOICE, WORDS_PER_MINUTE, WORD_GAP_10MS = "en-us+m1", 130, 4
SILENCE = 0.01
"""Leading and trailing samples below this amplitude are trimmed (keeping PAD_S of them)."""
PAD_S = 0.1
SENTENCES = {
    "intended": ("This is generally not what was intended.", "kvlab/quality/texts/python_reference.txt"),
    "block": ("Each command typed interactively is a block.", "kvlab/quality/texts/python_reference.txt"),
    "decorators": ("Multiple decorators are applied in nested fashion.", "kvlab/quality/texts/python_reference.txt"),
    "memorize": ("Find it and memorize it.", "presets/eviction.yaml"),
}
"""Sentences kvlab ships, each with its file. Chosen among the shipped sentences on which Whisper tiny.en
transcribes espeak-ng's voice well; some it does not (docs/speech.md has the figures)."""


def speak(text: str) -> np.ndarray:
    """espeak-ng's samples for `text`, float in [-1, 1], resampled to RATE."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "raw.wav"
        subprocess.run(["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "-g", str(WORD_GAP_10MS), "-w", str(path), text], check=True)
        with wave.open(str(path)) as raw:
            rate, frames = raw.getframerate(), raw.readframes(raw.getnframes())
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float64) / 32768
    loud = np.flatnonzero(np.abs(samples) > SILENCE)
    pad = round(PAD_S * rate)
    samples = samples[max(0, loud[0] - pad):loud[-1] + pad]
    length = round(len(samples) * RATE / rate)
    spectrum = np.fft.rfft(samples)[: length // 2 + 1]
    return np.fft.irfft(spectrum, n=length) * (length / len(samples))


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    index = []
    for name, (text, source) in SENTENCES.items():
        if text not in " ".join((ROOT / source).read_text().split()):
            raise SystemExit(f"{name}: the sentence is not in {source}")
        samples = np.clip(speak(text), -1, 1)
        with wave.open(str(OUT / f"{name}.wav"), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(RATE)
            out.writeframes((samples * 32767).round().astype("<i2").tobytes())
        index.append({"name": name, "file": f"{name}.wav", "text": text, "source": source,
                      "seconds": round(len(samples) / RATE, 2)})
        print(f"{name}: {len(samples) / RATE:.2f} s, {(OUT / f'{name}.wav').stat().st_size:,} bytes")
    made_with = f"espeak-ng -v {VOICE} -s {WORDS_PER_MINUTE} -g {WORD_GAP_10MS}, silence trimmed, resampled to {RATE} Hz (scripts/make_clips.py)"
    (OUT / "clips.json").write_text(json.dumps({"made_with": made_with, "clips": index}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
