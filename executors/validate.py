"""Everything the executor cannot run is rejected here, before any process group work.

`check_plan` raises `PlannerError` naming the layer (or stage) and the fix; it only reads
the model, the plan and the layer IR, so every rank reaches the same verdict.

What the executor supports, beyond the plan's own invariants:
  - every pipeline stage has the same number of devices (ranks pair up across stages);
  - a layer's TP degree divides its stage's devices; TP and SP as `tensor_parallel`
    allows (`tp_problem`); a layer with tp > 1 and no TP modules runs replicated;
  - the global micro-batch (global_batch / num_microbatches) divides by every layer's dp;
  - consecutive layers (also across a stage boundary) change TP degree only as
    `ir.legality.layout_change_problem` allows (the search obeys the same rule);
  - pipelines: stage boundaries at the layer IR's cut points, no root-level or merged
    layers (`pipeline.cut_problem`), a schedule pipelining can run, the stages of one
    pipeline rank reading their inputs in one layout; with example inputs, every stage
    also runs under fake tensors with the other stages stood in for
    (`pipeline.StageAnalysis`);
  - every parameter belongs to some layer (or aliases one a layer holds, `executors.tied`).
"""

from __future__ import annotations

from torch import nn

from executors.layout import Layout
from executors.mesh import ParallelDims
from executors.pipeline import StageAnalysis, cut_problem, rank_stages, schedule_problem
from executors.tensor_parallel import tp_problem
from executors.tied import alias_problem
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.legality import (input_layout_problem, layout_change_problem, layer_module_problem,
                         sequence_parallel_applies)
from ir.plan import ParallelPlan


def layer_layout(plan: ParallelPlan, graph: LayerGraph, j: int) -> Layout:
    """How layer j's activations are spread over its stage's ranks."""
    s = plan.layer_strategies[j]
    devices = plan.stages[plan.stage_of(j)].devices
    return Layout(devices // s.tp, s.tp, sequence_parallel_applies(graph.layers[j], s))


def parallel_dims(plan: ParallelPlan, world_size: int) -> ParallelDims:
    if len(plan.stages) % plan.virtual_stages:
        raise PlannerError(f"{len(plan.stages)} stages do not split into virtual_stages="
                           f"{plan.virtual_stages} chunks per pipeline rank")
    devices = {s.devices for s in plan.stages}
    if len(devices) > 1:
        listing = ", ".join(f"stage {i}: {s.devices}" for i, s in enumerate(plan.stages))
        raise PlannerError(f"the executor pairs ranks across pipeline stages, so every stage "
                           f"needs the same number of devices ({listing})")
    tps = tuple(sorted({s.tp for s in plan.layer_strategies}))
    return ParallelDims(world_size=world_size, pp=plan.pp, stage_devices=devices.pop(),
                        tp_degrees=tps)


def _module(model: nn.Module, name: str) -> nn.Module:
    try:
        return model.get_submodule(name) if name else model
    except AttributeError:
        raise PlannerError(f"layer {name!r} of the layer IR is not a module of this model; "
                           "trace the model the plan was made for") from None


def check_plan(model: nn.Module, plan: ParallelPlan, graph: LayerGraph, world_size: int,
               example_inputs: dict | None = None,
               analysis: StageAnalysis | None = None) -> ParallelDims:
    """Reject what cannot run; return the run's degrees. `analysis`: a `StageAnalysis` of
    `model` (and `graph`'s layers) that the checks of several plans share, so that a
    pipeline stage (layer range) several plans cut alike runs under fake tensors once."""
    names = [layer.name for layer in graph.layers]  # all a StageAnalysis reads of a graph
    if analysis is not None and (analysis.source() is not model
                                 or names != [layer.name for layer in analysis.graph.layers]):
        raise ValueError("check_plan: the StageAnalysis given is of another model or layers")
    if len(plan.layer_strategies) != len(graph.layers):
        raise PlannerError(f"the plan has {len(plan.layer_strategies)} layer strategies but "
                           f"{graph.model} has {len(graph.layers)} layers: plan for this model")
    dims = parallel_dims(plan, world_size)
    problem = layer_module_problem(graph)
    if problem:
        raise PlannerError(problem)
    micro = plan.global_batch // plan.num_microbatches
    if plan.global_batch % plan.num_microbatches:
        raise PlannerError(f"global batch {plan.global_batch} is not divisible by "
                           f"num_microbatches {plan.num_microbatches}")
    for layer, s in zip(graph.layers, plan.layer_strategies):
        module = _module(model, layer.name)
        if micro % s.dp:
            raise PlannerError(f"layer {layer.name}: a global micro-batch of {micro} samples "
                               f"does not split over dp={s.dp}")
        problem = tp_problem(layer, module, s, graph.seq_len)
        if problem:
            raise PlannerError(problem)
    for j in range(1, len(graph.layers)):
        problem = layout_change_problem(graph, j, plan.layer_strategies[j - 1].tp,
                                        plan.layer_strategies[j].tp)
        if problem:
            raise PlannerError(problem)
    tps = [s.tp for s in plan.layer_strategies]
    for stage in plan.stages:  # the model's inputs reach a stage split as its first layer
        first = stage.first_layer
        for j in range(first + 1, stage.last_layer + 1):
            problem = input_layout_problem(graph, j, first, tps[first], tps[j])
            if problem:
                raise PlannerError(problem)
    problem = alias_problem(model, graph)  # every parameter belongs to some layer
    if problem:
        raise PlannerError(problem)
    if plan.pp > 1:
        _check_pipeline(model, plan, graph, example_inputs, analysis)
    return dims


def _check_pipeline(model: nn.Module, plan: ParallelPlan, graph: LayerGraph,
                    example_inputs: dict | None, analysis: StageAnalysis | None) -> None:
    problem = cut_problem(graph, plan) or schedule_problem(plan)
    if problem:
        raise PlannerError(problem)
    for pp_rank in range(plan.pp):  # a rank's stages share the inputs it is given
        stages = rank_stages(plan, pp_rank)
        layouts = [layer_layout(plan, graph, plan.stages[s].first_layer).full_sequence
                   for s in stages]
        if len(set(layouts)) > 1:
            raise PlannerError(f"pipeline stages {stages} run on the same ranks but their "
                               f"first layers lay the batch out differently "
                               f"({', '.join(map(str, layouts))}); give them the same tp")
    if example_inputs is not None:
        (analysis or StageAnalysis(model, graph)).prepare(example_inputs, plan)
