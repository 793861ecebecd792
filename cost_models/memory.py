"""Per-rank peak memory of a plan: model states + activations in flight + buffers + overhead.

For each pipeline rank we add up its layers (all the model chunks it holds):

  params, grads, optimizer   model_states.py (ZeRO accounting, TP divides TP-able params)
  activations                activations.py per micro-batch x micro-batches in flight
                             (pipeline.py: GPipe m, 1F1B p - r, interleaved)
  buffers                    transient: one checkpointed layer's recompute working set,
                             the gradients flowing through the layer in backward, ZeRO-3
                             gathered units, gradient-reduction buckets, optimizer-step
                             temporaries
  overhead                   the cluster's fixed per-device runtime memory

and take the peak over the phases of a step. With gradient accumulation (m > 1) the
gradients of earlier micro-batches stay while later ones run forward, so the peak is the
plain sum of everything. With one micro-batch (m = 1) gradients are born as
activations die (PyTorch frees them at zero_grad(set_to_none=True)), so we walk the
backward pass layer by layer:

  live(k) = params + optimizer + sum_{j<=k} kept_j + sum_{j>=k} grads_j + transient_k

and also check the optimizer step (params + grads + optimizer + its temporaries).
The breakdown reported is the one at the peak, so its parts sum to `peak_bytes`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import Layer, LayerGraph
from ir.plan import ParallelPlan
from ir.strategy import Checkpoint, DPMode, LayerStrategy

from cost_models.activations import LayerActivations, layer_activations
from cost_models.common import GiB, MiB, StepConfig, layer_configs
from cost_models.model_states import (FP32_BYTES, OPTIMIZER_MOMENTS, BytesPerParam,
                                      ModelStates, bytes_per_param, gathered_param_bytes,
                                      largest_param_tensor, layer_model_states,
                                      tp_local_params)
from cost_models.pipeline import microbatches_in_flight

# torch DDP's default bucket_cap_mb: gradients are reduced in buckets of this size.
DP_BUCKET_BYTES = 25 * MiB
# One bucket being filled by backward while the previous one is on the wire.
DP_BUCKETS_IN_FLIGHT = 2
# FSDP/ZeRO-3 holds the unit it computes plus the prefetched next one (forward_prefetch).
ZERO3_UNITS_IN_FLIGHT = 2
# PyTorch's single-tensor Adam (the CPU default) makes two parameter-sized temporaries
# (sqrt(v), then / bias correction) for one tensor at a time; the foreach path (GPU
# default) makes one moment-sized temporary for all tensors at once.
ADAM_SINGLE_TENSOR_TEMPORARIES = 2
ADAM_FOREACH_TEMPORARIES = 1


@dataclass(frozen=True, slots=True)
class LayerMemory:
    """Everything the stage combiner needs from one layer (one rank, one micro-batch)."""

    states: ModelStates
    activations: LayerActivations
    gather_unit_bytes: float  # ZeRO-3: the layer's parameters gathered over DP (else 0)
    unsharded_grad_bytes: float  # ZeRO-2/3: the layer's gradient before reduce-scatter
    largest_tensor_params: float  # for the single-tensor optimizer's temporaries
    dp_replicated_grads: float  # gradient bytes reduced through DDP buckets
    fp32_moment_bytes: float  # one fp32 copy of the rank's optimizer-sharded parameters


def layer_memory(layer: Layer, strategy: LayerStrategy, config: StepConfig,
                 per_param: BytesPerParam | None = None) -> LayerMemory:
    """Cheap per-(layer, strategy) memory figures; combine them with `combine_stage`."""
    if per_param is None:
        per_param = bytes_per_param(config.precision, config.optimizer)
    states = layer_model_states(layer, strategy, per_param)
    sharded = strategy.dp > 1
    mode = strategy.dp_mode
    gather = gathered_param_bytes(layer, strategy, per_param) \
        if sharded and mode is DPMode.ZERO3 else 0.0
    local = tp_local_params(layer.params, layer.tp_params, strategy.tp)
    unsharded_grads = local * per_param.grads \
        if sharded and mode in (DPMode.ZERO2, DPMode.ZERO3) else 0.0
    bucketed = states.grads if sharded and mode in (DPMode.REPLICATE, DPMode.ZERO1) else 0.0
    moment = states.optimizer * FP32_BYTES / per_param.optimizer if per_param.optimizer else 0.0
    return LayerMemory(states=states, activations=layer_activations(layer, strategy, config),
                       gather_unit_bytes=gather, unsharded_grad_bytes=unsharded_grads,
                       largest_tensor_params=largest_param_tensor(layer) / strategy.tp,
                       dp_replicated_grads=bucketed, fp32_moment_bytes=moment)


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak memory of one pipeline rank and its parts at that peak (bytes)."""

    stage: int  # pipeline rank
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int
    overhead: int
    peak_bytes: int
    phase: str  # when the peak happens: "forward", "backward" or "optimizer"
    microbatches_in_flight: float

    def breakdown(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "buffers": self.buffers,
                "overhead": self.overhead}

    def to_json(self) -> dict:
        return {"stage": self.stage, "peak_bytes": self.peak_bytes,
                "breakdown": self.breakdown(), "phase": self.phase,
                "microbatches_in_flight": self.microbatches_in_flight}


