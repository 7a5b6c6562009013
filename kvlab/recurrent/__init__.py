"""The recurrent-state wing: what a linear-attention / state-space model's cache holds, on a tiny Mamba-2 built
from its config with fixed random weights (structure only: random weights, the text means nothing).

`state` (the tiny model, its state bytes at a sequence length, and whether a crop rolls the state back on this
transformers). No gradio.
"""
