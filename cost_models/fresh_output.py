"""What a CPU kernel pays, run in a layer's sequence, to write its output into memory that
is not in cache: the `fresh_output` kind of the memory-kernel table (issue 17).

Every CPU probe of `profile_device` repeats one call: its output tensor is freed and
malloc hands the next call the same block, still in L1/L2 (`profile_device.ROTATE_BYTES`:
CPU probes run warm). In a layer's pass each op's output is a block that last held some
other tensor, a pass or more ago: its lines are not in L2, and every line the kernel
writes is first fetched (write-allocate) from L3 or DRAM. bench/bench_kernel_sequence.py
measured it (one thread, thread clock, 2026-11-25, load 3-4): llama-tiny blocks.0 at
micro-batch 16, each op run twice in sequence, the repeat writing a fresh block, summed
184 us over the ops alone forward (6.5 MiB of fresh outputs) and 331 us backward (9.2
MiB): 28 and 35 ns per KiB; inputs read just before (warm) did not close it, and no page
fault occurred (glibc reuses its freed heap: no first-touch cost at these sizes). An add
of 128 KiB wrote into a pre-faulted block of a 4-64 MiB pool 3.2-4.4 us slower than into
the same block (27-34 ns per KiB).

The probe (`probe_fresh_output`): `torch.add(a, b, out=...)` with hot inputs, into one
block (hot) and into blocks of a pool twice the last-level cache in shuffled turn
(fresh), at each of FRESH_OUTPUT_BYTES; the point is the output's bytes over the difference of the two, as
a rate:  extra seconds = output bytes / gbps  (interpolated in log(bytes) by
`kernel_loops.memory_gbps`, as every memory kind). `fresh_output_seconds` prices one
call of a record: its output bytes at that rate; 0 where the calibration has no point
(GPUs: their probes rotate buffers already; CPU specs measured before this probe).
Outputs counted: a GEMM's m x n, a memory kernel's first output (its record's shape),
attention's output forward and its three input gradients backward, a convolution
forward's output, an embedding backward's table gradient. Weight gradients (the
recorder's `KernelRecord.weight_output`: a Linear's x^T @ dy, a bias's sum, the table
gradient) are weight-sized at any micro-batch; every other output grows with it. Not
counted: in-place ops (their output is their input), embedding bags, a convolution
backward's gradients (the record keeps no input positions).
"""

from __future__ import annotations

import math
import random

from ir.kernel_calibration import MemoryKernelPoint
from ir.kernel_recorder import DROPOUT_OP, EMBEDDING_BAG_OPS
from ir.kernel_records import KernelKind, KernelRecord

from cost_models.common import GB, StepConfig
from cost_models.kernel_loops import measured, memory_gbps

KIND = "fresh_output"
# Output sizes the probe writes: the zoo's tensors (llama-tiny's block at micro-batch 16
# writes 16-512 KiB outputs), past this CPU's 1 MiB L2 (lscpu: 2 MiB, 2 instances), where
# the warm probes' own outputs already leave L2, and past its 32 MiB L3, where they stream
# from DRAM either way (here 2026-11-25: 38-44 ns per KiB at 128 KiB, 12-16 at 2 MiB, 4-6
# at 8-16 MiB; at 32 MiB no slower, and 4 s more of probe); past the last size its rate
# applies (`kernel_loops.memory_gbps`).
FRESH_OUTPUT_BYTES = (8 * 2**10, 32 * 2**10, 128 * 2**10, 512 * 2**10, 2 * 2**20, 8 * 2**20)
# Fresh blocks rotate over FRESH_POOL_LLC_MULTIPLE x the CPU's last-level cache, read from
# sysfs (`last_level_cache_bytes`), so a block's lines were last written a pool ago and
# are out of every cache level, as a freed block is when a pass (15-27 MiB of kernel
# traffic at llama-tiny mb 16) ran since. The spec records the pool it used
# (`KernelCalibration.fresh_output_pool_bytes`).
FRESH_POOL_LLC_MULTIPLE = 2
# Where the CPU describes its caches (Linux: one index<N> folder per cache, with its
# level, type and size); cpu0's, as the probe runs on one thread.
CPU_CACHE_SYSFS = "/sys/devices/system/cpu/cpu0/cache"
# The last-level cache where sysfs says nothing (no /sys in a container, not Linux): the
# L3 of the CPU this probe was written on (lscpu and sysfs index3: 32768K, 2026-11-25).
FALLBACK_LAST_LEVEL_CACHE_BYTES = 32 * 2**20
_SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}  # sysfs sizes: "48K", "32768K", "2M"
# x-sized blocks a CPU dropout's forward writes: the float mask and the output (ATen's
# CPU dropout: empty_like + bernoulli_, div_ in place, mul). Fresh points exist on CPUs
# only, so a GPU's fused kernel is not charged them.
CPU_DROPOUT_OUTPUTS = 2
FRESH_PROBE_ROUNDS = 3  # hot and fresh alternate; the fastest of each (least disturbed)
# Fresh blocks are visited in a shuffled order: malloc hands back scattered blocks, and
# blocks in address order would let the hardware prefetcher stream them (in order, the
# probe measured 15 and 33 ns per KiB at 8 and 32 KiB; shuffled 21 and 47: 2026-11-25).
FRESH_ORDER_SEED = 0


