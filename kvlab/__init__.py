"""kvlab: run one prompt under several transformers KV-cache strategies side by side.

The package is the backend: model loading, cache strategies, exact cache byte
accounting, the side-by-side runner and its typed events, fidelity scoring,
presets and the command line. Only `kvlab.ui` (the browser tabs) and `app.py`
import gradio; everything else imports and is tested without it.
"""

__version__ = "0.1.0"

SETUP_HINT = "run `bash scripts/setup.sh` (the README's `make run` / `make test` do it) or `pip install .`"
"""What to do when a required package is missing (said in one line by the command line and app.py)."""

try:
    from .caches.deferred_hqq import import_cache_utils_without_hqq

    import_cache_utils_without_hqq()
except ImportError:
    pass  # transformers is missing: `kvlab.__main__.entry` and app.py say so in one line when they need it
except KeyboardInterrupt:  # Ctrl-C while torch and transformers import, before any command's own handler
    import sys

    print("kvlab: interrupted while starting; nothing was run", file=sys.stderr)
    raise SystemExit(130) from None
