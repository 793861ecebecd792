"""Full (unsharded) parameters of a parallel model, gathered on every rank, and back.

`full_state_dict(pm)` is collective (every rank calls it): each stage gathers its
parameters' shards (`DTensor.full_tensor()` over TP and FSDP meshes), the first rank of
every pipeline stage contributes its stage's tensors, and every rank gets the union,
keyed by the original model's parameter names (checkpointing and FSDP keep them), in the
model's own dtypes (an fp64 model round-trips bit-exactly). A
tied weight appears under every name whose layer holds a copy (the copies are equal).
Fused projections split per part hold their rows rank-major (`executors.fused`); both
directions convert, so a full state dict is always in the model's own order.

`load_full_state_dict(pm, state)` is the inverse on every rank (no communication): each
parameter this rank holds takes its shard of the full tensor of its name.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from executors.fused import (full_in_model_order, fused_parameters, load_model_order,
                             load_shard)
from executors.runtime import ParallelModel
from executors.zero1 import WORKING_COPY_ATTR
from ir.errors import PlannerError


@torch.no_grad()
def full_state_dict(pm: ParallelModel) -> dict[str, torch.Tensor]:
    local: dict[str, torch.Tensor] = {}
    for _, module in pm.stage_modules:
        fused = fused_parameters([module])
        for name, param in module.named_parameters():
            if name in fused:
                full = full_in_model_order(param, *fused[name])
            else:
                full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
            local[name] = full.to(model_dtype(param, full)).cpu().clone()
    contributes = dist.get_rank() % pm.meshes.dims.stage_devices == 0
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local if contributes else {})
    merged: dict[str, torch.Tensor] = {}
    for part in gathered:
        merged.update(part)
    return merged


def model_dtype(param: torch.Tensor, full: torch.Tensor) -> torch.dtype:
    """The dtype the user's model holds `param` in: its own, except a 16-bit ZeRO-1
    working copy's, the model tensor's it was cast from (`executors.zero1`)."""
    return getattr(param, WORKING_COPY_ATTR, full.dtype)


@torch.no_grad()
def load_full_state_dict(pm: ParallelModel, state: dict[str, torch.Tensor]) -> None:
    """Set every parameter this rank holds from `state` (full tensors in the model's
    order, e.g. a single-device model's `state_dict()`), keeping this rank's shard."""
    for _, module in pm.stage_modules:
        fused = fused_parameters([module])
        for name, param in module.named_parameters():
            if name not in state:
                raise PlannerError(f"load_full_state_dict: no tensor for parameter {name!r}")
            full = state[name]
            # a fused parameter holding shared parts is stored longer than the model's
            shape = (fused[name][0].model_shape(param.shape, fused[name][1]) if name in fused
                     else tuple(param.shape))
            if tuple(full.shape) != shape:
                raise PlannerError(f"load_full_state_dict: {name!r} is {list(full.shape)} in "
                                   f"the state dict but {list(shape)} in the model")
            if name in fused:
                load_model_order(param, full, *fused[name])
            else:
                load_shard(param, full)
