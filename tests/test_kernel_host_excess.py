"""The per-call host excess list (`cost_models.host_excess.HOST_EXCESS_OPS`) after the
sweep over the ops zoo and HF models run (bench/bench_host_excess_sweep.py): each tiny
call dispatches exactly the op it is named for; the probe takes each op's excess over
the reference (on a stand-in clock, by hand) and measures every new op here (structure
and units: no timing ratio); a real layer (dlrm-small's top MLP: its features' stack,
index and cat, and its loss) is charged each new op's excess per call, by hand; a calibration measured before the sweep prices as before."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cost_models.host_dispatch import backward_host_seconds, forward_host_seconds
from cost_models.host_excess import (HOST_EXCESS_OPS, SWEPT_EXCESS_OPS, _tiny_calls,
                                     plain_dispatch_seconds)
from cost_models.memory_probes import EXCESS_OP_OF_KIND
from ir.kernel_calibration import HostOpExcess, KernelCalibration
from ir.kernel_records import KernelKind, KernelRecord
from ir.measure import layer_graph_from_trace
from ir.trace import trace
from planner.models import load_model
from tests.test_host_split import US, cpu

SWEPT_OPS = ("aten::binary_cross_entropy_with_logits", "aten::repeat",
             "aten::native_batch_norm", "aten::native_batch_norm_backward",
             "aten::slice_backward", "aten::embedding_dense_backward", "aten::index_put",
             "aten::index", "aten::_softmax_backward_data", "aten::_log_softmax_backward_data",
             "aten::stack", "aten::cat", "aten::masked_fill", "aten::nll_loss_forward",
             "aten::histc", "aten::sort", "aten::select_backward", "aten::_to_copy",
             "aten::topk", "aten::scatter_add", "aten::scatter", "aten::new_zeros",
             "aten::new_ones", "aten::new_empty_strided", "aten::empty")


class _Names(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def test_each_tiny_call_dispatches_the_op_it_measures():
    calls = _tiny_calls("cpu")
    assert set(SWEPT_OPS) == set(SWEPT_EXCESS_OPS) and set(SWEPT_OPS) <= set(HOST_EXCESS_OPS)
    for op in SWEPT_OPS:  # (a fused RMS norm's CPU kernel is a composite: it shows parts)
        mode = _Names()
        with mode:
            calls[op]()
        assert mode.names == [op], (op, mode.names)


def test_probe_takes_each_ops_excess_over_the_reference_in_seconds(monkeypatch):
    """The probe's arithmetic on a clock that cannot flake: each tiny call advances a
    stand-in probe clock by a set cost (the reference aten::add 1 us, torch.add 1.5 us,
    a view 0.25 us, relu 1.1 us, every swept op 2 + i/10 us, mul 0.5 us: cheaper than the
    reference). Each op's figure is then its cost less the reference's, in seconds
    (relu 0.1 us; swept op i 1 + i/10 us; mul -0.5 us, floored at 0), the plain op and
    the view their own costs, whatever the rounds, warm-ups and groups."""
    from cost_models import host_excess, host_probes

    now = [0.0]
    cost_s = {host_excess.REFERENCE_OP: 1.0 * US, host_excess.PLAIN_OP: 1.5 * US,
              host_excess.PLAIN_VIEW: 0.25 * US, "aten::relu": 1.1 * US, "aten::mul": 0.5 * US,
              **{op: (2 + i / 10) * US for i, op in enumerate(SWEPT_OPS)}}

    def ticking(op):
        def call():
            now[0] += cost_s[op]
        return call

    monkeypatch.setattr(host_excess, "_tiny_calls", lambda device: {
        op: ticking(op) for op in (*HOST_EXCESS_OPS, *cost_s)})
    monkeypatch.setattr(host_probes, "probe_clock", lambda device: lambda: now[0])
    probe = plain_dispatch_seconds("cpu", ops=SWEPT_OPS + ("aten::relu", "aten::mul"))
    assert probe.op_s == pytest.approx(1.5 * US) and probe.view_s == pytest.approx(0.25 * US)
    assert set(probe.excess_s) == set(SWEPT_OPS) | {"aten::relu", "aten::mul"}
    assert probe.excess_s["aten::relu"] == pytest.approx(0.1 * US)
    assert probe.excess_s["aten::mul"] == 0.0
    for i, op in enumerate(SWEPT_OPS):
        assert probe.excess_s[op] == pytest.approx((1 + i / 10) * US), op


def test_probe_measures_every_swept_op_on_this_cpu_in_seconds():
    """The real probe, structure and units only (a timing ratio flakes on a loaded host):
    a figure for every swept op, each >= 0 (a median difference floored at 0) and under
    1 ms (a tiny call's excess is microseconds: a unit slip of 1e3 lands outside); the
    plain op and the view timed directly, above 0."""
    probe = plain_dispatch_seconds("cpu", ops=SWEPT_OPS + ("aten::relu", "aten::mul"))
    assert set(probe.excess_s) == set(SWEPT_OPS) | {"aten::relu", "aten::mul"}
    assert all(0.0 <= seconds < 1e-3 for seconds in probe.excess_s.values()), probe.excess_s
    assert 0 < probe.op_s < 1e-3 and 0 < probe.view_s < 1e-3


def _dlrm_top_mlp(micro_batch: int = 4):
    loaded = load_model("dlrm-small", micro_batch, None, device="meta")
    traced = trace(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                   dtype=torch.float32)
    graph, _ = layer_graph_from_trace(traced, loaded.inputs, loaded.target,
                                      name=loaded.name, dtype=torch.float32)
    return next(layer for layer in graph.layers if layer.name == "top_mlp")


BEFORE_SWEEP = KernelCalibration(
    measured_on="made up for the test", forward_host_op_s=2 * US, view_host_op_s=0.5 * US,
    module_call_host_s=3 * US, python_node_host_s=0.25 * US,
    backward_view_host_op_s=0.5 * US, backward_nonview_host_op_s=1 * US,
    backward_node_host_s=3 * US, host_op_excess=(HostOpExcess("aten::addmm", 0.8 * US),))


def test_a_real_layer_pays_each_swept_ops_excess_per_call():
    """dlrm-small's top MLP forward runs one stack, one index, one cat and one
    BCE-with-logits (its loss); backward one index_put (the index's gradient). With
    excesses of 0.7, 2.9, 0.6, 4.4 and 1.7 us: forward + 0.7 + 2.9 + 0.6 + 4.4 = 8.6 us,
    backward + 1.7 us, on top of the same kit without them."""
    layer = _dlrm_top_mlp()
    forward_counts = {r.excess_key: r.count for r in layer.kernels.forward
                      if r.excess_key in SWEPT_OPS}
    assert forward_counts == {"aten::stack": 1, "aten::index": 1, "aten::cat": 1,
                              "aten::binary_cross_entropy_with_logits": 1}
    swept = BEFORE_SWEEP.host_op_excess + (
        HostOpExcess("aten::stack", 0.7 * US), HostOpExcess("aten::index", 2.9 * US),
        HostOpExcess("aten::cat", 0.6 * US),
        HostOpExcess("aten::binary_cross_entropy_with_logits", 4.4 * US),
        HostOpExcess("aten::index_put", 1.7 * US))
    before, after = cpu(BEFORE_SWEEP), cpu(dataclasses.replace(BEFORE_SWEEP,
                                                               host_op_excess=swept))
    assert (forward_host_seconds(layer, after)
            - forward_host_seconds(layer, before)) == pytest.approx(8.6 * US)
    assert (backward_host_seconds(layer, after)
            - backward_host_seconds(layer, before)) == pytest.approx(1.7 * US)


def test_a_calibration_from_before_the_sweep_prices_as_before():
    """Its table lacks the swept ops: it loads as written and they cost it nothing (the
    layer's forward at the made-up kit, by hand from the record counts, is unchanged by
    the list growing)."""
    again = KernelCalibration.from_dict(BEFORE_SWEEP.to_dict())
    assert again == BEFORE_SWEEP
    assert all(again.host_excess_s(op) == 0.0 for op in SWEPT_OPS)
    layer = _dlrm_top_mlp()
    addmm_calls = sum(r.count for r in layer.kernels.forward if r.excess_key == "aten::addmm")
    without_excess = dataclasses.replace(BEFORE_SWEEP, host_op_excess=())
    assert (forward_host_seconds(layer, cpu(BEFORE_SWEEP))
            - forward_host_seconds(layer, cpu(without_excess))
            ) == pytest.approx(addmm_calls * 0.8 * US)


def test_memory_probe_kinds_of_swept_ops_are_netted_of_their_excess():
    """A memory table's per-call intercept (softmax backward, masked fill, batch norm)
    must not charge again what the host model now charges per call."""
    for kind in ("softmax_backward", "masked_fill", "batch_norm", "batch_norm_backward"):
        assert EXCESS_OP_OF_KIND[kind] in HOST_EXCESS_OPS, kind


def _with_allocations(layer, count: int):
    """`layer` with `count` `new_empty_strided` calls more in its backward: what an
    AccumulateGrad runs to lay out a gradient that does not come as its tensor is laid
    out (before it copies the gradient in)."""
    allocation = KernelRecord("aten::new_empty_strided", KernelKind.VIEW, "float32", (), count)
    kernels = dataclasses.replace(layer.kernels,
                                  backward=layer.kernels.backward + (allocation,))
    return dataclasses.replace(layer, measured=dataclasses.replace(
        layer.measured, kernels=kernels, ops_bwd=layer.measured.ops_bwd + count))


def test_allocations_dispatch_as_ops_and_pay_their_excess():
    """dlrm-small's top MLP backward at micro-batch 4 runs no allocation (its inputs'
    gradients go on to the layers before: no AccumulateGrad re-lays them out,
    tests/test_step_inputs.py); given four (`_with_allocations`), each has no kernel
    (recorded as a view) but the host dispatches it as an op: at the made-up kit (views
    0.5 us, other ops 1 us, nodes 3 us) and an excess of 1.3 us a `new_empty_strided`,
    by hand from the record counts, the four pay 4 x (1 + 1.3) us, not 4 x 0.5."""
    def allocations(layer):
        return sum(r.count for r in layer.kernels.backward
                   if r.op == "aten::new_empty_strided")
    plain = _dlrm_top_mlp(4)
    four = _with_allocations(plain, 4)
    assert (allocations(plain), allocations(four)) == (0, 4)
    kit = dataclasses.replace(BEFORE_SWEEP, host_op_excess=(
        HostOpExcess("aten::new_empty_strided", 1.3 * US),))
    views = sum(r.count for r in four.kernels.backward
                if r.kind.value == "view" and r.op != "aten::new_empty_strided")
    by_hand = (views * 0.5 + (four.ops_bwd - views) * 1.0 + four.autograd_nodes_bwd * 3.0
               + 4 * 1.3) * US
    no_excess = cpu(dataclasses.replace(kit, host_op_excess=()))  # its cold terms are 0
    assert backward_host_seconds(four, cpu(kit)) == pytest.approx(by_hand)
    assert backward_host_seconds(four, no_excess) == pytest.approx(by_hand - 4 * 1.3 * US)
    assert backward_host_seconds(four, no_excess) - backward_host_seconds(
        plain, no_excess) == pytest.approx(4 * 1.0 * US)