def optimizer_step_temp_bytes(layers: Sequence[LayerMemory], optimizer: str,
                              foreach: bool) -> float:
    """Temporaries of one optimizer step (PyTorch's Adam/AdamW implementations)."""
    if OPTIMIZER_MOMENTS.get(optimizer, 0) < 2:
        return 0.0  # SGD (with or without momentum, no weight decay) updates in place
    if foreach:
        return ADAM_FOREACH_TEMPORARIES * sum(l.fp32_moment_bytes for l in layers)
    biggest = max((l.largest_tensor_params for l in layers), default=0.0)
    return ADAM_SINGLE_TENSOR_TEMPORARIES * biggest * FP32_BYTES


def combine_stage(layers: Sequence[LayerMemory], *, stage: int, in_flight: float,
                  num_microbatches: int, overhead_bytes: int, optimizer: str,
                  foreach: bool) -> StageMemory:
    """Peak memory of one pipeline rank from its layers' figures (execution order)."""
    params = sum(l.states.params for l in layers)
    grads = sum(l.states.grads for l in layers)
    opt = sum(l.states.optimizer for l in layers)
    kept = sum(l.activations.kept_bytes for l in layers)
    # Buffers alive for a whole phase, wherever the peak is.
    zero3 = ZERO3_UNITS_IN_FLIGHT * max((l.gather_unit_bytes for l in layers), default=0.0)
    reduce_unit = max((l.unsharded_grad_bytes for l in layers), default=0.0)
    buckets = min(DP_BUCKETS_IN_FLIGHT * DP_BUCKET_BYTES,
                  sum(l.dp_replicated_grads for l in layers))
    # Optimizer step: all states plus the step's temporaries.
    step_temp = optimizer_step_temp_bytes(layers, optimizer, foreach)
    candidates = [(params + grads + opt + step_temp + overhead_bytes, "optimizer",
                   grads, 0.0, step_temp)]
    # End of forward: all kept activations, no gradients yet unless accumulated.
    accumulated = grads if num_microbatches > 1 else 0.0
    fwd_buffers = zero3
    candidates.append((params + opt + accumulated + in_flight * kept + fwd_buffers
                       + overhead_bytes, "forward", accumulated, in_flight * kept,
                       fwd_buffers))
    # Backward, layer by layer from the last.
    before = kept * in_flight  # activations of all micro-batches in flight
    grads_done = accumulated
    for l in reversed(layers):
        if num_microbatches == 1:
            grads_done += l.states.grads
        acts = l.activations
        # Recomputed activations (checkpointing), gradients entering/leaving the layer,
        # gathered ZeRO-3 units, the unsharded gradient before its reduce-scatter, buckets.
        transient = acts.recompute_bytes + acts.grad_flow_bytes + zero3 + reduce_unit + buckets
        candidates.append((params + opt + grads_done + before + transient + overhead_bytes,
                           "backward", grads_done, before, transient))
        before -= acts.kept_bytes
    peak, phase, g, a, buf = max(candidates, key=lambda c: c[0])
    return StageMemory(stage=stage, params=round(params), grads=round(g),
                       optimizer=round(opt), activations=round(a), buffers=round(buf),
                       overhead=overhead_bytes,
                       peak_bytes=round(params) + round(g) + round(opt) + round(a)
                       + round(buf) + overhead_bytes,
                       phase=phase, microbatches_in_flight=in_flight)


