"""A serving engine's `/metrics` page (Prometheus text format): the KV-cache usage and prefix-cache counters
vLLM, SGLang and llama-server publish, read before and during one request.

`parse_metrics` reads the text exposition format (samples, labels, `# HELP`/`# TYPE` skipped); it is written
here, not taken from `prometheus_client`, because that package is not among kvlab's dependencies and its parser
is the only part kvlab would use. `server_figures` names what the known series say, summed over their label
sets (a server may label by model or engine). Which series each engine publishes (checked in their sources and
docs): vLLM `vllm:kv_cache_usage_perc` (0-1; `vllm:gpu_cache_usage_perc` before v1) and the counters
`vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` (tokens); SGLang `sglang:token_usage` (0-1),
`sglang:num_used_tokens` and the gauge `sglang:cache_hit_rate`; llama-server (`--metrics`)
`llamacpp:prompt_tokens_cached_total` (prompt tokens reused from the cache) beside `llamacpp:prompt_tokens_total`
(processed, the cached ones excluded), and, in older releases, `llamacpp:kv_cache_usage_ratio` and
`llamacpp:kv_cache_tokens`. It reads no network itself.
"""

from __future__ import annotations

import math
import re

KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
            "llamacpp:kv_cache_usage_ratio")
"""Gauges of the fraction (0-1) of the server's KV cache in use."""
KV_TOKENS = ("llamacpp:kv_cache_tokens", "sglang:num_used_tokens")
"""Gauges of the tokens the server's KV cache holds."""
PREFIX_COUNTERS = (("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", False),
                   ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total", False),
                   ("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_tokens_total", True))
"""(hits, queries or misses, whether the second counts misses only) counters of prompt tokens."""
HIT_RATE = ("sglang:cache_hit_rate",)
"""Gauges of the prefix cache's hit rate (0-1)."""
MAX_METRICS_CHARS = 4_000_000
"""A `/metrics` page longer than this is not read (a real one is a few hundred kB at most)."""

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?\s*')


class MetricsError(ValueError):
    """The text is not Prometheus's exposition format; the message says which line."""


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples of a Prometheus text page: name -> [(labels, value), ...] in page order.

    Raises:
        MetricsError: a line that is neither a comment nor a sample, or a value that is not a number.
    """
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise MetricsError(f"line {number} is not a Prometheus sample: {line[:80]!r}")
        labels = dict(_LABEL.findall(match["labels"] or ""))
        try:
            value = float(match["value"])
        except ValueError:
            raise MetricsError(f"line {number}: {match['value'][:40]!r} is not a number") from None
        samples.setdefault(match["name"], []).append((labels, value))
    return samples


def total(samples: dict, name: str) -> float | None:
    """The sum of series `name` over its label sets (NaN samples left out), None when the page has none."""
    values = [value for _, value in samples.get(name, []) if not math.isnan(value)]
    return sum(values) if values else None


def _first(samples: dict, names: tuple[str, ...]) -> tuple[str, float] | None:
    for name in names:
        value = total(samples, name)
        if value is not None:
            return name, value
    return None


def server_figures(before: dict, during: dict | None, after: dict) -> dict:
    """What the server's pages say about one request: `kv_cache_usage` (0-1) and `kv_cache_tokens` read while it
    ran (`during`, else `after`), the prefix cache's `prefix_cache_hits` and `prefix_cache_queries` (prompt
    tokens, the counters' growth from `before` to `after`: server-wide, so other clients' requests count too) or
    its `prefix_cache_hit_rate`, and `series`: the names read. Keys the server does not publish are absent."""
    live = during or after
    figures: dict = {"series": []}
    for key, names in (("kv_cache_usage", KV_USAGE), ("kv_cache_tokens", KV_TOKENS),
                       ("prefix_cache_hit_rate", HIT_RATE)):
        found = _first(live, names)
        if found:
            figures["series"].append(found[0])
            figures[key] = found[1]
    for hits, second, misses_only in PREFIX_COUNTERS:
        grown = [_grown(before, after, name) for name in (hits, second)]
        if None not in grown:
            figures["series"] += [hits, second]
            figures["prefix_cache_hits"] = grown[0]
            figures["prefix_cache_queries"] = grown[0] + grown[1] if misses_only else grown[1]
            break
    return figures


def _grown(before: dict, after: dict, name: str) -> float | None:
    end = total(after, name)
    return None if end is None else end - (total(before, name) or 0.0)


def figures_line(figures: dict) -> str:
    """One line for the column: `server: KV cache 3.1% used (212 tokens) · prefix cache 96 of 208 prompt tokens
    hit`; '' when the server published none of the known series."""
    parts = []
    if "kv_cache_usage" in figures:
        tokens = f" ({figures['kv_cache_tokens']:,.0f} tokens)" if "kv_cache_tokens" in figures else ""
        parts.append(f"KV cache {100 * figures['kv_cache_usage']:.1f}% used{tokens}")
    elif "kv_cache_tokens" in figures:
        parts.append(f"KV cache holds {figures['kv_cache_tokens']:,.0f} tokens")
    if "prefix_cache_queries" in figures:
        parts.append(f"prefix cache {figures['prefix_cache_hits']:,.0f} of {figures['prefix_cache_queries']:,.0f} "
                     "prompt tokens hit")
    elif "prefix_cache_hit_rate" in figures:
        parts.append(f"prefix cache hit rate {100 * figures['prefix_cache_hit_rate']:.1f}%")
    return "server: " + " · ".join(parts) if parts else ""
