"""One training iteration of a plan: time breakdown, throughput, MFU and per-rank memory.

    estimate(graph, plan, cluster) -> Estimate

Per pipeline rank r and micro-batch (compute.py, comm.py):
  F_r = sum over its layers of forward compute + TP comm + exposed ZeRO-3 gather
        + send of its output to the next stage
  B_r = backward compute + recompute + TP comm + exposed ZeRO-2/3 traffic
        + the autograd engine's start per backward call (step_host: one per stage and
        micro-batch, CPU processes) + send of its input gradient to the previous stage
  and, with a pipeline on CPU processes, torch pipelining's host work per action in each
  (step_host.pipeline_action_s), and in B_r the stage input's AccumulateGrad on every
  stage but the first (step_host.input_accumulation_s); once a step, with the optimizer
  step, the training loop's own work (batch split, loss weighting and all-reduce) and the
  optimizer's entry after a backward (step_host.step_loop_s); per micro-batch 2..m, the
  gradients' accumulation (CPU processes: step_host.grad_accumulation_s; GPUs: its
  kernels, cost_models.grad_accumulation, hiding no DP traffic)
On GPUs the host queues kernels ahead of the device and waits only where it syncs, so
the compute of a run of passes between syncs is `compute.with_host` of its layers' device
and host sums (max), not the sum of each layer's (`gpu_runs_s`, the runs:
`step_host.one_host_window`); CPU processes add both up layer by layer, as before.
Each stage's first and last layers' cold ops are counted against what their rank runs
before them in the step, and a first layer's forwards priced apart by whether a backward
ran just before them (`step_host.placed_layers`), not against their model neighbours.
The search adds the same per-stage host terms to its objective (`planner.stage_host`).
Data-parallel traffic overlaps the compute it runs beside with efficiency
`overlap_efficiency(cluster)` (GPUs DP_OVERLAP_EFFICIENCY; CPU processes none: their DP
calls block the main thread; or the spec's `dp_overlap_efficiency`); the rest is exposed.
The pipeline (pipeline.py) turns each stage's F and B, its p2p sends apart, into the
iteration (closed forms, or the replayed schedule for unequal interleaved chunks:
pipeline_sim); sends the schedule does not wait on count only through the bubble. The
once-per-step gradient sync adds what the last backward could not hide, and ZeRO-1's
parameter all-gathers follow the optimizer step. The breakdown is the critical rank's:

  iteration = m*(compute + tp_comm + pp_comm + exposed per-micro-batch dp) + bubble
              + per-step SP gradient sync + exposed per-step dp + optimizer step
              (with the tied copies' gradient sum before it: cost_models.tied_sync)
              + ZeRO-1 all-gathers

so compute + tp_comm + dp_comm + pp_comm + bubble + optimizer == iteration_seconds
exactly (the per-step terms are those of the rank that finishes last).
MFU counts model FLOPs only, forward + backward without recomputation (Narayanan et
al. 2021 and Chowdhery et al. 2022: recompute is not useful work).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.legality import sequence_parallel_applies
from ir.plan import ParallelPlan
from ir.strategy import Schedule

from cost_models.activations import boundary_bytes
from cost_models.comm import layer_comm, p2p_s, tp_transition_s
from cost_models.common import StepConfig, layer_configs
from cost_models.compute import with_host
from cost_models.compute_profile import ComputeProfile
from cost_models.dp_copies import dp_copy_step_seconds
from cost_models.grad_accumulation import accumulation_step_seconds
from cost_models.memory import MemoryEstimate, check_plan_matches, plan_memory, rank_layers
from cost_models.model_states import bytes_per_param
from cost_models.pipeline import PipelineTime, stage_pipeline_time
from cost_models.pipeline_sim import SENDS_BLOCK, StageCost
from cost_models.step_host import (Placed, grad_accumulation_s, one_host_window,
                                   param_walk_s, placed_compute, placed_layers,
                                   step_host_per_microbatch_s, step_loop_s)
from cost_models.tied_sync import tied_sum_seconds

# Share of a compute window that overlapped data-parallel communication can hide. PyTorch
# DDP (Li et al. 2020) and FSDP overlap bucketed collectives with backward/forward; the
# communication kernels take SMs and memory bandwidth, and the first bucket only starts
# once the last layers' gradients exist, so not all of it hides. An assumption to calibrate.
DP_OVERLAP_EFFICIENCY = 0.8


@dataclass(frozen=True, slots=True)
class StageTime:
    """Seconds of one pipeline rank for one micro-batch (dp_step_s: once per iteration)."""

    rank: int
    compute_forward_s: float
    compute_backward_s: float  # recomputation included
    recompute_s: float
    tp_forward_s: float
    tp_backward_s: float
    dp_forward_s: float  # exposed
    dp_backward_s: float  # exposed
    pp_forward_s: float
    pp_backward_s: float
    dp_step_s: float  # exposed, once per iteration
    optimizer_s: float = 0.0  # the optimizer step, once per iteration
    tp_step_s: float = 0.0  # SP's partial-gradient all-reduce, once per iteration, blocking
    dp_after_step_s: float = 0.0  # ZeRO-1 all-gathers after the step, units' reduce copies
    engine_s: float = 0.0  # autograd engine starts (in compute_backward_s), step_host
    # pipelining runtime and the stage inputs' accumulations (in compute_*), step_host
    pipeline_action_s: float = 0.0
    loop_s: float = 0.0  # loop work + optimizer entry, once per step (in optimizer_s), step_host

    @property
    def forward_s(self) -> float:
        return self.compute_forward_s + self.tp_forward_s + self.dp_forward_s + self.pp_forward_s

    @property
    def backward_s(self) -> float:
        return (self.compute_backward_s + self.tp_backward_s + self.dp_backward_s
                + self.pp_backward_s)


@dataclass(frozen=True, slots=True)
class TimeBreakdown:
    compute: float
    tp_comm: float
    dp_comm: float
    pp_comm: float
    bubble: float
    optimizer: float = 0.0

    @property
    def total(self) -> float:
        return (self.compute + self.tp_comm + self.dp_comm + self.pp_comm + self.bubble
                + self.optimizer)

    def to_json(self) -> dict[str, float]:
        return {"compute": self.compute, "tp_comm": self.tp_comm, "dp_comm": self.dp_comm,
                "pp_comm": self.pp_comm, "bubble": self.bubble, "optimizer": self.optimizer}


@dataclass(frozen=True, slots=True)
class Estimate:
    model: str
    cluster: str
    plan: str  # str(plan), for people
    world_size: int
    global_batch: int
    iteration_seconds: float
    samples_per_second: float
    tflops_per_device: float
    mfu: float
    time: TimeBreakdown
    memory: MemoryEstimate
    stage_times: tuple[StageTime, ...]
    pipeline: PipelineTime
    stage_costs: tuple[StageCost, ...] = ()  # per plan stage, what `pipeline` was priced from

    def to_json(self) -> dict:
        """The `planner estimate --json` contract (issue 3), plus a few extra keys."""
        return {"model": self.model, "cluster": self.cluster, "plan": self.plan,
                "world_size": self.world_size, "global_batch": self.global_batch,
                "iteration_seconds": self.iteration_seconds,
                "samples_per_second": self.samples_per_second,
                "tflops_per_device": self.tflops_per_device, "mfu": self.mfu,
                "time": self.time.to_json(),
                "bubble_fraction": self.pipeline.bubble_fraction,
                "critical_stage": self.pipeline.critical_rank,
                "memory": self.memory.to_json()}


def overlap_efficiency(cluster: ClusterSpec) -> float:
    """The spec's fitted DP overlap efficiency, else the default assumption: on GPUs
    DP_OVERLAP_EFFICIENCY; on CPU processes 0, idle cores or not. There every DP call is
    synchronous on the main thread (`comm.dp_comm_s` prices them as `blocking_s`): FSDP2's
    `foreach_reduce` issues its reduce-scatter and the replicate all-reduce with async_op
    False (torch 2.13, `_fsdp_collectives.py`; a CPU "stream" orders nothing), its
    all-gathers likewise, and the lean host rings (`executors.host_collectives`) are
    synchronous with backward prefetch off. Measured on gpt-tiny dp2 on 2 cores: backward
    + step = plain + DP units + all of the DP traffic."""
    if cluster.dp_overlap_efficiency is not None:
        return cluster.dp_overlap_efficiency
    if cluster.host_bound:
        return 0.0
    return DP_OVERLAP_EFFICIENCY


def exposed(comm_s: float, window_s: float, efficiency: float = DP_OVERLAP_EFFICIENCY) -> float:
    """Communication left over after hiding behind `window_s` of compute."""
    return max(0.0, comm_s - efficiency * window_s)


def stage_time(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec, rank: int,
               indices: list[int], configs: Sequence[StepConfig],
               profile: ComputeProfile | None = None,
               stage_ids: Sequence[int] | None = None,
               layers: Sequence[Placed] | None = None) -> StageTime:
    """Per-micro-batch seconds of pipeline rank `rank`, holding layers `indices`, whose
    p2p sends are those of plan stages `stage_ids` (default: all the rank's stages).
    `layers`: the graph's layers as placed in the plan (`step_host.placed_layers`, the
    default): each layer's passes priced apart where they differ (`placed_compute`)."""
    per_param = bytes_per_param(configs[0].precision, configs[0].optimizer)
    layers = layers if layers is not None else placed_layers(graph, plan, cluster)
    fwd = bwd = rec = tp_f = tp_b = dp_f = dp_b = dp_step = tp_step = after_step = opt = 0.0
    parts = [0.0] * 6  # GPUs: (device, host) of forward, backward, optimizer (`LayerCompute`)
    one_run = one_host_window(plan, cluster)  # passes, reduce copies and step: one run
    # GPUs: the units' reduce copies in one run (in after_step), the layers' optimizer step
    copies_s = layers_step_s = 0.0
    accumulation_s = 0.0  # GPUs: a step's gradient accumulation kernels
    for j in indices:
        layer, strategy, config = graph.layers[j], plan.layer_strategies[j], configs[j]
        c = placed_compute(layers[j], strategy, cluster, config, profile)
        m = layer_comm(layer, strategy, cluster, config, per_param)
        fwd += c.forward_s
        bwd += c.backward_s + c.recompute_s
        rec += c.recompute_s
        if not cluster.host_bound:
            parts = [a + b for a, b in zip(parts, (
                c.forward_device_s, c.forward_host_s, c.backward_device_s, c.backward_host_s,
                c.optimizer_device_s, c.optimizer_host_s))]
            layers_step_s += c.optimizer_s
            accumulation_s += accumulation_step_seconds(layer, strategy, cluster, config,
                                                        plan.num_microbatches)
            if one_run:
                copies_s += dp_copy_step_seconds(layer, strategy, cluster, config)
        # + the tied copies' gradient sum before the step (CPU kits: cost_models.tied_sync)
        opt += c.optimizer_s + tied_sum_seconds(graph, plan, cluster, j, config)
        tp_f += m.tp_forward_s
        tp_b += m.tp_backward_s
        dp_f += m.dp_forward_s
        dp_b += m.dp_backward_s
        dp_step += m.dp_step_s
        tp_step += m.tp_step_s
        after_step += m.dp_after_step_s
        # A layout change to the next layer (other TP degree or SP): forward and backward.
        if j + 1 < len(graph.layers) and plan.stage_of(j + 1) == plan.stage_of(j):
            relayout = _relayout_s(graph, plan, cluster, j, config)
            tp_f += relayout
            tp_b += relayout
    if not cluster.host_bound:  # the host queues ahead: runs of passes compose as one
        fwd, composed_bwd, step_s, copies = gpu_runs_s(parts, copies_s, plan.num_microbatches,
                                                       one_run, cluster)
        opt += step_s - layers_step_s
        rec *= composed_bwd / bwd if bwd else 0.0
        after_step += copies - copies_s
        bwd = composed_bwd
    pp_f = pp_b = 0.0
    overlap = overlap_efficiency(cluster)
    last_stage = len(plan.stages) - 1
    mine = range(rank, len(plan.stages), plan.pp) if stage_ids is None else stage_ids
    # one backward call per stage and micro-batch, and with a pipeline its runtime's
    # actions (step_host.backward_calls, pipeline_actions)
    engine, actions, inputs = step_host_per_microbatch_s(
        cluster, plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_stages,
        tuple(mine))
    fwd += actions / 2  # one forward and one backward action
    # once a step, after the last backward with the optimizer step: the loop's own work
    # and the optimizer's entry
    loop = step_loop_s(cluster, plan.num_microbatches, last_stage in mine, plan.optimizer,
                       plan.world_size if plan.clip_grad_norm else 0)
    loop += param_walk_s(cluster, [graph.layers[j] for j in indices])  # its tensors' walk
    opt += loop
    # micro-batches 2..m add into the existing gradients: on CPU processes at the kit's
    # host figures (step_host.grad_accumulation_s); on GPUs their kernels, after the
    # passes' composition and hiding no DP traffic, as the search adds them
    # (cost_models.grad_accumulation, planner.layer_tables._price)
    bwd += engine + actions / 2 + inputs + grad_accumulation_s(
        cluster, [graph.layers[j] for j in indices], plan.num_microbatches)
    for i in mine:
        stage = plan.stages[i]
        if i < last_stage:  # forward: send this chunk's output on
            pp_f += _send_s(graph, plan, cluster, stage.last_layer, configs, stage.devices)
        # backward: send the gradient of this chunk's input back, where it has one
        if i > 0 and graph.carries_gradient(stage.first_layer - 1):
            pp_b += _send_s(graph, plan, cluster, stage.first_layer - 1, configs,
                            stage.devices)
    return StageTime(rank=rank, compute_forward_s=fwd,
                     compute_backward_s=bwd + accumulation_s / plan.num_microbatches,
                     recompute_s=rec, tp_forward_s=tp_f, tp_backward_s=tp_b,
                     dp_forward_s=exposed(dp_f, fwd, overlap),
                     dp_backward_s=exposed(dp_b, bwd, overlap),
                     pp_forward_s=pp_f, pp_backward_s=pp_b,
                     dp_step_s=exposed(dp_step, bwd, overlap), optimizer_s=opt,
                     tp_step_s=tp_step, dp_after_step_s=after_step, engine_s=engine,
                     pipeline_action_s=actions + inputs, loop_s=loop)


