"""vLLM's --kv-cache-dtype formats as kvlab stores them (`kvlab.caches.vllm_turboquant`, `kvlab.caches.vllm_int4`):
the slot sizes equal vLLM's `TurboQuantConfig` arithmetic, the stored bytes sit where vLLM's store kernels put
them, the round trips lose what the quantizers are documented to lose, and the knobs refuse what neither vLLM nor
the paper has, naming the allowed values."""

import math

import pytest
import torch

from kvlab.caches.lloyd_max import MAX_1960_DISTORTION
from kvlab.caches.quant.vllm import DEFAULTS, check_vllm_knobs, vllm_kv_cache
from kvlab.caches.vllm_int4 import Int4PerTokenHeadCodec, rht_signs
from kvlab.caches.vllm_turboquant import PRESETS, SlotFormat, TurboQuantCodec, gaussian_lloyd_max, hadamard

pytestmark = pytest.mark.unit

MAX_1960_4BIT_LEVELS = (0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6180, 2.0690, 2.7326)
"""The positive half of Max (1960)'s 16-level quantizer of a unit Gaussian (Table I)."""


def vllm_slot_size(head_dim: int, key_bits: int, value_bits: int) -> int:
    """vLLM's `TurboQuantConfig.slot_size_aligned`, written out from its config.py: key_packed_size (head_dim for
    FP8 keys, else ceil(d·b/8) + 2) + value_packed_size (ceil(d·b/8) + 4), rounded up to even."""
    key = head_dim if key_bits == 8 else math.ceil(head_dim * key_bits / 8) + 2
    slot = key + math.ceil(head_dim * value_bits / 8) + 4
    return slot + slot % 2


@pytest.mark.parametrize("head_dim", [8, 64, 128, 256])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_slot_is_vllms_slot_size(preset, head_dim):
    key_bits, value_bits, correction = PRESETS[preset]
    fmt = SlotFormat(head_dim, key_bits, value_bits, correction)
    codec = TurboQuantCodec(fmt)
    slots = codec.encode(torch.randn(1, 2, 3, head_dim), torch.randn(1, 2, 3, head_dim))["slots"]
    assert fmt.slot_size_aligned == vllm_slot_size(head_dim, key_bits, value_bits) == slots.shape[-1]
    assert slots.dtype == torch.uint8 and slots.shape[:3] == (1, 2, 3)
    assert sum(stop - start for start, stop in codec.offsets().values()) == fmt.slot_size_aligned


def test_the_slot_sizes_vllm_documents_at_head_dim_128():
    """The page sizes others read off vLLM at head_dim 128: 196, 134, 118, 102 bytes per token and head."""
    sizes = {name: SlotFormat(128, *PRESETS[name]).slot_size_aligned for name in PRESETS}
    assert sizes == {"turboquant_k8v4": 196, "turboquant_4bit_nc": 134, "turboquant_k3v4_nc": 118,
                     "turboquant_3bit_nc": 102}


def _expected_indices(unit: torch.Tensor, bits: int, head_dim: int) -> torch.Tensor:
    """A coordinate's cell: how many of the codebook's midpoints are <= it (vLLM's binary search)."""
    centroids = torch.tensor(gaussian_lloyd_max(head_dim, bits), dtype=torch.float32)
    midpoints = (centroids[:-1] + centroids[1:]) / 2
    rotated = unit @ hadamard(head_dim)
    return (rotated.unsqueeze(-1) >= midpoints).sum(-1)


def test_a_4bit_nc_slot_holds_vllms_bytes_in_vllms_order():
    torch.manual_seed(1)
    key, value = torch.randn(64) * 3, torch.randn(64)
    slot = TurboQuantCodec(SlotFormat(64, 4, 4, True)).encode(key.view(1, 1, 1, 64), value.view(1, 1, 1, 64))["slots"][0, 0, 0]
    norm = key.norm()
    indices = _expected_indices(key / (norm + 1e-8), 4, 64)
    assert slot[:32].tolist() == (indices[0::2] | (indices[1::2] << 4)).tolist()  # even coordinate: low nibble
    assert bytes(slot[32:34].tolist()) == norm.to(torch.float16).view(1).view(torch.uint8).numpy().tobytes()
    low, scale = value.min(), (value.max() - value.min()) / 15
    codes = ((value - low) / scale + 0.5).floor().clamp(0, 15).to(torch.int64)
    assert slot[34:66].tolist() == (codes[0::2] | (codes[1::2] << 4)).tolist()
    assert slot[66:68].view(torch.float16).item() == scale.to(torch.float16).item()
    assert slot[68:70].view(torch.float16).item() == low.to(torch.float16).item()


