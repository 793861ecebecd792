"""Seconds of the tied copies' gradient sum after backward, as the executor takes it.

`executors.tied.untie` gives every layer after the first its own copy of a shared weight;
after the last backward `executors.tied.TiedGradients.sync` sets each copy's gradient to
the sum over the copies: `total = sum(grads)` (Python's `sum`, starting from 0), then
`grad.copy_(total)` per copy. Once per step, per tie group and pipeline rank (the copies
of all the stage modules a rank holds, `TiedGradients.__init__`), on plain or local
tensors: no per-layer profile times it (each layer's backward only makes its own copy's
gradient), so the step pays it on top. (edgebwd measured a shared 33.5 MB table's second
contribution at +17 ms per backward on this CPU: a memory-bound pass with fresh pages.)

Priced where the kit measured it (`probe_tied_sum`, CPU kits); GPU presets carry no
figure, so their searches (tests/test_search_pinned.py) price no sum: on a GPU it is a few
memory-bound kernels, some tens of us a step, below what their pins resolve. The
cross-rank path's gather and all-reduce are communication, not priced here. The search
prices the same sum per candidate stage (`planner.stage_host`, `tied_group_seconds`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from ir.cluster import ClusterSpec
from ir.layer import Layer, LayerGraph
from ir.plan import ParallelPlan

from cost_models.common import StepConfig
from cost_models.model_states import held_bytes_per_param
from cost_models.tied_memory import TieGroup, tie_groups, tied_local_fraction, tied_numel

# glibc serves a request above its largest dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX,
# 32 MiB on 64-bit: mallopt(3)) with fresh pages, so the sum's new tensors of a larger
# gradient page-fault every step; smaller ones mostly reuse the heap, and the gradients,
# just written by backward, sit in the caches. Two lines, one per side of it.
FRESH_PAGES_ABOVE_BYTES = 32 * 2**20
# Bytes per copy of each line's two fit points: above the threshold, caches evicted
# (bench/bench_tied_sum.py: 0.06-0.1 ns per byte moved here); below it, warm (0.02-0.03).
TIED_PROBE_GRAD_BYTES = (48 * 2**20, 96 * 2**20)
TIED_PROBE_SMALL_GRAD_BYTES = (8 * 2**20, 24 * 2**20)
TIED_PROBE_COPIES = 2  # an embedding and its LM head: the ties the model zoo has
TIED_PROBE_ROUNDS = 3  # the fastest of each (a shared host only ever slows a run down)
FP32_BYTES = 4
# The kit's fields `probe_tied_sum` fills, in the order it returns them
TIED_SUM_FIELDS = ("tied_sum_host_s", "tied_sum_s_per_byte", "tied_sum_small_host_s",
                   "tied_sum_small_s_per_byte")


def sum_traffic_bytes(copies: int, grad_bytes: float) -> float:
    """Bytes sync's sum moves for `copies` gradients of `grad_bytes` each. Counted from
    the code (executors.tied.TiedGradients.sync): `0 + g1` reads g1 and writes a new
    tensor (2N), each further `+ g` reads two and writes one (3N, copies - 1 times), each
    `copy_` reads the total and writes a gradient (2N, copies times): (5 copies - 1) N."""
    return (5 * copies - 1) * grad_bytes


def _sum_and_write(grads) -> None:
    """The sync's local path (executors.tied.TiedGradients.sync): sum, then copy back."""
    total = sum(grads)
    for grad in grads:
        grad.copy_(total)