# ---- a whole plan -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Per-rank memory of a plan: one entry per pipeline rank."""

    stages: tuple[StageMemory, ...]
    device_bytes: int

    @property
    def peak_bytes(self) -> int:
        return max(s.peak_bytes for s in self.stages)

    @property
    def worst_stage(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.peak_bytes)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.device_bytes

    def shortfall(self) -> str:
        """'' when it fits, else 'does not fit: needs X GiB of Y GiB on stage S'."""
        if self.fits:
            return ""
        worst = self.worst_stage
        return (f"does not fit: needs {worst.peak_bytes / GiB:.1f} GiB of "
                f"{self.device_bytes / GiB:.1f} GiB on stage {worst.stage}")

    def to_json(self) -> dict:
        return {"peak_bytes": self.peak_bytes, "device_bytes": self.device_bytes,
                "fits": self.fits, "stages": [s.to_json() for s in self.stages]}


def rank_layers(plan: ParallelPlan) -> list[list[int]]:
    """Layer indices each pipeline rank holds, in execution order (rank r holds stages
    r, r + p, r + 2p, ... under interleaving)."""
    pp = plan.pp
    out: list[list[int]] = [[] for _ in range(pp)]
    for i, stage in enumerate(plan.stages):
        out[i % pp].extend(range(stage.first_layer, stage.last_layer + 1))
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


def plan_memory(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec,
                configs: Sequence[StepConfig] | None = None) -> MemoryEstimate:
    """Peak memory per pipeline rank of `plan` for `graph` on `cluster`."""
    check_plan_matches(graph, plan, cluster)
    configs = configs or layer_configs(graph, plan, cluster.device)
    config = configs[0]
    per_param = bytes_per_param(config.precision, config.optimizer)
    foreach = device_uses_foreach(cluster.device)
    stages = []
    for rank, indices in enumerate(rank_layers(plan)):
        layers = [layer_memory(graph.layers[j], plan.layer_strategies[j], configs[j], per_param)
                  for j in indices]
        shared = shared_checkpoint_inputs(graph, plan, indices, configs)
        for j, nbytes in shared_boundary_saves(graph, plan, indices, configs).items():
            shared[j] = shared.get(j, 0.0) + nbytes
        layers = [_without_shared(mem, shared.get(j, 0.0)) for mem, j in zip(layers, indices)]
        in_flight = microbatches_in_flight(plan.schedule, plan.pp, rank,
                                           plan.num_microbatches, plan.virtual_stages)
        stages.append(combine_stage(layers, stage=rank, in_flight=in_flight,
                                    num_microbatches=plan.num_microbatches,
                                    overhead_bytes=cluster.runtime_overhead_bytes,
                                    optimizer=config.optimizer, foreach=foreach))
    return MemoryEstimate(tuple(stages), cluster.device_memory_bytes)


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
            sp = strategy.sequence_parallel
            out[j] = duplicate * configs[j].activation_scale / (strategy.tp if sp else 1)
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
        if a.checkpoint is Checkpoint.FULL or (a.tp, a.sequence_parallel) != (
                b.tp, b.sequence_parallel):
            continue
        kept_input = graph.layers[j].input_bytes if b.checkpoint is Checkpoint.FULL \
            else graph.layers[j].saved_input_bytes
        overlap = min(graph.layers[j - 1].saved_output_bytes, kept_input)
        if overlap:
            out[j] = overlap * configs[j].activation_scale / (b.tp if b.sequence_parallel else 1)
    return out


def _without_shared(mem: LayerMemory, shared_bytes: float) -> LayerMemory:
    if not shared_bytes:
        return mem
    acts = dataclasses.replace(mem.activations,
                               kept_bytes=max(0.0, mem.activations.kept_bytes - shared_bytes))
    return dataclasses.replace(mem, activations=acts)


def device_uses_foreach(device: str) -> bool:
    """PyTorch optimizers default to the foreach path on accelerators, not on CPU."""
    return device.lower() != "cpu"
