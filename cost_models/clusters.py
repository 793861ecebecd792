"""Cluster presets from datasheets, the measured `local` machine, and `get_cluster`.

Presets are 8 GPUs per node on NVLink/NVSwitch with one InfiniBand NIC per GPU
(DGX/HGX layout). Link fields hold achievable bus bandwidth (what the alpha-beta model
divides by): the datasheet's one-direction figure times a measured achievable fraction.
Every number below is a named constant with its source.

    >>> get_cluster("h100-80g", nodes=4).world_size
    32
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from pathlib import Path

from ir.cluster import ClusterSpec
from ir.errors import PlannerError

from cost_models.item_probes import probe_random_element_s

GiB = 2**30
MiB = 2**20

GPUS_PER_NODE = 8  # DGX A100 / DGX H100 / HGX H200 nodes

# Device memory: the total CUDA reports (nvidia-smi "MiB" column) for each SKU.
A100_40G_MEMORY_BYTES = 40_960 * MiB
A100_80G_MEMORY_BYTES = 81_920 * MiB
H100_80G_MEMORY_BYTES = 81_559 * MiB
H200_MEMORY_BYTES = 143_771 * MiB

# Dense peak FLOP/s (NVIDIA A100 and H100 datasheets; H200 shares H100's SM array).
# float32 is plain FP32 (PyTorch's default matmul, TF32 off); tf32 is listed separately.
A100_PEAK_FLOPS = (("bfloat16", 312e12), ("float16", 312e12), ("float32", 19.5e12),
                   ("tf32", 156e12))
H100_PEAK_FLOPS = (("bfloat16", 989e12), ("float16", 989e12), ("float32", 67e12),
                   ("tf32", 494.5e12))

# HBM bandwidth, GB/s (datasheets, REFERENCES.md devices table).
A100_40G_HBM_GBPS = 1_600.0
A100_80G_HBM_GBPS = 2_000.0
H100_HBM_GBPS = 3_350.0
H200_HBM_GBPS = 4_800.0

# NVLink per GPU, GB/s, both directions together (datasheets): one direction is half.
A100_NVLINK_BIDIR_GBPS = 600.0
H100_NVLINK_BIDIR_GBPS = 900.0
# Achievable all-reduce busbw inside an 8xA100 node is 200-230 GB/s (REFERENCES.md,
# nccl-tests) against 300 GB/s one-way: take the midpoint, 215/300.
NVLINK_BUSBW_FRACTION = 215.0 / 300.0
# InfiniBand per GPU: one NIC each, HDR 200 Gb/s (A100 nodes), NDR 400 Gb/s (H100/H200).
A100_NIC_GBPS = 200 / 8
H100_NIC_GBPS = 400 / 8
# Measured across DGX-A100 nodes: ~190 GB/s busbw over 8x200 Gb/s = 200 GB/s (REFERENCES.md).
IB_BUSBW_FRACTION = 190.0 / 200.0

# Per-step latency alpha of NCCL collectives; typical order of magnitude of nccl-tests'
# small-message times divided by ring steps. Calibrate with `planner profile-cluster`.
NVLINK_LATENCY_S = 3e-6
IB_LATENCY_S = 8e-6

# Memory a GPU process spends before any tensor: CUDA context and kernels (~0.5-1 GiB
# with PyTorch's kernels loaded), cuBLAS workspaces, NCCL communicator buffers and the
# caching allocator's slack. A planning margin, not a measurement.
GPU_RUNTIME_OVERHEAD_BYTES = 2 * GiB

# Best measured fraction of dense bf16 peak on large GEMMs: an 8192^3 bf16 matmul ran at
# ~795 of 989 TFLOP/s on H100 and H200 (REFERENCES.md). A100 assumed the same fraction.
HOPPER_MATMUL_EFFICIENCY = 795.0 / 989.0
AMPERE_MATMUL_EFFICIENCY = HOPPER_MATMUL_EFFICIENCY

# ---- the local machine (CPU processes talking gloo over loopback) -------------------------
# Guesses for gloo over localhost until `planner profile-cluster` measures them.
LOCAL_GLOO_GBPS = 2.0
LOCAL_GLOO_LATENCY_S = 50e-6
# Resident memory of a Python process before any model tensor: measured here ~220 MiB RSS
# after `import torch`, ~370 MiB once the first matmul kernels and thread pools are up.
LOCAL_RUNTIME_OVERHEAD_BYTES = 384 * MiB
# Matmul and copy sizes for the quick measurement (big enough to reach steady state on a
# core, small enough to take well under a second).
LOCAL_MATMUL_DIM = 512
LOCAL_MATMUL_REPEATS = 3
LOCAL_COPY_BYTES = 64 * MiB
# Each local process runs one intra-op thread (planner validate, the tests, the examples):
# on a shared machine extra OpenMP threads spin at barriers instead of working.
LOCAL_THREADS_PER_PROCESS = 1
# Per-op framework overhead: a tiny MLP block (Linear, LayerNorm, GELU, Linear) forward and
# backward, timed over OP_OVERHEAD_REPEATS runs and divided by the ATen ops it dispatches.
OP_OVERHEAD_WIDTH = 8
OP_OVERHEAD_REPEATS = 200
# The median round of this many: a median of 3 moved 6.3-11.4 us between calls a second
# apart on the shared 2-core machine (sub-second slow spells).
OP_OVERHEAD_ROUNDS = 9
# Extra per op on (replicated) DTensors over plain tensors, measured the same way by
# `planner profile-cluster` (it needs a process group); this is that figure on the 2-core
# development machine (torch 2.13, CPU), used by the `local` preset until one is measured.
LOCAL_DTENSOR_OP_OVERHEAD_S = 60e-6

# ---- host side, for CPU offload (theoretical peaks; unmeasured on these nodes) ------------
# PCIe host link of one GPU, one direction: lanes x GT/s x 128b/130b encoding / 8 bits
# (PCI-SIG base specs). A100 SXM4 is PCIe Gen4 x16, H100/H200 SXM5 Gen5 x16 (datasheets).
PCIE_GEN4_X16_GBPS = 16 * 16 * 128 / 130 / 8  # 31.5 GB/s
PCIE_GEN5_X16_GBPS = 16 * 32 * 128 / 130 / 8  # 63.0 GB/s
# Host memory per node: DGX A100 320GB system 1 TB, DGX A100 640GB system 2 TB, DGX H100 /
# DGX H200 2 TB (NVIDIA DGX datasheets).
DGX_A100_320G_HOST_MEMORY_BYTES = 1 * 2**40
DGX_A100_640G_HOST_MEMORY_BYTES = 2 * 2**40
DGX_H100_HOST_MEMORY_BYTES = 2 * 2**40
# Host memory bandwidth per node, channels x transfer rate x 8 bytes: DGX A100's two AMD
# EPYC 7742 (8 x DDR4-3200 each, AMD spec 204.8 GB/s per socket); DGX H100's two Xeon
# Platinum 8480C (8 x DDR5-4800 each, 307.2 GB/s per socket, Intel ark).
DGX_A100_HOST_MEMORY_GBPS = 2 * 8 * 3.2 * 8
DGX_H100_HOST_MEMORY_GBPS = 2 * 8 * 4.8 * 8


def _gpu_preset(name: str, device: str, memory_bytes: int, peak, hbm_gbps: float,
                nvlink_bidir_gbps: float, nic_gbps: float, efficiency: float,
                pcie_gbps: float = 0.0, host_memory_bytes: int = 0,
                host_memory_gbps: float = 0.0) -> ClusterSpec:
    return ClusterSpec(
        name=name, device=device, num_nodes=1, devices_per_node=GPUS_PER_NODE,
        device_memory_bytes=memory_bytes, peak_flops_by_dtype=tuple(sorted(peak)),
        hbm_gbps=hbm_gbps,
        intra_node_gbps=nvlink_bidir_gbps / 2 * NVLINK_BUSBW_FRACTION,
        inter_node_gbps=nic_gbps * IB_BUSBW_FRACTION,
        intra_node_latency_s=NVLINK_LATENCY_S, inter_node_latency_s=IB_LATENCY_S,
        runtime_overhead_bytes=GPU_RUNTIME_OVERHEAD_BYTES, matmul_efficiency=efficiency,
        pcie_gbps=pcie_gbps, host_memory_bytes=host_memory_bytes,
        host_memory_gbps=host_memory_gbps,
        notes="datasheet preset (cost_models/clusters.py)")


def _a100_40g() -> ClusterSpec:
    return _gpu_preset("a100-40g", "A100-SXM4-40GB", A100_40G_MEMORY_BYTES, A100_PEAK_FLOPS,
                       A100_40G_HBM_GBPS, A100_NVLINK_BIDIR_GBPS, A100_NIC_GBPS,
                       AMPERE_MATMUL_EFFICIENCY, PCIE_GEN4_X16_GBPS,
                       DGX_A100_320G_HOST_MEMORY_BYTES, DGX_A100_HOST_MEMORY_GBPS)


def _a100_80g() -> ClusterSpec:
    return _gpu_preset("a100-80g", "A100-SXM4-80GB", A100_80G_MEMORY_BYTES, A100_PEAK_FLOPS,
                       A100_80G_HBM_GBPS, A100_NVLINK_BIDIR_GBPS, A100_NIC_GBPS,
                       AMPERE_MATMUL_EFFICIENCY, PCIE_GEN4_X16_GBPS,
                       DGX_A100_640G_HOST_MEMORY_BYTES, DGX_A100_HOST_MEMORY_GBPS)


# Kernel tables `planner profile-device --device cuda` measured on one H100 80GB HBM3
# (torch 2.11, CUDA 13.0, 2026-11-24): GEMMs by shape, memory-bound kernels, SDPA, launches.
H100_CALIBRATION_PATH = Path(__file__).parent / "calibration" / "h100-80g.json"


def _h100_80g() -> ClusterSpec:
    import dataclasses

    spec = _gpu_preset("h100-80g", "H100-SXM5-80GB", H100_80G_MEMORY_BYTES, H100_PEAK_FLOPS,
                       H100_HBM_GBPS, H100_NVLINK_BIDIR_GBPS, H100_NIC_GBPS,
                       HOPPER_MATMUL_EFFICIENCY, PCIE_GEN5_X16_GBPS,
                       DGX_H100_HOST_MEMORY_BYTES, DGX_H100_HOST_MEMORY_GBPS)
    measured = _measured_spec(H100_CALIBRATION_PATH)
    return dataclasses.replace(spec, kernel_calibration=measured.kernel_calibration,
                               op_overhead_s=measured.op_overhead_s)


@functools.lru_cache(maxsize=None)
def _measured_spec(path: Path) -> ClusterSpec:
    """A committed profile-device spec. Presets take its kernel tables and its host's
    framework seconds per op (`seconds_per_op` on the GPU: 0 would price an eager step's
    host as free, and llama3.2-1b at micro-batch 1 ran 150 ms of host-bound steps on the
    H100 the preset predicted at 44: bench/bench_gpu_validate.py, 2026-11-25); links and
    peaks stay the datasheet's."""
    return ClusterSpec.load(path)