def _seconds(grad_bytes: int, copies: int, evict) -> float:
    """The fastest of a few sums of fresh gradients; `evict` (a tensor, or None for the
    warm line) written before each, so the gradients leave the caches."""
    import torch

    best = float("inf")
    for _ in range(TIED_PROBE_ROUNDS):
        grads = [torch.randn(grad_bytes // FP32_BYTES) for _ in range(copies)]
        if evict is not None:
            evict.add_(1.0)  # a pool twice the last-level cache
        start = time.perf_counter()
        _sum_and_write(grads)
        best = min(best, time.perf_counter() - start)
    return best


def _line(sizes: tuple[int, int], copies: int, evict) -> tuple[float, float]:
    """(seconds per call, seconds per byte moved) through two sizes, both floored at 0."""
    small, large = sizes
    small_s, large_s = _seconds(small, copies, evict), _seconds(large, copies, evict)
    moved = sum_traffic_bytes(copies, large) - sum_traffic_bytes(copies, small)
    per_byte_s = max(0.0, (large_s - small_s) / moved)
    return max(0.0, small_s - per_byte_s * sum_traffic_bytes(copies, small)), per_byte_s


def probe_tied_sum(copies: int = TIED_PROBE_COPIES) -> tuple[float, float, float, float]:
    """Sync's sum on this CPU, fresh gradients: (per call, per byte moved) above
    `FRESH_PAGES_ABOVE_BYTES`, caches evicted, then the same below it, warm."""
    import torch

    from cost_models.fresh_output import fresh_pool_bytes

    evict = torch.zeros(fresh_pool_bytes() // FP32_BYTES)
    large = _line(TIED_PROBE_GRAD_BYTES, copies, evict)
    del evict
    return large + _line(TIED_PROBE_SMALL_GRAD_BYTES, copies, None)


def tied_group_seconds(cluster: ClusterSpec, copies: int, grad_bytes: float) -> float:
    """Seconds of sync's sum on one rank over `copies` gradients of `grad_bytes` each: the
    kit's per call + per byte x `sum_traffic_bytes`, the warm line's figures at or below
    `FRESH_PAGES_ABOVE_BYTES` where the kit measured them; x the core share
    (`ClusterSpec.host_share`). 0 where it measured none or no copy is held."""
    cal = cluster.kernel_calibration
    if cal is None or cal.tied_sum_s_per_byte <= 0 or copies < 1:
        return 0.0
    call_s, per_byte_s = cal.tied_sum_host_s, cal.tied_sum_s_per_byte
    if grad_bytes <= FRESH_PAGES_ABOVE_BYTES and cal.tied_sum_small_s_per_byte > 0:
        call_s, per_byte_s = cal.tied_sum_small_host_s, cal.tied_sum_small_s_per_byte
    # one process's figure (its fastest repeat), stretched as ranks share cores, as the
    # engine start is (cost_models.step_host.engine_start_s)
    return (call_s + per_byte_s * sum_traffic_bytes(copies, grad_bytes)) * cluster.host_share


def tied_grad_bytes(layer: Layer, config: StepConfig, fraction: float = 1.0,
                    name: str | None = None) -> float:
    """Bytes of one holder's gradient of its tied tensor `name` (`tied_memory.tied_numel`;
    None: all its tied tensors) as sync sums it: fp32 (`held_bytes_per_param`), x
    `fraction` (`tied_local_fraction`: local shards)."""
    numel = layer.tied_params if name is None else tied_numel(layer, name)
    return numel * held_bytes_per_param(config.precision, config.optimizer).grads * fraction


def tied_sum_seconds(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec, j: int,
                     config: StepConfig) -> float:
    """Seconds a step spends in sync's sum for the tie groups holding layer `j`, counted
    once per group and pipeline RANK, where `executors.tied.TiedGradients.sync` takes it:
    it sums the copies of every stage module the rank holds (an interleaved rank's chunks
    too) in one sum, so copies on one rank are summed together and those on other ranks
    only through the all-reduce (communication, not priced here). Charged at the rank's
    last holder, the owner too (0 for every other layer): `tied_group_seconds(holders on
    the rank, the gradient's bytes)`, where sync sums local shards this rank's share
    (`tied_local_fraction`)."""
    if not tied_sums_priced(cluster):
        return 0.0
    rank = plan.stage_of(j) % plan.pp
    held = {k for group in tie_groups(graph) for k in group.holders
            if plan.stage_of(k) % plan.pp == rank}
    return rank_tied_sums_s(graph, cluster, held, lambda group: tied_grad_bytes(
        graph.layers[group.copy], config,
        tied_local_fraction(graph, plan, group.copy, group.name), group.name), charged_at=j)


def rank_tied_sums_s(graph: LayerGraph, cluster: ClusterSpec, held: Collection[int],
                     grad_bytes: Callable[[TieGroup], float],
                     charged_at: int | None = None) -> float:
    """Seconds of sync's sums on a pipeline rank holding layers `held`: per tie group with
    holders there, one sum over those holders (`tied_group_seconds`). `grad_bytes(group)`:
    the group's gradient bytes as sync sums them on this rank (the caller's share: a
    plan's `tied_local_fraction`, the search's per-layout share); `charged_at`: only the
    groups whose last holder there is that layer (the estimate charges each at one layer).
    The one grouping `tied_sum_seconds` and the search (`planner.stage_host`) both read."""
    total_s = 0.0
    for group in tie_groups(graph):
        local = [k for k in group.holders if k in held]
        if local and (charged_at is None or charged_at == local[-1]):
            total_s += tied_group_seconds(cluster, len(local), grad_bytes(group))
    return total_s


def tied_sums_priced(cluster: ClusterSpec) -> bool:
    """Whether `cluster`'s kit measured the sum (CPU kits; GPU presets and older kits not)."""
    cal = cluster.kernel_calibration
    return cal is not None and cal.tied_sum_s_per_byte > 0
