"""Tied copies' gradient sum after backward, as the executor takes it (`executors.tied`)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ir.layer import LayerGraph
from ir.plan import ParallelPlan
from ir.strategy import LayerStrategy, Precision

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


def gradient_layout(strategy: LayerStrategy) -> tuple:
    """What a gradient's DTensor layout depends on: the TP and DP degrees, sharded or not."""
    return strategy.tp, strategy.dp, strategy.dp_mode.stage >= 2


def tied_copies(graph: LayerGraph, name: str) -> tuple[int, ...]:
    """The layers holding tied parameter `name`, ascending (its owner first)."""
    return _copies(graph, name)


class TieGroup(NamedTuple):
    """One shared tensor: its holders (`tied_copies`, the owner first), the first holder
    of a copy, and that copy's name for it (its size: `tied_numel`)."""

    holders: tuple[int, ...]
    copy: int
    name: str


def tied_numel(layer, name: str) -> int:
    """Elements of `layer`'s copy `name` (`Layer.tied_param_numels`); for layers built
    before that field, all its tied elements."""
    if layer.tied_param_numels:
        return layer.tied_param_numels[layer.tied_param_names.index(name)]
    return layer.tied_params


_GROUPS: dict[str, list[TieGroup]] = {}  # graph fingerprint -> its tie groups


def tie_groups(graph: LayerGraph) -> list[TieGroup]:
    """One per shared tensor, as `executors.tied.find_tie_groups` groups them by tensor
    identity and `TiedGradients.sync` sums each on its own: keyed by the holders and the
    tensor (`tie_key`), so two tensors copied into one layer are two groups. Layers built
    before `Layer.tied_param_numels` count their tied elements together: keyed by the
    holders alone, one group sized by them all."""
    out = _GROUPS.get(graph.fingerprint)
    if out is None:
        groups: dict[tuple, TieGroup] = {}
        for layer in graph.layers:
            for name in layer.tied_param_names:
                holders = _copies(graph, name)
                key = (holders, tie_key(layer, name) if layer.tied_param_numels else None)
                groups.setdefault(key, TieGroup(holders, layer.index, name))
        out = _GROUPS[graph.fingerprint] = list(groups.values())
    return out


def tied_local_fraction(graph: LayerGraph, plan: ParallelPlan, j: int,
                        name: str | None = None) -> float:
    """The share of tied copy `j`'s full gradient that `executors.tied.TiedGradients.sync`
    sums on one rank: a copy whose copies all sit on its pipeline rank (its stage, or
    another chunk of the rank: `TiedGradients` groups holders by rank) with its layout has
    gradients that are DTensors of one layout, and sync sums the local shards
    (`_one_layout`), not full gradients; else 1 (the full path). Under TP only a TP-split
    copy counts (a replicated one may meet a split owner: the full path, as priced).
    `name`: the tie group's tensor as `j` holds it (default: its first)."""
    layer = graph.layers[j]
    strategy, rank = plan.layer_strategies[j], plan.stage_of(j) % plan.pp
    if not layer.tied_params:
        return 1.0
    layout = gradient_layout(strategy)
    copies = _copies(graph, name or layer.tied_param_names[0])
    if any(plan.stage_of(k) % plan.pp != rank
           or gradient_layout(plan.layer_strategies[k]) != layout for k in copies):
        return 1.0
    return shared_layout_fraction(graph, j, strategy, plan.precision, name)


def shared_layout_fraction(graph: LayerGraph, j: int, strategy: LayerStrategy,
                           precision: Precision, name: str | None = None) -> float:
    """`tied_local_fraction` of copy `j` at `strategy` where every copy of its tie group
    sits on its rank in its `gradient_layout` (the search prices that case per layout:
    `planner.stage_host.tied_variants`)."""
    layer = graph.layers[j]
    if not layer.tied_params or (strategy.tp > 1 and not layer.tied_tp_params):
        return 1.0
    copies = _copies(graph, name or layer.tied_param_names[0])
    if strategy.tp == 1 and not any(has_dp_unit(graph.layers[k], strategy, precision)
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
