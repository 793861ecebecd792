"""The optimizer of a parallel model, with ZeRO-1 optimizer-state sharding.

ZeRO-1 (Rajbhandari et al. 2020, P_os) shards optimizer states over a layer's
data-parallel group while parameters and gradients stay replicated. `ShardedOptimizer`
does it the way `torch.distributed.optim.ZeroRedundancyOptimizer` does — each parameter
is owned by one rank of its group (greedy by size, largest first), only the owner keeps
optimizer state for it and updates it, and the owners broadcast the updated values — but
it works on DTensor parameters (TP shards, FSDP2 `replicate` units) and on one data-parallel
group per layer. Everything else (ZeRO-2/3 shards, DDP, TP, unsharded parameters) goes
through the same single inner optimizer, so `step()` is one call. Element-wise
optimizers (Adam, AdamW, SGD) give the same numbers however parameters are sharded.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores for `t` (a DTensor's local shard, aliased: writes to it
    change `t`)."""
    if isinstance(t, DTensor):
        with torch.no_grad():  # to_local() returns the stored shard itself without autograd
            return t.to_local()
    return t


def owners_by_size(params: list[nn.Parameter], group_size: int) -> list[int]:
    """Owner (group rank) of each parameter: largest first onto the least loaded rank."""
    load = [0] * group_size
    owner = [0] * len(params)
    order = sorted(range(len(params)), key=lambda i: (-local_tensor(params[i]).numel(), i))
    for i in order:
        rank = min(range(group_size), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += local_tensor(params[i]).numel()
    return owner


class ShardedOptimizer:
    """One optimizer over this rank's parameters; ZeRO-1 groups shard its state.

    zero1_groups: (parameters, data-parallel process group) per ZeRO-1 layer group.
    """

    def __init__(self, params: Iterable[nn.Parameter],
                 zero1_groups: list[tuple[list[nn.Parameter], dist.ProcessGroup]],
                 optimizer_cls: type[torch.optim.Optimizer], optimizer_kwargs: dict[str, Any]):
        self.params = [p for p in params if p.requires_grad]
        sharded: set[int] = set()
        owned: list[nn.Parameter] = []
        # (group, global rank of the owner, its parameters): one coalesced broadcast each
        self._broadcasts: list[tuple[dist.ProcessGroup, int, list[nn.Parameter]]] = []
        for group_params, group in zero1_groups:
            group_params = [p for p in group_params if p.requires_grad]
            owners = owners_by_size(group_params, dist.get_world_size(group))
            me = dist.get_rank(group)
            for owner in range(dist.get_world_size(group)):
                mine = [p for p, o in zip(group_params, owners) if o == owner]
                if mine:
                    self._broadcasts.append((group, dist.get_global_rank(group, owner), mine))
            owned += [p for p, o in zip(group_params, owners) if o == me]
            sharded.update(id(p) for p in group_params)
        updated = [p for p in self.params if id(p) not in sharded] + owned
        self.inner = optimizer_cls(updated, **optimizer_kwargs) if updated else None

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups if self.inner is not None else []

    @torch.no_grad()
    def step(self) -> None:
        if self.inner is not None:
            self.inner.step()
        for group, src, params in self._broadcasts:
            locals_ = [local_tensor(p) for p in params]
            flat = torch.cat([t.reshape(-1) for t in locals_])
            dist.broadcast(flat, src=src, group=group)
            offset = 0
            for t in locals_:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

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


def build_optimizer(params: list[nn.Parameter],
                    zero1_groups: list[tuple[list[nn.Parameter], dist.ProcessGroup]],
                    optimizer_cls: type[torch.optim.Optimizer], optimizer_kwargs: dict[str, Any]):
    """A plain torch optimizer when nothing is ZeRO-1, else a `ShardedOptimizer`."""
    params = [p for p in params if p.requires_grad]
    if not zero1_groups:
        if not params:  # a rank may hold no trainable parameter (e.g. a glue-only stage)
            return ShardedOptimizer([], [], optimizer_cls, optimizer_kwargs)
        return optimizer_cls(params, **optimizer_kwargs)
    return ShardedOptimizer(params, zero1_groups, optimizer_cls, optimizer_kwargs)
