"""The optimizer of a parallel model, with ZeRO-1's flat-buffer sharding.

Layers under ZeRO-1 (`executors.zero1`): their fp32 master weights and optimizer
moments are sharded evenly over the layer's data-parallel group, one flat buffer per
layer (the Megatron-LM distributed optimizer's layout); the inner torch optimizer
steps on this rank's pieces of them, then the group all-gathers the updated
parameters. Everything else (ZeRO-2/3 shards, DDP, TP, unsharded parameters) goes
through the same single inner optimizer, so `step()` is one call. Element-wise
optimizers (Adam, AdamW, SGD) give the same numbers however parameters are sharded.

Parameters step as the plan's `optimizer_impl` says (fused, foreach or single-tensor,
set per param group: `step_implementation`), as the planner priced them. Offloaded ones
(ZeRO-Offload, `LayerStrategy.offload`) step on the host in their own param groups:
Adam/AdamW with torch's fused CPU kernel (`fused=True`), what cost_models/offload.py
prices (a memory-bound vectorized CPU Adam, ZeRO-Offload's DeepSpeedCPUAdam) and what a
ZeRO-Offload user gets from DeepSpeed (torch's default for CPU tensors, one tensor at a
time, measured 8-10x slower there); others foreach, since DTensor runs no other fused
kernel (`ir.plan.host_step_implementation`).

Checkpoints of its state: `executors.optimizer_state`.
"""

from __future__ import annotations

import inspect
from itertools import groupby
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn

from executors.zero1 import FlatShardGroup, local_tensor
from ir.errors import PlannerError
from ir.plan import (OPTIMIZERS, host_step_implementation, optimizer_implementation,
                     requested_implementation)
from ir.step_groups import StepGroup

__all__ = ["ShardedOptimizer", "build_optimizer", "local_tensor", "step_implementation"]


class ShardedOptimizer:
    """One optimizer over this rank's parameters; ZeRO-1 groups shard its state.

    zero1_groups: (parameters, data-parallel process group) per ZeRO-1 layer group.
    """

    def __init__(self, params: Iterable[nn.Parameter],
                 zero1_groups: list[tuple[list[nn.Parameter], dist.ProcessGroup]],
                 optimizer_cls: type[torch.optim.Optimizer], optimizer_kwargs: dict[str, Any],
                 offloaded: frozenset[int] = frozenset(), implementation: str = "single"):
        self.params = [p for p in params if p.requires_grad]
        self.groups = [FlatShardGroup([p for p in ps if p.requires_grad], group)
                       for ps, group in zero1_groups]
        sharded = {id(p) for g in self.groups for p in g.params}
        updated = [p for p in self.params if id(p) not in sharded]
        updated += [t for g in self.groups for t in g.opt_params]
        self.inner = (optimizer_cls(param_groups(updated, offloaded, optimizer_cls,
                                                 implementation), **optimizer_kwargs)
                      if updated else None)

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups if self.inner is not None else []

    @torch.no_grad()
    def step(self, grad_multiplier: float | torch.Tensor = 1.0) -> None:
        """grad_multiplier (a float, or a 0-dim tensor on the gradients' device): applied
        to ZeRO-1's fp32 copies of 16-bit gradients (`multiplied_params`), which reach the
        step as backward left them: fp16 loss scaling's unscale
        (`executors.loss_scaling`) times the clip's coefficient (`executors.grad_clip`)."""
        for g in self.groups:
            g.attach_grads(grad_multiplier)
        if self.inner is not None:
            self.inner.step()
        for g in self.groups:
            g.release_grads()  # the fp32 gradient shards go before the all-gathers
        for g in self.groups:
            g.all_gather_params()

    def multiplied_params(self) -> frozenset[int]:
        """Ids of the parameters whose gradients `step` reads times `grad_multiplier`
        (ZeRO-1's 16-bit ones, copied to fp32 there) rather than as they are."""
        return frozenset(id(p) for g in self.groups if g.master is not None for p in g.params)

    def optimized_params(self) -> list[nn.Parameter]:
        """The model parameters this optimizer updates (ZeRO-1 ones through their pieces)."""
        sharded = {id(p) for g in self.groups for p in g.params}
        return [p for p in self.params if id(p) not in sharded] + [
            p for g in self.groups for p in g.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def state_dict(self) -> dict:
        return self.inner.state_dict() if self.inner is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.inner is not None:
            self.inner.load_state_dict(state)


def _plan_name(optimizer_cls) -> str:
    """The plan's optimizer name a torch class steps as ("" for one without a fused path
    the planner prices): a subclass of Adam or AdamW takes its parent's fused kernel."""
    for name, (cls, _) in OPTIMIZERS.items():
        if cls in (torch.optim.Adam, torch.optim.AdamW) and issubclass(optimizer_cls, cls):
            return name
    return ""


def _takes(optimizer_cls, implementation: str) -> bool:
    """Whether the class has `implementation` ("single" every one has); an `__init__`
    taking **kwargs is taken to pass it on to its parent."""
    arg = {"fused": "fused", "foreach": "foreach"}.get(implementation)
    if arg is None:
        return True
    parameters = inspect.signature(optimizer_cls).parameters
    return arg in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                    for p in parameters.values())


