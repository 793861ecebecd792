"""The backward host model in parts (cost_models.host_dispatch.backward_host_seconds), the
per-call excess probe (cost_models.host_excess) and the calibration fields that carry
them (ir.kernel_calibration), including specs written before those fields existed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cost_models.common import StepConfig
from cost_models.compute import layer_compute
from cost_models.host_dispatch import backward_host_seconds
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.kernel_calibration import HostOpExcess, KernelCalibration
from ir.kernel_records import KernelKind, KernelRecord, KernelRecords
from ir.layer import Layer, LayerMeasurement
from ir.strategy import LayerStrategy, Precision
from tests.cpu_specs import one_process_with_host_figures

US = 1e-6


def cpu(calibration: KernelCalibration | None, **changes) -> ClusterSpec:
    """One CPU process (host_share 1): a forward op 4 us, a backward op 2 us in one figure."""
    return one_process_with_host_figures(calibration, **changes)


PARTS = KernelCalibration(
    measured_on="made up for the test", backward_view_host_op_s=1 * US,
    backward_nonview_host_op_s=2 * US, backward_node_host_s=3 * US,
    host_op_excess=(HostOpExcess("aten::gelu_backward", 10 * US),
                    HostOpExcess("aten::gelu", 7 * US)))


def tiny_layer(params: int = 2) -> Layer:
    """Forward: 5 ops (gelu, 2 views, mul on floats; an int64 arange). Backward: 3 detach
    views, one gelu_backward, two tiny mm, one add."""
    def mem(op, count, dtype="float32"):
        return KernelRecord(op, KernelKind.MEMORY, dtype, (2, 8), count, activation_bytes=64)

    backward = (KernelRecord("aten::detach", KernelKind.VIEW, "float32", (), 3),
                mem("aten::gelu_backward", 1),
                KernelRecord("aten::mm", KernelKind.GEMM, "float32", (1, 2, 8, 8), 2,
                             flops=256, activation_bytes=192),
                mem("aten::add", 1))
    forward = (mem("aten::gelu", 1), KernelRecord("aten::view", KernelKind.VIEW, "float32", (), 2),
               mem("aten::arange", 1, "int64"), mem("aten::mul", 1))
    return Layer(name="blocks.0", kind="Block", index=0, params=16 * params, param_bytes=0,
                 tp_params=0, input_bytes=64, output_bytes=64, structural_hash="x",
                 param_names=tuple(f"w{i}" for i in range(params)),
                 measured=LayerMeasurement(ops_fwd=5, ops_bwd=7, kernels=KernelRecords(
                     forward=forward, backward=backward, forward_module_calls=1)))


def test_backward_host_is_views_ops_nodes_and_excess():
    """Hand computation. Backward: 3 views x 1 us + 4 other ops (gelu_backward, 2 mm, add)
    x 2 us + nodes (4 forward calls on floats: gelu, 2 views, mul, the int64 arange
    records none; + 2 parameter tensors = 6) x 3 us + gelu_backward's excess 10 us once
    = 3 + 8 + 18 + 10 = 39 us; gelu's 7 us is a forward op's, not charged here. A third
    parameter tensor adds one node: 42 us."""
    layer, spec = tiny_layer(), cpu(PARTS)
    assert backward_host_seconds(layer, spec) == pytest.approx(39 * US)
    assert backward_host_seconds(tiny_layer(params=3), spec) == pytest.approx(42 * US)


def test_backward_host_falls_back_to_one_figure_per_op():
    """Without the parts (a spec measured before them, or a GPU preset) or without the
    layer's records, every backward op costs `backward_op_overhead_s`: 7 x 2 us."""
    layer = tiny_layer()
    old = KernelCalibration(measured_on="before the split")
    assert backward_host_seconds(layer, cpu(old)) == pytest.approx(14 * US)
    assert backward_host_seconds(layer, cpu(None)) == pytest.approx(14 * US)
    bare = dataclasses.replace(layer, measured=dataclasses.replace(layer.measured, kernels=None))
    assert backward_host_seconds(bare, cpu(PARTS)) == pytest.approx(14 * US)


def test_layer_compute_adds_the_split_backward_host_on_cpu():
    """A CPU process adds host and kernels: the layer's backward over the same layer on
    a spec with no backward host cost (no parts, 0 per op; PARTS holds no kernel tables,
    so the kernels price alike) is exactly the 39 us of the split."""
    layer, strategy = tiny_layer(), LayerStrategy()
    config = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="float32",
                        precision=Precision.FP32, device_type="cpu")
    with_split = layer_compute(layer, strategy, cpu(PARTS), config)
    without = layer_compute(layer, strategy, cpu(None, backward_op_overhead_s=0.0), config)
    assert with_split.backward_s - without.backward_s == pytest.approx(39 * US, rel=1e-6)


def test_calibration_round_trips_the_new_fields_and_old_json_still_loads():
    again = KernelCalibration.from_dict(json.loads(json.dumps(PARTS.to_dict())))
    assert again == PARTS and again.host_excess_s("aten::gelu_backward") == 10 * US
    assert again.host_excess_s("aten::relu") == 0.0  # an op not listed: no excess
    # A calibration written before these fields: no key at all -> 0 and empty (fallback).
    old = {k: v for k, v in PARTS.to_dict().items()
           if k not in ("backward_view_host_op_s", "backward_nonview_host_op_s",
                        "backward_node_host_s", "host_op_excess")}
    legacy = KernelCalibration.from_dict(old)
    assert legacy.backward_nonview_host_op_s == 0.0 and legacy.host_op_excess == ()
    # The committed H100 spec predates them and loads as it is.
    h100 = Path(__file__).parent.parent / "cost_models" / "calibration" / "h100-80g.json"
    assert "host_op_excess" not in h100.read_text()
    cal = ClusterSpec.load(h100).kernel_calibration
    assert cal.backward_node_host_s == 0.0 and cal.host_op_excess == ()


@pytest.mark.parametrize("row, message", [
    ({"op": "aten::gelu", "seconds": -1e-6}, "seconds must be a number >= 0"),
    ({"op": "", "seconds": 1e-6}, "op must be a non-empty string"),
    ({"op": "aten::gelu"}, "seconds"),
])
def test_bad_excess_rows_name_the_field(row, message):
    with pytest.raises(PlannerError, match=message):
        KernelCalibration.from_dict({"measured_on": "x", "host_op_excess": [row]})


def test_exact_gelu_has_a_fixed_excess_and_streaming_ops_do_not():
    """Physics, not a timing threshold: on a CPU thread exact GELU costs a fixed several
    microseconds per call beyond a streaming op's dispatch (erf's path; ~5 us over add's
    ~1 us here), relu and mul stream like add. Both sides are timed in the same rounds on
    the thread clock, so load stretches them alike; the margins are wide (gelu's excess
    above half a whole add dispatch and above 4x the larger streaming excess)."""
    from cost_models.host_excess import plain_dispatch_seconds

    probe = plain_dispatch_seconds("cpu", ops=("aten::gelu", "aten::relu", "aten::mul"))
    gelu, streaming = probe.excess_s["aten::gelu"], max(probe.excess_s["aten::relu"],
                                                        probe.excess_s["aten::mul"])
    assert gelu > 0.5 * probe.op_s
    assert gelu > 4 * streaming
    assert 0 < probe.view_s < 1e-3 and 0 < probe.op_s < 1e-3