def last_level_cache_bytes(cache_dir: str = CPU_CACHE_SYSFS, level: int | None = None) -> int:
    """Bytes of the CPU's last-level data cache: the size of the highest-level data or
    unified cache sysfs lists under `cache_dir` (of that `level` where given),
    FALLBACK_LAST_LEVEL_CACHE_BYTES where it lists none it can read."""
    import glob
    import os

    levels = []
    for index in glob.glob(os.path.join(cache_dir, "index*")):
        try:
            fields = {name: open(os.path.join(index, name)).read().strip()
                      for name in ("level", "type", "size")}
            size = fields["size"]
            nbytes = int(size[:-1]) * _SIZE_UNITS[size[-1]] if size[-1] in _SIZE_UNITS \
                else int(size)
            levels.append((int(fields["level"]), nbytes, fields["type"]))
        except (OSError, ValueError, IndexError):
            continue
    data = [(at, nbytes) for at, nbytes, kind in levels
            if kind != "Instruction" and level in (None, at)]
    return max(data)[1] if data else FALLBACK_LAST_LEVEL_CACHE_BYTES


def fresh_pool_bytes(cache_dir: str = CPU_CACHE_SYSFS) -> int:
    """The bytes the probe's fresh blocks rotate over on this CPU."""
    return FRESH_POOL_LLC_MULTIPLE * last_level_cache_bytes(cache_dir)


def probe_fresh_output(device: str, seconds_per_call, pool_bytes: int,
                       sizes: tuple[int, ...] = FRESH_OUTPUT_BYTES) -> list[MemoryKernelPoint]:
    """The `fresh_output` points of a CPU (none elsewhere). `seconds_per_call` is
    `profile_device.seconds_per_call` (passed in: profile_device imports this module);
    fresh blocks of each of `sizes` rotate over `pool_bytes` (`fresh_pool_bytes`, at
    least two blocks; bench/bench_fresh_tiers.py probes smaller and larger pools too).
    A size whose fresh writes came out no slower than hot ones gives no point."""
    import torch

    if device != "cpu":
        return []
    points = []
    for nbytes in sizes:
        n = nbytes // 4  # float32 elements
        a, b = torch.rand(n), torch.rand(n)
        hot = torch.empty(n)
        pool = [torch.zeros(n) for _ in range(max(2, pool_bytes // nbytes))]  # faulted in
        order = list(range(len(pool)))
        random.Random(FRESH_ORDER_SEED).shuffle(order)
        hot_s, fresh_s = math.inf, math.inf
        for _ in range(FRESH_PROBE_ROUNDS):
            hot_s = min(hot_s, seconds_per_call(lambda i: torch.add(a, b, out=hot), device))
            fresh_s = min(fresh_s, seconds_per_call(
                lambda i: torch.add(a, b, out=pool[order[i % len(pool)]]), device))
        if fresh_s > hot_s:
            points.append(MemoryKernelPoint(KIND, "float32", nbytes,
                                            nbytes / (fresh_s - hot_s) / GB))
        del pool
    return points


def output_bytes(r: KernelRecord, config: StepConfig, share: float, backward: bool) -> float:
    """Bytes of the fresh outputs of ONE call of a record, after the micro-batch change
    and the TP split (see the module docstring for which outputs count)."""
    from cost_models import kernel_time  # kernel_time imports this module: call time only

    op = r.op.split("::")[-1]
    element = config.precision.compute_bytes
    if r.kind is KernelKind.GEMM:  # a weight gradient's m x n is weight-sized: k grows
        tokens = config.graph_micro_batch * (config.seq_len or 1)
        m, n, _ = kernel_time._token_scaled_gemm(r.shape, config.batch_scale, tokens, share,
                                                 r.weight_output)
        return m * n * element  # a batched product's batch is folded into m
    if r.kind is KernelKind.ATTENTION:
        batch, heads, q_len, kv_len, head_dim = r.shape
        rows = q_len + 2 * kv_len if backward else q_len  # dq, dk, dv; forward: out
        return batch * config.batch_scale * heads * share * rows * head_dim * element
    if r.kind is KernelKind.CONV:
        if op != "convolution":
            return 0.0
        groups, batch, _, c_out, positions, _, _ = r.shape
        return groups * batch * config.batch_scale * c_out * share * positions * element
    if op == "embedding_dense_backward":  # the table's gradient: weight-sized, as
        return r.weight_bytes * config.dtype_scale * share  # kernel_time's table fill
    if r.kind is KernelKind.MEMORY and not op.endswith("_") and op not in EMBEDDING_BAG_OPS:
        # in the compute dtype, as the model's other activation bytes (an int64 index or a
        # bool mask is priced at its elements' count; they are the small outputs); a
        # weight gradient (a bias's sum over the tokens) as recorded, whatever the batch
        grows = 1.0 if r.weight_output else config.batch_scale
        return math.prod(r.shape) * element * grows * share
    return 0.0


def fresh_output_seconds(r: KernelRecord, cal, config: StepConfig, share: float,
                         backward: bool) -> float:
    """Seconds ONE call of a record adds, run in sequence, writing its outputs into lines
    not in cache: output bytes / the `fresh_output` rate at that size (0 unmeasured)."""
    if not measured(cal, KIND):
        return 0.0
    nbytes = output_bytes(r, config, share, backward)
    if nbytes <= 0:
        return 0.0
    # a CPU dropout writes its float mask (bernoulli_ into a fresh x-sized block) and its
    # output (mul), where the record holds CUDA's one output and a bool mask
    blocks = CPU_DROPOUT_OUTPUTS if r.op == DROPOUT_OP and not backward else 1
    # write-allocate (Hennessy & Patterson, Computer Architecture 6th ed. §B.1: a write miss
    # fetches the line first), priced at the rate `probe_fresh_output` measured
    return blocks * nbytes / (memory_gbps(cal, KIND, config.precision.compute_dtype, nbytes,
                                          1.0) * GB)