def _h200() -> ClusterSpec:
    return _gpu_preset("h200", "H200-SXM-141GB", H200_MEMORY_BYTES, H100_PEAK_FLOPS,
                       H200_HBM_GBPS, H100_NVLINK_BIDIR_GBPS, H100_NIC_GBPS,
                       HOPPER_MATMUL_EFFICIENCY, PCIE_GEN5_X16_GBPS,
                       DGX_H100_HOST_MEMORY_BYTES, DGX_H100_HOST_MEMORY_GBPS)


def _local() -> ClusterSpec:
    flops = measure_matmul_flops()
    return ClusterSpec(
        name="local", device="cpu", num_nodes=1, devices_per_node=1,
        device_memory_bytes=total_memory_bytes(), peak_flops_by_dtype=flops,
        hbm_gbps=measure_copy_gbps(), intra_node_gbps=LOCAL_GLOO_GBPS,
        inter_node_gbps=LOCAL_GLOO_GBPS, intra_node_latency_s=LOCAL_GLOO_LATENCY_S,
        inter_node_latency_s=LOCAL_GLOO_LATENCY_S,
        runtime_overhead_bytes=LOCAL_RUNTIME_OVERHEAD_BYTES, matmul_efficiency=1.0,
        op_overhead_s=measure_op_overhead_s(),
        dtensor_op_overhead_s=LOCAL_DTENSOR_OP_OVERHEAD_S, host_cores=host_cores(),
        random_element_s=probe_random_element_s("cpu"),
        notes="this machine, one thread per process: matmul FLOP/s, copy bandwidth, "
              "per-op overhead and random draws measured; links and DTensor overhead "
              "guessed (run "
              "`planner profile-cluster` to measure them)")


