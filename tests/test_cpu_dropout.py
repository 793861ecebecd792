"""A dropout as a CPU runs it (issue 17): the kernel records hold CUDA's one fused
`native_dropout` (reads x, writes the output and a bool mask: 9 bytes per fp32 element),
while ATen on a CPU draws a float mask (`bernoulli_`, priced per element apart), scales
it in place (`div_`) and multiplies (`mul`): two more kernels and two fresh x-sized
outputs. The kit measures those two kernels as the memory kind "dropout" over the
record's bytes; a spec without the kind (a GPU's, an older CPU spec) prices the kernel as
before, streaming like an add (a CPU kit with fresh-output points still charges the
forward its two fresh outputs: `fresh_output`).

Hand figures: a (1024, 64) fp32 record moves 2 x 256 KiB + 64 KiB (the bool mask) =
576 KiB; at 3 GB/s that is 589824 / 3e9 s; at add's 6 GB/s half of it.
"""

from __future__ import annotations

import pytest
import torch

from ir.cluster import ClusterSpec
from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint
from ir.kernel_records import KernelKind, KernelRecord
from ir.strategy import Precision

from cost_models.common import StepConfig
from cost_models.fresh_output import fresh_output_seconds
from cost_models.kernel_time import kernel_call_seconds
from cost_models.memory_probes import _memory_kernel, probed_kinds

KiB = 2**10
ROWS, WIDTH = 1024, 64
X_BYTES = ROWS * WIDTH * 4  # 256 KiB of fp32
RECORD_BYTES = 2 * X_BYTES + ROWS * WIDTH  # x read, output written, a bool mask written


def dropout_record(backward: bool = False) -> KernelRecord:
    op = "aten::native_dropout_backward" if backward else "aten::native_dropout"
    return KernelRecord(op, KernelKind.MEMORY, "float32", (ROWS, WIDTH), 1,
                        activation_bytes=RECORD_BYTES)


def cpu_spec(*points: MemoryKernelPoint) -> ClusterSpec:
    cal = KernelCalibration(measured_on="made up for the test", memory_kernels=points)
    return ClusterSpec(
        name="test", device="cpu", num_nodes=1, devices_per_node=1,
        device_memory_bytes=2**34, peak_flops_by_dtype=(("float32", 1e11),), hbm_gbps=10.0,
        intra_node_gbps=10.0, inter_node_gbps=1.0, intra_node_latency_s=1e-6,
        inter_node_latency_s=1e-5, runtime_overhead_bytes=0, matmul_efficiency=1.0,
        kernel_calibration=cal)


CONFIG = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="float32",
                    precision=Precision.FP32, device_type="cpu")
ADD = MemoryKernelPoint("add", "float32", RECORD_BYTES, 6.0)


def test_a_cpu_dropout_is_priced_at_its_measured_kind():
    spec = cpu_spec(ADD, MemoryKernelPoint("dropout", "float32", RECORD_BYTES, 3.0))
    seconds = kernel_call_seconds(dropout_record(), spec, CONFIG, 1.0, backward=False)
    assert seconds == pytest.approx(RECORD_BYTES / 3e9)


def test_without_the_kind_a_dropout_streams_as_an_add():
    seconds = kernel_call_seconds(dropout_record(), cpu_spec(ADD), CONFIG, 1.0, backward=False)
    assert seconds == pytest.approx(RECORD_BYTES / 6e9)


def test_the_backward_is_one_multiply_priced_as_an_add():
    # CPU autograd runs grad * mask: one streaming kernel, not the forward's two
    spec = cpu_spec(ADD, MemoryKernelPoint("dropout", "float32", RECORD_BYTES, 3.0))
    seconds = kernel_call_seconds(dropout_record(backward=True), spec, CONFIG, 1.0,
                                  backward=True)
    assert seconds == pytest.approx(RECORD_BYTES / 6e9)


def test_a_cpu_dropout_forward_writes_its_mask_and_output_fresh():
    # 4 GB/s of fresh output at x's size: each of the two x-sized blocks pays X_BYTES / 4e9
    spec = cpu_spec(ADD, MemoryKernelPoint("fresh_output", "float32", X_BYTES, 4.0))
    cal = spec.kernel_calibration
    forward = fresh_output_seconds(dropout_record(), cal, CONFIG, 1.0, backward=False)
    backward = fresh_output_seconds(dropout_record(True), cal, CONFIG, 1.0, backward=True)
    assert forward == pytest.approx(2 * X_BYTES / 4e9)
    assert backward == pytest.approx(X_BYTES / 4e9)


def test_the_probe_runs_the_cpus_scale_and_multiply_over_the_records_bytes():
    x, y, out = (torch.rand(ROWS * WIDTH) for _ in range(3))
    call, moved = _memory_kernel("dropout", x, y, out)
    assert moved == RECORD_BYTES
    result = call()
    assert result.shape == x.shape
    assert torch.equal(call(), result)  # the mask stays as it was: every call does the same


def test_only_a_cpu_probes_the_kind():
    assert "dropout" in probed_kinds("cpu", 256 * KiB)
    assert "dropout" not in probed_kinds("cuda", 256 * KiB)  # CUDA runs one fused kernel
