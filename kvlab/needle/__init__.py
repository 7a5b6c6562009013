"""The Needle wing: passkey retrieval per cache strategy (does each cache keep the model right at long context?).

- `prompt`: the Landmark-Attention passkey prompt built to a token length with the needle at a depth.
- `grid`: parsing and checking a grid of context lengths x depths x seeds (named limits).
- `runner`: runs every cell through every column's cache with the engine and streams typed events.
- `record`: per-cell records, the dense gate, the per-column summary, JSON/CSV and the reproduce snippet.
- `preset`: the schema of `presets/needle_*.yaml`. `cli`: `kvlab needle`.

This package does not import gradio; the tab lives in `kvlab/ui/needle/tab.py` and `needle_view.py`.
"""
