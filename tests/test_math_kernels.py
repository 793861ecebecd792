"""Elementwise math ops priced at their own measured rate (`cost_models.math_kernels`):
tanh-GELU, GELU's backward (both variants) and tanh are no longer priced at exact GELU
forward's rate where the spec measured them; specs without their points price as before.
Each expected figure is worked out here from the numbers of the case."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ir.cluster import ClusterSpec
from ir.gemm_table import fastest_points
from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint
from ir.kernel_records import KernelKind, KernelRecord
from ir.strategy import Precision

from cost_models.clusters import get_cluster
from cost_models.common import StepConfig
from cost_models.kernel_time import memory_kind, pass_seconds
from cost_models.math_kernels import MATH_KINDS, math_kind, probe_math_kernels
from tests.cpu_specs import one_cpu_process

KiB = 2**10
# Made-up rates: exact GELU 30 GB/s, a plain add 100; the new kinds 6, 20, 9, 3, 90 GB/s,
# each measured at one size (a single point applies at every size).
BASE = KernelCalibration(
    measured_on="made up for the test",
    memory_kernels=(MemoryKernelPoint("add", "float32", 64 * KiB, 100.0),
                    MemoryKernelPoint("gelu", "float32", 64 * KiB, 30.0)))
MATH = (MemoryKernelPoint("gelu_tanh", "float32", 64 * KiB, 6.0),
        MemoryKernelPoint("gelu_backward", "float32", 64 * KiB, 20.0),
        MemoryKernelPoint("gelu_tanh_backward", "float32", 64 * KiB, 9.0),
        MemoryKernelPoint("tanh", "float32", 64 * KiB, 3.0),
        MemoryKernelPoint("tanh_backward", "float32", 64 * KiB, 90.0))


spec = one_cpu_process


CONFIG = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="float32",
                    precision=Precision.FP32, seq_len=64, device_type="cpu")

# A (64, 256) fp32 MLP activation: 64 KiB. Forward reads x and writes y: 128 KiB; a
# backward reads the gradient and x and writes grad_x: 192 KiB.
N = 64 * 256 * 4


def record(op: str, variant: str = "", tensors: int = 2) -> KernelRecord:
    return KernelRecord(f"aten::{op}", KernelKind.MEMORY, "float32", (64, 256), 1,
                        activation_bytes=tensors * N, variant=variant)


GELU, GELU_TANH = record("gelu"), record("gelu", "tanh")
GELU_BWD, GELU_TANH_BWD = record("gelu_backward", tensors=3), \
    record("gelu_backward", "tanh", tensors=3)
TANH, SILU, TANH_BWD = record("tanh"), record("silu"), record("tanh_backward", tensors=3)


def memory_s(records, cal) -> float:
    return pass_seconds(records, spec(cal), CONFIG, 1.0, backward=False).memory_s


def test_each_variant_is_priced_at_its_own_measured_rate():
    cal = dataclasses.replace(BASE, memory_kernels=BASE.memory_kernels + MATH)
    # bytes moved over the kind's rate: 128 KiB / 6 GB/s, 192 KiB / 20, 192 KiB / 9,
    # 128 KiB / 3, 192 KiB / 90; exact GELU forward keeps its 30 GB/s, silu stays a
    # "gelu" op (30)
    assert memory_s((GELU_TANH,), cal) == pytest.approx(2 * N / 6e9)
    assert memory_s((GELU_BWD,), cal) == pytest.approx(3 * N / 20e9)
    assert memory_s((GELU_TANH_BWD,), cal) == pytest.approx(3 * N / 9e9)
    assert memory_s((TANH,), cal) == pytest.approx(2 * N / 3e9)
    assert memory_s((TANH_BWD,), cal) == pytest.approx(3 * N / 90e9)  # 192 KiB / 90 GB/s
    assert memory_s((GELU,), cal) == pytest.approx(2 * N / 30e9)
    assert memory_s((SILU,), cal) == pytest.approx(2 * N / 30e9)
    assert [memory_kind(r, cal) for r in (GELU, GELU_TANH, GELU_BWD, GELU_TANH_BWD, TANH)] \
        == ["gelu", "gelu_tanh", "gelu_backward", "gelu_tanh_backward", "tanh"]


def test_a_spec_without_the_points_prices_as_before():
    # every one of them at exact GELU's 30 GB/s, as before the kinds existed: 2 x 128 KiB
    # + 3 x 192 KiB + 128 KiB over 30 GB/s
    layer = (GELU_TANH, GELU_BWD, GELU_TANH_BWD, TANH, SILU, TANH_BWD)
    assert memory_s(layer, BASE) == pytest.approx((2 * 2 + 3 * 3 + 2) * N / 30e9)
    assert all(math_kind(r, BASE) is None for r in layer)
    # an old spec's JSON loads and prices the same; the new points round-trip
    old = ClusterSpec.from_dict(json.loads(json.dumps(spec(BASE).to_dict())))
    assert pass_seconds(layer, old, CONFIG, 1.0, False).memory_s == pytest.approx(
        memory_s(layer, BASE))
    cal = dataclasses.replace(BASE, memory_kernels=BASE.memory_kernels + MATH)
    assert KernelCalibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    # only the kind a spec measured moves: with gelu_tanh alone, GELU's backward is
    # still at 30 GB/s
    one = dataclasses.replace(BASE, memory_kernels=BASE.memory_kernels + MATH[:1])
    assert memory_s((GELU_BWD,), one) == pytest.approx(3 * N / 30e9)


def test_the_gpu_preset_has_no_points_and_keeps_the_gelu_kind():
    cal = get_cluster("h100-80g").kernel_calibration
    assert not [p for p in cal.memory_kernels if p.kernel in MATH_KINDS]
    assert memory_kind(GELU_TANH_BWD, cal) == "gelu"


def test_the_probe_stores_each_kind_and_tanh_gelu_is_slower_than_exact_here():
    # one small size (bytes moved): each kind gets a point, priced per byte moved; the
    # fastest of three probes, as the kit keeps the fastest of its passes (a shared host
    # only slows a kernel: one CI run under the suite's load read tanh_backward at 8 GB/s)
    points = fastest_points(*(probe_math_kernels("cpu", (96 * KiB, 384 * KiB))
                              for _ in range(3)))
    assert {(p.kernel, p.nbytes) for p in points} == {
        (kind, n // (tensors * 4) * tensors * 4) for kind, (_, _, tensors, _) in
        MATH_KINDS.items() for n in (96 * KiB, 384 * KiB)}
    # one thread: between 0.1 GB/s and 10 TB/s (a unit slip of 1e3 lands outside; a
    # streaming kind net of its call's dispatch can read far above DRAM's rate at 96 KiB)
    assert all(0.1 < p.gbps < 1e4 for p in points), points
    # tanh-GELU (a tanh per element) runs slower than exact GELU's backward per byte
    # here (6 vs 22 GB/s on this CPU, 2026-11-25: a 3x margin over load noise)
    rate = {(p.kernel, p.nbytes): p.gbps for p in points}
    assert rate[("gelu_tanh", 384 * KiB)] < rate[("gelu_backward", 384 * KiB)]
    # tanh's backward (a multiply-add per element) streams past tanh itself (16 vs 276 us
    # at 512 KiB here: a 17x margin)
    assert rate[("tanh_backward", 384 * KiB)] > rate[("tanh", 384 * KiB)]
    assert probe_math_kernels("cuda", (96 * KiB,)) == []
