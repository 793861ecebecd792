"""Tied copies' gradient sum after backward, as the executor takes it (`executors.tied`)."""

from __future__ import annotations

import dataclasses

from ir.layer import LayerGraph
from ir.plan import ParallelPlan
from ir.strategy import LayerStrategy

from cost_models.memory_walk import LayerMemory
from cost_models.model_states import has_dp_unit, tp_local_params


_COPIES: dict[tuple[str, str], tuple[int, ...]] = {}  # (graph fingerprint, name) -> layers


def _copies(graph: LayerGraph, name: str) -> tuple[int, ...]:
    """The layers holding tied parameter `name` (its owner and its copies), kept: the
    owner a holder of `name` names (`Layer.tied_owner_layers`) and every layer naming that
    owner; for layers traced before owners were recorded, the layers holding `name`."""
    key = (graph.fingerprint, name)
    out = _COPIES.get(key)
    if out is None:
        owners = {l.tied_owner_layers[l.tied_param_names.index(name)] for l in graph.layers
                  if name in l.tied_param_names and l.tied_owner_layers}
        out = _COPIES[key] = tuple(
            l.index for l in graph.layers
            if name in l.param_names or name in l.tied_param_names or l.index in owners
            or owners.intersection(l.tied_owner_layers))
    return out


def _layout(strategy: LayerStrategy) -> tuple:
    """What a gradient's DTensor layout depends on: the TP and DP degrees, sharded or not."""
    return strategy.tp, strategy.dp, strategy.dp_mode.stage >= 2


def tied_copies(graph: LayerGraph, name: str) -> tuple[int, ...]:
    """The layers holding tied parameter `name`, ascending (its owner first)."""
    return _copies(graph, name)


def tied_local_fraction(graph: LayerGraph, plan: ParallelPlan, j: int) -> float:
    """The share of tied copy `j`'s full gradient that `executors.tied.TiedGradients.sync`
    sums on one rank: a copy whose copies all sit in its stage with its layout has
    gradients that are DTensors of one layout, and sync sums the local shards
    (`_one_layout`), not full gradients; else 1 (the full path). Under TP only a TP-split
    copy counts (a replicated one may meet a split owner: the full path, as priced)."""
    layer = graph.layers[j]
    strategy, stage = plan.layer_strategies[j], plan.stage_of(j)
    layout = _layout(strategy)
    if not layer.tied_params or (strategy.tp > 1 and not layer.tied_tp_params):
        return 1.0
    copies = _copies(graph, layer.tied_param_names[0])
    if any(plan.stage_of(k) != stage or _layout(plan.layer_strategies[k]) != layout
           for k in copies):
        return 1.0
    if strategy.tp == 1 and not any(has_dp_unit(graph.layers[k], strategy, plan.precision)
                                    for k in copies):
        return 1.0  # plain tensors: the full path
    dp_shards = strategy.dp if strategy.dp_mode.stage >= 2 else 1
    local = tp_local_params(layer.tied_params, layer.tied_tp_params, strategy.tp) / dp_shards
    return local / layer.tied_params


def tied_shards(graph: LayerGraph, plan: ParallelPlan, j: int,
                mem: LayerMemory) -> LayerMemory:
    """Tied copy `j`'s memory with its gradient sum's bytes as sync takes them: the local
    shards' where all copies share its stage and layout (`tied_local_fraction`)."""
    if not mem.tied_grad_bytes:
        return mem
    fraction = tied_local_fraction(graph, plan, j)
    return mem if fraction == 1.0 else dataclasses.replace(
        mem, tied_grad_bytes=mem.tied_grad_bytes * fraction)
