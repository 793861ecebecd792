"""What would make a plan fit: try one knob at a time and report those that do.

Knobs, cheapest first (each is a standard memory lever):
  ZeRO stage up             shards optimizer states, then gradients, then parameters
  sequence parallelism      splits the activations TP leaves replicated (needs tp > 1)
  selective / full recompute keeps less activation memory
  smaller micro-batch       fewer activations per micro-batch (more of them)
  more TP / more PP         splits parameters and activations over more devices
  more nodes                a bigger data-parallel group for the ZeRO shards
Each candidate is priced with the same memory model; no search happens here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.plan import ParallelPlan, uniform_plan
from ir.strategy import Checkpoint, DPMode, LayerStrategy

from cost_models.common import GiB
from cost_models.memory import plan_memory

# Doublings a ladder tries when adding nodes (2x .. 64x the pipeline or ZeRO group).
LADDER_STEPS = 6


@dataclass(frozen=True, slots=True)
class Fix:
    change: str  # the flags to change, e.g. "--zero 3"
    peak_bytes: int
    fits: bool

    def __str__(self) -> str:
        verdict = "fits" if self.fits else "still too big"
        return f"{self.change} (peak {self.peak_bytes / GiB:.1f} GiB, {verdict})"


def _all_layers(plan: ParallelPlan, edit: Callable[[LayerStrategy], LayerStrategy]
                ) -> ParallelPlan:
    return dataclasses.replace(plan, layer_strategies=tuple(edit(s) for s in
                                                            plan.layer_strategies))


def _uniform_strategy(plan: ParallelPlan) -> LayerStrategy | None:
    first = plan.layer_strategies[0]
    return first if all(s == first for s in plan.layer_strategies) else None


def candidate_fixes(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec
                    ) -> list[tuple[str, ParallelPlan, ClusterSpec]]:
    """(flags, plan, cluster) variants that change one knob towards less memory."""
    out: list[tuple[str, ParallelPlan, ClusterSpec]] = []
    max_zero = max(s.dp_mode.stage for s in plan.layer_strategies)
    if max(s.dp for s in plan.layer_strategies) > 1:
        for stage in range(max_zero + 1, 4):
            mode = DPMode.from_stage(stage)
            out.append((f"--zero {stage}", _all_layers(
                plan, lambda s, m=mode: dataclasses.replace(s, dp_mode=m)), cluster))
    if any(s.tp > 1 and not s.sequence_parallel for s in plan.layer_strategies):
        out.append(("--sequence-parallel", _all_layers(
            plan, lambda s: dataclasses.replace(s, sequence_parallel=s.tp > 1)), cluster))
    for ckpt in (Checkpoint.SELECTIVE, Checkpoint.FULL):
        if any(s.checkpoint is Checkpoint.NONE for s in plan.layer_strategies):
            out.append((f"--checkpoint {ckpt}", _all_layers(
                plan, lambda s, c=ckpt: dataclasses.replace(s, checkpoint=c)), cluster))
    if plan.micro_batch > 1 and plan.micro_batch % 2 == 0:
        smaller = dataclasses.replace(plan, micro_batch=plan.micro_batch // 2,
                                      num_microbatches=plan.num_microbatches * 2)
        out.append((f"--micro-batch {plan.micro_batch // 2}", smaller, cluster))
    strategy = _uniform_strategy(plan)
    if strategy is not None and plan.virtual_stages == 1:
        out.extend(_uniform_fixes(graph, plan, cluster, strategy))
    return out


def _uniform_fixes(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec,
                   s: LayerStrategy) -> list[tuple[str, ParallelPlan, ClusterSpec]]:
    """Re-split the devices (TP <-> DP, PP <-> DP), then ladders that add nodes: a deeper
    pipeline at the same TP x DP, or a wider ZeRO-3 group."""
    base = dict(tp=s.tp, dp=s.dp, pp=plan.pp, zero=s.dp_mode.stage, checkpoint=s.checkpoint,
                sequence_parallel=s.sequence_parallel, micro_batch=plan.micro_batch,
                global_batch=plan.global_batch, schedule=plan.schedule,
                precision=plan.precision, optimizer=plan.optimizer)
    tries: list[tuple[str, dict, ClusterSpec]] = []
    if s.dp % 2 == 0 and s.tp * 2 <= cluster.devices_per_node:
        tries.append((f"--tp {s.tp * 2} --dp {s.dp // 2}", dict(tp=s.tp * 2, dp=s.dp // 2),
                      cluster))
    if s.dp % 2 == 0:
        tries.append((f"--pp {plan.pp * 2} --dp {s.dp // 2}",
                      dict(pp=plan.pp * 2, dp=s.dp // 2), cluster))
    for k in range(1, LADDER_STEPS + 1):
        pp = plan.pp * 2**k
        if pp > len(graph.layers):
            break
        nodes = _nodes_for(s.tp * s.dp * pp, cluster)
        tries.append((f"--pp {pp} --nodes {nodes}", dict(pp=pp),
                      cluster.with_nodes(num_nodes=nodes)))
    for k in range(1, LADDER_STEPS + 1):
        dp = s.dp * 2**k
        if plan.global_batch % (dp * plan.micro_batch):
            break
        nodes = _nodes_for(s.tp * dp * plan.pp, cluster)
        tries.append((f"--zero 3 --dp {dp} --nodes {nodes}", dict(dp=dp, zero=3),
                      cluster.with_nodes(num_nodes=nodes)))
    out = []
    for flags, change, spec in tries:
        try:
            candidate = uniform_plan(len(graph.layers), **{**base, **change})
        except PlannerError:
            continue
        tp = candidate.layer_strategies[0].tp
        if any(layer.tp_candidates and layer.tp_violation(tp) for layer in graph.layers):
            continue
        out.append((flags, candidate, spec))
    return out


def _nodes_for(devices: int, cluster: ClusterSpec) -> int:
    return max(cluster.num_nodes, -(-devices // cluster.devices_per_node))


def suggest_fixes(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec,
                  limit: int = 3) -> list[Fix]:
    """Changes that fit, in the order tried (same devices first, then the smallest
    addition of nodes per ladder); if none fits, the ones that come closest."""
    priced = []
    ladders_done: set[str] = set()
    for flags, candidate, spec in candidate_fixes(graph, plan, cluster):
        ladder = flags.split()[0] + ("/nodes" if "--nodes" in flags else "")
        if ladder in ladders_done:
            continue  # a ladder reports only its first rung that fits
        try:
            memory = plan_memory(graph, candidate, spec)
        except PlannerError:
            continue
        priced.append(Fix(flags, memory.peak_bytes, memory.fits))
        if memory.fits and "--nodes" in flags:
            ladders_done.add(ladder)
    fitting = [f for f in priced if f.fits]
    chosen = fitting if fitting else sorted(priced, key=lambda f: f.peak_bytes)
    return chosen[:limit]
