"""The optimizer of a parallel model, with ZeRO-1's flat-buffer sharding.

Layers under ZeRO-1 (`executors.zero1`): their fp32 master weights and optimizer
moments are sharded evenly over the layer's data-parallel group, one flat buffer per
layer (the Megatron-LM distributed optimizer's layout); the inner torch optimizer
steps on this rank's pieces of them, then the group all-gathers the updated
parameters. Everything else (ZeRO-2/3 shards, DDP, TP, unsharded parameters) goes
through the same single inner optimizer, so `step()` is one call. Element-wise
optimizers (Adam, AdamW, SGD) give the same numbers however parameters are sharded.

Offloaded parameters (ZeRO-Offload, `LayerStrategy.offload`) step on the host with
torch's fused CPU kernel (`fused=True`, in their own param groups) whenever the
optimizer takes `fused` and the caller set neither `fused` nor `foreach`: that is what
cost_models/offload.py prices (a memory-bound vectorized CPU Adam, ZeRO-Offload's
DeepSpeedCPUAdam) and what a ZeRO-Offload user gets from DeepSpeed; torch's default
for CPU tensors, one tensor at a time, measured 8-10x slower there.

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
from ir.plan import OPTIMIZERS, optimizer_implementation

__all__ = ["ShardedOptimizer", "build_optimizer", "local_tensor"]


class ShardedOptimizer:
    """One optimizer over this rank's parameters; ZeRO-1 groups shard its state.

    zero1_groups: (parameters, data-parallel process group) per ZeRO-1 layer group.
    """

    def __init__(self, params: Iterable[nn.Parameter],
                 zero1_groups: list[tuple[list[nn.Parameter], dist.ProcessGroup]],
                 optimizer_cls: type[torch.optim.Optimizer], optimizer_kwargs: dict[str, Any],
                 offloaded: frozenset[int] = frozenset()):
        self.params = [p for p in params if p.requires_grad]
        self.groups = [FlatShardGroup([p for p in ps if p.requires_grad], group)
                       for ps, group in zero1_groups]
        sharded = {id(p) for g in self.groups for p in g.params}
        updated = [p for p in self.params if id(p) not in sharded]
        updated += [t for g in self.groups for t in g.opt_params]
        self.inner = (optimizer_cls(param_groups(updated, offloaded, optimizer_cls,
                                                 optimizer_kwargs), **optimizer_kwargs)
                      if updated else None)

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups if self.inner is not None else []

    @torch.no_grad()
    def step(self, grad_multiplier: float = 1.0) -> None:
        """grad_multiplier: applied to ZeRO-1's fp32 copies of 16-bit gradients (fp16
        loss scaling's unscale, `executors.loss_scaling`)."""
        for g in self.groups:
            g.attach_grads(grad_multiplier)
        if self.inner is not None:
            self.inner.step()
        for g in self.groups:
            g.release_grads()  # the fp32 gradient shards go before the all-gathers
        for g in self.groups:
            g.all_gather_params()

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


def param_groups(params: list[nn.Parameter], offloaded: frozenset[int],
                 optimizer_cls: type[torch.optim.Optimizer],
                 optimizer_kwargs: dict[str, Any]) -> list[nn.Parameter] | list[dict]:
    """`params` as the optimizer takes them: the list itself, or consecutive runs of one
    kind as param groups (the parameters keep their order). Kinds: stepping fused or not
    (offloaded ones, ids in `offloaded`, module docstring; Adam/AdamW on GPUs,
    `ir.plan.optimizer_implementation`; a caller's own `fused`/`foreach` wins), and
    DTensor or plain tensor: torch's list kernels refuse a list mixing them (ZeRO-1's
    plain flat shards beside FSDP2's or TP's DTensors)."""
    from torch.distributed.tensor import DTensor

    fusable = "fused" in inspect.signature(optimizer_cls).parameters
    chosen = "fused" in optimizer_kwargs or "foreach" in optimizer_kwargs
    name = _plan_name(optimizer_cls)

    def kind(p) -> tuple[bool, bool]:
        fused = fusable and not chosen and (id(p) in offloaded or optimizer_implementation(
            name, p.device.type) == "fused")
        return fused, isinstance(p, DTensor)

    kinds = [kind(p) for p in params]
    if not any(fused for fused, _ in kinds) and len(set(kinds)) <= 1:
        return params
    groups = []
    for (fused, _), run in groupby(zip(params, kinds), key=lambda pk: pk[1]):
        groups.append({"params": [p for p, _ in run], **({"fused": True} if fused else {})})
    return groups


def build_optimizer(params: list[nn.Parameter],
                    zero1_groups: list[tuple[list[nn.Parameter], dist.ProcessGroup]],
                    optimizer_cls: type[torch.optim.Optimizer], optimizer_kwargs: dict[str, Any],
                    offloaded: frozenset[int] = frozenset()):
    """A plain torch optimizer when nothing is ZeRO-1, else a `ShardedOptimizer`.
    offloaded: ids of the parameters whose shards live on the host (`offloaded_params`)."""
    params = [p for p in params if p.requires_grad]
    if not zero1_groups:
        if not params:  # a rank may hold no trainable parameter (e.g. a glue-only stage)
            return ShardedOptimizer([], [], optimizer_cls, optimizer_kwargs)
        return optimizer_cls(param_groups(params, offloaded, optimizer_cls, optimizer_kwargs),
                             **optimizer_kwargs)
    return ShardedOptimizer(params, zero1_groups, optimizer_cls, optimizer_kwargs, offloaded)
