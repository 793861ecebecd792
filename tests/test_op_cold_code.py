"""The per-op-kind cold-code term (`cost_models.op_cold_code`) against a hand computation:
each distinct kernel op of a pass pays its kind's cold seconds over the reference's, times
the share of the pass's distinct ops the host counts cold; the table round-trips through
a spec's JSON; the probe (`cost_models.op_cold_probe`) runs on this CPU, one point per
kind in range, its other ops disjoint from the kinds' ops."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

import torch

from ir.errors import PlannerError
from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint, OpColdCodePoint
from ir.kernel_records import KernelKind, KernelRecord, KernelRecords
from ir.op_count import OpCounter

from cost_models import compute
from cost_models.op_cold_code import layer_cold_code_seconds, pass_cold_code_seconds
from cost_models.op_cold_probe import (OTHER_ELEMENTS, OTHER_OPS_COUNT, OWN_KIND_OPS,
                                       REFERENCE_KIND, kind_calls, other_ops,
                                       probe_op_cold_code)
from tests.cpu_specs import US, linear_layer, one_cpu_process
from tests.test_kernel_sequence import config

# made up: the reference (a small unary op) 2 us cold, mm 5, log-softmax's backward 12,
# nll_loss_backward under its own name 6, a sum 1 (under the reference: no excess); "add"
# not probed (no excess)
POINTS = (OpColdCodePoint(REFERENCE_KIND, "float32", 2 * US),
          OpColdCodePoint("gemm", "float32", 5 * US),
          OpColdCodePoint("log_softmax_backward", "float32", 12 * US),
          OpColdCodePoint("nll_loss_backward", "float32", 6 * US),
          OpColdCodePoint("sum", "float32", 1 * US),
          OpColdCodePoint("gemm", "bfloat16", 99 * US))  # another dtype: never read here
CAL = KernelCalibration(
    measured_on="made up for the test",
    # the kinds memory_kind reads for these records are measured (no stand-ins)
    memory_kernels=tuple(MemoryKernelPoint(k, "float32", 8192, 10.0)
                         for k in ("add", "sum", "log_softmax_backward")),
    op_cold_code=POINTS)
MM = KernelRecord("aten::mm", KernelKind.GEMM, "float32", (1, 32, 64, 128), 1,
                  flops=2 * 32 * 64 * 128)
MM_2 = dataclasses.replace(MM, shape=(1, 128, 64, 32), count=3)  # the same op: once
LSM_BWD = KernelRecord("aten::_log_softmax_backward_data", KernelKind.MEMORY, "float32",
                       (32, 128), 1, activation_bytes=3 * 32 * 128 * 4)
NLL_BWD = KernelRecord("aten::nll_loss_backward", KernelKind.MEMORY, "float32", (32, 128), 1,
                       activation_bytes=2 * 32 * 128 * 4)  # a "sum" in the bandwidth tables
SUM = KernelRecord("aten::sum", KernelKind.MEMORY, "float32", (128,), 1,
                   activation_bytes=(32 * 128 + 128) * 4)
ADD = KernelRecord("aten::add", KernelKind.MEMORY, "float32", (32, 128), 2,
                   activation_bytes=3 * 32 * 128 * 4)
VIEW = KernelRecord("aten::view", KernelKind.VIEW, "float32", (32, 128), 4)
BACKWARD = (MM, MM_2, LSM_BWD, NLL_BWD, SUM, ADD, VIEW)
# (5 - 2) for mm + (12 - 2) for the log-softmax backward + (6 - 2) for nll_loss_backward
# (its own point, not the sum's); sum, add and the view: nothing
BACKWARD_EXCESS_S = 17 * US


def test_each_distinct_kernel_op_pays_its_kinds_excess_over_the_reference_times_the_share():
    assert pass_cold_code_seconds(BACKWARD, CAL, 1.0) == pytest.approx(BACKWARD_EXCESS_S)
    assert pass_cold_code_seconds(BACKWARD, CAL, 0.25) == pytest.approx(BACKWARD_EXCESS_S / 4)
    without_reference = dataclasses.replace(CAL, op_cold_code=POINTS[1:])
    assert pass_cold_code_seconds(BACKWARD, without_reference, 1.0) == 0.0


def layer(**changes):
    """A head-like layer: forward mm + add (4 distinct ops counted, 1 cold), backward the
    records above (6 distinct overloads counted, all cold)."""
    base = linear_layer()
    measured = dataclasses.replace(
        base.measured, distinct_ops_fwd=4,
        kernels=KernelRecords(forward=(MM, ADD), backward=BACKWARD),
        backward_overloads=frozenset(("aten.mm.default", "aten._log_softmax_backward_data.default",
                                      "aten.nll_loss_backward.default", "aten.sum.dim_IntList",
                                      "aten.add.Tensor", "aten.view.default")))
    return dataclasses.replace(base, measured=measured, cold_distinct_ops_fwd=1,
                               cold_distinct_ops_bwd=6, **changes)


def test_a_layer_pays_each_pass_at_its_cold_share_and_nothing_when_its_step_stays_warm():
    forward_s, backward_s = layer_cold_code_seconds(layer(), one_cpu_process(CAL))
    assert forward_s == pytest.approx(3 * US / 4)  # mm's excess x 1 cold of 4 distinct
    assert backward_s == pytest.approx(BACKWARD_EXCESS_S)  # 6 cold of 6
    assert layer_cold_code_seconds(layer(step_warm=True), one_cpu_process(CAL)) == (0.0, 0.0)
    old_kit = dataclasses.replace(CAL, op_cold_code=())
    assert layer_cold_code_seconds(layer(), one_cpu_process(old_kit)) == (0.0, 0.0)


def test_the_kernel_model_adds_the_term_to_each_pass():
    with_table = compute._analytic_seconds(layer(), one_cpu_process(CAL), config(), 1.0)
    without = compute._analytic_seconds(
        layer(), one_cpu_process(dataclasses.replace(CAL, op_cold_code=())), config(), 1.0)
    assert with_table[0] - without[0] == pytest.approx(3 * US / 4)
    assert with_table[1] - without[1] == pytest.approx(BACKWARD_EXCESS_S)


def test_the_table_round_trips_through_json_and_bad_rows_fail():
    assert KernelCalibration.from_dict(json.loads(json.dumps(CAL.to_dict()))) == CAL
    old = CAL.to_dict()
    del old["op_cold_code"]  # a spec written before the table: loads, unmeasured
    assert KernelCalibration.from_dict(old).op_cold_code == ()
    with pytest.raises(PlannerError):
        OpColdCodePoint("gemm", "float32", -1e-6)
    with pytest.raises(PlannerError):
        KernelCalibration.from_dict({**CAL.to_dict(), "op_cold_code": [{"kind": "gemm"}]})


def overloads(calls) -> frozenset[str]:
    with OpCounter() as counter:
        for call in calls:
            call()
    return counter.overload_names


def test_the_other_ops_are_distinct_and_run_none_of_the_probed_kinds_ops():
    small = torch.randn(OTHER_ELEMENTS)
    others = overloads([lambda op=op: op(small) for op in other_ops()])
    assert len(other_ops()) == OTHER_OPS_COUNT
    assert len(others) >= OTHER_OPS_COUNT  # each its own op (some run helpers inside)
    probed = overloads(kind_calls().values())
    assert not others & probed, sorted(others & probed)


def test_the_probe_runs_on_this_cpu_one_point_per_kind_in_range():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as profile-device runs its probes
    try:
        start = time.process_time()
        points = probe_op_cold_code("cpu")
        assert time.process_time() - start < 2.0  # profile-device's budget: ~8 s at most
    finally:
        torch.set_num_threads(threads)
    kinds = [p.kind for p in points]
    assert len(kinds) == len(set(kinds)) == len(kind_calls())
    assert {REFERENCE_KIND, "gemm", "attention", "conv", "copy", "add", "sum", "layer_norm",
            "log_softmax_backward", "softmax_backward", "gelu_backward",
            *OWN_KIND_OPS} <= set(kinds)
    # a cost per call: at most a millisecond (a unit slip of 1e3 lands outside)
    assert all(p.dtype == "float32" and 0.0 <= p.seconds < 1e-3 for p in points)
    assert sum(p.seconds for p in points) > 0  # cold code costs something somewhere
    assert probe_op_cold_code("cuda") == []