def gpu_runs_s(parts: Sequence[float], copies_s: float, m: int, one_window: bool,
               cluster: ClusterSpec) -> tuple[float, float, float, float]:
    """(forward and backward per micro-batch, optimizer step, reduce copies) seconds of a
    GPU rank whose layers' passes sum to `parts` (device and host seconds of forward,
    backward and optimizer step apiece, `compute.LayerCompute`). The host queues kernels
    ahead and waits only where it syncs (`step_host.one_host_window`), so a run of passes
    costs `compute.with_host` of its device and host sums (max: the device idles only
    while the host is behind). Each pass is one run; where the whole step is one
    (`one_window`: its m forwards and backwards, the units' reduce copies, which run on
    the device under the host's backward, and the optimizer step) its time is shared out
    over the terms in proportion to their own runs' times (the breakdown still adds up
    to the step)."""
    fd, fh, bd, bh, od, oh = parts
    f, b, o = with_host(fd, fh, cluster), with_host(bd, bh, cluster), with_host(od, oh, cluster)
    if not one_window:
        return f, b, o, copies_s
    runs_s = m * (f + b) + o + copies_s
    window_s = with_host(m * (fd + bd) + od + copies_s, m * (fh + bh) + oh, cluster)
    scale = window_s / runs_s if runs_s else 1.0
    return scale * f, scale * b, scale * o, scale * copies_s


