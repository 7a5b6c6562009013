"""Keeps the `hqq` package out of start-up until an hqq cache is built.

transformers' `cache_utils` imports `hqq.core.quantize` as soon as hqq is
installed, and hqq's module body applies `torch.compile` decorators, which
import torch's compiler stack: about 1 s of every start on 2 cores, measured
with `python -X importtime` (see the start-up section of `python -m kvlab
bench`). kvlab imports `cache_utils` once with hqq hidden and leaves a stand-in for
hqq's `Quantizer` there, which imports hqq and puts the real class in its
place the first time an hqq layer uses it, which is what transformers would
have done at import.

Nothing changes when `cache_utils` or hqq were already imported before kvlab
(both then stay as transformers made them), or when hqq is not installed.
"""

from __future__ import annotations

import sys
import threading

_lock = threading.Lock()
HQQ_MODULE = "hqq"
"""The hqq package's import name (a Python module, not the quantization backend of that name)."""


def import_cache_utils_without_hqq() -> None:
    """Import `transformers.cache_utils` without importing hqq; a no-op when it is already imported.

    hqq is hidden from the import system only for the duration of that import
    (`sys.modules["hqq"] = None` makes `importlib.util.find_spec` report it
    absent) and restored in `finally`, with transformers' cached
    `is_hqq_available()` answer cleared so later checks see hqq again.
    """
    if "transformers.cache_utils" in sys.modules or HQQ_MODULE in sys.modules:
        return
    from transformers.utils import import_utils

    sys.modules[HQQ_MODULE] = None
    try:
        import transformers.cache_utils as cache_utils
    finally:
        del sys.modules[HQQ_MODULE]
        import_utils.is_hqq_available.cache_clear()
    if not hasattr(cache_utils, "HQQQuantizer"):
        # transformers' own QuantizedCache(backend="hqq") keeps working for code that imports kvlab first.
        cache_utils.HQQQuantizer = _DeferredQuantizer()


class _DeferredQuantizer:
    """Stands in for hqq's `Quantizer` in `transformers.cache_utils` until first used, then imports hqq and
    puts the real class in its place.

    Raises (on first use):
        ImportError: hqq is not installed (kvlab checks availability first and
            reports it in the column instead).
    """

    def __getattr__(self, name: str):
        import transformers.cache_utils as cache_utils

        with _lock:
            if isinstance(cache_utils.HQQQuantizer, _DeferredQuantizer):
                from hqq.core.quantize import Quantizer

                cache_utils.HQQQuantizer = Quantizer
        return getattr(cache_utils.HQQQuantizer, name)