PRESETS = {
    "a100-40g": _a100_40g,
    "a100-80g": _a100_80g,
    "h100-80g": _h100_80g,
    "h200": _h200,
    "local": _local,
}


def preset_names() -> tuple[str, ...]:
    return tuple(PRESETS)


# The name torch.cuda.get_device_properties reports for each SKU a preset describes: the
# SXM boards. Others (H100 PCIe/NVL, GH200, H200 NVL, A100 PCIe) differ in clocks, power,
# HBM and links, so they get no preset's figures. H100: the lent machine
# (bench/gpu_measured/h100_steps_2026-11-25.json); the rest: nvidia-smi's product names.
PRESET_BY_DEVICE_NAME = {
    "NVIDIA A100-SXM4-40GB": "a100-40g",
    "NVIDIA A100-SXM4-80GB": "a100-80g",
    "NVIDIA H100 80GB HBM3": "h100-80g",
    "NVIDIA H200": "h200",
}
# A GPU with no preset borrows this one's links and host figures (its own peak FLOP/s
# are the best measured; `profile_device.spec_from_calibration`).
FALLBACK_GPU_PRESET = "h100-80g"


def preset_for_device(device_name: str) -> str | None:
    """The datasheet preset of a GPU by the exact name torch reports ("NVIDIA H100 80GB
    HBM3" -> "h100-80g"); None for one no preset describes."""
    return PRESET_BY_DEVICE_NAME.get(device_name.strip())


