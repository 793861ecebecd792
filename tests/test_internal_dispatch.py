"""The backward's per-view and per-op host figures and the forward's per-view one are
what a C++ caller pays (`cost_models.host_excess.internal_dispatch_seconds`), not a
Python call's: the probe's calls loop through the dispatcher one item at a time (the CPU
profiler sees each add and each select); its slope arithmetic on a stand-in clock, by
hand; the real probe's units; the per-pass probe hands those figures to the parts it
solves the per-node and forward per-op figures with; a spec measured before prices a
layer as before."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cost_models import host_excess, host_probes
from cost_models.host_dispatch import backward_host_seconds
from cost_models.host_excess import (INTERNAL_LONG, INTERNAL_SHORT, InternalDispatch,
                                     _internal_calls, internal_dispatch_seconds)
from tests.test_host_split import US, cpu


def _profiled_names(call) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    return [event.name for event in prof.events()]


def test_each_internal_call_dispatches_one_op_or_view_per_item_from_cpp():
    """A CPU foreach add runs one aten::add per pair and an unbind one aten::select per
    row, each through the dispatcher (the profiler records them), so the slope over
    items is one C++ dispatch of each; a fused foreach kernel would record none."""
    calls = _internal_calls("cpu")
    with torch.no_grad():
        for n in (INTERNAL_SHORT, INTERNAL_LONG):
            assert _profiled_names(calls["op", n]).count("aten::add") == n
            assert _profiled_names(calls["view", n]).count("aten::select") == n


def test_slopes_on_a_stand_in_clock(monkeypatch):
    """Each call advances a stand-in clock by a fixed cost plus a cost per item: the adds
    3 us + 0.6 us per pair, the unbinds 2 us + 0.25 us per row, the Python view chains
    4 us + 0.55 us per node. The figures are the per-item costs in seconds (0.6, 0.25 and
    0.55 us), the fixed ones cancel; a view chain made cheaper at length (a negative
    slope) is floored at 0."""
    now = [0.0]
    cost_us = {"op": (3.0, 0.6), "view": (2.0, 0.25), "python_view": (4.0, 0.55)}

    def ticking(kind, n, costs):
        def call():
            now[0] += (costs[kind][0] + costs[kind][1] * n) * US
        return call

    def calls(costs):
        return lambda device: {(kind, n): ticking(kind, n, costs) for kind in costs
                               for n in (INTERNAL_SHORT, INTERNAL_LONG)}

    monkeypatch.setattr(host_probes, "probe_clock", lambda device: lambda: now[0])
    monkeypatch.setattr(host_excess, "_internal_calls", calls(cost_us))
    probe = internal_dispatch_seconds("cpu")
    assert probe.op_s == pytest.approx(0.6 * US) and probe.view_s == pytest.approx(0.25 * US)
    assert probe.python_view_s == pytest.approx(0.55 * US)
    monkeypatch.setattr(host_excess, "_internal_calls", calls({**cost_us, "view": (9.0, -0.1)}))
    assert internal_dispatch_seconds("cpu").view_s == 0.0


def test_real_internal_probe_units():
    """Structure and units only (a ratio flakes on a loaded host, and each figure is a
    slope floored at 0): each at least 0 and under 1 ms (a C++ dispatch is a fraction of
    a microsecond: a unit slip of 1e3 lands outside)."""
    probe = internal_dispatch_seconds("cpu")
    assert all(0 <= s < 1e-3 for s in (probe.op_s, probe.view_s, probe.python_view_s))


def test_per_pass_probe_solves_both_passes_with_the_internal_figures(monkeypatch,
                                                                    few_host_op_rounds):
    """`host_op_seconds_by_pass` puts the internal probe's figures in the backward parts
    (stand-in figures 0.7 / 0.3 us come out as the kit's per-op and per-view figures) and
    its view figure in the forward's (a layer's forward views are mostly a C++ caller's);
    its per-node and forward per-op figures are what the chains leave after them."""
    internal = InternalDispatch(op_s=0.7 * US, view_s=0.3 * US)
    monkeypatch.setattr(host_excess, "internal_dispatch_seconds", lambda device: internal)
    probe = host_probes.host_op_seconds_by_pass("cpu")
    fields = probe.calibration_fields()
    assert fields["backward_nonview_host_op_s"] == 0.7 * US
    assert fields["backward_view_host_op_s"] == 0.3 * US
    assert fields["view_host_op_s"] == 0.3 * US and 0 <= fields["forward_host_op_s"] < 1e-4
    assert 0 <= fields["backward_node_host_s"] < 1e-4


def test_a_spec_measured_before_prices_a_backward_as_before():
    """The backward formula is unchanged, so a kit carrying the plain (Python-call)
    figures prices `tiny_layer` as before: 39 us (test_host_split). The same layer (3
    views, 4 other ops, 6 nodes, gelu_backward's 10 us excess) on a kit probed since,
    whose figures round-trip through the spec's JSON: 3 x 0.3 + 4 x 0.7 + 6 x 3.5 + 10 =
    34.7 us."""
    from ir.cluster import ClusterSpec
    from tests.test_host_split import PARTS, tiny_layer

    assert backward_host_seconds(tiny_layer(), cpu(PARTS)) == pytest.approx(39 * US)
    probed = dataclasses.replace(PARTS, backward_view_host_op_s=0.3 * US,
                                 backward_nonview_host_op_s=0.7 * US,
                                 backward_node_host_s=3.5 * US)
    spec = ClusterSpec.from_json(cpu(probed).to_json())
    assert spec.kernel_calibration.backward_view_host_op_s == 0.3 * US
    assert backward_host_seconds(tiny_layer(), spec) == pytest.approx(34.7 * US)
