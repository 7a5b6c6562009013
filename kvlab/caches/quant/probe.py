"""A quantization backend tried on a model's key shapes before a run, once per process and setting.

`probe_reason` quantizes, flushes and de-quantizes keys/values of the model's shape, dtype and device with the
backend's knobs: the backend's one-time set-up (imports, kernel loading, first-call dispatch) happens here,
outside any timed step, and a setting the backend cannot handle (quanto's axis -1 at most lengths)
is refused with the backend's own error instead of failing mid-run. This module tries; it does not time.
"""

from __future__ import annotations

import threading

PROBE_TOKENS = (1, 2, 3, 5, 17, 64, 129)
"""Token counts a non-default axis is tried on before a run: the backends' bit-packing fails on some lengths and
not others, so one length proves nothing."""

_probed: dict[tuple, str | None] = {}
_probe_lock = threading.Lock()


def probe_reason(backend, config, dtype, device, knobs: dict) -> str | None:
    """The backend's error as a sentence, or None: its layer (`backend.make_layer`, residual 1 where it has one)
    updated with a prompt and two single tokens of (1, kv_heads, tokens, head_dim) states of `config`'s model in
    `dtype` on `device`, at every PROBE_TOKENS prompt length for a non-default axis, at the longest otherwise.
    Remembered per backend, knobs, shape, dtype and device; nothing runs on the meta device (the planner)."""
    import torch

    from ...models.loading import head_dim

    cfg = config.get_text_config(decoder=True)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    shape = (kv_heads, head_dim(cfg))
    device = torch.device(device)
    if device.type == "meta":
        return None  # shapes only (the planner): nothing runs, nothing to set up or check
    axes = (knobs.get("axis_key", 0), knobs.get("axis_value", 0))
    key = (backend.name, knobs.get("nbits"), knobs.get("q_group_size"), *axes, shape, dtype, str(device))
    lengths = PROBE_TOKENS if axes != (0, 0) else PROBE_TOKENS[-1:]
    kwargs = backend.layer_kwargs(knobs)
    if "residual_length" in kwargs:
        kwargs["residual_length"] = 1
    with _probe_lock:
        if key in _probed:
            return _probed[key]
        _probed[key] = None
        for tokens in lengths:
            layer = backend.make_layer(**kwargs)
            try:
                for step in (tokens, 1, 1):
                    states = torch.randn(1, kv_heads, step, shape[1], dtype=dtype, device=device)
                    layer.update(states, states.clone())
            except Exception as err:  # noqa: BLE001 - any backend failure is the answer
                _probed[key] = (
                    f"the {backend.name} backend ({backend.version()}) fails with axis_key={axes[0]}, "
                    f"axis_value={axes[1]}, nbits={knobs.get('nbits')} on this model's keys ({kv_heads} KV heads x "
                    f"{shape[1]} dims, {tokens} tokens: {type(err).__name__}: {str(err).splitlines()[0][:120]}); "
                    "use axis_key=0 and axis_value=0")
                break
        return _probed[key]
