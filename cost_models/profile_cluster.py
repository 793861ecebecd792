"""Measure this machine's collectives and matmuls and write a cluster spec from them.

`profile_cluster(nproc, backend)` spawns `nproc` processes (torch.multiprocessing, a free
localhost port), times all-reduce, all-gather, reduce-scatter, all-to-all and send/recv
over message sizes from 1 KiB up to `max_bytes` (x4 per step), and fits for each
collective the alpha-beta model the communication model uses (comm.py):

    t(S) = steps(n) * alpha + volume(n, S) / B
    all-reduce: steps 2(n-1), volume 2(n-1)/n * S   (ring form)
    all-gather, reduce-scatter, all-to-all: steps n-1, volume (n-1)/n * S
    send/recv: steps 1, volume S                    (one way, from a ping-pong)

by least squares over the sizes (alpha >= 0, B > 0). S is the full tensor: the output of
an all-gather, the input of a reduce-scatter. The sweep runs once over all N processes
and once per smaller power-of-two group size g with every group of g running at once
(TP and DP groups inside a node): a fit records its group size (`measured_ranks`) and
the comm model takes the one that matches. All processes run on this host, so the
fits are intra-node; the spec reuses them for inter-node until a multi-node profile
exists. Matmul FLOP/s and copy bandwidth are measured too, and on CPU processes the
framework's host costs and the wait of a blocking call whose peers compute between
calls (`_blocking_seconds`); the result is a spec `planner estimate --cluster spec.json`
accepts.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ir.cluster import COLLECTIVES, ClusterSpec, CollectiveFit
from ir.errors import PlannerError

from cost_models.clusters import (GPU_RUNTIME_OVERHEAD_BYTES, LOCAL_RUNTIME_OVERHEAD_BYTES,
                                  host_cores, measure_copy_gbps, measure_matmul_flops,
                                  measure_op_overhead_s, measure_random_element_s,
                                  total_memory_bytes)
from cost_models.comm import (Link, all_gather_s, broadcast_s, reduce_scatter_s,
                              ring_all_reduce_s, send_recv_s)

KiB = 2**10
MiB = 2**20
DEFAULT_MIN_BYTES = 1 * KiB
# 256 MiB is the top size; on a 2-core machine gloo moves ~1 GB/s, so 64 MiB keeps
# a 2-process run near 10 s. Pass --max-bytes 256M for the full sweep.
DEFAULT_MAX_BYTES = 64 * MiB
SIZE_FACTOR = 4  # sizes grow x4: 1K, 4K, ..., 64M
WARMUP = 1  # first call of a size pays for buffer allocation and connection setup
REPEATS = 3  # median of three
# A collective is timed as the mean of a burst of back-to-back calls, as training issues
# them: on CPU processes a call waits for its peers' scheduling and has a long tail, so a
# lone call right after a barrier measured 1/3-1/2 of the in-training time (gloo, 2 cores).
BURST_CALLS = 10
BURST_BYTES = 4 * MiB  # fewer calls for large messages: one burst moves at most this
BURSTS = 5  # the median burst
PROCESS_GROUP_TIMEOUT_S = 120
PORT_ATTEMPTS = 3  # fresh localhost ports to try if one is taken between probe and bind
FLOAT_BYTES = 4  # messages are float32 tensors


def message_sizes(min_bytes: int = DEFAULT_MIN_BYTES, max_bytes: int = DEFAULT_MAX_BYTES,
                  factor: int = SIZE_FACTOR) -> list[int]:
    if min_bytes < FLOAT_BYTES or max_bytes < min_bytes:
        raise PlannerError(f"message sizes must satisfy 4 <= min ({min_bytes}) <= max "
                           f"({max_bytes}) bytes")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def algorithm_factors(collective: str, n: int) -> tuple[float, float]:
    """(latency steps, bytes moved per byte of S) of the ring algorithms in comm.py."""
    if collective == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return n - 1, (n - 1) / n
    if collective == "broadcast":  # binomial tree (comm.broadcast_s)
        rounds = math.ceil(math.log2(n)) if n > 1 else 0
        return rounds, float(rounds)
    if collective == "send_recv":
        return 1, 1.0
    raise PlannerError(f"unknown collective {collective!r}; use one of {', '.join(COLLECTIVES)}")


def fit_alpha_beta(collective: str, n: int, sizes: list[int],
                   seconds: list[float]) -> tuple[float, float]:
    """Least-squares alpha (s) and bandwidth (bytes/s) of t = steps*alpha + volume*S/B."""
    steps, per_byte = algorithm_factors(collective, n)
    x = np.array([[steps, per_byte * s] for s in sizes], dtype=float)
    y = np.array(seconds, dtype=float)
    # Relative error matters at every size: weight each row by 1/t.
    w = 1.0 / np.maximum(y, 1e-9)
    (alpha, inv_bw), *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    if inv_bw <= 0:  # latency-bound everywhere: bandwidth from the largest message alone
        inv_bw = max(y[-1] - steps * max(alpha, 0.0), 1e-12) / (per_byte * sizes[-1])
    if alpha < 0:  # bandwidth-bound everywhere: refit the slope through the origin
        alpha = 0.0
        inv_bw = float(np.dot(x[:, 1] * w, y * w) / np.dot(x[:, 1] * w, x[:, 1] * w))
    return float(alpha), float(1.0 / inv_bw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, backend: str, sizes: list[int],
            queue) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    results: dict[str, Any] = {}
    try:
        results.update(_sweep(dist, rank, world, None, sizes, device, sync))
        groups = {}  # smaller groups, every group of a size running at once
        for size in _smaller_group_sizes(world):
            groups[size] = init_device_mesh(device.type, (world // size, size),
                                            mesh_dim_names=("across", "group"))["group"]
            results[f"group{size}"] = _sweep(dist, rank, size, groups[size].get_group(),
                                             sizes, device, sync)
        if device.type == "cpu":  # framework overhead of DTensor ops, on rank 0 alone
            mesh = init_device_mesh("cpu", (world,))
            results["dtensor_op_overhead_s"] = \
                _dtensor_op_overhead_s(device, mesh) if rank == 0 else 0.0
            dist.barrier()
            results["optimizer_tensor_seconds"] = _optimizer_tensor_seconds(mesh)
            results["dp_unit_seconds"] = {world: _dp_unit_seconds(mesh)}
            results["tp_module_seconds"] = {world: _tp_module_seconds(mesh)}
            for size, group in groups.items():
                results["dp_unit_seconds"][size] = _dp_unit_seconds(group)
                results["tp_module_seconds"][size] = _tp_module_seconds(group)
            results["blocking_seconds"] = {world: _blocking_seconds(dist, rank, None)}
            for size, group in groups.items():
                results["blocking_seconds"][size] = _blocking_seconds(dist, rank,
                                                                      group.get_group())
        if rank == 0:
            queue.put(results)
        dist.barrier()  # nobody tears down gloo while a peer still uses it
    finally:
        dist.destroy_process_group()


def _collective_calls(dist, group, n: int, nbytes: int, device
                      ) -> tuple[dict[str, Callable[[], object]], Any]:
    """One call of each group collective on a message of ~`nbytes` over `group` (None:
    the whole world), and the full-size tensor they share."""
    import torch

    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    root = 0 if group is None else dist.get_global_rank(group, 0)  # the broadcast's source
    numel = max(n, nbytes // FLOAT_BYTES) // n * n  # divisible by n
    full = torch.ones(numel, device=device)
    shard = torch.ones(numel // n, device=device)
    out = torch.empty(numel, device=device)
    return {
        "all_reduce": lambda: dist.all_reduce(full, group=group),
        "all_gather": lambda: all_gather(out, shard, group=group),
        "reduce_scatter": lambda: reduce_scatter(shard, full, group=group),
        "all_to_all": lambda: dist.all_to_all_single(out, full, group=group),
        "broadcast": lambda: dist.broadcast(full, src=root, group=group),
    }, full


def _sweep(dist, rank: int, n: int, group, sizes: list[int], device,
           sync) -> dict[str, list[float]]:
    """Seconds per call of each collective per message size over `group` (None: the whole
    world; else this rank's group of `n`, every group running at once): the median over
    BURSTS bursts of the burst's mean."""
    results: dict[str, list[float]] = {}
    for size in sizes:
        ops, full = _collective_calls(dist, group, n, size, device)
        if group is None:  # point-to-point does not depend on the group size
            ops["send_recv"] = lambda: _ping_pong(dist, rank, full)
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


def _dtensor_op_overhead_s(device, mesh) -> float:
    """Extra seconds per op on replicated DTensors over plain tensors: the same tiny
    block, once plain and once with DTensor parameters and input (no communication)."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    from cost_models.clusters import OP_OVERHEAD_WIDTH, _one_thread, _overhead_block, \
        seconds_per_op

    def replicated(t):  # from_local: no broadcast, so rank 0 can run alone
        return DTensor.from_local(t, mesh, [Replicate()], run_check=False)

    with _one_thread():
        x = torch.randn(2, OP_OVERHEAD_WIDTH, device=device)
        plain = seconds_per_op(_overhead_block().to(device), x)
        block = _overhead_block().to(device)
        for module in block.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                setattr(module, name, torch.nn.Parameter(replicated(param.detach())))
        on_dtensors = seconds_per_op(block, replicated(x))
    return max(on_dtensors - plain, 0.0)


# Optimizer steps timed: OPTIMIZER_PROBE_TENSORS tensors small enough that the host's
# per-tensor work dominates (the bytes streamed are priced apart), sharded on DTensors
# by rows as FSDP2 shards them (the row count divides every group size up to 16).
OPTIMIZER_PROBE_TENSORS = 32
OPTIMIZER_PROBE_SHAPE = (16, 16)
OPTIMIZER_PROBE_STEPS = 12  # after OPTIMIZER_PROBE_WARMUP steps (state allocation); the median
OPTIMIZER_PROBE_WARMUP = 3


def _optimizer_tensor_seconds(mesh) -> dict[str, float]:
    """Host seconds per parameter tensor of one optimizer step + zero_grad, for every
    optimizer a plan names, on plain tensors ("adamw") and on row-sharded DTensors
    ("adamw@dtensor"), all ranks stepping together (their sharing of the cores
    included). The executor's optimizers run torch's per-tensor loop on DTensors."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    from ir.plan import OPTIMIZERS
    from cost_models.clusters import _one_thread

    def timed_step(optimizer, params) -> float:
        for p in params:
            p.grad = torch.ones_like(p)
        dist.barrier()
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    out = {}
    with _one_thread():
        for name, (cls, kwargs) in OPTIMIZERS.items():
            for on_dtensors in (False, True):
                params = []
                for _ in range(OPTIMIZER_PROBE_TENSORS):
                    t = torch.randn(OPTIMIZER_PROBE_SHAPE)
                    if on_dtensors:
                        t = distribute_tensor(t, mesh, [Shard(0)])
                    params.append(torch.nn.Parameter(t))
                optimizer = cls(params, **kwargs)
                times = [timed_step(optimizer, params) for _ in range(
                    OPTIMIZER_PROBE_WARMUP + OPTIMIZER_PROBE_STEPS)][OPTIMIZER_PROBE_WARMUP:]
                key = f"{name}@dtensor" if on_dtensors else name
                out[key] = statistics.median(times) / OPTIMIZER_PROBE_TENSORS
    return out


# Data-parallel units timed: a stack of DP_UNITS units of DP_UNIT_BLOCKS tiny blocks each.
DP_UNITS = 8
DP_UNIT_BLOCKS = (1, 4)  # probe blocks per unit: units of 6 and 24 parameter tensors
DP_UNIT_STEPS = 20  # after DP_UNIT_WARMUP steps; the median
DP_UNIT_WARMUP = 3
OP_OVERHEAD_WIDTH_TP = 8  # TP measurement width per rank (the width must split evenly)


def _smaller_group_sizes(world: int) -> list[int]:
    """Powers of two from 2 below `world` that divide it: the DP group sizes plans use."""
    return [2**k for k in range(1, world.bit_length()) if 2**k < world and world % 2**k == 0]


def _dp_unit_seconds(mesh) -> dict[str, dict[int, float]]:
    """Seconds per unit per forward+backward that wrapping adds over the plain stack, by
    mode and by the unit's parameter tensor count (units of DP_UNIT_BLOCKS probe blocks),
    all ranks running together (collectives included)."""
    import torch
    from torch import nn
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard

    from cost_models.clusters import OP_OVERHEAD_WIDTH, _one_thread, _overhead_block

    def wrap(mode: str, blocks: int) -> nn.Module:
        stack = nn.Sequential(*[nn.Sequential(*[_overhead_block() for _ in range(blocks)])
                                for _ in range(DP_UNITS)])
        if mode == "plain":
            return stack
        for unit in [*stack, stack]:  # each unit, then the root (as the executor does)
            if mode == "replicate":
                replicate(unit, mesh=mesh)
            else:
                fully_shard(unit, mesh=mesh, reshard_after_forward=mode == "zero3")
        return stack

    x = torch.randn(2, OP_OVERHEAD_WIDTH)
    out: dict[str, dict[int, float]] = {}
    with _one_thread():
        for blocks in DP_UNIT_BLOCKS:
            plain = wrap("plain", blocks)
            tensors = len(list(plain[0].parameters()))
            for mode in ("replicate", "zero2", "zero3"):
                added = _added_step_s(plain, wrap(mode, blocks), x)
                out.setdefault(mode, {})[tensors] = max(added, 0.0) / DP_UNITS
    return out


def _added_step_s(plain, wrapped, x) -> float:
    """Median over steps of how much longer `wrapped(x).sum().backward()` takes than the
    same on `plain`, the two run alternately (a slow spell of a shared machine hits both
    halves of a pair) with every rank starting each run together."""
    import torch.distributed as dist

    def timed(model) -> float:
        dist.barrier()
        start = time.perf_counter()
        model(x).sum().backward()
        return time.perf_counter() - start

    added = []
    for step in range(DP_UNIT_WARMUP + DP_UNIT_STEPS):
        pair = timed(wrapped) - timed(plain)
        if step >= DP_UNIT_WARMUP:
            added.append(pair)
    return statistics.median(added)


TP_BLOCKS = 4  # column-parallel + row-parallel pairs in the TP measurement


def _tp_module_seconds(mesh) -> float:
    """Seconds per tensor-parallel module per forward+backward that sharding adds over
    the plain stack: DTensor dispatch, re-layouts and the module's collective waits, all
    ranks running together as one TP group."""
    import torch
    from torch import nn
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from cost_models.clusters import _one_thread

    width = OP_OVERHEAD_WIDTH_TP * mesh.size()

    def stack(parallel: bool) -> nn.Module:
        blocks = nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                               nn.Linear(4 * width, width))
                                 for _ in range(TP_BLOCKS)])
        if parallel:
            for block in blocks:
                parallelize_module(block, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        return blocks

    x = torch.randn(2, width)
    with _one_thread():
        return max(_added_step_s(stack(False), stack(True), x), 0.0) / (2 * TP_BLOCKS)


def tp_module_overhead(measured: dict[int, float], fits: dict[tuple[str, int], CollectiveFit]
                       ) -> tuple[tuple[int, float], ...]:
    """Per-module TP overhead by group size, less what the comm model already prices:
    each module has one all-reduce of the probe's (2, width) activation (row-parallel
    output in forward, column-parallel input gradient in backward), priced with the fit
    measured at that group size."""
    out = []
    for size, seconds in sorted(measured.items()):
        fit = fits["all_reduce", size]
        priced = ring_all_reduce_s(2 * OP_OVERHEAD_WIDTH_TP * size * FLOAT_BYTES, size,
                                   Link(fit.alpha_s, fit.bytes_per_s, spans_nodes=False))
        out.append((size, max(seconds - priced, 0.0)))
    return tuple(out)


# How comm.py prices each fitted collective (all-reduce fits are made in ring form).
_PRICE = {"all_reduce": ring_all_reduce_s, "all_gather": all_gather_s,
          "reduce_scatter": reduce_scatter_s, "broadcast": broadcast_s,
          "send_recv": lambda nbytes, _n, link: send_recv_s(nbytes, link)}

# The blocking-wait probe: every process computes BLOCKING_PROBE_COMPUTE_S (wall time,
# all processes busy, about the gap between a TP layer's collectives on CPU) and then
# makes one call of BLOCKING_PROBE_BYTES; the call's cost is the loop's time per
# iteration less that of the same loop without calls, the median of BLOCKING_PROBE_ROUNDS
# alternating pairs (one pair read 1.1-3.6 ms for a 2-rank all-reduce on 4 processes).
BLOCKING_PROBE_BYTES = 32 * KiB
BLOCKING_PROBE_COMPUTE_S = 2e-3
BLOCKING_PROBE_CALLS = 16  # calls per timed loop
BLOCKING_PROBE_ROUNDS = 7
BLOCKING_PROBE_MATMUL = 64  # edge of the square matmul the compute repeats


def _blocking_seconds(dist, rank: int, group) -> dict[str, float]:
    """Seconds per blocking call of each collective over `group` (None: the whole world,
    plus send/recv between rank pairs 2k, 2k+1) when every process computes between
    calls: wire time and the wait for peers that are late or off their core."""
    import torch

    from cost_models.clusters import _one_thread

    n = dist.get_world_size(group)
    ops, full = _collective_calls(dist, group, n, BLOCKING_PROBE_BYTES, torch.device("cpu"))
    del ops["all_to_all"]  # nothing the model prices blocks on one
    world = dist.get_world_size()
    if group is None and world % 2 == 0:  # pipeline neighbours: a pair exchanges a message
        ops["send_recv"] = lambda: _exchange(dist, rank, full)
    a = torch.randn(BLOCKING_PROBE_MATMUL, BLOCKING_PROBE_MATMUL)

    def compute(reps: int) -> None:
        for _ in range(reps):
            torch.mm(a, a)

    def loop(reps: int, op) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(BLOCKING_PROBE_CALLS):
            compute(reps)
            if op is not None:
                op()
        return (time.perf_counter() - start) / BLOCKING_PROBE_CALLS

    with _one_thread():
        compute(BLOCKING_PROBE_CALLS)  # warm-up
        reps = 200
        per_rep = torch.tensor([loop(reps, None) / reps])  # every process busy at once
        dist.all_reduce(per_rep)
        reps = max(1, round(BLOCKING_PROBE_COMPUTE_S / (per_rep.item() / world)))
        seconds = {}
        for name, op in ops.items():
            op()
            added = [-loop(reps, None) + loop(reps, op) for _ in range(BLOCKING_PROBE_ROUNDS)]
            seconds[name] = max(statistics.median(added), 0.0)
            if name == "send_recv":
                seconds[name] /= 2  # two one-way messages per call
    return seconds


def _exchange(dist, rank: int, tensor) -> None:
    """Ranks 2k and 2k+1 swap a message: even sends first, odd receives first."""
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    if rank % 2 == 0:
        dist.send(tensor, peer)
        dist.recv(tensor, peer)
    else:
        dist.recv(tensor, peer)
        dist.send(tensor, peer)


def blocking_wait(measured: dict[int, dict[str, float]],
                  fits: dict[tuple[str, int], CollectiveFit]) -> tuple[tuple[str, float], ...]:
    """Per collective and group size ("all_reduce@2"), what a blocking call of the probe's
    message took beyond the comm model's price for it (the fit at that group size)."""
    waits = {}
    for size, by_collective in measured.items():
        for collective, seconds in by_collective.items():
            group = 2 if collective == "send_recv" else size
            fit = fits[collective, size]
            link = Link(fit.alpha_s, fit.bytes_per_s, spans_nodes=False)
            priced = _PRICE[collective](BLOCKING_PROBE_BYTES, group, link)
            waits[f"{collective}@{group}"] = max(seconds - priced, 0.0)
    return tuple(sorted(waits.items()))


# Collectives one probe unit issues per forward+backward as (collective, passes): FSDP2
# reshards after backward and the probe steps no optimizer, so every forward gathers.
DP_PROBE_TRAFFIC = {
    "replicate": (("all_reduce", 1),),
    "zero1": (("all_reduce", 1),),  # ZeRO-1 runs replicate units (the probe has no step)
    "zero2": (("all_gather", 1), ("reduce_scatter", 1)),
    "zero3": (("all_gather", 2), ("reduce_scatter", 1)),
}


def dp_probe_traffic_s(mode: str, tensors: int, size: int,
                       fits: dict[tuple[str, int], CollectiveFit]) -> float:
    """What the comm model charges for one probe unit's collectives (a unit of `tensors`
    parameter tensors of DP_UNIT_BLOCKS-sized probe blocks) in groups of `size`, priced
    with the fits measured at that size."""
    from cost_models.clusters import _overhead_block

    block = list(_overhead_block().parameters())
    nbytes = tensors / len(block) * sum(p.numel() for p in block) * FLOAT_BYTES
    seconds = 0.0
    for collective, passes in DP_PROBE_TRAFFIC[mode]:
        fit = fits[collective, size]
        seconds += passes * _PRICE[collective](nbytes, size,
                                               Link(fit.alpha_s, fit.bytes_per_s, False))
    return seconds


def dp_unit_overhead(measured: dict[int, dict[str, dict[int, float]]],
                     fits: dict[tuple[str, int], CollectiveFit]
                     ) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]:
    """(per-unit, per-tensor) overhead by DP mode and group size ("zero3@2": groups of
    2): the line through the two unit sizes measured, as measured with all N processes
    running in groups of that size (so it holds their sharing of the cores; the compute
    model does not stretch it again), less what the comm model prices for the unit's own
    collectives (`dp_probe_traffic_s`: it charges them again for the real layer); the
    bare mode is the whole-node group."""
    world = max(measured)
    per_unit, per_tensor = {}, {}
    for size, by_mode in measured.items():
        by_mode = {**by_mode, "zero1": by_mode["replicate"]}  # ZeRO-1 is replicate + ...
        for mode, by_tensors in by_mode.items():
            (few, few_s), (many, many_s) = sorted(
                (tensors, max(seconds - dp_probe_traffic_s(mode, tensors, size, fits), 0.0))
                for tensors, seconds in by_tensors.items())
            slope = max((many_s - few_s) / (many - few), 0.0)
            fixed = max(few_s - slope * few, 0.0)
            for key in [f"{mode}@{size}"] + ([mode] if size == world else []):
                per_unit[key], per_tensor[key] = fixed, slope
    return tuple(sorted(per_unit.items())), tuple(sorted(per_tensor.items()))


