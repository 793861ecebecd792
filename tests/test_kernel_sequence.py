"""A kernel run in a layer's sequence writes its output into lines not in cache
(`cost_models.fresh_output`): the probe stores its figure in the spec, the term adds
output bytes over the measured rate to each kernel, specs without the figure price as
before. Each expected figure is worked out here from the numbers of the case."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint
from ir.kernel_records import KernelKind, KernelRecord
from ir.strategy import Precision

from cost_models.clusters import get_cluster
from cost_models.common import StepConfig
from cost_models.fresh_output import (FRESH_OUTPUT_BYTES, fresh_output_seconds, fresh_pool_bytes,
                                      probe_fresh_output)
from cost_models.kernel_time import kernel_call_seconds, pass_seconds
from cost_models.profile_device import seconds_per_call
from tests.cpu_specs import one_cpu_process

KiB = 2**10
# Made-up fresh-output points: 8 KiB at 10 GB/s, 32 KiB at 20 GB/s (output bytes over
# the extra seconds).
FRESH = (MemoryKernelPoint("fresh_output", "float32", 8 * KiB, 10.0),
         MemoryKernelPoint("fresh_output", "float32", 32 * KiB, 20.0))
BASE = KernelCalibration(
    measured_on="made up for the test",
    memory_kernels=(MemoryKernelPoint("add", "float32", 8 * KiB, 50.0),
                    MemoryKernelPoint("gelu", "float32", 8 * KiB, 25.0)))


spec = one_cpu_process


def config(micro_batch: int = 1) -> StepConfig:
    # traced at micro-batch 1, 64 tokens (seq_len 64): a GEMM's m = 64 is the tokens
    return StepConfig(micro_batch=micro_batch, graph_micro_batch=1, graph_dtype="float32",
                      precision=Precision.FP32, seq_len=64, device_type="cpu")


# The tiny layer: a (64 x 16) @ (16 x 32) product, a gelu over (64, 64), an in-place add_
# over (64, 32), a view.
GEMM = KernelRecord("aten::mm", KernelKind.GEMM, "float32", (1, 64, 32, 16), 1,
                    flops=2 * 64 * 32 * 16, weight_bytes=16 * 32 * 4,
                    activation_bytes=(64 * 16 + 64 * 32) * 4)
GELU = KernelRecord("aten::gelu", KernelKind.MEMORY, "float32", (64, 64), 2,
                    activation_bytes=2 * 64 * 64 * 4)
ADD_ = KernelRecord("aten::add_", KernelKind.MEMORY, "float32", (64, 32), 1,
                    activation_bytes=3 * 64 * 32 * 4)
VIEW = KernelRecord("aten::view", KernelKind.VIEW, "float32", (64, 32), 1)
LAYER = (GEMM, GELU, ADD_, VIEW)


def with_fresh(points=FRESH) -> ClusterSpec:
    return spec(dataclasses.replace(BASE, memory_kernels=BASE.memory_kernels + points))


def test_the_term_is_output_bytes_over_the_measured_rate_on_a_tiny_layer():
    # GEMM: output 64 x 32 x 4 = 8 KiB, at the 8 KiB point's 10 GB/s: 8192 / 10e9 s.
    # gelu: output 64 x 64 x 4 = 16 KiB, halfway in log(bytes) between 8 and 32 KiB:
    # 10 + (20 - 10) * log(2) / log(4) = 15 GB/s, 16384 / 15e9 s, twice (count 2).
    # add_ writes into its input: nothing; the view: no kernel.
    expected = 8192 / 10e9 + 2 * 16384 / 15e9
    before = pass_seconds(LAYER, spec(BASE), config(), 1.0, backward=False)
    after = pass_seconds(LAYER, with_fresh(), config(), 1.0, backward=False)
    assert after.total_s - before.total_s == pytest.approx(expected)
    assert after.gemm_s - before.gemm_s == pytest.approx(8192 / 10e9)
    assert after.memory_s - before.memory_s == pytest.approx(2 * 16384 / 15e9)


def test_the_outputs_grow_with_the_micro_batch_and_shrink_with_the_tp_share():
    # micro-batch 4: the product's m = 256 (32 KiB out: 20 GB/s), the gelu 64 KiB (past
    # the last point: its 20 GB/s); TP share 0.5 halves n and the gelu's bytes.
    grown = pass_seconds((GEMM, GELU), with_fresh(), config(4), 1.0, backward=False)
    plain = pass_seconds((GEMM, GELU), spec(BASE), config(4), 1.0, backward=False)
    assert grown.total_s - plain.total_s == pytest.approx(32768 / 20e9 + 2 * 65536 / 20e9)
    split = pass_seconds((GEMM, GELU), with_fresh(), config(4), 0.5, backward=False)
    plain = pass_seconds((GEMM, GELU), spec(BASE), config(4), 0.5, backward=False)
    # the product 256 x 16 x 4 = 16 KiB at 15 GB/s; each gelu 64 KiB x 0.5 = 32 KiB at 20
    assert split.total_s - plain.total_s == pytest.approx(16384 / 15e9 + 2 * 32768 / 20e9)


def test_attention_writes_its_output_forward_and_three_gradients_backward():
    attention = KernelRecord("aten::_scaled_dot_product_flash_attention",
                             KernelKind.ATTENTION, "float32", (1, 2, 16, 16, 32), 1,
                             flops=4 * 2 * 16 * 16 * 32)
    out_bytes = 2 * 16 * 32 * 4  # batch x heads x q_len x head_dim, fp32: 4 KiB
    for backward, outputs in ((False, 1), (True, 3)):
        with_term = pass_seconds((attention,), with_fresh(), config(), 1.0, backward)
        without = pass_seconds((attention,), spec(BASE), config(), 1.0, backward)
        # 4 KiB and 12 KiB: 4 KiB is below the first point (its 10 GB/s); 12 KiB is
        # 10 + 10 * log(1.5) / log(4) GB/s
        rate = 10.0 if outputs == 1 else 10 + 10 * math.log(1.5) / math.log(4)
        assert with_term.total_s - without.total_s == pytest.approx(
            outputs * out_bytes / (rate * 1e9))


def test_a_spec_without_the_figure_prices_as_before():
    # No fresh_output point (specs measured before the probe, GPU presets): each kernel
    # is its roofline call alone, count times, as the model summed before the term.
    cluster = spec(BASE)
    t = pass_seconds(LAYER, cluster, config(), 1.0, backward=False)
    alone = sum(r.count * kernel_call_seconds(r, cluster, config(), 1.0, False)
                for r in LAYER if r.kind is not KernelKind.VIEW)
    assert t.total_s == pytest.approx(alone)
    # and an old spec's JSON (no such points) loads and prices the same
    old = ClusterSpec.from_dict(json.loads(json.dumps(cluster.to_dict())))
    assert pass_seconds(LAYER, old, config(), 1.0, backward=False).total_s == \
        pytest.approx(t.total_s)


def test_the_points_round_trip_through_json_and_bad_kinds_still_fail():
    cal = dataclasses.replace(BASE, memory_kernels=BASE.memory_kernels + FRESH)
    assert KernelCalibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    with pytest.raises(PlannerError, match="unknown kernel"):
        MemoryKernelPoint("fresh_outputs", "float32", 8 * KiB, 10.0)


def test_the_probe_runs_on_this_cpu_and_writes_cold_lines_slower():
    points = probe_fresh_output("cpu", seconds_per_call, fresh_pool_bytes())
    # a point per probed size where fresh blocks wrote slower than a hot one: at 128 KiB
    # (inside L2) they were ~2x slower here, so that point at least is there
    assert {p.nbytes for p in points} <= set(FRESH_OUTPUT_BYTES)
    assert 128 * KiB in {p.nbytes for p in points}
    # one thread writing cold lines: between 0.1 GB/s and 10 TB/s of extra (a unit slip
    # of 1e3 lands outside)
    assert all(p.kernel == "fresh_output" and 0.1 < p.gbps < 1e4 for p in points)
    assert probe_fresh_output("cuda", seconds_per_call, 0) == []  # GPU probes rotate already


def test_the_committed_gpu_preset_carries_no_figure_and_adds_nothing():
    # The H100 preset's calibration (measured before the probe, and a GPU: its probes
    # rotate buffers past L2 already) holds no fresh_output point: every kernel of the tiny
    # layer, at any micro-batch, adds 0 and the pass is its roofline sum, as before.
    h100 = get_cluster("h100-80g")
    assert not [p for p in h100.kernel_calibration.memory_kernels
                if p.kernel == "fresh_output"]
    for micro_batch in (1, 16):
        for backward in (False, True):
            assert all(fresh_output_seconds(r, h100.kernel_calibration, config(micro_batch),
                                            1.0, backward) == 0.0 for r in LAYER)


def test_an_embedding_backward_writes_a_table_whatever_the_micro_batch():
    # embedding_dense_backward's output is the (100 x 16) fp32 table gradient, 6400 bytes:
    # at micro-batch 1 or 16 alike, below the first point (10 GB/s): 6400 / 10e9 s.
    grad = KernelRecord("aten::embedding_dense_backward", KernelKind.MEMORY, "float32",
                        (100, 16), 1, weight_bytes=100 * 16 * 4,
                        activation_bytes=64 * (16 * 4 + 8))
    cal = with_fresh().kernel_calibration
    for micro_batch in (1, 16):
        assert fresh_output_seconds(grad, cal, config(micro_batch), 1.0, True) == \
            pytest.approx(6400 / 10e9)
