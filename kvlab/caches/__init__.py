"""kvlab's own cache classes and what the quantization backends need.

`sink` (StreamingLLM's attention-sink cache, which transformers 5 removed), `rotary` (moving cached keys
between positions), `compiled` (the static cache's compiled decode step), `backends` (one-time preparation of
quanto's kernel; `python -m kvlab.caches.backends`), `deferred_hqq` (keeps `hqq` out of start-up) and
rotation quantization (TurboQuant: `lloyd_max` codebooks, `rotation_quant` packing, `rotation_cache`), vLLM's KV
cache formats (`vllm_turboquant`, `vllm_int4`: the codecs; `vllm_cache`: the layers keeping them), llama.cpp's
(`ggml_blocks`: ggml's block types and Hadamard rotation; `ggml_cache`: the layers keeping them) and `hybrid`
(quantized full-attention layers beside a hybrid model's sliding layers, which transformers refuses), and `quant`,
the quantization backends' home: one object per backend (quanto, hqq, fp8, vllm, llamacpp, rotation) owning its
knobs, cache layer, byte layout, snippet, refusal reason and serving note, and their registry. The strategies in
`kvlab.strategies` build these; nothing here knows about a run or a page.
"""
