"""How big a hub model is before anything is downloaded: its loaded weights' bytes from the hub's metadata
(`huggingface_hub.model_info`), held to `KVLAB_MAX_MODEL_MB` (`kvlab.models.sources.max_model_mb`), so one
visitor typing a 70B id on a public server does not take its disk and memory. `dtype` is a name of
`kvlab.models.loading.DTYPES` ("float32", "bfloat16", "float16"); `timeout_s` bounds the hub's answer, in seconds.
"""

from __future__ import annotations

import torch

from .gguf_cache import ModelLoadError
from .sources import hub_not_found, max_model_mb, too_big

WEIGHT_SUFFIXES = (".safetensors", ".bin")
"""The weight files transformers reads from a hub repository."""


def hub_weights_bytes(source: str, dtype: str, timeout_s: float) -> int | None:
    """Bytes hub model `source`'s weights take once loaded in `dtype`, read from the hub's metadata (nothing is
    downloaded): its parameter count times the dtype's size; without a count, its weight files' bytes, doubled
    for float32 (the files may hold half precision); None when the hub lists neither.

    Raises:
        ModelLoadError: the hub does not know `source` or will not say (`hub_not_found`'s line).
    """
    from huggingface_hub import model_info

    try:
        info = model_info(source, files_metadata=True, timeout=timeout_s)
    except Exception:  # noqa: BLE001 - not found, gated, private, the hub failing: from_pretrained would fail too
        raise ModelLoadError(hub_not_found(source)) from None
    size = getattr(torch, dtype).itemsize
    total = getattr(getattr(info, "safetensors", None), "total", None)
    if isinstance(total, int) and total > 0:
        return total * size
    files = [sibling.size for sibling in info.siblings or () if sibling.rfilename.endswith(WEIGHT_SUFFIXES)]
    if not files or any(not isinstance(each, int) for each in files):
        return None
    return sum(files) * max(1, size // 2)


def check_hub_size(source: str, dtype: str, timeout_s: float) -> None:
    """Refuse hub model `source` when its weights in `dtype` would take more than `max_model_mb` MiB (no cap:
    nothing is asked of the hub).

    Raises:
        ModelLoadError: too big, its size unknown while capped (`too_big`), or as `hub_weights_bytes`.
    """
    cap = max_model_mb()
    if not cap:
        return
    need = hub_weights_bytes(source, dtype, timeout_s)
    if need is None or need > cap * 2**20:
        raise ModelLoadError(too_big(source, need, cap))
