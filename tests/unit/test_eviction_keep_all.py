"""A prune that keeps every position leaves the cache in position order, as kvpress leaves a prefill it does not
compress (issue 37 item 2): a later compression by an order-dependent scorer then keeps kvpress's positions."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from kvlab.eviction.kept import prune_layer

pytestmark = pytest.mark.unit
BATCH, HEADS, SEQ, DIM = 1, 3, 57, 8


def _layer(seed: int = 0) -> SimpleNamespace:
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(BATCH, HEADS, SEQ, DIM, generator=generator)
    return SimpleNamespace(keys=keys, values=keys * 2)


def _pooled(layer) -> torch.Tensor:
    """An order-dependent scorer: each slot's key norm averaged with its neighbours' (SnapKV-style pooling)."""
    norms = layer.keys.norm(dim=-1)
    return F.avg_pool1d(norms, kernel_size=5, stride=1, padding=2, count_include_pad=False)


def test_keeping_every_position_leaves_the_layer_untouched():
    layer = _layer()
    keys = layer.keys.clone()
    scores = torch.rand(BATCH, HEADS, SEQ)
    kept = prune_layer(layer, scores, SEQ)
    assert torch.equal(layer.keys, keys) and torch.equal(layer.values, keys * 2)
    assert torch.equal(kept, torch.arange(SEQ).expand(BATCH, HEADS, SEQ))


def test_a_later_compression_keeps_the_positions_it_keeps_without_the_prefill_prune():
    without = _layer()  # kvpress: the prefill is not compressed at all
    with_prune = _layer()
    held = prune_layer(with_prune, torch.rand(BATCH, HEADS, SEQ), SEQ)  # kvlab's prefill, budget >= prompt
    expected = prune_layer(without, _pooled(without), 20).sort(dim=-1).values
    slots = prune_layer(with_prune, _pooled(with_prune), 20)
    positions = held.gather(-1, slots).sort(dim=-1).values
    assert torch.equal(positions, expected)


def test_a_prune_that_drops_positions_still_keeps_the_best_in_score_order():
    layer = _layer()
    scores = torch.rand(BATCH, HEADS, SEQ)
    kept = prune_layer(layer, scores, 10)
    assert torch.equal(kept, scores.topk(10, dim=-1).indices)
    assert torch.equal(layer.keys, _layer().keys.gather(2, kept.unsqueeze(-1).expand(-1, -1, -1, DIM)))