def _ping_pong(dist, rank: int, tensor) -> None:
    """Rank 0 sends to rank 1 and gets it back: twice the one-way time."""
    if rank < 2:
        _exchange(dist, rank, tensor)


def measure_collectives(nproc: int, backend: str, sizes: list[int]) -> dict[str, list[float]]:
    """Median seconds per collective and size, measured on `nproc` spawned processes."""
    import torch.multiprocessing as mp

    if nproc < 2:
        raise PlannerError(f"--nproc must be >= 2 to measure collectives, got {nproc}")
    if backend not in ("gloo", "nccl"):
        raise PlannerError(f"--backend must be gloo or nccl, got {backend!r}")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise PlannerError("--backend nccl needs CUDA devices; none is visible here "
                               "(use --backend gloo)")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    for attempt in range(PORT_ATTEMPTS):
        # Another process may take the free port before rank 0 binds it: try a new one.
        port = _free_port()
        try:
            mp.start_processes(_worker, args=(nproc, port, backend, sizes, queue),
                               nprocs=nproc, join=True, start_method="spawn")
            break
        except Exception as exc:  # a worker failed: one line, the cause
            cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            if "address already in use" in str(exc).lower() and attempt + 1 < PORT_ATTEMPTS:
                continue
            raise PlannerError(f"profile-cluster: a worker process failed: {cause}") from None
    if queue.empty():
        raise PlannerError("profile-cluster: rank 0 returned no measurements")
    return queue.get()


