"""Cold ops counted against the ops of the layers just before (`ir.op_count
.recent_forward_ops`): a layer running fewer than a cache's worth of distinct ops
(`COLD_WINDOW_DISTINCT_OPS`, the in-sequence probe's knee) leaves the ops of the layers
before it warm, so a head after a small norm after a block finds the block's ops warm
(bench/bench_small_layers.py)."""

from __future__ import annotations

import torch
from torch import nn

from ir.measure import build_layer_graph
from ir.op_count import COLD_WINDOW_DISTINCT_OPS, recent_forward_ops


def test_the_window_reaches_back_until_a_cache_worth_of_ops_ran():
    """Nearest first: a 2-op layer, then a 3-op one, then one of the window's size, then
    one more. The first three (2 + 3 + window distinct ops) reach the window's size: the
    fourth is left out. A layer before of the window's size alone: only its ops. None
    before: None (the first layer: `cold_distinct_ops` counts against its backward)."""
    small, middle = frozenset({"a", "b"}), frozenset({"c", "d", "e"})
    full = frozenset(f"op{i}" for i in range(COLD_WINDOW_DISTINCT_OPS))
    older = frozenset({"z"})
    assert recent_forward_ops([small, middle, full, older]) == small | middle | full
    assert recent_forward_ops([full, small]) == full
    assert recent_forward_ops([small]) == small
    assert recent_forward_ops([]) is None


class Mix(nn.Module):
    """aten.relu.default, aten.tanh.default, aten.add.Tensor, aten.detach.default."""

    def forward(self, x):
        return torch.relu(x) + torch.tanh(x)


class Neg(nn.Module):
    """aten.neg.default alone (neg saves nothing for its backward)."""

    def forward(self, x):
        return -x


class Gate(nn.Module):
    """aten.sigmoid.default, aten.tanh.default, aten.add.Tensor, aten.detach.default."""

    def forward(self, x):
        return torch.sigmoid(x) + torch.tanh(x)


class MixNegGate(nn.Module):
    def __init__(self):
        super().__init__()
        self.mix, self.neg, self.gate = Mix(), Neg(), Gate()

    def forward(self, x):
        return self.gate(self.neg(self.mix(x)))


def test_a_layer_after_a_small_one_finds_the_ops_before_it_warm():
    """gate after neg (1 distinct op, fewer than the window) after mix: against neg
    alone all four of gate's ops would be cold; against neg and mix only sigmoid is (1).
    neg after mix: neg (1). mix first: its forward after its own backward (tanh_backward,
    threshold_backward, add, detach): relu and tanh are cold (2)."""
    # no parameters: the input requires grad, else a step runs no backward at all
    graph = build_layer_graph(MixNegGate(), {"x": torch.randn(2, 8, requires_grad=True)},
                              dtype=torch.float32)
    assert [layer.name for layer in graph.layers] == ["mix", "neg", "gate"]
    assert [layer.distinct_ops_fwd for layer in graph.layers] == [4, 1, 4]
    assert [layer.cold_distinct_ops_fwd for layer in graph.layers] == [2, 1, 1]
