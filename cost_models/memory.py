"""Per-rank peak memory of a plan: one training step walked pass by pass, as the executor runs it.

For each pipeline rank we take its model chunks (`rank_layers`) and the order of its
forward and backward passes (`pipeline_ops.rank_ops`: torch.distributed.pipelining's
schedules, or the plain loop without a pipeline), and keep a running sum of what is
alive, taking its maximum (`memory_walk.walk_rank`):

  held all step     stored weights, stored gradients (once reduced), optimizer moments
                    (model_states.layer_held_states), pipeline receive buffers
  per micro-batch   kept activations (activations.py) from a layer's forward to its
                    backward; the stage output the pipeline caches (the model output
                    the runtime keeps without one)
  FSDP2 units       each data-parallel layer's gathered working copy: from its forward
                    to its backward (replicate, ZeRO-2), only during its forward and
                    backward (ZeRO-3, with the next unit prefetched in backward); its
                    unreduced gradient and the reduce-scatter input, then the input and
                    output (and a divided copy on a one-rank group); the input is kept
                    till the next unit reduces. Gradient accumulation keeps unreduced
                    gradients till the last micro-batch; a pipeline keeps copies and unreduced
                    gradients of all micro-batches and reduces at the end of the step.
                    On the lean host path (`ir.lean_host`, a meta-built model on a CPU
                    cluster: `StepConfig.lean`) an embedding unit is not gathered for
                    its backward, a unit of one evenly split tensor reduces in place,
                    nothing is prefetched and no reduce-scatter input is retained
  transients        one layer's backward at a time: the gradients entering and leaving
                    it, its recomputed activations or temporaries, the gradient it makes
  after backward    the tied-copy gradient sum, the optimizer step's temporaries (and
                    ZeRO-1's fp32 gradient shards), ZeRO-1's all-gather buffers

The breakdown reported is the one at the peak, so its parts sum to `peak_bytes`: params
(stored + gathered weights), grads (stored + unreduced), optimizer (moments),
activations (kept + cached outputs), buffers (everything transient and the pipeline's
receive buffers), overhead (the cluster's fixed per-device runtime memory).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import Layer, LayerGraph
from ir.lean_host import (LEAN_BACKWARD_PREFETCH, LEAN_RETAINS_REDUCE_INPUT, LeanLayer,
                          ring_scratch_bytes, takes_lean_path)
from ir.legality import sequence_parallel_applies
from ir.plan import ParallelPlan
from ir.strategy import Checkpoint, LayerStrategy, Schedule

from cost_models.activations import boundary_bytes, layer_activations
from cost_models.common import GiB, MiB, StepConfig, layer_configs
from cost_models.dp_copies import reduces_on_one_rank
from cost_models.memory_walk import (ChunkMemory, LayerMemory, OverLimit,  # noqa: F401
                                     StageMemory, model_output_bytes, walk_rank)
from cost_models.model_states import (FP32_BYTES, BytesPerParam, has_dp_unit,
                                      held_bytes_per_param, held_local_params,
                                      layer_held_states, moment_shares,
                                      zero1_step_bytes)
from cost_models.offload import host_wall_problem, split_states
from cost_models.pipeline_ops import rank_ops
from cost_models.step_temporaries import step_group, step_tensor_params
from cost_models.tied_memory import tied_shards

# torch DDP's default bucket_cap_mb. The executor's data parallelism is FSDP2 (no DDP
# buckets: its reduction buffers are priced per unit here); planner.search still keeps
# this much of the budget in reserve.
DP_BUCKET_BYTES = 25 * MiB
DP_BUCKETS_IN_FLIGHT = 2
# FSDP2 backward: the unit computing plus the next one, prefetched in its pre-backward
# hook (FSDPParamGroup._backward_prefetch). Forward prefetches nothing by default.
ZERO3_UNITS_IN_FLIGHT = 2


def layer_memory(layer: Layer, strategy: LayerStrategy, config: StepConfig,
                 per_param: BytesPerParam | None = None) -> LayerMemory:
    """Cheap per-(layer, strategy) memory figures; `plan_memory` walks them through a step.
    (`per_param` is accepted for the search's calls; the executor's own bytes per
    parameter, `held_bytes_per_param`, are what it holds.)"""
    held = held_bytes_per_param(config.precision, config.optimizer)
    states, host = split_states(layer_held_states(layer, strategy, held), strategy)
    local = held_local_params(layer, strategy)
    stage = strategy.dp_mode.stage  # with dp = 1 every division below is by 1
    unit = has_dp_unit(layer, strategy, config.precision)
    working = local * held.working if unit else 0.0
    shares = moment_shares(layer, strategy)
    moments = max(shares)
    tied_full = layer.tied_params * held.grads
    zero1_step = zero1_step_bytes(layer, strategy, held)
    lean = config.lean if unit and takes_lean_path(config.lean is not None, strategy) else None
    reduce_bytes = local * held.reduce if unit else 0.0
    unsharded = local * held.unsharded_grads if unit else 0.0
    return LayerMemory(
        states=states, activations=layer_activations(layer, strategy, config),
        gather_unit_bytes=working if stage == 3 else 0.0,
        # an offloaded layer's optimizer step (and its temporaries) runs on the host
        step_tensor_params=() if strategy.offload else step_tensor_params(layer, strategy,
                                                                          moments),
        fp32_moment_bytes=0.0 if strategy.offload or not held.moments
        else moments * FP32_BYTES,
        working_param_bytes=working, reduce_bytes=reduce_bytes,
        tied_grad_bytes=tied_full,
        zero1_master_grad_bytes=zero1_step[0], zero1_share_bytes=zero1_step[1],
        reshard_after_forward=stage == 3 and unit,
        moment_shares=tuple(x * held.moments for x in shares) if len(shares) > 1 else (),
        host_bytes=host.total, step_group=step_group(layer, strategy, config.precision),
        **_lean_fields(lean, working, reduce_bytes, unsharded, strategy))


def _lean_fields(lean: LeanLayer | None, working: float, reduce_bytes: float,
                 unsharded_grad_bytes: float, strategy: LayerStrategy) -> dict:
    """LayerMemory's lean host fields (`ir.lean_host`): a unit's share gathered for its
    backward, its reduce-scatter's copy-in, no prefetch, no retained input, and the
    ring's receive scratch (its largest unit's chunk, at most a piece)."""
    if lean is None:  # FSDP2's world-1 path divides a copy of the input (memory_walk)
        return dict(unsharded_grad_bytes=unsharded_grad_bytes, reduce_divide_bytes=(
            reduce_bytes if reduces_on_one_rank(strategy) else 0.0))
    dp = strategy.dp
    return dict(unsharded_grad_bytes=unsharded_grad_bytes * lean.unsharded_grad_scale,
                backward_gather_bytes=working * lean.backward_gather_share,
                backward_prefetch=LEAN_BACKWARD_PREFETCH,
                reduce_input_bytes=reduce_bytes * lean.reduce_copy_share,
                retains_reduce_input=LEAN_RETAINS_REDUCE_INPUT,
                reduce_scratch_bytes=ring_scratch_bytes(reduce_bytes * lean.largest_unit_share
                                                        / dp))


def held_through_step(mem: LayerMemory, *, num_microbatches: int, pipelined: bool) -> float:
    """Bytes a DP unit holds beyond `states` from its first forward to its last backward,
    for callers that add layers up instead of walking the step (planner.search): its
    working copy (a ZeRO-3 unit only under a pipeline, which stops resharding after
    backward) and, with gradient accumulation or a pipeline, its unreduced gradient,
    which FSDP2 keeps whole while gradient sync is off (`set_requires_gradient_sync`)."""
    if not mem.has_unit:
        return 0.0
    copy = mem.working_param_bytes if pipelined or not mem.reshard_after_forward else 0.0
    unreduced = mem.reduce_bytes if pipelined or num_microbatches > 1 else 0.0
    return copy + unreduced


# ---- a whole plan -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Per-rank memory of a plan: one entry per pipeline rank."""

    stages: tuple[StageMemory, ...]
    device_bytes: int
    host_problem: str = ""  # the host-memory wall's shortfall (cost_models.offload), '' if none

    @property
    def peak_bytes(self) -> int:
        return max(s.peak_bytes for s in self.stages)

    @property
    def worst_stage(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.peak_bytes)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.device_bytes and not self.host_problem

    def shortfall(self) -> str:
        """'' when it fits, else 'does not fit: needs X GiB of Y GiB on stage S'."""
        if self.fits:
            return ""
        if self.peak_bytes <= self.device_bytes:
            return f"does not fit: {self.host_problem}"
        worst = self.worst_stage
        return (f"does not fit: needs {worst.peak_bytes / GiB:.1f} GiB of "
                f"{self.device_bytes / GiB:.1f} GiB on stage {worst.stage}")

    def to_json(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "device_bytes": self.device_bytes,
                "fits": self.fits, "host_problem": self.host_problem,
                "stages": [s.to_json() for s in self.stages]}


