"""Scored KV-cache eviction at prefill (the methods NVIDIA kvpress collects as "presses").

`scoring`: one pure function per method that ranks a layer's prompt positions per KV head.
`prefill`: the forward hooks that, during one prefill forward, prune each layer's cached keys
and values to the positions its scores rank highest, and the `EvictionRecord` of what was kept.
`decoding`: with `compress_every`, the same hooks compress each layer again every N tokens fed
after the prompt (kvpress's DecodingPress).
The strategies in `kvlab.strategies` (snapkv, pyramidkv, tova, observed_attention, knorm,
expected_attention, random) choose a scoring function and a budget; the engine runs them.
This package does not decode, render or measure.
"""