def test_3bit_codes_fill_three_bytes_per_eight_coordinates_little_endian_and_an_odd_slot_is_padded():
    torch.manual_seed(2)
    key = torch.randn(8)
    codec = TurboQuantCodec(SlotFormat(8, 3, 4, True))
    slot = codec.encode(key.view(1, 1, 1, 8), torch.randn(1, 1, 1, 8))["slots"][0, 0, 0]
    indices = _expected_indices(key / (key.norm() + 1e-8), 3, 8)
    word = sum(int(index) << (3 * j) for j, index in enumerate(indices))
    assert slot[:3].tolist() == [word & 0xFF, (word >> 8) & 0xFF, word >> 16]
    assert codec.fmt.slot_size == 13 and slot.shape == (14,) and slot[-1] == 0 and codec.offsets()["pad"] == (13, 14)


def test_k8v4_keys_are_float8_e4m3_bytes_without_a_scale():
    key = torch.tensor([0.5, -3.25, 1000.0, 1e-4] * 16)
    slot = TurboQuantCodec(SlotFormat(64, 8, 4, False)).encode(key.view(1, 1, 1, 64), torch.zeros(1, 1, 1, 64))["slots"]
    keys, values = TurboQuantCodec(SlotFormat(64, 8, 4, False)).decode({"slots": slot})
    assert slot[0, 0, 0, :64].tolist() == key.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    assert keys[0, 0, 0, :4].tolist() == [0.5, -3.25, 448.0, key[3].to(torch.float8_e4m3fn).float().item()]
    assert values.abs().max() == 0  # a constant vector: scale floored at 1e-8, every code 0, min 0


def test_the_codebook_is_vllms_lloyd_max_for_n_0_1_over_d():
    centroids = gaussian_lloyd_max(128, 4)
    positive = [c * math.sqrt(128) for c in centroids[8:]]
    assert max(abs(a + b) for a, b in zip(centroids[:8], reversed(centroids[8:]))) < 1e-15  # symmetric
    assert max(abs(a - b) for a, b in zip(positive, MAX_1960_4BIT_LEVELS)) < 2e-3  # 200 iterations from even spacing
    assert gaussian_lloyd_max(128, 4) is gaussian_lloyd_max(128, 4)
    matrix = hadamard(64)
    assert torch.allclose(matrix @ matrix, torch.eye(64), atol=1e-6) and torch.equal(matrix, matrix.T)
    with pytest.raises(ValueError, match="power-of-two head_dim, got 96"):
        hadamard(96)


def _relative_error(original: torch.Tensor, decoded: torch.Tensor) -> float:
    return float(((decoded - original) ** 2).sum(-1).mean() / (original ** 2).sum(-1).mean())


@pytest.mark.parametrize("bits", [3, 4])
def test_lloyd_max_keys_lose_the_documented_distortion(bits):
    """Without norm correction a unit vector's squared error is the Lloyd-Max distortion of N(0,1) (Max 1960), as
    TurboQuant (arXiv 2504.19874) documents; norm correction gives every decoded key its exact norm (float16) at
    about the same squared error."""
    torch.manual_seed(3)
    keys = torch.randn(4, 8, 256, 128)
    plain = TurboQuantCodec(SlotFormat(128, bits, 4, False))
    error = _relative_error(keys, plain.decode(plain.encode(keys, keys))[0])
    assert abs(error - MAX_1960_DISTORTION[bits]) < 0.1 * MAX_1960_DISTORTION[bits]
    corrected = TurboQuantCodec(SlotFormat(128, bits, 4, True))
    decoded = corrected.decode(corrected.encode(keys, keys))[0]
    assert torch.allclose(decoded.norm(dim=-1), keys.norm(dim=-1), rtol=2e-3)
    assert abs(_relative_error(keys, decoded) - error) < 0.05 * error


def test_uniform_values_lose_a_twelfth_of_the_step_squared_and_int4_a_step_at_most():
    torch.manual_seed(4)
    values = torch.randn(2, 4, 512, 64)
    codec = TurboQuantCodec(SlotFormat(64, 4, 4, True))
    decoded = codec.decode(codec.encode(values, values))[1]
    step = (values.amax(-1, keepdim=True) - values.amin(-1, keepdim=True)) / 15
    ratio = float(((decoded - values) ** 2).mean() / (step ** 2 / 12).mean())
    assert 0.8 < ratio < 1.3
    int4 = Int4PerTokenHeadCodec(64)
    keys = int4.decode(int4.encode(values, values))[0]
    rotated_step = float(step.mean()) * 8  # the unnormalized transform stretches a vector by sqrt(64)
    assert float((keys - values).abs().max()) < rotated_step and _relative_error(values, keys) < 0.02