def _device_info(backend: str, nproc: int) -> tuple[str, int, tuple, float, int]:
    """(device name, memory per device, peak FLOP/s, memory GB/s, runtime overhead)."""
    if backend == "nccl":
        import torch

        props = torch.cuda.get_device_properties(0)
        return (props.name, int(props.total_memory), _cuda_matmul_flops(),
                _cuda_copy_gbps(), GPU_RUNTIME_OVERHEAD_BYTES)
    return ("cpu", total_memory_bytes() // nproc, measure_matmul_flops(),
            measure_copy_gbps(), LOCAL_RUNTIME_OVERHEAD_BYTES)


# The matmul edge and copy size on a GPU: REFERENCES.md's 8192^3 product and a 1 GiB copy.
CUDA_MATMUL_DIM = 8192
CUDA_COPY_BYTES = 1 << 30


def _cuda_matmul_flops() -> tuple[tuple[str, float], ...]:
    import torch

    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        a = torch.randn(CUDA_MATMUL_DIM, CUDA_MATMUL_DIM, device="cuda", dtype=dtype)
        b = torch.randn_like(a)
        torch.mm(a, b)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(REPEATS):
            torch.mm(a, b)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / REPEATS
        out.append((str(dtype).removeprefix("torch."), 2 * CUDA_MATMUL_DIM**3 / seconds))
    return tuple(sorted(out))


