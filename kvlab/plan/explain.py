"""One-line explanations and notes for a cache plan, from the measured growth of each layer group.

`explain` says, per layer group, how many layers there are and how their bytes grow
(linear, flat after a window, fixed, quantized steps) and, for multi-head latent
attention, how what transformers stores compares with the latent and with per-head
keys and values. `strategy_notes` adds what the numbers do not show: a quantized
cache's full-precision residual and de-quantized working copy, and where an
offloaded cache lives. Pure functions of measured numbers; nothing is measured here.
"""

from __future__ import annotations

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def format_bytes(size: float) -> str:
    """`1.50 GiB`, `12.0 MiB`, `4.00 KiB` or `512 B` (binary units)."""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if abs(size) >= unit:
            return f"{size / unit:.2f} {name}" if unit == GIB else f"{size / unit:.1f} {name}"
    return f"{size:,.0f} B"


def _law_text(law) -> str:
    per_token = f"{law.bytes_per_token:,.0f} B"
    if law.kind == "none":
        return "hold nothing"
    if law.kind == "linear":
        return f"grow exactly {per_token} per token each (linear)"
    if law.kind == "flat_after":
        return f"grow {per_token} per token each until {law.knee:,} tokens, then stay at {format_bytes(law.far_bytes)}"
    if law.kind == "constant":
        return f"hold a fixed {format_bytes(law.far_bytes)} each"
    return f"grow about {law.bytes_per_token:,.1f} B per token each, in steps (packed groups or a rounded buffer)"


def _latent_text(arch, group) -> str:
    """How a multi-head latent attention cache compares with the latent and with per-head keys/values."""
    text = arch.config.get_text_config(decoder=True)
    rank = getattr(text, "kv_lora_rank", None)
    if not rank or group.key_shape is None:
        return ""
    stored = group.elements_per_token
    rope = getattr(text, "qk_rope_head_dim", 0)
    heads = text.num_attention_heads
    expanded = heads * (getattr(text, "qk_nope_head_dim", 0) + rope + getattr(text, "v_head_dim", 0))
    (kh, kw), (vh, vw) = group.key_shape, group.value_shape
    same = "exactly the latent" if stored == rank + rope else f"{stored / (rank + rope):.2f}x the latent"
    return (f"multi-head latent attention: transformers caches keys {kh}x{kw} + values {vh}x{vw} = {stored:,} values "
            f"per token per layer, {same} ({rank} + {rope} RoPE); per-head keys and values would be {heads} x "
            f"{expanded // heads} = {expanded:,} ({expanded / stored:.1f}x more)")


def _split(group, laws: dict) -> list:
    """The sub-groups of `group` that `laws` holds (a group whose layers the cache makes of several classes)."""
    return [part for part in laws if part.layer_type == group.layer_type and part.window == group.window
            and part != group and set(part.indices) <= set(group.indices)]


def _indices(part) -> str:
    shown = ", ".join(str(index) for index in part.indices[:8])
    return shown + (", …" if part.count > 8 else "")


def explain(strategy, arch, laws: dict, states: dict) -> str:
    """One line: per layer group, how many layers and how their bytes grow under `strategy`.

    Args:
        strategy: the `Strategy` planned. arch: the probed `Architecture`.
        laws: group (or each sub-group by layer class, `StrategyMeter.parts_of`) -> `GroupLaw` of one of its
            layers. states: group -> fixed bytes of
            one state-holding layer (state-space, linear attention).
    """
    if not strategy.use_cache:
        return "keeps nothing (use_cache=False): 0 bytes at any context; every step recomputes the whole sequence"
    parts = []
    for group in arch.groups:
        if group in laws and strategy.is_evicting and group.window is None:
            parts.append(f"{group.count} of {arch.layers} layers {group.label}: {strategy.growth_text()}")
        elif group in laws:
            parts.append(f"{group.count} of {arch.layers} layers {group.label}: {_law_text(laws[group])}")
        elif _split(group, laws):
            parts += [f"{part.count} of {arch.layers} layers {part.label} (layers {_indices(part)}): "
                      f"{_law_text(laws[part])}" for part in _split(group, laws)]
        elif group in states:
            parts.append(f"{group.count} of {arch.layers} layers {group.label}: hold a fixed "
                         f"{format_bytes(states[group])} of recurrent/convolution state each, whatever the context")
        else:
            parts.append(f"{group.count} of {arch.layers} layers {group.label}: hold nothing (they reuse other layers)")
    head = f"{strategy.describe()}: "
    sliding = [group for group in arch.groups if group.window is not None]
    if sliding and strategy.keeps_everything and not strategy.follows_layer_types:
        windows = ", ".join(str(group.window) for group in sliding)
        head += (f"keeps every token, even in the model's {sum(g.count for g in sliding)} sliding layers "
                 f"(window {windows}), which a cache built without the config treats as full; ")
    elif sliding and strategy.follows_layer_types and not strategy.is_sliding:
        head += "built from the model's config as transformers does by default, so its sliding layers slide; "
    latent = next((_latent_text(arch, group) for group in laws if _latent_text(arch, group)), "")
    return head + "; ".join(parts) + (f"; {latent}" if latent else "")


def strategy_notes(strategy, arch, totals, cells) -> list[str]:
    """What to know beside the bytes: quantized residual and working copy, offloaded placement."""
    notes = []
    planned = [cell for cell in cells if cell.cache_bytes is not None]
    if not planned:
        return notes
    last = planned[-1]
    element = totals.meter.dtype.itemsize
    kv_groups = [group for group in arch.groups if group.key_shape is not None]
    if totals.meter.quantized:  # the residual and the working copy are the quantized layers' only
        kv_groups = [part for group in kv_groups for part in totals.meter.parts_of(group)
                     if part.indices[0] in totals.meter.quantized_indices]
    residual = totals.meter.residual_length
    if residual and residual > 1:
        per_token = sum(group.count * group.elements_per_token for group in kv_groups) * totals.request.batch * element
        notes.append(f"decoding keeps up to {residual - 1} newest tokens in full precision before quantizing them "
                     f"again: up to {format_bytes((residual - 1) * per_token)} more than a fully quantized cache")
    if totals.meter.quantized:
        widest = max((group.elements_per_token for group in kv_groups), default=0)
        working = widest * last.context * totals.request.batch * element
        notes.append(f"each forward de-quantizes one layer's keys and values to full precision while attending: "
                     f"{format_bytes(working)} of working memory at {last.context:,} tokens (not cache bytes)")
    if totals.resident_sliding is not None:
        notes.append(f"offloaded: planned from the on-device {totals.measured.describe()} cache it offloads; at "
                     f"{last.context:,} tokens {format_bytes(last.cache_bytes - last.cache_bytes_on_device)} wait in "
                     f"host RAM and {format_bytes(last.cache_bytes_on_device)} stay on the GPU (the layer attending "
                     f"and the next one, prefetched{', plus the sliding layers' if totals.resident_sliding else ''}); "
                     f"fits and max_context_in_budget count the GPU part")
    return notes