def _stage_costs(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec,
                 ranks: Sequence[StageTime], configs: Sequence[StepConfig],
                 profile: ComputeProfile | None,
                 layers: Sequence[Placed] | None = None) -> list[StageCost]:
    """Per plan stage (rank r's chunk c is stage c * pp + r): compute and blocking
    collectives, and the p2p sends apart (the schedule decides whether they hold the rank)."""
    def cost(t: StageTime) -> StageCost:
        return StageCost(t.forward_s - t.pp_forward_s, t.backward_s - t.pp_backward_s,
                         t.pp_forward_s, t.pp_backward_s)
    if plan.virtual_stages == 1:
        return [cost(t) for t in ranks]
    chunks = [cost(stage_time(graph, plan, cluster, i % plan.pp,
                              list(range(stage.first_layer, stage.last_layer + 1)), configs,
                              profile, stage_ids=[i], layers=layers))
              for i, stage in enumerate(plan.stages)]
    # Exposed DP traffic is priced per rank (it hides behind the rank's whole window):
    # split each rank's totals over its chunks in proportion to the chunks' own times.
    out = []
    for i, c in enumerate(chunks):
        rank, mine = cost(ranks[i % plan.pp]), chunks[i % plan.pp::plan.pp]
        f = sum(x.forward_s for x in mine)
        b = sum(x.backward_s for x in mine)
        out.append(StageCost(rank.forward_s * c.forward_s / f if f else 0.0,
                             rank.backward_s * c.backward_s / b if b else 0.0,
                             c.send_forward_s, c.send_backward_s))
    return out