def step_implementation(optimizer_cls: type[torch.optim.Optimizer], optimizer_kwargs: dict,
                        chosen: str | None, device_type: str) -> tuple[str, dict[str, Any]]:
    """How the optimizer steps, and its kwargs less `fused`/`foreach` (the param groups
    carry them). `chosen`: the plan's `optimizer_impl`, which the planner priced: a
    caller's `fused`/`foreach` asking for another, or a class without it, is refused.
    None (a plan written before it was recorded): the default rule
    (`ir.plan.optimizer_implementation`) unless the caller's kwargs ask for one."""
    requested = requested_implementation(optimizer_kwargs, device_type)
    name = f"{optimizer_cls.__module__}.{optimizer_cls.__qualname__}"
    if chosen is not None:
        if requested not in (None, chosen):
            raise PlannerError(f"optimizer_kwargs ask torch for the {requested} step but the "
                               f"plan was priced for optimizer_impl {chosen!r}: drop "
                               "fused/foreach from optimizer_kwargs, or re-plan with them")
        if not _takes(optimizer_cls, chosen):
            raise PlannerError(f"the plan steps the optimizer {chosen} but {name} has no "
                               f"{chosen} step: re-plan for {name}, or set the plan's "
                               "optimizer_impl to one it has")
        implementation = chosen
    else:
        implementation = requested or optimizer_implementation(_plan_name(optimizer_cls),
                                                               device_type)
        if not _takes(optimizer_cls, implementation):  # torch's default then
            implementation = optimizer_implementation("", device_type)
    kwargs = {k: v for k, v in optimizer_kwargs.items() if k not in ("fused", "foreach")}
    return implementation, kwargs


# A param group's kwargs that make torch run one implementation.
_GROUP_KWARGS = {"fused": {"fused": True}, "foreach": {"foreach": True},
                 "single": {"foreach": False}}


def param_groups(params: list[nn.Parameter], offloaded: frozenset[int],
                 optimizer_cls: type[torch.optim.Optimizer],
                 implementation: str) -> list[dict]:
    """`params` as consecutive runs of one kind, each a param group that runs one step
    implementation (the parameters keep their order). Kinds: stepping as
    `implementation` (`step_implementation`) or, offloaded (ids in `offloaded`), as
    `ir.plan.host_step_implementation` says (module docstring); and DTensor or
    plain tensor (`StepGroup.of_tensor`): torch's list kernels refuse a list mixing them
    (ZeRO-1's plain flat shards beside FSDP2's or TP's DTensors)."""
    host = host_step_implementation(_plan_name(optimizer_cls))
    if not _takes(optimizer_cls, host):
        host = implementation

    def kind(p) -> tuple[str, StepGroup]:
        return host if id(p) in offloaded else implementation, StepGroup.of_tensor(p)

    groups = []
    for (impl, _), run in groupby(zip(params, map(kind, params)), key=lambda pk: pk[1]):
        groups.append({"params": [p for p, _ in run], **_GROUP_KWARGS[impl]})
    return groups


def build_optimizer(params: list[nn.Parameter],
                    zero1_groups: list[tuple[list[nn.Parameter], dist.ProcessGroup]],
                    optimizer_cls: type[torch.optim.Optimizer], optimizer_kwargs: dict[str, Any],
                    offloaded: frozenset[int] = frozenset(), implementation: str = "single"):
    """A plain torch optimizer when nothing is ZeRO-1, else a `ShardedOptimizer`.
    offloaded: ids of the parameters whose shards live on the host (`offloaded_params`);
    implementation and optimizer_kwargs: `step_implementation`'s."""
    params = [p for p in params if p.requires_grad]
    if not zero1_groups:
        if not params:  # a rank may hold no trainable parameter (e.g. a glue-only stage)
            return ShardedOptimizer([], [], optimizer_cls, optimizer_kwargs)
        return optimizer_cls(param_groups(params, offloaded, optimizer_cls, implementation),
                             **optimizer_kwargs)
    return ShardedOptimizer(params, zero1_groups, optimizer_cls, optimizer_kwargs, offloaded,
                            implementation)


def multiplied_params(optimizer) -> frozenset[int]:
    """Ids of the parameters whose gradients `optimizer` reads times its step's
    `grad_multiplier` (`ShardedOptimizer.multiplied_params`; none for any other): the one
    rule for which gradients loss scaling's unscale and the clip leave as they are."""
    return optimizer.multiplied_params() if isinstance(optimizer, ShardedOptimizer) \
        else frozenset()
