"""Limits on a model config someone supplies (a folder's or a hub repository's `config.json`), checked before
planning: the file's size before it is read, its JSON without trusting its structure, and the numbers that size
a model.

- `read_config_file(path)`: refuses a file over `MAX_CONFIG_BYTES` (from its size, then by reading at most one
  byte more), text that is not UTF-8 JSON, NaN or infinite numbers (transformers' own tagged infinities,
  `{"__float__": "Infinity"}`, are read as it reads them), nesting deeper than `MAX_CONFIG_DEPTH`, and
  anything but an object at the top; then `check_config_dict`.
- `check_config_dict(data)` / `check_config(config)`: every field of `CONFIG_LIMITS` (at any depth of the
  JSON; on a transformers config, the config and its text config, aliases such as GPT-2's `n_layer`
  included) must be a whole number within its range. The caps leave generous room above the largest public
  models (about 128 layers and 128 heads, head_dim 256, a 262k vocabulary, contexts of 10M tokens), so a real
  config always passes, while `num_hidden_layers: 999999` (which would build a million layers on the meta
  device and take gigabytes and minutes) is refused at once.

Each refusal is one `ConfigError` line naming the field and its limit. The request's own numbers (contexts,
batch) are capped by `kvlab.plan.planner.PlanRequest.check`. This module checks; it builds no config.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

MAX_CONFIG_BYTES = 1 << 20
"""Largest config.json read, bytes (1 MiB; real ones are 1-60 KB)."""
TOO_LARGE = (f"config.json is larger than {MAX_CONFIG_BYTES:,} bytes (1 MiB), the planner's limit; real ones are "
             "under 100 KB")
MAX_CONFIG_DEPTH = 32
"""Deepest nesting of objects and lists in a config.json (real ones nest 3-4 deep)."""
LAYERS, HEADS, WIDTH, RANK = 1024, 1024, 4096, 16384
HIDDEN, FFN, VOCAB, POSITIONS, EXPERTS = 1 << 17, 1 << 20, 1 << 21, 1 << 27, 4096
CONFIG_LIMITS: dict[str, tuple[int, int]] = {
    # field: (lowest, highest); the largest public model's value in the comment
    "num_hidden_layers": (1, LAYERS),  # 126 (Llama 3.1 405B)
    "num_attention_heads": (1, HEADS),  # 128
    "num_key_value_heads": (1, HEADS),  # 128
    "head_dim": (1, WIDTH),  # 256 (Gemma 2 and 3)
    "qk_nope_head_dim": (0, WIDTH), "qk_rope_head_dim": (0, WIDTH), "v_head_dim": (1, WIDTH),  # 128/64/128
    "kv_lora_rank": (1, RANK), "q_lora_rank": (1, RANK),  # 512 / 1,536 (DeepSeek V3)
    "hidden_size": (1, HIDDEN),  # 18,432 (Nemotron-4 340B)
    "intermediate_size": (1, FFN), "moe_intermediate_size": (1, FFN),  # 73,728 (Nemotron-4 340B)
    "vocab_size": (1, VOCAB),  # 262,144 (Gemma 3)
    "max_position_embeddings": (1, POSITIONS),  # 10,485,760 (Llama 4 Scout)
    "sliding_window": (0, POSITIONS), "attention_chunk_size": (0, POSITIONS),
    "num_local_experts": (0, EXPERTS), "num_experts": (0, EXPERTS), "n_routed_experts": (0, EXPERTS),  # 384
    "num_experts_per_tok": (0, EXPERTS),
}
"""Fields that size a model, with the range the planner accepts."""
ALIASES = {"n_layer": "num_hidden_layers", "n_layers": "num_hidden_layers", "num_layers": "num_hidden_layers",
           "n_head": "num_attention_heads", "n_heads": "num_attention_heads", "n_embd": "hidden_size",
           "d_model": "hidden_size", "n_positions": "max_position_embeddings", "n_ctx": "max_position_embeddings"}
"""Older configs' names for `CONFIG_LIMITS` fields (transformers maps them with each config's attribute_map)."""
VALUE_CHARS = 40
"""Most characters of a refused value quoted back."""


class ConfigError(ValueError):
    """A model source cannot give a config: unknown name, folder without config.json, hub unreachable, or a
    config over a limit of this module."""


def _limit_of(key: str) -> tuple[str, tuple[int, int]] | None:
    name = ALIASES.get(key, key)
    return (name, CONFIG_LIMITS[name]) if name in CONFIG_LIMITS else None


def check_value(key: str, value) -> None:
    """Refuse `value` for field `key` unless it is None or a whole number within `CONFIG_LIMITS[key]` (or its
    alias's); fields without a limit pass.

    Raises:
        ConfigError: one line naming the field, its range and (cut to `VALUE_CHARS`) the value.
    """
    found = _limit_of(key)
    if found is None or value is None:
        return
    name, (low, high) = found
    whole = isinstance(value, int) and not isinstance(value, bool)
    if whole and low <= value <= high:
        return
    raise ConfigError(f"config {key} must be a whole number from {low:,} to {high:,} (the planner's limit for "
                      f"{name}, far above any public model), got {_shown(value)}")


def _shown(value) -> str:
    """A short, safe rendering of a refused value: numbers and short text as written, anything else by type."""
    if isinstance(value, bool) or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) < 10 ** VALUE_CHARS else f"a number of more than {VALUE_CHARS} digits"
    if isinstance(value, str):
        return repr(value[:VALUE_CHARS]) + ("…" if len(value) > VALUE_CHARS else "")
    return f"a {type(value).__name__}"


FLOAT_TAG = "__float__"
"""transformers writes an infinite float as `{"__float__": "Infinity"}` (`PreTrainedConfig._encode_special_floats`)."""
TAGGED_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf}


def _reject_constant(text: str):
    raise ConfigError(f"config.json holds {text}: numbers must be finite (or transformers' tagged infinity)")


def _tagged_float(obj: dict):
    """json's object hook: transformers' tagged infinities become floats, a tagged NaN is refused."""
    if set(obj) != {FLOAT_TAG} or not isinstance(obj[FLOAT_TAG], str):
        return obj
    if obj[FLOAT_TAG] in TAGGED_FLOATS:
        return TAGGED_FLOATS[obj[FLOAT_TAG]]
    raise ConfigError(f"config.json holds {FLOAT_TAG} {obj[FLOAT_TAG][:VALUE_CHARS]!r}: only +/-Infinity may be "
                      "tagged, and no number may be NaN")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ConfigError(f"config.json holds a number too large for a float ({text[:VALUE_CHARS]})")
    return value


def parse_config_json(raw: bytes) -> dict:
    """The object in `raw` (at most `MAX_CONFIG_BYTES`), checked with `check_config_dict`.

    Raises:
        ConfigError: too large, not UTF-8 JSON, a non-finite number, nested deeper than `MAX_CONFIG_DEPTH`,
            not an object, or a field over its limit.
    """
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(TOO_LARGE)
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float,
                          object_hook=_tagged_float)
    except RecursionError:
        raise ConfigError(f"config.json nests deeper than {MAX_CONFIG_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise ConfigError("config.json is not UTF-8 text") from None
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"config.json is not valid JSON: {str(err).splitlines()[0][:120]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config.json must hold a JSON object, got {type(data).__name__}")
    check_config_dict(data)
    return data


def read_config_file(path: Path) -> dict:
    """`parse_config_json` of the file at `path`, its size checked before it is read.

    Raises:
        ConfigError: see `parse_config_json`; or the file cannot be read (the OS's reason, no path).
    """
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size > MAX_CONFIG_BYTES:
                raise ConfigError(TOO_LARGE)
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"config.json cannot be read ({err.strerror or type(err).__name__})") from None
    return parse_config_json(raw)


def check_config_dict(data: dict) -> None:
    """Walk `data` (objects and lists, iteratively) and check every `CONFIG_LIMITS` field and the nesting depth.

    Raises:
        ConfigError: nested deeper than `MAX_CONFIG_DEPTH`, or a field out of its range (see `check_value`).
    """
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"config.json nests deeper than {MAX_CONFIG_DEPTH} levels")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(key, str):
                check_value(key, value)
            if isinstance(value, (dict, list)):
                stack.append((value, depth + 1))


def check_config(config) -> None:
    """Check a transformers config (and its text config) against `CONFIG_LIMITS`, aliases resolved by the
    config's attribute_map; call before building anything from it.

    Raises:
        ConfigError: a field out of its range (see `check_value`).
    """
    parts = [config]
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if text is not config:
        parts.append(text)
    for part in parts:
        for key in CONFIG_LIMITS:
            check_value(key, getattr(part, key, None))