def _relayout_s(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec, j: int,
                config: StepConfig) -> float:
    a, b = plan.layer_strategies[j], plan.layer_strategies[j + 1]
    return relayout_s(graph.crossing_bytes(j), config, a.tp, b.tp,
                      sequence_parallel_applies(graph.layers[j], a),
                      sequence_parallel_applies(graph.layers[j + 1], b), cluster)


def relayout_s(crossing_bytes: float, source: StepConfig, tp_from: int, tp_to: int,
               sp_from: bool, sp_to: bool, cluster: ClusterSpec) -> float:
    """Forward seconds of re-laying out the activation after a layer for the next layer's
    (TP, SP) layout (backward costs the same; `comm.tp_transition_s`). `crossing_bytes`
    is at the graph's micro-batch; the activation re-laid out is one replica's at the
    source layer's own micro-batch (`source`: samples / its dp, as
    `ParallelPlan.layer_micro_batch`). The one definition the estimate and the search's
    transition table (`planner.layer_tables.transitions`) both price."""
    if tp_from == tp_to and sp_from == sp_to:
        return 0.0
    return tp_transition_s(crossing_bytes * source.activation_scale, tp_from, tp_to,
                           sp_from, sp_to, cluster)


def _send_s(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec, cut: int,
            configs: Sequence[StepConfig], stage_devices: int) -> float:
    s = plan.layer_strategies[cut]
    return boundary_send_s(graph.crossing_bytes(cut), configs[cut], s.tp,
                           sequence_parallel_applies(graph.layers[cut], s), cluster,
                           stage_devices)


