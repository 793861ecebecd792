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
    """The layers holding tied parameter `name` (its owner and its copies), kept."""
    key = (graph.fingerprint, name)
    out = _COPIES.get(key)
    if out is None:
        out = _COPIES[key] = tuple(l.index for l in graph.layers
                                   if name in l.param_names or name in l.tied_param_names)
    return out


def _layout(strategy: LayerStrategy) -> tuple:
    """What a gradient's DTensor layout depends on: the TP and DP degrees, sharded or not."""
    return strategy.tp, strategy.dp, strategy.dp_mode.stage >= 2


def tied_shards(graph: LayerGraph, plan: ParallelPlan, j: int,
                mem: LayerMemory) -> LayerMemory:
    """A tied copy whose copies all sit in its stage with its layout: their gradients
    are DTensors of one layout and `executors.tied.TiedGradients.sync` sums the local
    shards (`_one_layout`), not full gradients. Under TP only a TP-split copy counts (a
    replicated one may meet a split owner: the full path, as priced)."""
    if not mem.tied_grad_bytes:
        return mem
    layer = graph.layers[j]
    strategy, stage = plan.layer_strategies[j], plan.stage_of(j)
    layout = _layout(strategy)
    if strategy.tp > 1 and not layer.tied_tp_params:
        return mem
    copies = _copies(graph, layer.tied_param_names[0])
    if any(plan.stage_of(k) != stage or _layout(plan.layer_strategies[k]) != layout
           for k in copies):
        return mem
    if strategy.tp == 1 and not any(has_dp_unit(graph.layers[k], strategy, plan.precision)
                                    for k in copies):
        return mem  # plain tensors: the full path
    dp_shards = strategy.dp if strategy.dp_mode.stage >= 2 else 1
    local = tp_local_params(layer.tied_params, layer.tied_tp_params, strategy.tp) / dp_shards
    return dataclasses.replace(mem, tied_grad_bytes=mem.tied_grad_bytes
                               * local / layer.tied_params)