def get_cluster(name_or_path: str | os.PathLike, nodes: int | None = None,
                gpus_per_node: int | None = None) -> ClusterSpec:
    """A preset by name or a spec JSON file by path, resized to `nodes` x `gpus_per_node`.

    On `local`, devices are processes sharing this machine's memory, so each gets
    total / gpus_per_node.
    """
    key = str(name_or_path)
    if nodes is not None and nodes < 1:
        raise PlannerError(f"--nodes must be >= 1, got {nodes}")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise PlannerError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    if key in PRESETS:
        spec = PRESETS[key]()
        if key == "local" and gpus_per_node is not None:
            spec = _share_memory(spec, gpus_per_node)
    elif key.endswith(".json") or Path(key).is_file():
        spec = ClusterSpec.load(key)
    else:
        raise PlannerError(f"unknown cluster {key!r}: use a preset ({', '.join(PRESETS)}) "
                           "or a spec JSON file (planner profile-cluster --out spec.json)")
    return spec.with_nodes(num_nodes=nodes, devices_per_node=gpus_per_node)


def _share_memory(spec: ClusterSpec, processes: int) -> ClusterSpec:
    import dataclasses

    per_process = spec.device_memory_bytes // processes
    return dataclasses.replace(spec, device_memory_bytes=max(per_process,
                                                             spec.runtime_overhead_bytes + 1))