def boundary_send_s(crossing_bytes: float, source: StepConfig, tp: int, sp: bool,
                    cluster: ClusterSpec, stage_devices: int) -> float:
    """Seconds of one p2p send across the cut after a layer laid out (`tp`, `sp`): its
    output forward, or that output's gradient back (`comm.p2p_s`). One replica's
    activation at the layer's own micro-batch (`source`, as `relayout_s`), whole on every
    TP rank, sequence-sharded under SP so each sends its 1/t share (Korthikanti et al.
    2022 sec. 4.2.2). The one definition the estimate and the search's partition program
    (`planner.layer_tables.sends`) both price."""
    return p2p_s(boundary_bytes(crossing_bytes, source, tp, sp), cluster, stage_devices)


def estimate(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec,
             profile: ComputeProfile | None = None, rank_cache: dict | None = None,
             configs: Sequence[StepConfig] | None = None) -> Estimate:
    """Time and memory of one iteration of `plan` on `cluster` (see the module docstring).
    `rank_cache`: memory walks to reuse (`cost_models.memory.plan_memory`); `configs`:
    per layer (`common.model_layer_configs` for a given model; default `layer_configs`)."""
    check_plan_matches(graph, plan, cluster)
    if plan.schedule is Schedule.INTERLEAVED and plan.virtual_stages > 1 \
            and plan.num_microbatches % plan.pp:
        raise PlannerError(f"the interleaved schedule needs the number of micro-batches "
                           f"({plan.num_microbatches}) to be a multiple of pp ({plan.pp}): "
                           "change --global-batch or --micro-batch")
    if profile is not None:
        profile.check_matches(cluster, plan.precision.compute_dtype)
    configs = configs or layer_configs(graph, plan, cluster.device)
    m = plan.num_microbatches
    layers = placed_layers(graph, plan, cluster)
    stages = tuple(stage_time(graph, plan, cluster, r, idx, configs, profile, layers=layers)
                   for r, idx in enumerate(rank_layers(plan)))
    costs = tuple(_stage_costs(graph, plan, cluster, stages, configs, profile, layers))
    pipe = stage_pipeline_time(costs, plan.pp, m, plan.schedule, plan.virtual_stages)
    # After its last backward each rank syncs what is left and steps its optimizer.
    finish = max(stages, key=lambda s: (s.tp_step_s + s.dp_step_s + s.optimizer_s
                                        + s.dp_after_step_s))
    step_sync = finish.dp_step_s + finish.dp_after_step_s
    iteration = pipe.iteration_s + finish.tp_step_s + step_sync + finish.optimizer_s
    crit = stages[pipe.critical_rank]
    breakdown = TimeBreakdown(
        compute=m * (crit.compute_forward_s + crit.compute_backward_s),
        tp_comm=m * (crit.tp_forward_s + crit.tp_backward_s) + finish.tp_step_s,
        dp_comm=m * (crit.dp_forward_s + crit.dp_backward_s) + step_sync,
        # Sends the schedule does not wait on overlap; their lag is in the bubble.
        pp_comm=m * (crit.pp_forward_s + crit.pp_backward_s) * SENDS_BLOCK[plan.schedule],
        bubble=pipe.bubble_s, optimizer=finish.optimizer_s)
    # Model FLOPs: the IR's forward + backward per sample, times the global batch.
    model_flops = (graph.flops_fwd + graph.flops_bwd) / graph.micro_batch * plan.global_batch
    world = plan.world_size
    flops_per_device = model_flops / world / iteration if iteration > 0 else 0.0
    peak = cluster.peak_flops(plan.precision.compute_dtype)
    return Estimate(
        model=graph.model, cluster=cluster.name, plan=str(plan), world_size=world,
        global_batch=plan.global_batch, iteration_seconds=iteration,
        samples_per_second=plan.global_batch / iteration if iteration > 0 else 0.0,
        tflops_per_device=flops_per_device / 1e12, mfu=flops_per_device / peak,
        time=breakdown, memory=plan_memory(graph, plan, cluster, configs, rank_cache),
        stage_times=stages, pipeline=pipe, stage_costs=costs)
