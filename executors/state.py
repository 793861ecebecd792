"""Full (unsharded) parameters of a parallel model, gathered on every rank.

`full_state_dict(pm)` is collective (every rank calls it): each stage gathers its
parameters' shards (`DTensor.full_tensor()` over TP and FSDP meshes), the first rank of
every pipeline stage contributes its stage's tensors, and every rank gets the union,
keyed by the original model's parameter names (checkpointing and FSDP keep them). A
tied weight appears under every name whose layer holds a copy (the copies are equal).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from executors.runtime import ParallelModel


@torch.no_grad()
def full_state_dict(pm: ParallelModel) -> dict[str, torch.Tensor]:
    local: dict[str, torch.Tensor] = {}
    for _, module in pm.stage_modules:
        for name, param in module.named_parameters():
            full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
            local[name] = full.float().cpu().clone()
    contributes = dist.get_rank() % pm.meshes.dims.stage_devices == 0
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local if contributes else {})
    merged: dict[str, torch.Tensor] = {}
    for part in gathered:
        merged.update(part)
    return merged
