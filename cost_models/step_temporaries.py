"""The optimizer step's temporaries on one rank: which torch param group each layer's
tensors step in, each tensor's local size, and the bytes the step makes beyond the
states it updates in place (`cost_models.memory_walk` adds them after backward)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cost_models.layer_memo import per_layer
from cost_models.model_states import (FP32_BYTES, OPTIMIZER_MOMENTS, has_dp_unit,
                                      largest_param_tensor, tp_local_params)
from ir.layer import Layer, TPCandidate, TPStyle
from ir.step_groups import StepGroup
from ir.strategy import DPMode, LayerStrategy, Precision

if TYPE_CHECKING:
    from cost_models.memory_walk import LayerMemory

# PyTorch's single-tensor Adam (the CPU default) makes two parameter-sized temporaries
# per tensor (sqrt(v), then / bias correction) while the previous tensor's `denom` is
# still bound (torch 2.13 optim/adam.py `_single_tensor_adam`; AdamW, amsgrad alike; Adam's
# coupled weight decay adds a third, unpriced: plans carry no optimizer kwargs); foreach one
# moment-sized temporary (`exp_avg_sq_sqrt`) for a param group's tensors at once, freed
# when the group's `adam()` call returns (torch 2.13 optim/adam.py `_multi_tensor_adam`);
# the fused kernel none.
ADAM_SINGLE_TENSOR_TEMPORARIES = 2
ADAM_FOREACH_TEMPORARIES = 1
# Which torch param group a layer's tensors step in: `ir.step_groups.StepGroup`. A
# StepGroup.ANY layer (no parameters, or TP'd DTensors beside plain ones: a norm outside
# the TP plan) may join the run on either side, so it is counted in both.


def optimizer_step_temp_bytes(layers: Sequence[LayerMemory], optimizer: str,
                              implementation: str) -> float:
    """Temporaries of one optimizer step (PyTorch's Adam/AdamW implementations:
    `ir.plan.optimizer_implementation`; the fused kernel makes none)."""
    if OPTIMIZER_MOMENTS.get(optimizer, 0) < 2 or implementation == "fused":
        return 0.0  # SGD (with or without momentum, no weight decay) updates in place
    if implementation == "foreach":  # the largest param group's
        return ADAM_FOREACH_TEMPORARIES * max(_step_group_bytes(layers), default=0.0)
    return _single_tensor_peak_params(layers) * FP32_BYTES


def step_order(layers: Sequence[LayerMemory]) -> list[tuple[LayerMemory, StepGroup]]:
    """The layers in the order the executor steps them, each with the kind its group
    is split by: ZeRO-1's flat shards go last (`ShardedOptimizer`), and being plain
    tensors they join a plain run just before them (param_groups keys on
    (implementation, is-DTensor) only)."""
    ordered = [l for l in layers if l.step_group is not StepGroup.FLAT] + [
        l for l in layers if l.step_group is StepGroup.FLAT]
    return [(l, l.step_group.list_kind) for l in ordered]


def _single_tensor_peak_params(layers: Sequence[LayerMemory]) -> float:
    """max of 2 t_i + t_(i-1) over one param group's tensors in step order (`denom` goes
    when its `adam()` returns); a StepGroup.ANY layer may end the group before it."""
    peak, before, key, last = 0.0, 0.0, None, StepGroup.ANY
    for l, kind in step_order(layers):
        if kind not in (StepGroup.ANY, key):
            key, before = kind, before if last is StepGroup.ANY else 0.0
        last = kind
        for t in l.step_tensor_params:
            peak, before = max(peak, ADAM_SINGLE_TENSOR_TEMPORARIES * t + before), t
    return peak


def _step_group_bytes(layers: Sequence[LayerMemory]) -> list[float]:
    """Moment bytes of each param group the executor steps, in its order; a
    StepGroup.ANY layer counts in the groups on both its sides. A group's (device,
    dtype) lists are stepped in turn, but the previous list's temporary is still bound
    while the next is made (measured: 2 dtypes hold both), and the executor's groups are
    one fp32 list each: a group holds its whole sum."""
    groups, key, run, either = [], None, 0.0, 0.0  # either: ANY bytes since the last key
    for l, kind in step_order(layers):
        if kind is StepGroup.ANY:
            run += l.fp32_moment_bytes
            either += l.fp32_moment_bytes
            continue
        if kind != key:
            groups.append(run)
            key, run = kind, either
        either = 0.0
        run += l.fp32_moment_bytes
    return groups + [run]


def step_group(layer: Layer, strategy: LayerStrategy, precision: Precision) -> StepGroup:
    """The kind of param group a layer's tensors step in."""
    if strategy.offload:
        return StepGroup.HOST
    if strategy.dp_mode is DPMode.ZERO1 and strategy.dp > 1:
        return StepGroup.FLAT
    if not layer.params + layer.tied_params:
        return StepGroup.ANY
    if has_dp_unit(layer, strategy, precision):  # FSDP2 makes every parameter a DTensor
        return StepGroup.DTENSOR
    if strategy.tp == 1 or not layer.tp_candidates:
        return StepGroup.PLAIN
    split = sum(c.params for c in layer.tp_candidates)
    return StepGroup.DTENSOR if split >= layer.params + layer.tied_params else StepGroup.ANY


def step_tensor_params(layer: Layer, strategy: LayerStrategy, moments: float) -> tuple[float, ...]:
    """Elements of each tensor the layer steps on one rank, in step order: TP divides
    only its split part (`held_local_params`' rule, per tensor), ZeRO-2/3 every tensor
    (FSDP2 shards each on dim 0); at most the rank's moment-sharded parameters."""
    dp_shards = strategy.dp if strategy.dp_mode.stage >= 2 else 1
    return tuple(min(tp_local_params(n, split, strategy.tp) / dp_shards, moments)
                 for n, split in _tensor_splits(layer))


@per_layer
def _tensor_splits(layer: Layer) -> tuple[tuple[int, float], ...]:
    """(elements, elements TP divides) of each tensor in `param_numels` order, told by
    `param_step_names` as `ir.measure._tp_params` splits them (candidates' weights,
    column-parallel biases). Layers without those names (hand-built) give each tensor
    the layer's split share."""
    numels = layer.param_numels or (largest_param_tensor(layer),)
    names = layer.param_step_names
    if len(names) != len(numels):
        total = layer.params + layer.tied_params
        share = (layer.tp_params + layer.tied_tp_params) / total if total else 0.0
        return tuple((n, n * share) for n in numels)
    split: dict[str, TPCandidate] = {}
    for c in layer.tp_candidates:
        for attr in ("weight", "bias") if c.style is TPStyle.COLWISE else ("weight",):
            split[".".join(filter(None, (c.module, attr)))] = c
    return tuple((n, split[name].split_numel(n) if name in split else 0)
                 for n, name in zip(numels, names))