def test_qjl_keys_give_unbiased_inner_products_and_lloyd_max_ones_shrink_them():
    torch.manual_seed(5)
    keys, queries = torch.randn(1, 1, 4096, 64), torch.randn(64)
    exact = keys @ queries
    for qjl, biased in ((True, False), (False, True)):
        codec = TurboQuantCodec(SlotFormat(64, 3, 4, False, qjl=qjl))
        error = codec.decode(codec.encode(keys, keys))[0] @ queries - exact
        ratio = float((codec.decode(codec.encode(keys, keys))[0] @ queries * exact).sum() / (exact * exact).sum())
        assert (abs(ratio - 1) > 0.02) == biased, (qjl, ratio)
        assert abs(float(error.mean())) < 4 * float(error.std()) / math.sqrt(error.numel())


def test_int4_per_token_head_stores_nibbles_and_a_float32_scale_carrying_the_zero_point():
    torch.manual_seed(6)
    vector = torch.randn(64)
    codec = Int4PerTokenHeadCodec(64)
    state = codec.encode(vector.view(1, 1, 1, 64), vector.view(1, 1, 1, 64))
    rotated = (vector * rht_signs(64)) @ (hadamard(64) * 8)  # H·(s⊙x), H unnormalized
    scale = (rotated.max() - rotated.min()) / 15
    zero_point = int(torch.round(-rotated.min() / scale).clamp(0, 15))
    bits = int(state["key_scales"].view(torch.int32))
    stored_scale = torch.tensor([bits & -16], dtype=torch.int32).view(torch.float32)
    assert bits & 0xF == zero_point and abs(stored_scale - scale) < 1e-5 * scale
    codes = torch.round(rotated / scale + zero_point).clamp(0, 15).to(torch.int64)
    assert state["key_codes"][0, 0, 0].tolist() == (codes[0::2] | (codes[1::2] << 4)).tolist()
    assert {name: tuple(t.shape) for name, t in state.items()} == {
        "key_codes": (1, 1, 1, 32), "key_scales": (1, 1, 1, 1), "value_codes": (1, 1, 1, 32), "value_scales": (1, 1, 1, 1)}
    assert codec.bytes_per_token_head() == 64 + 8
    assert rht_signs(64).abs().eq(1).all() and torch.equal(rht_signs(64), rht_signs(64))


@pytest.mark.parametrize("knobs, message", [
    ({"kv_cache_dtype": "turboquant_2bit"}, r"kv_cache_dtype must be one of \['turboquant_k8v4', 'turboquant_4bit_nc', "
                                             r"'turboquant_k3v4_nc', 'turboquant_3bit_nc', 'int4_per_token_head'\], got "),
    ({"values": "codebook"}, r"values must be one of \['uniform', 'lloyd_max'\], got 'codebook'"),
    ({"rotation": "random"}, r"rotation must be one of \['hadamard', 'haar'\], got 'random'"),
    ({"qjl": 1}, r"qjl must be one of \[False, True\], got 1"),
    ({"norm_correction": "yes"}, r"norm_correction must be one of \[False, True\], got 'yes'"),
    ({"boundary_layers": -1}, r"boundary_layers must be an integer >= 0 \(or empty: the preset's\), got -1"),
    ({"kv_cache_dtype": "int4_per_token_head", "values": "lloyd_max", "qjl": True},
     r"int4_per_token_head takes no values, qjl: those knobs are the TurboQuant presets'"),
    ({"kv_cache_dtype": "turboquant_k8v4", "qjl": True},
     r"turboquant_k8v4 stores float8 keys: use turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_3bit_nc"),
    ({"kv_cache_dtype": "turboquant_k8v4", "rotation": "haar"}, r"rotation only acts on Lloyd-Max codes"),
])
def test_knobs_outside_vllm_and_the_paper_are_refused_naming_the_allowed_values(knobs, message):
    with pytest.raises(ValueError, match=message):
        check_vllm_knobs({**DEFAULTS, **knobs})


def test_the_cache_builder_refuses_an_unknown_knob_and_a_model_it_cannot_serve(tiny):
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['bits'\]; allowed: .*'qjl'"):
        vllm_kv_cache(tiny.config, "turboquant_4bit_nc", bits=4)
    with pytest.raises(ValueError, match=r"boundary_layers=2 keeps all 2 layers of this model .* set boundary_layers=0"):
        vllm_kv_cache(tiny.config, "turboquant_4bit_nc")
    assert vllm_kv_cache(tiny.config, "turboquant_k8v4", values="lloyd_max", rotation="haar", boundary_layers=0)
