"""Timing what a data-parallel unit (DDP-style replicate, FSDP2) adds per forward+backward,
inside a process group `profile-cluster` spawned: `dp_unit_seconds`, by mode and unit size
(tensors and parameters: two narrow units and a wide one, `dp_probe_units`), every rank
running together. A unit's figure is the calling thread's CPU time
outside its collectives (`_added_step_s`): `cost_models.host_overhead_fit` keeps it as
measured, since the comm model prices each collective call whole.

The probe's units are the executor's: a ZeRO-2/3 unit on gloo runs
`ir.gloo_collectives.use_gloo_collectives` (the same function `executors.data_parallel
.apply_dp` calls), so the Python around its gloo calls (the storage aliases made and
emptied each call) is in the figure. What the collective probes time
(`cost_models.collective_probes`: `reduce_scatter_in_place` whole, and the
`dist.all_gather` inside `all_gather_chunks`, the gloo call `GlooAllGather` makes) is
left out here, so nothing is priced twice.
"""

from __future__ import annotations

import functools
import statistics

from cost_models.host_probes import probe_clock
from ir.strategy import DPMode

# Data-parallel units timed: a stack of DP_UNITS units of DP_UNIT_BLOCKS tiny blocks each.
DP_UNITS = 8
DP_UNIT_BLOCKS = (1, 4)  # probe blocks per unit: units of 6 and 24 parameter tensors
# ... and a unit of DP_UNIT_BLOCKS[0] blocks DP_UNIT_WIDE_WIDTH wide (132K parameters,
# 6 tensors): what a unit adds grows with its parameters (FSDP2 copies the parameters
# into the unsharded ones, the gradients into the reduce buffer and out: 2 gloo ranks,
# replicate units of 24 tensors read 1.40 / 1.69 / 2.77 / 5.0 ms at 0.6K / 34K / 133K /
# 528K parameters, 6.8 ns a parameter, 2026-11-26), which the 8-wide units hold ~none of.
DP_UNIT_WIDE_WIDTH = 256
DP_UNIT_STEPS = 20  # after DP_UNIT_WARMUP steps; the median
DP_UNIT_WARMUP = 3
# FSDP2's collectives by their torch.distributed names (torch 2.13 `_fsdp_collectives`
# calls `dist.all_gather_single` / `dist.reduce_scatter_single`, looked up on the module
# at call time; older torch the `*_tensor` names, which forward to them inside c10d, not
# through the module), and `all_gather`, the gloo call inside `GlooAllGather`
# (`all_gather_chunks`, which the collective probe times on gloo): the calling
# thread's CPU inside them is left out of a unit's figure, since `comm.blocking_s`
# prices each call whole. A call inside another counted one is not counted again.
FSDP_COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
                    "reduce_scatter_tensor", "all_reduce", "all_gather")
# ... and the in-place reduce-scatter `GlooReduceScatter` runs, whole: the collective
# probes time it so (`collective_probes._collective_calls`), aliases and copy-out included.
GLOO_COLLECTIVES = ("reduce_scatter_in_place",)


def dp_probe_units() -> tuple[tuple[int, int], ...]:
    """(blocks, width) of each unit size the probe times: the narrow units of
    DP_UNIT_BLOCKS, then the wide one."""
    from cost_models.clusters import OP_OVERHEAD_WIDTH

    return (*((blocks, OP_OVERHEAD_WIDTH) for blocks in DP_UNIT_BLOCKS),
            (DP_UNIT_BLOCKS[0], DP_UNIT_WIDE_WIDTH))