# ---- measurements of this machine (cached in memory only, never on disk) --------------


def total_memory_bytes() -> int:
    """Physical memory of this machine from /proc/meminfo (MemTotal), else sysconf."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # the file counts KiB
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_cores() -> int:
    """Cores this process may run on (the affinity mask, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _one_thread:
    """Measure as a local process runs: LOCAL_THREADS_PER_PROCESS intra-op threads."""

    def __enter__(self):
        import torch

        self.before = torch.get_num_threads()
        torch.set_num_threads(LOCAL_THREADS_PER_PROCESS)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.before)


@functools.lru_cache(maxsize=1)
def measure_matmul_flops(dim: int = LOCAL_MATMUL_DIM,
                         repeats: int = LOCAL_MATMUL_REPEATS) -> tuple[tuple[str, float], ...]:
    """Best-of-`repeats` FLOP/s of a dim^3 matmul on one thread, float32 and bfloat16."""
    with _one_thread():
        return _matmul_flops(dim, repeats)


def _matmul_flops(dim: int, repeats: int) -> tuple[tuple[str, float], ...]:
    import torch

    out = []
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(dim, dim).to(dtype)
        b = torch.randn(dim, dim).to(dtype)
        torch.mm(a, b)  # warm-up: thread pool, kernel selection
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
        # A dim x dim by dim x dim product is 2*dim^3 FLOPs (one multiply, one add each).
        out.append((str(dtype).removeprefix("torch."), 2 * dim**3 / max(best, 1e-9)))
    return tuple(sorted(out))


@functools.lru_cache(maxsize=1)
def measure_copy_gbps(nbytes: int = LOCAL_COPY_BYTES) -> float:
    """Memory bandwidth of a large tensor copy on one thread, bytes read plus written."""
    with _one_thread():
        return _copy_gbps(nbytes)


def _copy_gbps(nbytes: int) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / max(best, 1e-9) / 1e9


def _overhead_block(width: int = OP_OVERHEAD_WIDTH):
    from torch import nn

    return nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(),
                         nn.Linear(width, width))


def op_rounds_s(block, x, repeats: int = OP_OVERHEAD_REPEATS) -> list[float]:
    """Seconds per dispatched ATen op of `block(x).sum()` forward + backward, one reading
    per round of `repeats` runs (tensors this small cost nothing to compute: what remains
    is framework overhead)."""
    from ir.op_count import count_ops

    def run():
        block(x).sum().backward()

    run()  # warm-up: autograd graph caches, DTensor sharding-propagation caches
    ops = max(count_ops(run), 1)
    rounds = []
    for _ in range(OP_OVERHEAD_ROUNDS):
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        rounds.append((time.perf_counter() - start) / repeats / ops)
    return rounds


def seconds_per_op(block, x, repeats: int = OP_OVERHEAD_REPEATS) -> float:
    """The median round of `op_rounds_s`."""
    return statistics.median(op_rounds_s(block, x, repeats))


def host_op_rounds_s(device: str = "cpu") -> list[float]:
    """This host's per-op readings now (`op_rounds_s` of the overhead block on `device`,
    one thread on CPU), uncached: profile-device's GPU figure and `planner validate`'s
    re-reading before a run."""
    import torch

    with _one_thread() if device == "cpu" else contextlib.nullcontext():
        block = _overhead_block().to(device)
        return op_rounds_s(block, torch.randn(2, OP_OVERHEAD_WIDTH, device=device))


@functools.lru_cache(maxsize=1)
def measure_op_overhead_s() -> float:
    """Host seconds per eager ATen op on one thread (see `seconds_per_op`)."""
    return statistics.median(host_op_rounds_s("cpu"))
