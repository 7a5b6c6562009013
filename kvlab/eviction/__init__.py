"""Scored KV-cache eviction at prefill (the methods NVIDIA kvpress collects as "presses").

`scoring`: one pure function per method that ranks a layer's prompt positions per KV head.
`kept`: `prune_layer` (keep a layer's best-scored positions) and the `EvictionRecord` of what was kept.
`prefill`: the forward hooks that, during one prefill forward, prune each layer's cached keys
and values to the positions its scores rank highest.
`decoding`: with `compress_every`, the same hooks buffer the tokens fed after the prompt and
compress each layer again every N of them (`buffer_and_compress`, kvpress's DecodingPress).
`cache`: the pruned cache classes, whose layers know the positions they hold.
The strategies in `kvlab.strategies` (snapkv, pyramidkv, tova, observed_attention, knorm,
expected_attention, random) choose a scoring function and a budget; the engine runs them.
This package does not decode, render or measure.
"""
