"""kvlab keeps hqq out of start-up and still builds hqq caches (kvlab/caches/deferred_hqq.py).

Checked in a fresh python: in this test process transformers may have been
imported before kvlab, which makes the deferral a no-op.
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
import torch
import kvlab
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import import_utils
from kvlab.models import LoadedModel, ModelSpec
from kvlab.strategies import make_strategy

report = {"hqq_after_import": "hqq" in sys.modules,
          "cache_utils_after_import": "transformers.cache_utils" in sys.modules,
          "available_after_import": import_utils.is_hqq_available()}
from transformers import QuantizedCache

torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=64)
model = LlamaForCausalLM(config).eval()
direct = QuantizedCache(backend="hqq", config=config, nbits=4, residual_length=2, q_group_size=64)
with torch.inference_mode():
    model(torch.arange(8)[None], cache=direct)
report["direct_length"] = direct.get_seq_length()
report["hqq_after_direct"] = "hqq" in sys.modules
loaded = LoadedModel(ModelSpec(source="tiny", device="cpu"), model, None, torch.device("cpu"), 0.0, "tiny")
strategy = make_strategy({"strategy": "quantized", "backend": "hqq", "nbits": 4, "residual_length": 2,
                          "q_group_size": 64})
report["unavailable"] = strategy.unavailable_reason(loaded)
cache = strategy.build_cache(loaded, 16)
with torch.inference_mode():
    model(torch.arange(8)[None], cache=cache)
    for token in range(4):
        model(torch.tensor([[token]]), cache=cache)
report["hqq_after_build"] = "hqq" in sys.modules
report["layer"] = type(cache.layers[0]).__name__
report["length"] = cache.get_seq_length()
report["quantized_tokens"] = int(cache.layers[0]._quantized_keys is not None)
print(json.dumps(report))
"""


def test_import_skips_hqq_and_hqq_caches_still_work():
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["cache_utils_after_import"] is True
    assert report["hqq_after_import"] is False
    assert report["available_after_import"] is True
    assert report["direct_length"] == 8 and report["hqq_after_direct"] is True
    assert report["unavailable"] is None
    assert report["hqq_after_build"] is True
    assert report["layer"] == "HQQQuantizedLayer"
    assert report["length"] == 12
    assert report["quantized_tokens"] == 1
