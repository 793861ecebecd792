"""Timing collectives on this rank, inside a process group `profile-cluster` started.

`sweep` times all-reduce, all-gather, reduce-scatter, all-to-all, broadcast and (over
the whole world) send/recv at every message size: each figure is the median over
BURSTS bursts of a burst's mean, since training issues collectives back to back. The
whole world runs one sweep, then every group of a smaller size runs its own at once
(TP and DP groups inside a node). `blocking_seconds` times one blocking call of each,
at BLOCKING_PROBE_SIZES, when every process computes between calls: the wait for peers
that are late or off their core, which grows with the message; `dtensor_extra_seconds`
what TP's collectives take beyond that in the form DTensor issues them.
`cost_models.collective_fit` and `cost_models.host_overhead_fit` turn the readings into
spec figures.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from ir.gloo_collectives import all_gather_chunks, flat_chunks, reduce_scatter_in_place

from cost_models.collective_fit import FLOAT_BYTES, KiB, MiB

WARMUP = 1  # first call of a size pays for buffer allocation and connection setup
# A collective is timed as the mean of a burst of back-to-back calls, as training issues
# them: on CPU processes a call waits for its peers' scheduling and has a long tail, so a
# lone call right after a barrier measured 1/3-1/2 of the in-training time (gloo, 2 cores).
BURST_CALLS = 10
BURST_BYTES = 4 * MiB  # fewer calls for large messages: one burst moves at most this
BURSTS = 5  # the median burst


def _collective_calls(dist, group, n: int, nbytes: int, device
                      ) -> tuple[dict[str, Callable[[], object]], Any]:
    """One call of each group collective on a message of ~`nbytes` over `group` (None:
    the whole world), and the full-size tensor they share. The all-gather and the
    reduce-scatter are the ones the executor's data-parallel units run: on gloo
    `ir.gloo_collectives.all_gather_chunks` (the gloo call its `GlooAllGather` makes, into
    a list of the output's chunks; its aliases are in the DP-unit figure) and
    `reduce_scatter_in_place` (what its `GlooReduceScatter` runs whole; gloo's own clones
    the input first), elsewhere torch's (NCCL's kernels)."""
    import torch

    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    root = 0 if group is None else dist.get_global_rank(group, 0)  # the broadcast's source
    numel = max(n, nbytes // FLOAT_BYTES) // n * n  # divisible by n
    full = torch.ones(numel, device=device)
    shard = torch.ones(numel // n, device=device)
    out = torch.empty(numel, device=device)
    if dist.get_backend(group) == "gloo":  # ZeRO-2/3's on gloo (`use_gloo_collectives`)
        out_chunks = list(flat_chunks(out, n, "all-gather"))

        def all_gather(output, shard, group):  # into `output`'s chunks, as GlooAllGather
            all_gather_chunks(out_chunks, shard, group)

        def reduce_scatter(output, flat, group):  # in place, no full clone
            reduce_scatter_in_place(output, flat, group or dist.group.WORLD)
    return {
        "all_reduce": lambda: dist.all_reduce(full, group=group),
        "all_gather": lambda: all_gather(out, shard, group=group),
        "reduce_scatter": lambda: reduce_scatter(shard, full, group=group),
        "all_to_all": lambda: dist.all_to_all_single(out, full, group=group),
        "broadcast": lambda: dist.broadcast(full, src=root, group=group),
    }, full


def sweep(dist, rank: int, n: int, group, sizes: list[int], device,
           sync) -> dict[str, list[float]]:
    """Seconds per call of each collective per message size over `group` (None: the whole
    world; else this rank's group of `n`, every group running at once): the median over
    BURSTS bursts of the burst's mean."""
    results: dict[str, list[float]] = {}
    for size in sizes:
        ops, full = _collective_calls(dist, group, n, size, device)
        if group is None:  # point-to-point does not depend on the group size
            ops["send_recv"] = lambda: ping_pong(dist, rank, full)
        calls = max(1, min(BURST_CALLS, BURST_BYTES // size))
        for name, op in ops.items():
            for _ in range(WARMUP):
                op()
            times = []
            for _ in range(BURSTS):
                dist.barrier()
                sync()
                start = time.perf_counter()
                for _ in range(calls):
                    op()
                sync()
                elapsed = (time.perf_counter() - start) / calls
                times.append(elapsed / 2 if name == "send_recv" else elapsed)
            results.setdefault(name, []).append(statistics.median(times))
        del ops, full
    return results


# The blocking-wait probe: every process computes BLOCKING_PROBE_COMPUTE_S (wall time,
# all processes busy, about the gap between a TP layer's collectives on CPU) and then
# makes one call of each of BLOCKING_PROBE_SIZES; the call's cost is the loop's time per
# iteration less that of the same loop without calls, the median of BLOCKING_PROBE_ROUNDS
# alternating pairs (one pair read 1.1-3.6 ms for a 2-rank all-reduce on 4 processes).
# Two sizes because the wait grows with the message: a DP gradient all-reduce inside the
# backward took 1.0-4.1 ms against 0.22-0.93 ms in a burst (gpt-ddp2, bench_dp_phases),
# and compute-then-all-reduce waited +0.23 ms at 32 KiB, +0.66 ms at 200 KiB (issue 17).
# What the wait is (2 gloo ranks, 3 ms of matmul then one all-reduce, 25 calls, load
# 11): at 32 KiB 2.4 ms wall against 0.49 ms in a burst, with the same process CPU time
# (0.22 vs 0.16 ms) and the peer arriving on time (median 0 ms late); 1.5 ms of it the
# process's threads sat runnable in the run queue (/proc/<pid>/task/*/schedstat): gloo's
# sleeping I/O threads, woken by the call, wait for a core the computing ranks hold. A
# barrier just before the call (threads awake) brought it to 0.45 ms; evicting the
# caches (16 MB written after the compute) changed nothing beyond noise. At 1 MiB: 1.16
# vs 0.73 ms. On 4 ranks (load 22) peers also arrived 2.5-8 ms late. The probe keeps
# the loop difference, not the call's wall time: the compute after a call runs faster
# (the scheduler credits the sleeper), e.g. 2 ranks, 32 KiB: call 1.66 ms wall, loop
# +1.25 ms, compute 1.14 ms in the loop with calls against 1.54 ms without.
BLOCKING_PROBE_SIZES = (32 * KiB, 1 * MiB)  # a TP activation; a layer's gradient bucket
BLOCKING_PROBE_COMPUTE_S = 2e-3
BLOCKING_PROBE_CALLS = 16  # calls per timed loop
BLOCKING_PROBE_ROUNDS = 7
BLOCKING_PROBE_MATMUL = 64  # edge of the square matmul the compute repeats


def blocking_seconds(dist, rank: int, group, rounds: int = BLOCKING_PROBE_ROUNDS,
                     only: tuple[str, ...] | None = None) -> dict[str, list[tuple[int, float]]]:
    """Per collective over `group` (None: the whole world, plus send/recv between rank
    pairs 2k, 2k+1; `only`: those collectives alone), [(bytes, seconds per blocking
    call)] at each of BLOCKING_PROBE_SIZES when every process computes between calls:
    wire time and the wait for peers that are late or off their core; the median of
    `rounds` pairs."""
    import torch

    from cost_models.clusters import _one_thread

    n = dist.get_world_size(group)
    world = dist.get_world_size()
    compute, timed = _probe_loop(dist)

    def loop(reps: int, op) -> float:
        return timed(reps, op)[0]

    seconds: dict[str, list[tuple[int, float]]] = {}
    with _one_thread():
        reps = _compute_reps(dist, compute, timed)
        for nbytes in BLOCKING_PROBE_SIZES:
            ops, full = _collective_calls(dist, group, n, nbytes, torch.device("cpu"))
            if group is None and world % 2 == 0:  # pipeline neighbours swap a message
                ops["send_recv"] = lambda: exchange(dist, rank, full)
            for name, op in ops.items():
                if only is not None and name not in only:
                    continue
                op()
                added = [-loop(reps, None) + loop(reps, op) for _ in range(rounds)]
                call_s = max(statistics.median(added), 0.0)
                if name == "send_recv":
                    call_s /= 2  # two one-way messages per call
                seconds.setdefault(name, []).append((nbytes, call_s))
            del ops, full
    return seconds


def _probe_loop(dist):
    """(compute(reps), loop(reps, op)): `reps` matmuls, and BLOCKING_PROBE_CALLS of
    compute then `op` (None: compute alone) after a barrier, as (wall seconds, this
    thread's CPU seconds) per iteration."""
    import torch

    a = torch.randn(BLOCKING_PROBE_MATMUL, BLOCKING_PROBE_MATMUL)

    def compute(reps: int) -> None:
        for _ in range(reps):
            torch.mm(a, a)

    def loop(reps: int, op) -> tuple[float, float]:
        dist.barrier()
        start, cpu = time.perf_counter(), time.thread_time()
        for _ in range(BLOCKING_PROBE_CALLS):
            compute(reps)
            if op is not None:
                op()
        return ((time.perf_counter() - start) / BLOCKING_PROBE_CALLS,
                (time.thread_time() - cpu) / BLOCKING_PROBE_CALLS)

    return compute, loop


def _compute_reps(dist, compute, loop) -> int:
    """Matmuls per BLOCKING_PROBE_COMPUTE_S, timed with every process busy at once."""
    import torch

    compute(BLOCKING_PROBE_CALLS)  # warm-up
    reps = 200
    per_rep = torch.tensor([loop(reps, None)[0] / reps])
    dist.all_reduce(per_rep)
    return max(1, round(BLOCKING_PROBE_COMPUTE_S / (per_rep.item() / dist.get_world_size())))


# TP's collectives as DTensor issues them: a funcol collective and `wait_tensor` under a
# redistribution (RowwiseParallel's output and ColwiseParallel's input gradient:
# Partial -> Replicate; sequence parallelism's Shard(0) -> Replicate and Partial ->
# Shard(0)). 2 gloo ranks after 0.5 ms of compute (issue 17, load 5, 12 runs of
# `bench_blocking_wait.py --forms`) read DTensor's all-reduce 0.7-4.0x the plain
# `dist.all_reduce` (median 1.4 at 32 KiB, 1.65 at 1 MiB; funcol + wait_tensor alone
# 1.3), 0.15-0.45 ms of it more CPU on the calling thread.
DTENSOR_REDISTRIBUTIONS = {"all_reduce": ("Partial", "Replicate"),
                           "all_gather": ("Shard", "Replicate"),
                           "reduce_scatter": ("Partial", "Shard")}


def dtensor_extra_seconds(dist, mesh) -> dict[str, list[tuple[int, float]]]:
    """Per TP collective over 1-D `mesh`, [(bytes, seconds)] at each of
    BLOCKING_PROBE_SIZES: what a call in DTensor's form (DTENSOR_REDISTRIBUTIONS) takes
    beyond the plain call (`blocking_seconds`'s) when every process computes between
    calls, from BLOCKING_PROBE_ROUNDS pairs of the two loops run back to back, so the load
    they share cancels (two probes taken apart swung the DTensor-form all-reduce from
    0.45 ms under the plain call's wait to 0.4 ms over it); `form_extra_seconds` turns
    the pairs into the figure. Signed: a form that read faster than the plain call is
    noise about no difference, and clamping it at 0 would bias the median up."""
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    from cost_models.clusters import _one_thread

    group, n = mesh.get_group(), mesh.size()
    compute, loop = _probe_loop(dist)
    placement = {"Partial": Partial(), "Replicate": Replicate(), "Shard": Shard(0)}
    pairs: dict[str, dict[int, list]] = {}  # name -> bytes -> [(plain, DTensor) loops]
    with _one_thread():
        reps = _compute_reps(dist, compute, loop)
        for nbytes in BLOCKING_PROBE_SIZES:
            plain, full = _collective_calls(dist, group, n, nbytes, torch.device("cpu"))
            for name, (src, dst) in DTENSOR_REDISTRIBUTIONS.items():
                local = full[:full.numel() // n] if src == "Shard" else full
                source = DTensor.from_local(local, mesh, [placement[src]], run_check=False)

                def redistribute():
                    return source.redistribute(mesh, [placement[dst]])

                for op in (plain[name], redistribute):  # first calls: warm-up
                    op()
                pairs.setdefault(name, {})[nbytes] = [
                    (loop(reps, plain[name]), loop(reps, redistribute))
                    for _ in range(BLOCKING_PROBE_ROUNDS)]
            del plain, full
    return {name: form_extra_seconds(by_size) for name, by_size in pairs.items()}


def form_extra_seconds(pairs: dict[int, list[tuple[tuple[float, float], tuple[float, float]]]]
                       ) -> list[tuple[int, float]]:
    """[(bytes, seconds)] a DTensor-form call takes beyond the plain one, from `pairs`:
    per message size, [((plain wall s, plain CPU s), (DTensor wall s, DTensor CPU s))]
    per iteration of loops run back to back. Two parts, each on one clock:
      off-CPU  the median over pairs of the DTensor loop's (wall - calling thread's CPU)
               less the plain loop's, both from the same pair: the time the caller sat
               waiting beyond the plain call's (the collective's threads, peers);
      growth   the median paired CPU difference at this size less that at the smallest
               size: what DTensor's form does on the calling thread that grows with the
               message (funcol's out-of-place output; 0 at the smallest size).
    The calling thread's CPU at the smallest size is left out: the TP module probe
    (`tp_probes`, one such redistribution per module) prices it. Both keep their sign."""
    def cpu_added(rows) -> float:
        return statistics.median(d[1] - p[1] for p, d in rows)

    smallest = min(pairs)
    base_cpu_s = cpu_added(pairs[smallest])
    return [(nbytes, statistics.median((d[0] - d[1]) - (p[0] - p[1]) for p, d in rows)
             + cpu_added(rows) - base_cpu_s)
            for nbytes, rows in sorted(pairs.items())]


def exchange(dist, rank: int, tensor) -> None:
    """Ranks 2k and 2k+1 swap a message: even sends first, odd receives first."""
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    if rank % 2 == 0:
        dist.send(tensor, peer)
        dist.recv(tensor, peer)
    else:
        dist.recv(tensor, peer)
        dist.send(tensor, peer)


def ping_pong(dist, rank: int, tensor) -> None:
    """Rank 0 sends to rank 1 and gets it back: twice the one-way time."""
    if rank < 2:
        exchange(dist, rank, tensor)