def rank_layers(plan: ParallelPlan) -> list[list[int]]:
    """Layer indices each pipeline rank holds, in execution order (rank r holds stages
    r, r + p, r + 2p, ... under interleaving)."""
    return [[j for c in chunks for j in c] for chunks in rank_chunks(plan)]


def rank_chunks(plan: ParallelPlan) -> list[list[list[int]]]:
    """Per pipeline rank, the layer indices of each stage it holds (its model chunks)."""
    out: list[list[list[int]]] = [[] for _ in range(plan.pp)]
    for i, stage in enumerate(plan.stages):
        out[i % plan.pp].append(list(range(stage.first_layer, stage.last_layer + 1)))
    return out


def check_plan_matches(graph: LayerGraph, plan: ParallelPlan,
                       cluster: ClusterSpec | None = None) -> None:
    """Reject a plan that cannot price this graph on this cluster, naming the fix."""
    if len(plan.layer_strategies) != len(graph.layers):
        raise PlannerError(f"the plan has {len(plan.layer_strategies)} layer strategies but "
                           f"{graph.model} has {len(graph.layers)} layers: plan for this model")
    for layer, strategy in zip(graph.layers, plan.layer_strategies):
        # A layer with no TP-able module runs replicated inside its TP group (Megatron's
        # layer norms); only a TP degree that a TP-able layer cannot split is an error.
        problem = layer.tp_violation(strategy.tp) if layer.tp_candidates else None
        if problem:
            legal = [t for t in (1, 2, 4, 8, 16, 32, 64) if layer.tp_degree_allowed(t)]
            raise PlannerError(f"{problem}: use a TP degree in {legal}")
    if cluster is not None and plan.world_size > cluster.world_size:
        raise PlannerError(f"the plan needs {plan.world_size} devices but cluster "
                           f"{cluster.name} has {cluster.world_size} "
                           f"({cluster.num_nodes} x {cluster.devices_per_node}): add "
                           "--nodes or lower --dp/--tp/--pp")


