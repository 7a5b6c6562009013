"""kvlab: run one prompt under several transformers KV-cache strategies side by side.

The package is the backend: model loading, cache strategies, exact cache byte
accounting, the side-by-side runner and its typed events, fidelity scoring,
presets and the command line. Only `kvlab.ui` (the browser tabs) and `app.py`
import gradio; everything else imports and is tested without it.
"""

__version__ = "0.1.0"

from .deferred_hqq import import_cache_utils_without_hqq

import_cache_utils_without_hqq()