def dp_probe_stack(mesh, mode: DPMode | None, blocks: int, width: int | None = None):
    """DP_UNITS units of `blocks` probe blocks each (`width` wide, default the per-op
    probe's), wrapped in `mode` on `mesh` as the executor wraps layers (None: the plain
    stack): each unit, then the root; a ZeRO-2/3 unit on gloo gets the executor's
    collectives (`use_gloo_collectives`)."""
    from torch import nn
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard

    from cost_models.clusters import OP_OVERHEAD_WIDTH, _overhead_block
    from ir.gloo_collectives import on_gloo, sum_reduction, use_gloo_collectives

    width = width or OP_OVERHEAD_WIDTH
    stack = nn.Sequential(*[nn.Sequential(*[_overhead_block(width) for _ in range(blocks)])
                            for _ in range(DP_UNITS)])
    if mode is None:
        return stack
    gloo = on_gloo(mesh)
    for unit in stack:
        if mode is DPMode.REPLICATE:
            replicate(unit, mesh=mesh)
        else:
            fully_shard(unit, mesh=mesh, reshard_after_forward=mode is DPMode.ZERO3)
            if gloo:  # as `executors.data_parallel.apply_dp`
                use_gloo_collectives(unit)
        sum_reduction(unit, mesh)  # the executor's reduction (2 ranks: within 2 us a unit)
    if mode is DPMode.REPLICATE:  # the root, which owns no parameters
        replicate(stack, mesh=mesh)
    else:
        fully_shard(stack, mesh=mesh, reshard_after_forward=mode is DPMode.ZERO3)
    sum_reduction(stack, mesh)
    return stack


def dp_unit_seconds(mesh) -> dict[DPMode, dict[tuple[int, int], float]]:
    """Host CPU seconds per unit per forward+backward that wrapping adds over the plain
    stack, by mode and by the unit's (parameter tensors, parameters) (`dp_probe_units`),
    all ranks running together, their collectives left out (`_added_step_s`)."""
    import torch

    from cost_models.clusters import _one_thread

    out: dict[DPMode, dict[tuple[int, int], float]] = {}
    with _one_thread():
        for blocks, width in dp_probe_units():
            x = torch.randn(2, width)
            plain = dp_probe_stack(mesh, None, blocks, width)
            size = (len(list(plain[0].parameters())), sum(p.numel() for p in plain[0].parameters()))
            for mode in (DPMode.REPLICATE, DPMode.ZERO2, DPMode.ZERO3):
                added = _added_step_s(plain, dp_probe_stack(mesh, mode, blocks, width), x)
                out.setdefault(mode, {})[size] = max(added, 0.0) / DP_UNITS
    return out


def _added_step_s(plain, wrapped, x) -> float:
    """Median over steps of how much more CPU time the calling thread spends on
    `wrapped(x).sum().backward()` than on the same on `plain` (`probe_clock`), less its
    CPU time inside FSDP_COLLECTIVES and GLOO_COLLECTIVES calls; the two run alternately
    (a slow spell of a shared machine hits both halves of a pair), every rank starting
    each run together. The thread clock leaves out what `comm.blocking_s` prices for the
    real layer: the waits for peers and gloo's own threads. (Wall time less that price
    read 0 per unit + 26 us per tensor on 2 processes; the thread clock 0.39 ms + 14 us,
    and gpt-tiny's units spend ~0.8 ms each in FSDP2's hooks: issue 17.)"""
    import torch.distributed as dist

    from ir import gloo_collectives

    clock = probe_clock("cpu")
    inside = [0.0]
    depth = [0]

    def counted(call):
        @functools.wraps(call)
        def timed_call(*args, **kwargs):
            depth[0] += 1
            start = clock()
            try:
                return call(*args, **kwargs)
            finally:
                depth[0] -= 1
                if not depth[0]:  # the outermost counted call holds the inner ones
                    inside[0] += clock() - start
        return timed_call

    def timed(model) -> float:
        dist.barrier()
        before, start = inside[0], clock()
        model(x).sum().backward()
        return clock() - start - (inside[0] - before)

    plain_calls = {(holder, name): getattr(holder, name)
                   for holder, names in ((dist, FSDP_COLLECTIVES),
                                         (gloo_collectives, GLOO_COLLECTIVES))
                   for name in names if hasattr(holder, name)}
    added = []
    try:
        for (holder, name), call in plain_calls.items():
            setattr(holder, name, counted(call))
        for step in range(DP_UNIT_WARMUP + DP_UNIT_STEPS):
            pair = timed(wrapped) - timed(plain)
            if step >= DP_UNIT_WARMUP:
                added.append(pair)
    finally:
        for (holder, name), call in plain_calls.items():
            setattr(holder, name, call)
    return statistics.median(added)
