"""The GPU host priced per kind of op (issue 17): `profile-device --device cuda` runs the
per-pass host probe's GPU branch (`host_probes.host_op_seconds_by_pass`, here on CPU
tensors) and `host_dispatch` prices a GPU spec that carries its figures per view, op,
module call and autograd node; a GPU spec without them keeps the one per-op figure
(the H100 preset's 33.2 us priced llama3.2-1b's 2,423 views, which launch nothing, as
its 2,290 other ops: host 161 ms against ~105 measured, 2026-11-25)."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models.clusters import get_cluster
from cost_models.host_dispatch import backward_host_seconds, forward_host_seconds
from cost_models.host_probes import HOST_OP_ROUNDS_GPU, host_op_seconds_by_pass
from ir.kernel_calibration import KernelCalibration
from tests.test_host_split import tiny_layer

US = 1e-6


def test_the_probes_gpu_branch_gives_every_per_kind_figure():
    """The GPU branch (taken on CPU tensors: the device argument is what a CUDA kit passes
    through) measures the parts, and prices a backward formula's op at the grad-off
    chain's figure, not the C++ `_foreach_add` loop's (one fused kernel on a GPU), and
    times the core ops' excess only."""
    host = host_op_seconds_by_pass("cpu", gpu=True)
    fields = host.calibration_fields()
    assert host.parts_measured
    assert fields["view_host_op_s"] == host.backward_view_op_s > 0
    assert fields["forward_host_op_s"] == host.function_nograd_op_s
    assert host.backward_nonview_op_s == host.function_nograd_op_s
    assert host.excess_s and host.forward_ops > 0 and host.backward_ops > 0
    excess = dict(host.excess_s)  # the core ops' (GELU, norms...), not the CPU-swept ones'
    assert "aten::gelu" in excess and "aten::sort" not in excess
    assert HOST_OP_ROUNDS_GPU < 11  # the GPU kit's time: fewer rounds


def h100(cal: KernelCalibration | None):
    """The H100 preset (one per-op figure) carrying `cal` instead of its calibration."""
    return dataclasses.replace(get_cluster("h100-80g"), kernel_calibration=cal)


KINDS = KernelCalibration(
    measured_on="a made-up GPU kit", view_host_op_s=2 * US, forward_host_op_s=30 * US,
    module_call_host_s=10 * US, forward_node_host_s=5 * US, backward_view_host_op_s=1 * US,
    backward_nonview_host_op_s=25 * US, backward_node_host_s=4 * US)


def test_a_gpu_spec_with_the_kinds_prices_views_ops_calls_and_nodes_apart():
    """tiny_layer's forward: 2 views x 2 us + 3 other ops x 30 + 1 module call x 10 + the
    nodes it records (`host_excess.backward_nodes`: gelu, 2 views, mul; the int64 arange
    none) 4 x 5 = 4 + 90 + 10 + 20 = 124 us. Backward: 3 views x 1 + 4 other ops x 25 +
    (4 + 2 parameter tensors) nodes x 4 = 3 + 100 + 24 = 127 us; the preset's one figure
    would have read 5 and 7 x its per-op figure."""
    layer, spec = tiny_layer(), h100(KINDS)
    assert forward_host_seconds(layer, spec) == pytest.approx(124 * US)
    assert backward_host_seconds(layer, spec) == pytest.approx(127 * US)


def test_a_gpu_spec_without_the_kinds_keeps_one_figure_per_op():
    """The preset's per-op figure on every op, views too: 5 and 7 ops."""
    layer, spec = tiny_layer(), h100(KernelCalibration(measured_on="the preset's"))
    assert forward_host_seconds(layer, spec) == pytest.approx(5 * spec.op_overhead_s)
    assert backward_host_seconds(layer, spec) == pytest.approx(7 * spec.backward_host_op_s)