def _cuda_op_overhead_s() -> float:
    """Seconds per op of tiny CUDA work: the host's dispatch-and-launch rate (or the
    kernels' own floor, whichever is slower: the launch queue fills up)."""
    import torch

    from cost_models.clusters import OP_OVERHEAD_WIDTH, _overhead_block, seconds_per_op

    x = torch.randn(2, OP_OVERHEAD_WIDTH, device="cuda")
    seconds = seconds_per_op(_overhead_block().cuda(), x)
    torch.cuda.synchronize()
    return seconds


def _cuda_copy_gbps() -> float:
    import torch

    src = torch.empty(CUDA_COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(REPEATS):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * CUDA_COPY_BYTES * REPEATS / (time.perf_counter() - start) / 1e9


def profile_cluster(nproc: int, backend: str = "gloo", max_bytes: int = DEFAULT_MAX_BYTES,
                    min_bytes: int = DEFAULT_MIN_BYTES, name: str = "local-profiled"
                    ) -> tuple[ClusterSpec, dict]:
    """Measure and fit; returns the spec and the raw table {collective: [(bytes, s), ...]}
    ("all_reduce@2": the same in groups of 2)."""
    sizes = message_sizes(min_bytes, max_bytes)
    if len(sizes) < 2:
        raise PlannerError(f"need at least two message sizes to fit alpha and beta; "
                           f"raise --max-bytes above {min_bytes * SIZE_FACTOR}")
    measured = measure_collectives(nproc, backend, sizes)
    by_size = {nproc: measured, **{g: measured[f"group{g}"] for g in _smaller_group_sizes(nproc)}}
    fits = []  # the whole node's first (the comm model's fallback), then smaller groups
    for size, table in by_size.items():
        for collective in COLLECTIVES:
            if collective in table:
                alpha, bandwidth = fit_alpha_beta(collective, size, sizes, table[collective])
                fits.append(CollectiveFit(collective, "intra_node", alpha, bandwidth, size))
    by_group = {(f.collective, f.measured_ranks): f for f in fits}
    device, memory, flops, copy_gbps, overhead = _device_info(backend, nproc)
    cpu = backend == "gloo"
    host = dict(op_overhead_s=measure_op_overhead_s(),
                random_element_s=measure_random_element_s(),
                dtensor_op_overhead_s=float(measured.get("dtensor_op_overhead_s", 0.0)),
                host_cores=host_cores(),
                **dict(zip(("dp_unit_overhead_s", "dp_tensor_overhead_s"),
                           dp_unit_overhead(measured["dp_unit_seconds"], by_group))),
                tp_module_overhead_s=tp_module_overhead(measured["tp_module_seconds"],
                                                        by_group),
                blocking_wait_s=blocking_wait(measured["blocking_seconds"], by_group),
                optimizer_tensor_overhead_s=tuple(sorted(
                    measured["optimizer_tensor_seconds"].items())),
                ) if cpu else dict(op_overhead_s=_cuda_op_overhead_s())
    node = by_group["all_reduce", nproc]
    spec = ClusterSpec(
        name=name, device=device, num_nodes=1, devices_per_node=nproc,
        device_memory_bytes=memory, peak_flops_by_dtype=flops, hbm_gbps=copy_gbps,
        intra_node_gbps=node.bytes_per_s / 1e9, inter_node_gbps=node.bytes_per_s / 1e9,
        intra_node_latency_s=node.alpha_s, inter_node_latency_s=node.alpha_s,
        runtime_overhead_bytes=overhead, matmul_efficiency=1.0, **host,
        collective_fits=tuple(fits) + tuple(
            CollectiveFit(f.collective, "inter_node", f.alpha_s, f.bytes_per_s, f.measured_ranks)
            for f in fits),
        notes=(f"measured by planner profile-cluster --nproc {nproc} --backend {backend} on "
               f"{platform.node() or 'this host'} ({platform.machine()}, {os.cpu_count()} "
               f"CPUs), sizes {sizes[0]}..{sizes[-1]} bytes; inter-node figures copy the "
               "intra-node fits (single host)"))
    raw = {c: list(zip(sizes, measured[c])) for c in COLLECTIVES}
    for size in _smaller_group_sizes(nproc):  # "all_reduce@2": groups of 2, all at once
        raw.update({f"{c}@{size}": list(zip(sizes, seconds))
                    for c, seconds in measured[f"group{size}"].items()})
    return spec, raw
