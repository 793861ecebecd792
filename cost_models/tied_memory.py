"""Tied copies' gradient sum after backward, as the executor takes it (`executors.tied`)."""

from __future__ import annotations

import dataclasses

from ir.layer import LayerGraph
from ir.plan import ParallelPlan
from ir.strategy import LayerStrategy

from cost_models.memory_walk import LayerMemory
from cost_models.model_states import has_dp_unit, tp_local_params


_COPIES: dict[tuple[str, str], tuple[int, ...]] = {}  # (graph fingerprint, name) -> layers


def tie_key(layer, name: str) -> tuple:
    """Which shared tensor holder `layer`'s tied parameter `name` copies: (its owner's layer
    index, the tensor's own name) (`Layer.tied_owner_layers`, `tied_owner_params`): one
    owner may own several shared tensors; (owner, None) for layers traced before the name
    was recorded, and ("name", name) for those traced before owners were."""
    if not layer.tied_owner_layers:
        return "name", name
    i = layer.tied_param_names.index(name)
    return (layer.tied_owner_layers[i],
            layer.tied_owner_params[i] if layer.tied_owner_params else None)


def _copies(graph: LayerGraph, name: str) -> tuple[int, ...]:
    """The layers holding tied parameter `name` (its owner and its copies), kept: the
    holders whose copy has the same `tie_key` as a holder naming `name`, and their owner;
    for layers traced before owners were recorded, the layers holding `name`."""
    key = (graph.fingerprint, name)
    out = _COPIES.get(key)
    if out is None:
        ties = {tie_key(l, name) for l in graph.layers if name in l.tied_param_names}
        owners = {tie[0] for tie in ties if tie[0] != "name"}
        out = _COPIES[key] = tuple(
            l.index for l in graph.layers
            if name in l.param_names or name in l.tied_param_names or l.index in owners
            or any(tie_key(l, n) in ties for n in l.tied_param_names))
    return out


def _layout(strategy: LayerStrategy) -> tuple:
    """What a gradient's DTensor layout depends on: the TP and DP degrees, sharded or not."""
    return strategy.tp, strategy.dp, strategy.dp_mode.stage >= 2


def tied_copies(graph: LayerGraph, name: str) -> tuple[int, ...]:
    """The layers holding tied parameter `name`, ascending (its owner first)."""
    return _copies(graph, name)


_GROUPS: dict[str, dict[tuple[int, ...], int]] = {}  # graph fingerprint -> its tie groups


def tie_groups(graph: LayerGraph) -> dict[tuple[int, ...], int]:
    """Each tie group's holders (`tied_copies`, its owner first) -> the first holder of a
    copy, whose `tied_params` size the group's gradient (the IR counts a layer's tied
    elements together: two tensors copied into one layer share a group)."""
    out = _GROUPS.get(graph.fingerprint)
    if out is None:
        out = _GROUPS[graph.fingerprint] = {}
        for layer in graph.layers:
            for name in layer.tied_param_names:
                out.setdefault(_copies(graph, name), layer.index)
    return out


def tied_local_fraction(graph: LayerGraph, plan: ParallelPlan, j: int) -> float:
    """The share of tied copy `j`'s full gradient that `executors.tied.TiedGradients.sync`
    sums on one rank: a copy whose copies all sit on its pipeline rank (its stage, or
    another chunk of the rank: `TiedGradients` groups holders by rank) with its layout has
    gradients that are DTensors of one layout, and sync sums the local shards
    (`_one_layout`), not full gradients; else 1 (the full path). Under TP only a TP-split
    copy counts (a replicated one may meet a split owner: the full path, as priced)."""
    layer = graph.layers[j]
    strategy, rank = plan.layer_strategies[j], plan.stage_of(j) % plan.pp
    layout = _layout(strategy)
    if not layer.tied_params or (strategy.tp > 1 and not layer.tied_tp_params):
        return 1.0
    copies = _copies(graph, layer.tied_param_names[0])
    if any(plan.stage_of(k) % plan.pp != rank or _layout(plan.layer_strategies[k]) != layout
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
