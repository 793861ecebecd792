"""Host costs a step pays per pass a pipeline rank runs, not per layer: read off the pass
order each rank runs (`pipeline_ops.rank_ops`, torch's schedules), so they follow the plan's
stages, schedule and micro-batches.

1. The autograd engine's start. Every backward figure the compute model prices leaves out
   what one `torch.autograd.backward` call costs beyond its nodes (`planner profile`'s
   `layer_profile.time_layer` and the kit's probes take it out:
   `KernelCalibration.autograd_call_host_s`). A step makes one call per backward pass: the
   plain loop's `loss.backward()` once per micro-batch (`executors.runtime`), a pipeline
   stage's `stage_backward` once per micro-batch and local stage (torch.distributed
   .pipelining). So per (stage, micro-batch):

       engine_s = backward passes of the stage in the step / m  x  autograd_call_host_s

   (e.g. 2 stages x 4 micro-batches: 8 calls, 4 per rank; without a pipeline, pp = 1, the
   plain loop runs however many stages the plan has: m calls), stretched by the core share as
   every host figure is (`compute.with_host`); 0 where the kit did not measure it (GPU
   presets, older kits) and on GPUs (the host's time hides under the queued kernels).
   Likewise, with a pipeline (pp > 1), torch's pipelining runtime's own host work per
   action (a stage's forward or backward of one micro-batch: `pipeline_probes`): per
   (stage, micro-batch) one forward and one backward action x `pipeline_action_host_s`,
   less the probe's share of an input accumulation, and, on every stage but the first,
   per backward its input's AccumulateGrad (`input_accumulations`: torch makes such a
   stage's input a leaf and `stage_backward` reads its .grad; (S - 1) / 2S of all actions
   with S stages, where the probe's two hold 1/4), in the backward.

2. Where a stage starts and ends. A layer's cold ops (`Layer.cold_distinct_ops_fwd`,
   `_bwd`, `cold_inner_ops_bwd`, with its composites' inner ops: `ir.composite_ops
   .cold_ops_fwd`, `cold_ops_bwd`) are counted at trace time against its neighbours in
   model order, and here, by the same functions, against what ran before on the rank. A stage's
   first layer's forward runs after whatever the rank ran last: its own stage's forward
   of the micro-batch before (GPipe, 1F1B's warm-up), its backward (1F1B's steady state:
   the backward ends in the stage's FIRST layer), another chunk's pass (interleaving), or,
   for the step's first forward, the previous step's last backward and the optimizer step
   (whose ops are not recorded: it is counted as that backward, as the trace-time count of
   the model's first layer is). Likewise a stage's last layer's backward. Per pass the
   warm ops are those of the passes before it on the rank (`warm_before`, layer by layer,
   nearest first, within the cache window of `ir.op_count.recent_forward_ops`: a chunk of
   one small layer leaves the chunk before it warm), and the layer's count is the mean
   over its m passes: its host time is linear in the count, so the mean count prices the
   mean pass exactly. Layers without recorded op names keep their trace-time counts.
   A forward's entry costs more right after a backward (`Layer.forward_after_backward`,
   the kit's `cold_entry_after_backward_host_s`): a stage's first layer's forwards are
   split by the pass before them in the rank's order (GPipe: only the step's first of m;
   1F1B: the first and every steady-state one; the plain loop: all), each kind priced
   apart and weighted by its share (`Placed`, `placed_compute`). The ops the trace took
   as run just before a pass (`Layer.recent_ops_fwd` / `_bwd`: the model's neighbours)
   are dropped where the rank ran other work there (`recent_ops.placed_recent_ops`),
   and a window that reaches past its stage's cut (the trace counts the model's
   neighbours, which run on another rank) is counted on the stage's layers alone
   (`recent_ops.stage_windows`).

3. What a step pays once outside its layers (`step_loop_s`; the kit's figures:
   `cost_models.step_loop_probes`). The training loop's own work
   (`executors.runtime.ProcessModel.train_step`), outside the model, the loss function,
   backward and the optimizer: each step splits the batch, counts the target, sums the
   loss (`STEP_LOOP_OPS` ops) and starts and waits on the loss's scalar all-reduce
   (`loss_sum_host_s`); per micro-batch the rank holding the loss weights it and adds it
   up (`LOSS_OPS_PER_MICROBATCH`), ops priced as forward ops (`host_op_seconds`); a kit
   that timed the real loop cold (`train_loop_host_s`, `planner.train_loop_probe`:
   Python and ops out of the caches, ~2.5x the warm ops' price) gives that figure for one
   micro-batch holding the loss, the other micro-batches' loss ops priced as above. And
   the optimizer's entry: its step runs once, right after a backward, its code and state
   out of the caches (`optimizer_entry_host_s`, measured on AdamW: Adam and AdamW
   plans; others unmeasured, 0). Once a step on the rank, x the core share; 0 on GPUs.
   A clipping plan adds its norm's blocking scalar all-reduce over the world, on GPUs
   too (`clip_all_reduce_s`).
   The loop also walks every parameter tensor of the rank (`reduce_partial_grads` over
   `module.parameters()`: ~2.5 us each inside a gpt-tiny step, 68 tensors, where the
   probe's one Linear has 2; bench/bench_step_terms.py): `param_walk_s`, per tensor the
   kit's `train_loop_param_host_s` (`planner.train_loop_probe`).

4. Gradient accumulation (`grad_accumulation_s`). Every backward figure is a step's first
   micro-batch's: its gradients None, AccumulateGrad steals each (`planner profile` and
   the kit clear them). From the second on it adds into each parameter's .grad: per
   tensor the kit's `grad_accumulate_host_s` (`step_loop_probes`) and an add kernel
   reading the gradient twice and writing it once (3 x its fp32 bytes, the TP-unsharded
   tensor: the search's stage term reads no strategy) at the kit's add bandwidth for
   the tensor's size, not priced where the kit measured no add (a profile-cluster spec:
   its DRAM copy rate, 13 GB/s here, priced gpt-tiny's adds at 2.3x what they took live,
   bench/bench_grad_accum.py); m - 1 of a step's m backwards pay it, x the core share;
   0 where not measured and on GPUs (their kernels: `grad_accumulation`).

5. Where the host waits on the device (`one_host_window`). On a GPU the host queues
   kernels and runs ahead until it syncs, so a run of passes between two syncs costs
   about max(its host seconds, its device seconds) (`estimate.stage_time`), not the sum
   of each layer's max. The plain loop (`executors.runtime.ProcessModel.train_step`, no
   pipeline) syncs only where a step starts (the batch's copies to the device, its
   work done: the step before ended in a sync) and where it ends (`float(value)`, the
   loss's `.item()`): its forwards, backwards and fused optimizer step are one run.
   fp16 loss scaling syncs between the last backward and the step (the overflow check's
   `.item()`, `executors.loss_scaling`), and an offloaded optimizer steps on the host
   after its gradients' copies back: then the step is a run of its own. With a
   pipeline each pass is priced as its own run (the schedule's waits on other ranks).

The search prices the same terms per candidate stage through these functions
(`planner.stage_host`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from ir.cluster import ClusterSpec
from ir.composite_ops import cold_ops_bwd, cold_ops_fwd
from ir.layer import Layer, LayerGraph
from ir.op_count import COLD_WINDOW_DISTINCT_OPS, recent_forward_ops
from ir.plan import ParallelPlan
from ir.strategy import LayerStrategy, Precision, Schedule

from cost_models.common import GB, StepConfig
from cost_models.compute import LayerCompute, layer_compute
from cost_models.comm import collective_s
from cost_models.compute_profile import ComputeProfile
from cost_models.grad_accumulation import ACCUMULATE_BYTES_PER_GRAD_BYTE
from cost_models.host_dispatch import host_op_seconds
from cost_models.kernel_loops import memory_gbps
from cost_models.model_states import FP32_BYTES
from cost_models.pipeline_ops import PassOp, rank_ops
from cost_models.pipeline_probes import PIPELINE_PROBE_INPUT_ACCUMULATIONS_PER_ACTION
from cost_models.recent_ops import placed_recent_ops, stage_windows


def one_host_window(plan: ParallelPlan, cluster: ClusterSpec) -> bool:
    """Whether a rank's passes and optimizer step run between two host syncs, as one
    queue of kernels (module docstring, 5): GPUs, no pipeline, no fp16 loss scaling, no
    offloaded optimizer, no embedding tables (their exchange reads counts to the host in
    forward, `executors.table_exchange`)."""
    return (not cluster.host_bound and plan.pp == 1 and plan.embeddings is None
            and plan.precision is not Precision.FP16_MIXED
            and not any(s.offload for s in plan.layer_strategies))


def engine_start_s(cluster: ClusterSpec) -> float:
    """Seconds one `torch.autograd.backward` call adds to a CPU process's step (the kit's
    `autograd_call_host_s` x the core share, as `compute.with_host` stretches host time);
    0 where not measured or where the host overlaps the device (GPUs)."""
    cal = cluster.kernel_calibration
    if cal is None or not cluster.host_bound:
        return 0.0
    return cal.autograd_call_host_s * cluster.host_share


def pipeline_action_s(cluster: ClusterSpec) -> float:
    """Seconds torch's pipelining runtime adds to a CPU process per stage action (the kit's
    `pipeline_action_host_s`, `cost_models.pipeline_probes`, x the core share), less the
    probe's share of an input accumulation (`input_accumulation_s`, priced per stage
    instead); 0 where not measured and on GPUs, as `engine_start_s`."""
    cal = cluster.kernel_calibration
    if cal is None or not cluster.host_bound or not cal.pipeline_action_host_s:
        return 0.0
    return max(0.0, cal.pipeline_action_host_s * cluster.host_share
               - PIPELINE_PROBE_INPUT_ACCUMULATIONS_PER_ACTION * input_accumulation_s(cluster))


def input_accumulation_s(cluster: ClusterSpec) -> float:
    """Seconds one pipeline stage input's AccumulateGrad adds to a CPU process's backward
    (module docstring, 1): its gradient stolen (the input is fresh each micro-batch,
    `stage_backward` clears its .grad), a node and a `detach` (`ir.stand_in.StepInput`),
    at the kit's `backward_node_host_s` + `backward_view_host_op_s` (whose probe counts
    its parameters' accumulations alike), x the core share; 0 where not measured and on
    GPUs."""
    cal = cluster.kernel_calibration
    if cal is None or not cluster.host_bound:
        return 0.0
    return (cal.backward_node_host_s + cal.backward_view_host_op_s) * cluster.host_share


# ATen ops `train_step` dispatches outside the model, its loss function, backward and the
# optimizer, counted under a dispatch mode (tests/test_step_loop_ops.py, integer targets):
# per step the target's count (ne, sum), the rank's rows (2 x lift_fresh, index_select),
# the micro-batches (2 x split), the loss total (zeros, clone, item); per micro-batch on
# the loss's rank its count (ne, sum), weight (gt, scalar_tensor, where, div, mul) and sum
# (detach, add_). The all-reduce is priced apart (`loss_sum_host_s`).
STEP_LOOP_OPS = 11
LOSS_OPS_PER_MICROBATCH = 9


# The clip's total norm (`executors.grad_clip`): one fp32 scalar, all-reduced (SUM) over
# every rank before the gradients are scaled.
CLIP_NORM_BYTES = 4


def clip_all_reduce_s(cluster: ClusterSpec, ranks: int) -> float:
    """Seconds of a clipping step's norm all-reduce over `ranks` (0: no clip, or one
    rank): blocking, on GPUs and CPU processes alike, no host read (the norm stays on the
    device; not priced: under ZeRO-Offload the coefficient's copy to the CPU gradients
    waits for the device). Alpha-beta all-reduce of 4 bytes, the cheaper of ring and tree
    (`cost_models.comm.collective_s`; Thakur et al. 2005): latency-bound."""
    return collective_s("all_reduce", CLIP_NORM_BYTES, ranks, cluster) if ranks > 1 else 0.0


def step_loop_s(cluster: ClusterSpec, m: int, holds_loss: bool, optimizer: str,
                clip_ranks: int = 0) -> float:
    """Seconds a step pays once on a rank outside its layers (module docstring, 3):
    `holds_loss`, the rank runs the last plan stage; `optimizer`, the plan's; x the core
    share as every host figure; 0 on GPUs and where the kit measured neither figure
    (older kits, GPU presets). `clip_ranks`: a clipping plan's world size, whose norm
    all-reduce every rank waits on (`clip_all_reduce_s`, priced on GPUs too)."""
    clip_s = clip_all_reduce_s(cluster, clip_ranks)
    cal = cluster.kernel_calibration
    if cal is None or not cluster.host_bound or not (
            cal.loss_sum_host_s or cal.optimizer_entry_host_s or cal.train_loop_host_s):
        return clip_s
    loss_ops = LOSS_OPS_PER_MICROBATCH * m if holds_loss else 0
    if cal.train_loop_host_s:  # measured cold around one micro-batch holding the loss
        loop_s = max(0.0, cal.train_loop_host_s
                     + (loss_ops - LOSS_OPS_PER_MICROBATCH) * host_op_seconds(cluster))
    else:  # older kits: the loop's ops warm, the all-reduce
        loop_s = (STEP_LOOP_OPS + loss_ops) * host_op_seconds(cluster) + cal.loss_sum_host_s
    entry_s = cal.optimizer_entry_host_s if optimizer.startswith("adam") else 0.0
    return (loop_s + entry_s) * cluster.host_share + clip_s


# The loop probe's model (`planner.train_loop_probe`: one Linear, weight and bias): the
# parameter tensors whose walk `train_loop_host_s` already holds.
TRAIN_LOOP_PROBE_PARAM_TENSORS = 2


def param_walk_s(cluster: ClusterSpec, layers: Sequence[Layer],
                 less_probe: bool = True) -> float:
    """Seconds a step's loop pays once on a rank walking its parameter tensors
    (`Layer.param_tensors`, tied copies included: `module.parameters()` after untie) beyond
    the loop probe's (module docstring, 3; `less_probe` False: all of them, for one of
    several pieces of a rank whose other piece takes the probe's off): per tensor the kit's
    `train_loop_param_host_s`, x the core share; 0 where not measured and on GPUs."""
    cal = cluster.kernel_calibration
    if cal is None or not cluster.host_bound or not cal.train_loop_param_host_s:
        return 0.0
    tensors = sum(layer.param_tensors for layer in layers)
    probe = TRAIN_LOOP_PROBE_PARAM_TENSORS if less_probe else 0
    # walk = (tensors - the probe's) x per-tensor seconds (planner.train_loop_probe)
    return max(0, tensors - probe) * cal.train_loop_param_host_s * cluster.host_share


def grad_accumulation_s(cluster: ClusterSpec, layers: Sequence[Layer], m: int) -> float:
    """Seconds per micro-batch (the mean over a step's m backwards) that `layers`' gradient
    accumulation adds on their rank (module docstring, 4)."""
    if m == 1 or not accumulation_priced(cluster):
        return 0.0
    cal, total_s = cluster.kernel_calibration, 0.0
    adds_measured = any(p.kernel == "add" for p in cal.memory_kernels)
    for layer in layers:
        tensors = layer.param_tensors  # tied copies too
        if not tensors:
            continue
        moved_bytes = ACCUMULATE_BYTES_PER_GRAD_BYTE * FP32_BYTES * (layer.params
                                                                     + layer.tied_params)
        total_s += tensors * cal.grad_accumulate_host_s
        if adds_measured:
            gbps = memory_gbps(cal, "add", "float32", moved_bytes / tensors, cluster.hbm_gbps)
            total_s += moved_bytes / (gbps * GB)
    return total_s * (m - 1) / m * cluster.host_share


def accumulation_priced(cluster: ClusterSpec) -> bool:
    """Whether `cluster`'s kit prices gradient accumulation (a CPU kit that measured it)."""
    cal = cluster.kernel_calibration
    return cal is not None and cluster.host_bound and cal.grad_accumulate_host_s > 0


def backward_calls(schedule: Schedule, pp: int, m: int, v: int) -> dict[int, int]:
    """Plan stage -> the `torch.autograd.backward` calls it makes in one step: one per
    backward pass of the schedule (module docstring, 1)."""
    return {stage: b for stage, (_, b) in passes_per_stage(schedule, pp, m, v).items()}


def pipeline_actions(schedule: Schedule, pp: int, m: int, v: int) -> dict[int, int]:
    """Plan stage -> the actions torch's pipelining runtime runs for it in one step (its
    forward and backward passes); none without a pipeline (pp 1: the plain loop)."""
    if pp == 1:
        return {}
    return {stage: f + b for stage, (f, b) in passes_per_stage(schedule, pp, m, v).items()}


def input_accumulations(schedule: Schedule, pp: int, m: int, v: int) -> dict[int, int]:
    """Plan stage -> its input's AccumulateGrads in one step: one per backward pass of
    every stage but the first (the model's input needs no gradient); none without a
    pipeline (module docstring, 1)."""
    if pp == 1:
        return {}
    return {stage: b for stage, (_, b) in passes_per_stage(schedule, pp, m, v).items()
            if stage > 0}


def passes_per_stage(schedule: Schedule, pp: int, m: int, v: int) -> dict[int, tuple[int, int]]:
    """Plan stage -> (forward, backward) passes in one step, as the executor runs them."""
    return {stage: (f, b) for stage, f, b in _passes(schedule, pp, m, v)}


def step_host_per_microbatch_s(cluster: ClusterSpec, schedule: Schedule, pp: int, m: int,
                               v: int, stages: Sequence[int]) -> tuple[float, float, float]:
    """(engine, actions, input accumulations) seconds per micro-batch that plan stages
    `stages` (one rank's) add: the engine starts (`backward_calls`, all in backward), the
    pipelining runtime's actions (`pipeline_actions`, one forward and one backward action
    each: half in each pass) and the stage inputs' AccumulateGrads (`input_accumulations`,
    all in backward). `cost_models.estimate.stage_time` and the search
    (`planner.stage_host`) both add these."""
    engine, action = engine_start_s(cluster), pipeline_action_s(cluster)
    accumulate = input_accumulation_s(cluster)
    if not engine and not action and not accumulate:
        return 0.0, 0.0, 0.0
    calls = backward_calls(schedule, pp, m, v)
    actions = pipeline_actions(schedule, pp, m, v)
    inputs = input_accumulations(schedule, pp, m, v)
    return (engine * sum(calls.get(i, 0) for i in stages) / m,
            action * sum(actions.get(i, 0) for i in stages) / m,
            accumulate * sum(inputs.get(i, 0) for i in stages) / m)


@functools.lru_cache(maxsize=256)
def _passes(schedule: Schedule, pp: int, m: int, v: int) -> tuple[tuple[int, int, int], ...]:
    if pp == 1:  # the plain loop, whatever the stages (`executors.apply`: no schedule)
        return ((0, m, m),)
    counts: dict[int, list[int]] = {}
    for rank in range(pp):
        for op in rank_ops(schedule, pp, rank, m, v):
            counts.setdefault(op.chunk * pp + rank, [0, 0])[0 if op.forward else 1] += 1
    return tuple((stage, f, b) for stage, (f, b) in sorted(counts.items()))


def warm_before(ops: Sequence[PassOp], i: int, spans: Sequence[Sequence[Layer]],
                pp: int, rank: int) -> frozenset[str]:
    """The ops warm when pass `ops[i]` of rank `rank` starts: those of the passes before it
    in the step on the rank, layer by layer in the order they ran, nearest first (a forward
    ends in its stage's last layer, a backward in its first), as far back as the window of
    `recent_forward_ops` reaches; for the step's first pass, the step before's last pass
    alone (the optimizer step ran since, its ops unrecorded: as the trace-time count of
    the model's first layer). `spans`: each plan stage's layers."""
    names: list[frozenset[str]] = []
    ran: set[str] = set()
    for op in ([ops[-1]] if i == 0 else ops[i - 1::-1]):
        span = spans[op.chunk * pp + rank]
        for layer in (span[::-1] if op.forward else span):
            names.append(layer.forward_overloads if op.forward else layer.backward_overloads)
            ran |= names[-1]
            if len(ran) >= COLD_WINDOW_DISTINCT_OPS:  # the window ends here
                return recent_forward_ops(names) or frozenset()
    return recent_forward_ops(names) or frozenset()


def prices_cold_ops(cluster: ClusterSpec) -> bool:
    """Whether `cluster`'s kit prices cold ops in either pass, a forward's entry after a
    backward apart or cold kernel code (the recent ops' credit, `placed_recent_ops`; GPU presets
    and older kits price none: then no count or order moves a time, and `placed_layers`
    need not run)."""
    cal = cluster.kernel_calibration
    return cal is not None and (cal.cold_op_host_s > 0 or cal.cold_backward_op_host_s > 0
                                or cal.cold_entry_after_backward_host_s > 0
                                or bool(cal.cold_kernels))  # `placed_recent_ops`


# A layer's passes as placed in a plan: (share of its passes, the layer as those see it).
Placed = tuple[tuple[float, Layer], ...]


def placed_layers(graph: LayerGraph, plan: ParallelPlan,
                  cluster: ClusterSpec | None = None) -> list[Placed]:
    """Per layer of `graph`, its passes as the plan runs them: each stage's first layer's
    forwards and last layer's backwards with their cold ops counted against what runs
    before them on their rank (module docstring, 2), and the first layer's forwards split
    by whether a backward ran just before (`Layer.forward_after_backward`: under GPipe
    only a step's first forward, under 1F1B every forward after the warm-up); as traced
    where `cluster` prices none of it (`prices_cold_ops`)."""
    layers = list(graph.layers)
    out: list[Placed] = [((1.0, layer),) for layer in layers]
    if cluster is not None and not prices_cold_ops(cluster):
        return out
    stages, v = plan.stages, plan.virtual_stages
    if plan.pp == 1:  # the plain loop runs the model whole (`executors.apply`)
        stages, v = (dataclasses.replace(plan.stages[0], last_layer=len(layers) - 1),), 1
    spans = {i: (s.first_layer, s.last_layer) for i, s in enumerate(stages)}
    for rank in range(plan.pp):
        for j, placed in place_rank(layers, spans, plan.schedule, plan.pp, rank,
                                    plan.num_microbatches, v).items():
            out[j] = placed
    return out


def place_rank(layers: Sequence[Layer], spans: dict[int, tuple[int, int]],
               schedule: Schedule, pp: int, rank: int, m: int, v: int) -> dict[int, Placed]:
    """The first and last layers of the stages rank `rank` runs, placed (`placed_layers`):
    per pass the cold ops against `warm_before`, the mean over the passes (host time is
    linear in the count: the mean count prices the mean pass), forwards apart by whether
    a backward ran just before them (the step's first after the step before's last, a
    backward) and, after a forward, whether that forward's last layer ran the same
    forward ops (`Layer.same_code_before`: the trace's is the layer before in the model).
    `spans`: (first, last) layer of each plan stage the rank runs (stage
    chunk * pp + rank); the search passes one candidate stage (`planner.stage_host`)."""
    ops = rank_ops(schedule, pp, rank, m, v)
    lists = {stage: layers[a:b + 1] for stage, (a, b) in spans.items()}
    # first layer -> (after a backward, same code before) -> counts
    forwards: dict[int, dict[tuple[bool, bool], list[int]]] = {}
    backwards: dict[int, list[dict | None]] = {}  # last layer -> `cold_ops_bwd`s
    # last layers whose every backward follows its own stage's forward (`placed_recent_ops`)
    after_own: dict[int, bool] = {}
    for i, op in enumerate(ops):
        first, last = spans[op.chunk * pp + rank]
        where = first if op.forward else last
        names = layers[where].forward_overloads if op.forward else layers[where].backward_overloads
        warm = warm_before(ops, i, lists, pp, rank) if names else None
        # the trace's counts (`ir.composite_ops`), against what ran before on the rank
        count = (None if warm is None else cold_ops_fwd(layers[where], warm) if op.forward
                 else cold_ops_bwd(layers[where], warm))
        if op.forward:  # ops[-1], before the step's first, is the step before's last backward
            before = ops[i - 1]
            # after a forward, the layer just before on the rank is that stage's last
            # (`Layer.same_code_before`; after a backward it prices nothing)
            same = (layers[where].same_code_before if not before.forward or not names else
                    layers[spans[before.chunk * pp + rank][1]].forward_overloads == names)
            forwards.setdefault(where, {}).setdefault((not before.forward, same), []).append(count)
        else:
            backwards.setdefault(where, []).append(count)
            before = ops[i - 1]
            after_own[where] = after_own.get(where, True) and before.forward and \
                before.chunk == op.chunk
    clipped = {j: fields for stage, (a, b) in spans.items() if stage % pp == rank
               for j, fields in stage_windows(layers, a, b).items()}
    out: dict[int, Placed] = {}
    for j in sorted(set(forwards) | set(backwards) | set(clipped)):
        layer = placed_recent_ops(dataclasses.replace(layers[j], **clipped.get(j, {})), j,
                            len(layers), j in forwards, j in backwards, after_own.get(j, True))
        if j in backwards:  # layers without recorded op names keep their trace-time counts
            layer = dataclasses.replace(layer, **{field: _mean(
                [None if c is None else c[field] for c in backwards[j]], getattr(layer, field))
                for field in ("cold_distinct_ops_bwd", "cold_inner_ops_bwd")})
        groups = forwards.get(j)
        if not groups:
            out[j] = ((1.0, layer),)
            continue
        total = sum(len(counts) for counts in groups.values())
        out[j] = tuple((len(counts) / total, dataclasses.replace(
            layer, forward_after_backward=after, same_code_before=same,
            cold_distinct_ops_fwd=_mean(counts, layer.cold_distinct_ops_fwd)))
            for (after, same), counts in sorted(groups.items()))
    return out


def _mean(counts: list[int | None], traced: float) -> float:
    return sum(traced if c is None else c for c in counts) / len(counts)


def placed_compute(placed: Placed, strategy: LayerStrategy, cluster: ClusterSpec,
                   config: StepConfig, profile: ComputeProfile | None = None) -> LayerCompute:
    """`compute.layer_compute` of a placed layer: the mean over its passes' shares."""
    if len(placed) == 1:
        return layer_compute(placed[0][1], strategy, cluster, config, profile)
    parts = [(share, layer_compute(layer, strategy, cluster, config, profile))
             for share, layer in placed]
    return LayerCompute(*(sum(share * getattr(c, f.name) for share, c in parts)
                          for f in dataclasses.fields(LayerCompute)))