# Steady-state rounds walked beyond one pass of the pipeline: after warm-up every 1F1B
# round (and every accumulation round without a pipeline) holds the same tensors, so the
# peak of m micro-batches is the peak of a few (tests/test_cost_memory.py checks it).
STEADY_ROUNDS_WALKED = 2


def walked_microbatches(plan: ParallelPlan) -> int:
    """Micro-batches `walk_rank` needs to see the peak of all `plan.num_microbatches`:
    warm-up, STEADY_ROUNDS_WALKED steady rounds and cool-down, rounded up to a multiple
    of pp (the interleaved schedule runs micro-batches in groups of pp). GPipe holds all
    m micro-batches' activations at once, so it is walked whole."""
    if plan.schedule is Schedule.GPIPE and plan.pp > 1:
        return plan.num_microbatches
    cap = len(plan.stages) + plan.pp * STEADY_ROUNDS_WALKED
    cap = -(-cap // plan.pp) * plan.pp
    return min(plan.num_microbatches, cap)


def plan_memory(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec,
                configs: Sequence[StepConfig] | None = None,
                rank_cache: dict | None = None) -> MemoryEstimate:
    """Peak memory per pipeline rank of `plan` for `graph` on `cluster`.

    `rank_cache` (one dict per graph and cluster) keeps each rank's result by everything
    its walk reads, so plans that share a rank (a search's re-solves) walk it once."""
    check_plan_matches(graph, plan, cluster)
    configs = configs or layer_configs(graph, plan, cluster.device)
    stages = []
    for rank, chunk_indices in enumerate(rank_chunks(plan)):
        key = None if rank_cache is None else _rank_key(plan, rank, chunk_indices, configs)
        stage = None if key is None else rank_cache.get(key)
        if stage is None:
            stage = _rank_memory(graph, plan, cluster, rank, chunk_indices, configs,
                                 layer_cache=rank_cache)
            if key is not None:
                rank_cache[key] = stage
        stages.append(stage)
    host = max(s.host_bytes for s in stages)  # the node's ranks as its most loaded rank
    return MemoryEstimate(tuple(stages), cluster.device_memory_bytes,
                          host_wall_problem(host, cluster) if host else "")


def _rank_key(plan: ParallelPlan, rank: int, chunk_indices: list[list[int]],
              configs: Sequence[StepConfig]) -> tuple:
    """What `_rank_memory` reads of the plan: the rank's layers and the one before each
    chunk (its receive buffer's layout), their strategies and configs, the schedule."""
    read = sorted({j for c in chunk_indices for j in c}
                  | {c[0] - 1 for c in chunk_indices if c[0] > 0})
    return (rank, tuple(map(tuple, chunk_indices)),
            tuple((plan.layer_strategies[j], configs[j]) for j in read),
            plan.schedule, plan.pp, plan.num_microbatches, len(plan.stages),
            plan.stages[plan.stage_of(chunk_indices[0][0])].devices)


def plan_peak_bytes(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec,
                    stop_above_bytes: float = math.inf,
                    layer_cache: dict | None = None,
                    configs: Sequence[StepConfig] | None = None) -> int | None:
    """`plan_memory(...).peak_bytes`, or None once some rank is sure to need more than
    `stop_above_bytes`: the rest of the walk is skipped (for the least of many peaks).
    `layer_cache` (one dict per graph) keeps `layer_memory` across calls."""
    check_plan_matches(graph, plan, cluster)
    configs = configs or layer_configs(graph, plan, cluster.device)
    peak = 0
    for rank, chunk_indices in enumerate(rank_chunks(plan)):
        try:
            stage = _rank_memory(graph, plan, cluster, rank, chunk_indices, configs,
                                 stop_above_bytes, layer_cache)
        except OverLimit:
            return None
        peak = max(peak, stage.peak_bytes)
    return peak


def _layer_memory(graph: LayerGraph, plan: ParallelPlan, j: int,
                  configs: Sequence[StepConfig], cache: dict | None) -> LayerMemory:
    if cache is None:
        return layer_memory(graph.layers[j], plan.layer_strategies[j], configs[j])
    key = ("layer", _layer_kinds(graph, cache)[j], plan.layer_strategies[j], configs[j])
    mem = cache.get(key)
    if mem is None:
        mem = cache[key] = layer_memory(graph.layers[j], plan.layer_strategies[j], configs[j])
    return mem


def _layer_kinds(graph: LayerGraph, cache: dict) -> list[int]:
    """Per layer, an id shared by the layers equal in everything but where they sit
    (`Layer.position_free`), which `layer_memory` does not read: 80 identical blocks are
    priced once per (strategy, config), not once per position. Kept in `cache`."""
    kinds = cache.get("layer-kinds")
    if kinds is None:
        ids: dict[Layer, int] = {}
        kinds = cache["layer-kinds"] = [ids.setdefault(l.position_free(), len(ids))
                                        for l in graph.layers]
    return kinds


@functools.lru_cache(maxsize=4096)
def _rank_ops(schedule: Schedule, pp: int, rank: int, walked: int, chunks: int) -> tuple:
    """`pipeline_ops.rank_ops`, kept: a search walks the same few schedules many times."""
    return tuple(rank_ops(schedule, pp, rank, walked, chunks))


def _rank_memory(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec, rank: int,
                 chunk_indices: list[list[int]], configs: Sequence[StepConfig],
                 stop_above_bytes: float = math.inf,
                 layer_cache: dict | None = None) -> StageMemory:
    """One pipeline rank's walk (`memory_walk.walk_rank`) over its chunks' layers.
    `layer_cache` keeps `layer_memory` by (`_layer_kinds`, strategy, config)."""
    indices = [j for c in chunk_indices for j in c]
    shared = shared_checkpoint_inputs(graph, plan, indices, configs)
    for j, nbytes in shared_boundary_saves(graph, plan, indices, configs).items():
        shared[j] = shared.get(j, 0.0) + nbytes
    chunks = []
    for c in chunk_indices:
        held, persistent, recv_shared = _pipeline_buffers(graph, plan, c, configs)
        if recv_shared:
            shared[c[0]] = shared.get(c[0], 0.0) + recv_shared
        mems = tuple(tied_shards(graph, plan, j, _without_shared(
            _layer_memory(graph, plan, j, configs, layer_cache), shared.get(j, 0.0)))
            for j in c)
        chunks.append(ChunkMemory(mems, held, persistent))
    walked = walked_microbatches(plan)
    ops = _rank_ops(plan.schedule, plan.pp, rank, walked, len(chunk_indices))
    chunks, device_moments = _most_loaded_device(chunks, indices, plan)
    stage = walk_rank(chunks, ops, stage=rank, num_microbatches=walked, pipelined=plan.pp > 1,
                      overhead_bytes=cluster.runtime_overhead_bytes,
                      optimizer=configs[0].optimizer,
                      implementation=configs[0].step_implementation,
                      stop_above_bytes=stop_above_bytes)
    if device_moments:
        worst = max(device_moments)
        stage = dataclasses.replace(stage, device_peak_bytes=tuple(
            stage.peak_bytes - round(worst - m) for m in device_moments))
    return stage


def _most_loaded_device(chunks: list[ChunkMemory], indices: list[int], plan: ParallelPlan
                        ) -> tuple[list[ChunkMemory], list[float]]:
    """ZeRO-1 layers hold different moments on different DP ranks: the chunks as the most
    loaded device of the pipeline rank holds them, and every device's moment bytes
    ([] when all devices hold the same). Device i of a stage is DP rank i // tp of a
    layer with TP degree tp (executors.mesh: TP innermost)."""
    mems = [l for c in chunks for l in c.layers]
    if not any(l.moment_shares for l in mems):
        return chunks, []
    devices = plan.stages[plan.stage_of(indices[0])].devices

    def held(l: LayerMemory, j: int, i: int) -> float:
        if not l.moment_shares:
            return l.states.optimizer
        return l.moment_shares[i // plan.layer_strategies[j].tp]

    moments = [sum(held(l, j, i) for l, j in zip(mems, indices)) for i in range(devices)]
    worst = max(range(devices), key=moments.__getitem__)

    def on_worst(l: LayerMemory, j: int) -> LayerMemory:
        if not l.moment_shares:
            return l
        share = held(l, j, worst)
        return dataclasses.replace(l, states=dataclasses.replace(l.states, optimizer=share),
                                   fp32_moment_bytes=l.fp32_moment_bytes
                                   * share / l.states.optimizer)

    out, k = [], 0
    for c in chunks:
        n = len(c.layers)
        out.append(dataclasses.replace(c, layers=tuple(
            on_worst(l, j) for l, j in zip(c.layers, indices[k:k + n]))))
        k += n
    return out, moments


def _pipeline_buffers(graph: LayerGraph, plan: ParallelPlan, chunk: list[int],
                      configs: Sequence[StepConfig]) -> tuple[float, float, float]:
    """(output held per micro-batch, persistent receive buffers, bytes of the receive
    buffer the chunk's first layer keeps as its own input) for one chunk.

    torch.distributed.pipelining (stage.py): a non-first stage allocates one activation
    receive buffer per micro-batch and a non-last stage one gradient receive buffer per
    micro-batch, once; `fwd_cache` keeps each micro-batch's stage output until its
    backward. Without a pipeline the runtime keeps the model output until the next
    forward returns (`executors.runtime`). The last stage's output is the logits
    (vocabulary-split under loss-parallel TP)."""
    first, last = chunk[0], chunk[-1]
    m = plan.num_microbatches
    final = last == len(graph.layers) - 1
    if final:
        held = model_output_bytes(graph.layers[last], plan.layer_strategies[last],
                                  configs[last])
    else:
        held = _boundary(graph, plan, last, configs)
        saved_out = graph.layers[last].saved_output_bytes * configs[last].activation_scale
        held -= min(held, saved_out / _sp_split(graph, plan, last))
    if plan.pp == 1:
        return held, 0.0, 0.0
    persistent = 0.0
    recv_shared = 0.0
    if first > 0:
        recv = _boundary(graph, plan, first - 1, configs)
        persistent += m * recv
        layer, strategy = graph.layers[first], plan.layer_strategies[first]
        kept_input = layer.input_bytes if strategy.checkpoint is Checkpoint.FULL \
            else layer.saved_input_bytes
        recv_shared = min(recv, kept_input * configs[first].activation_scale
                          / _sp_split(graph, plan, first))
    if not final:
        persistent += m * _boundary(graph, plan, last, configs)
    return held, persistent, recv_shared


def _boundary(graph: LayerGraph, plan: ParallelPlan, cut: int,
              configs: Sequence[StepConfig]) -> float:
    """Bytes of one micro-batch crossing after layer `cut`, as this rank holds them
    (sequence-split under SP, as cost_models.estimate sends them)."""
    strategy = plan.layer_strategies[cut]
    return boundary_bytes(graph.crossing_bytes(cut), configs[cut], strategy.tp,
                          sequence_parallel_applies(graph.layers[cut], strategy))


def _sp_split(graph: LayerGraph, plan: ParallelPlan, j: int) -> int:
    """t where layer j's activations are sequence-split (executors.validate.layer_layout)."""
    strategy = plan.layer_strategies[j]
    return strategy.tp if sequence_parallel_applies(graph.layers[j], strategy) else 1


def shared_checkpoint_inputs(graph: LayerGraph, plan: ParallelPlan, indices: list[int],
                             configs: Sequence[StepConfig]) -> dict[int, float]:
    """Input bytes a fully checkpointed layer need not keep because an earlier
    checkpointed layer on the same rank already keeps the same tensor: one layer feeding
    several (T5's encoder output and position bias reach every decoder block). Read off
    the IR's edges (src, dst, bytes); counted once per source, at its first consumer."""
    incoming: dict[int, list[tuple[int, int]]] = {}
    for src, dst, nbytes in graph.edges:
        incoming.setdefault(dst, []).append((src, nbytes))
    kept_from: dict[int, int] = {}  # source layer -> bytes of it already kept
    out: dict[int, float] = {}
    for j in indices:
        strategy = plan.layer_strategies[j]
        if strategy.checkpoint is not Checkpoint.FULL:
            continue
        duplicate = 0
        for src, nbytes in incoming.get(j, ()):
            if src in kept_from:
                duplicate += min(nbytes, kept_from[src])
            kept_from[src] = max(kept_from.get(src, 0), nbytes)
        if duplicate:
            out[j] = duplicate * configs[j].activation_scale / _sp_split(graph, plan, j)
    return out


def shared_boundary_saves(graph: LayerGraph, plan: ParallelPlan, indices: list[int],
                          configs: Sequence[StepConfig]) -> dict[int, float]:
    """Bytes layer j need not count because layer j-1 on the same rank already saves the
    same boundary tensor (a ReLU output that the next conv saves as its input, or keeps
    as its checkpointed input). Read off the IR's saved_output_bytes / saved_input_bytes /
    input_bytes; only where layer j-1 keeps its saved tensors (is not fully checkpointed)
    and both share one layout."""
    on_rank = set(indices)
    out: dict[int, float] = {}
    for j in indices:
        if j - 1 not in on_rank:
            continue
        a, b = plan.layer_strategies[j - 1], plan.layer_strategies[j]
        if a.checkpoint is Checkpoint.FULL or (a.tp, _sp_split(graph, plan, j - 1)) != (
                b.tp, _sp_split(graph, plan, j)):
            continue
        kept_input = graph.layers[j].input_bytes if b.checkpoint is Checkpoint.FULL \
            else graph.layers[j].saved_input_bytes
        overlap = min(graph.layers[j - 1].saved_output_bytes, kept_input)
        if overlap:
            out[j] = overlap * configs[j].activation_scale / _sp_split(graph, plan, j)
    return out


def _without_shared(mem: LayerMemory, shared_bytes: float) -> LayerMemory:
    if not shared_bytes:
        return mem
    acts = dataclasses.replace(mem.activations,
                               kept_bytes=max(0.0, mem.activations.kept_bytes - shared_bytes))
    return dataclasses.replace(mem, activations=acts)

