"""Small CPU cluster specs and a linear layer for pricing tests, in round figures so the
tests' hand arithmetic stays short."""

from __future__ import annotations

import dataclasses

from ir.calibration_tables import CalibrationTables
from ir.cluster import ClusterSpec
from ir.kernel_calibration import KernelCalibration
from ir.layer import Layer, LayerMeasurement

US = 1e-6


# What every test CPU cluster shares: one node, a 16 GiB device, 100 GFLOP/s fp32, 20 GB/s.
_CPU_NODE = dict(device="cpu", num_nodes=1, device_memory_bytes=2**34,
                 peak_flops_by_dtype=(("float32", 1e11),), hbm_gbps=20.0,
                 runtime_overhead_bytes=0, matmul_efficiency=1.0)
# Loopback links: 1 GB/s, 100 us, both scopes (the multi-rank helpers)
_SLOW_LINKS = dict(intra_node_gbps=1.0, inter_node_gbps=1.0, intra_node_latency_s=1e-4,
                   inter_node_latency_s=1e-4)
# 10 GB/s and 10 us in a node, 1 GB/s and 100 us across (the kernel-pricing helpers)
_FAST_LINKS = dict(intra_node_gbps=10.0, inter_node_gbps=1.0, intra_node_latency_s=1e-5,
                   inter_node_latency_s=1e-4)


def one_cpu_process(calibration: KernelCalibration | None) -> ClusterSpec:
    """One CPU process carrying `calibration`, no per-op overhead (kernel-pricing tests)."""
    return ClusterSpec(name="test-cpu", devices_per_node=1, **_CPU_NODE, **_FAST_LINKS,
                       op_overhead_s=0.0, kernel_calibration=calibration)


def two_cpu_processes(calibration: KernelCalibration | None) -> ClusterSpec:
    """2 CPU processes on 2 cores (core share 1), carrying `calibration`, an op 1 us (the
    step-host and search-host tests)."""
    return ClusterSpec(name="test-cpu2", devices_per_node=2, **_CPU_NODE, **_FAST_LINKS,
                       op_overhead_s=1e-6, host_cores=2, kernel_calibration=calibration)


def one_process_with_host_figures(calibration: KernelCalibration | None,
                                  **changes) -> ClusterSpec:
    """One CPU process (host share 1) carrying `calibration`, with `changes`: a forward op
    4 us, a backward op 2 us, a DTensor op 15 us (the host-split and checkpoint tests)."""
    return dataclasses.replace(ClusterSpec(
        name="cpu-test", devices_per_node=1, **_CPU_NODE, **_SLOW_LINKS,
        op_overhead_s=4 * US, backward_op_overhead_s=2 * US, dtensor_op_overhead_s=15 * US,
        host_cores=1, kernel_calibration=calibration), **changes)


def two_ranks_on_two_cores(calibration: CalibrationTables, **changes) -> ClusterSpec:
    """2 CPU processes on 2 cores (host share 1) carrying `calibration` tables, with
    `changes`: an op 5 us, a DTensor op 15 us (the host-cost and TP-pricing tests)."""
    return dataclasses.replace(ClusterSpec(
        name="cpu-test", devices_per_node=2, **_CPU_NODE, **_SLOW_LINKS,
        op_overhead_s=5 * US, dtensor_op_overhead_s=15 * US, host_cores=2,
        calibration=calibration), **changes)


def four_ranks_on_two_cores(calibration: CalibrationTables) -> ClusterSpec:
    """4 CPU processes on 2 cores (host share 2) carrying measured `calibration` tables."""
    return ClusterSpec(name="cpu-test", devices_per_node=4, **_CPU_NODE, **_SLOW_LINKS,
                       op_overhead_s=4e-6, host_cores=2, calibration=calibration)


def linear_layer() -> Layer:
    """nn.Linear(8, 8): 72 parameters in 2 tensors, one forward op, two backward."""
    return Layer(name="fc", kind="Linear", index=0, params=72, param_bytes=288, tp_params=0,
                 input_bytes=64, output_bytes=64, structural_hash="fc",
                 param_names=("fc.weight", "fc.bias"),
                 measured=LayerMeasurement(ops_fwd=1, ops_bwd=2))
