"""The cold-kernel term (`cost_models.cold_kernel`): each distinct memory op of a pass pays
its kind's measured cold-code seconds once, whatever its count or its records; no figure,
no change; the points round-trip through JSON; the probe runs on this CPU."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ir.errors import PlannerError
from ir.kernel_calibration import ColdKernelPoint, KernelCalibration
from ir.kernel_records import KernelKind, KernelRecord

from cost_models.cold_kernel import probe_cold_kernel
from cost_models.kernel_time import pass_seconds
from tests.test_kernel_sequence import BASE, LAYER, config, spec

GELU_COLD_S, ADD_COLD_S = 20e-6, 4e-6  # made up
L2 = 1.0  # bytes: any pass fills it (the share is 1)
COLD = (ColdKernelPoint("gelu", "float32", GELU_COLD_S, L2),
        ColdKernelPoint("add", "float32", ADD_COLD_S, L2),
        ColdKernelPoint("gelu", "bfloat16", 1.0, L2))  # another dtype: never read here
# a second gelu record (another shape) of the same op: its code is warm by then
GELU_2 = KernelRecord("aten::gelu", KernelKind.MEMORY, "float32", (64, 16), 3,
                      activation_bytes=2 * 64 * 16 * 4)


def with_cold(points=COLD):
    return spec(dataclasses.replace(BASE, cold_kernels=points))


def test_each_distinct_memory_op_pays_its_kinds_cold_seconds_once_per_pass():
    # LAYER: a GEMM (no cold term), gelu x2, add_ x1 ("add" kind), a view; GELU_2 adds
    # three more gelu calls: still one cold gelu
    records = (*LAYER, GELU_2)
    before = pass_seconds(records, spec(BASE), config(), 1.0, backward=False)
    after = pass_seconds(records, with_cold(), config(), 1.0, backward=False)
    assert after.memory_s - before.memory_s == pytest.approx(GELU_COLD_S + ADD_COLD_S)
    assert after.gemm_s == pytest.approx(before.gemm_s)


def test_a_spec_without_the_figure_prices_as_before():
    t = pass_seconds(LAYER, spec(BASE), config(), 1.0, backward=False)
    assert pass_seconds(LAYER, with_cold(()), config(), 1.0, backward=False).total_s == \
        pytest.approx(t.total_s)


def test_the_points_round_trip_through_json_and_a_negative_figure_fails():
    cal = dataclasses.replace(BASE, cold_kernels=COLD)
    assert KernelCalibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    assert cal.cold_kernel("gelu", "float32").seconds == GELU_COLD_S
    assert cal.cold_kernel("softmax", "float32") is None
    with pytest.raises(PlannerError):
        ColdKernelPoint("gelu", "float32", -1e-6, L2)


def test_the_probe_runs_on_this_cpu():
    points = probe_cold_kernel("cpu")
    kinds = {p.kernel for p in points}
    assert {"copy", "add", "gelu", "layer_norm", "gelu_backward"} <= kinds
    # a fixed cost per call: at most milliseconds (a unit slip of 1e3 lands outside)
    assert all(p.dtype == "float32" and 0.0 <= p.seconds < 5e-3 for p in points)
    assert probe_cold_kernel("cuda") == []


def test_a_pass_moving_less_than_the_l2_pays_that_share():
    # LAYER moves (GEMM 16*32*4 + (64*16 + 64*32)*4) + 2 gelu x 2*64*64*4 + add_ 3*64*32*4
    # bytes; against an L2 of 4x that, a quarter of each op's figure; of 1 byte, all of it
    moved = (16 * 32 + 64 * 16 + 64 * 32) * 4 + 2 * 2 * 64 * 64 * 4 + 3 * 64 * 32 * 4
    big_l2 = tuple(dataclasses.replace(p, l2_bytes=4 * moved) for p in COLD)
    before = pass_seconds(LAYER, spec(BASE), config(), 1.0, backward=False)
    after = pass_seconds(LAYER, with_cold(big_l2), config(), 1.0, backward=False)
    assert after.memory_s - before.memory_s == pytest.approx((GELU_COLD_S + ADD_COLD_S) / 4)
