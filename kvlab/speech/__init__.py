"""The speech wing: an encoder-decoder model (Whisper) transcribing shipped clips under several self-attention
caches beside its fixed cross-attention cache.

`clips` (the shipped clips, reading them, word error rate) and `runner` (`run_speech`: Compare's events for a
clip instead of a prompt). No gradio.
"""
