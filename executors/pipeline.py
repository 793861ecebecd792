"""Pipeline parallelism: split the model into stage modules and run a pipelining schedule.

A stage module is the whole model with everything outside the stage removed, torchtitan
style: a top-level layer outside the stage is set to None and a block outside it is
deleted from its top-level `nn.ModuleDict` (the zoo models' forward skips None modules
and iterates the blocks that are left, taking / returning hidden states). Parameter
names stay those of the full model. A rank holding several stages (interleaved 1F1B:
stages r, r + pp, r + 2pp, ...) gets a deep copy per stage.

Each stage module is wrapped in a `torch.distributed.pipelining.PipelineStage` on the
pipeline process group (the ranks with the same position in every stage), and the plan's
schedule runs `num_microbatches` micro-batches per step:

    gpipe        ScheduleGPipe            all forwards, then all backwards
    1f1b         Schedule1F1B             one forward, one backward (needs micro-batches >= stages)
    interleaved  ScheduleInterleaved1F1B  1F1B over virtual stages (Narayanan et al. 2021)

The loss runs on the last stage, already weighted by the share of the global batch's
counted targets that its micro-batch holds (`executors.runtime`: the schedule hands the
loss each micro-batch's target, so the count comes from it) so that summed gradients
equal those of the global-batch mean (`scale_grads=False`: the schedule does not rescale
them again).
"""

from __future__ import annotations

import copy
import inspect
from typing import Callable

import torch
from torch import nn
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B)

from ir.layer import LayerGraph
from ir.plan import ParallelPlan
from ir.strategy import Schedule


def rank_stages(plan: ParallelPlan, pp_rank: int) -> list[int]:
    """Stage indices pipeline rank `pp_rank` holds, in order (r, r + pp, ...)."""
    return [s for s in range(len(plan.stages)) if s % plan.pp == pp_rank]


def stage_layers(plan: ParallelPlan, stage_index: int) -> list[int]:
    stage = plan.stages[stage_index]
    return list(range(stage.first_layer, stage.last_layer + 1))


def pruning_problem(model: nn.Module, graph: LayerGraph) -> str | None:
    """Why the model cannot be cut into stage modules, or None."""
    children = dict(model.named_children())
    layer_names = {layer.name for layer in graph.layers}
    for layer in graph.layers:
        top, _, rest = layer.name.partition(".")
        if not layer.name:
            return "a pipeline cannot cut root-level glue layers"
        if not rest and top in children:
            continue
        if (top in children and isinstance(children[top], nn.ModuleDict) and "." not in rest
                and rest in children[top]):
            continue
        return (f"layer {layer.name}: a pipeline stage is made by setting top-level modules "
                "to None and deleting entries of a top-level nn.ModuleDict (torchtitan style); "
                f"{layer.name} is neither; use pp=1 for this model")
    for name, child in children.items():
        if child is None or name in layer_names:
            continue
        contains_layers = any(f"{name}.{key}" in layer_names for key, _ in child.named_children())
        if not contains_layers and any(True for _ in child.parameters()):
            return (f"module {name} holds parameters but is in no layer, so no pipeline stage "
                    "owns it; use pp=1 for this model")
    return None


def build_stage_module(model: nn.Module, graph: LayerGraph, layers: list[int],
                       make_copy: bool) -> nn.Module:
    """`model` (or a deep copy) with every layer outside `layers` removed."""
    module = copy.deepcopy(model) if make_copy else model
    keep = {graph.layers[j].name for j in layers}
    every = {layer.name for layer in graph.layers}
    for name, child in list(module.named_children()):
        if name in every:
            if name not in keep:
                setattr(module, name, None)
        elif isinstance(child, nn.ModuleDict):
            for key in list(child.keys()):
                path = f"{name}.{key}"
                if path in every and path not in keep:
                    del child[key]
    return module


def positional_inputs(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple | None:
    """The inputs in the order of `model.forward`'s parameters (pipelining passes the first
    stage's inputs positionally), or None if they are not a prefix of them."""
    names = [p.name for p in inspect.signature(model.forward).parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    given = [n for n in names if n in inputs]
    if set(given) != set(inputs) or given != names[:len(given)]:
        return None
    return tuple(inputs[n] for n in given)


def build_schedule(plan: ParallelPlan, stage_modules: list[tuple[int, nn.Module]],
                   device: torch.device, group, loss_fn: Callable):
    """PipelineStage per (stage index, module) of this rank, and the plan's schedule."""
    stages = [PipelineStage(module, index, len(plan.stages), device, group=group)
              for index, module in stage_modules]
    n = plan.num_microbatches
    if plan.schedule is Schedule.GPIPE:
        return ScheduleGPipe(stages[0], n, loss_fn=loss_fn, scale_grads=False), stages
    if plan.schedule is Schedule.ONE_F_ONE_B:
        return Schedule1F1B(stages[0], n, loss_fn=loss_fn, scale_grads=False), stages
    return ScheduleInterleaved1F1B(stages, n, loss_fn=loss_fn, scale_grads=False), stages


def schedule_problem(plan: ParallelPlan) -> str | None:
    """Why torch.distributed.pipelining cannot run this schedule, or None."""
    n, stages, pp = plan.num_microbatches, len(plan.stages), plan.pp
    if plan.schedule is Schedule.ONE_F_ONE_B and n < stages:
        return (f"1F1B needs num_microbatches >= stages, got {n} < {stages}; raise "
                "num_microbatches or use the gpipe schedule")
    if plan.schedule is Schedule.INTERLEAVED:
        rounds = max(1, n // pp)
        if n % rounds:
            return (f"interleaved 1F1B needs num_microbatches ({n}) to be a multiple of "
                    f"max(1, num_microbatches // pp) = {rounds}; use a multiple of pp={pp}")
    if plan.schedule is not Schedule.INTERLEAVED and stages != pp:
        return f"{plan.schedule} runs one stage per pipeline rank, the plan has {stages} for pp={pp}"
    return None
