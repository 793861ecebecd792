"""Gradient clipping by global norm: `torch.nn.utils.clip_grad_norm_` over the whole
model, whatever the plan shards (torchtitan's `max_norm`, Megatron's `clip_grad`,
DeepSpeed's `gradient_clipping`).

    total_norm  = sqrt(sum of g² over every gradient element of the model, each once)
    coefficient = min(max_norm / (total_norm + 1e-6), 1)       torch's clip_grad_norm_
    g          *= coefficient                                   every gradient

After the step's reductions (data-parallel all-reduce / reduce-scatter, TP partial sums,
tied sums) each rank holds local gradient tensors, and every element of the model's
gradient sits, with the same value, on `copies` ranks: `ParallelDims.stage_copies`
(`executors.mesh`: the ranks of its pipeline stage holding that piece of the gradient)
times `TiedGradients.copies` (`executors.tied`: tied layers each hold the summed
gradient). Each rank adds sum(g²) / copies over its local tensors, and ONE all-reduce
(SUM of that scalar over the default group) gives every rank the same total: each
element counted exactly once across the world.

Where it runs in the step (`executors.runtime`): after the tied sum; under fp16 loss
scaling after the unscale and the overflow check, as torch.amp.GradScaler documents
(unscale_, then clip, then step), and not at all on a skipped step. The gradients a
`ShardedOptimizer` copies with a multiplier (ZeRO-1's 16-bit ones: still loss-scaled
under fp16, `executors.loss_scaling`) are read times `held_multiplier` and not written:
their coefficient goes into that multiplier, so the fp32 copy is clipped instead. Which
gradients those are is one rule, `executors.optimizer.multiplied_params`, that loss
scaling's unscale reads too. As in torch's clip_grad_norm_, the norm and the coefficient
stay 0-dim tensors on the device (no host read in the step, but under ZeRO-Offload,
whose FSDP2 gradients sit on the CPU: the coefficient's copy there waits for the device):
`last_grad_norm` reads the norm only when asked. A gradient still Partial (unreduced sums) is refused, naming its
parameter: `stage_copies` would count it as replicated.

Embedding tables (`tables`: `executors.sharded_embedding`; the same as single-device
`torch.nn.utils.clip_grad_norm_` over all parameters with the tables' gradients dense,
not TorchRec's GradientClippingOptimizer, whose fused tables step in the backward
unclipped): a table's gradient is
a sparse COO tensor with duplicate ids, whose norm is that of its COALESCED form (the
dense nn.EmbeddingBag's gradient): each is coalesced here and left so, as the sparse
optimizer reads it (`executors.sparse_optimizer`: its coalesce() is then a no-op), and its
values join the norm and the scale. A replicated table's rows are equal on every rank
after `hybrid_step.all_gather_sparse` (copies = world); a sharded table's rows (or column
slices) are held by one rank each (copies = 1).
"""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Partial

from executors.zero1 import local_tensor
from executors.sharded_embedding import ReplicatedEmbedding, ShardedTables
from ir.errors import PlannerError

# torch.nn.utils.clip_grad_norm_'s guard against a zero norm (torch/nn/utils/clip_grad.py:
# clip_coef = max_norm / (total_norm + 1e-6)).
NORM_EPSILON = 1e-6


def check_max_grad_norm(max_grad_norm: float | None) -> float | None:
    """None (no clipping) or a positive finite float, else PlannerError naming the argument."""
    if max_grad_norm is None:
        return None
    number = isinstance(max_grad_norm, numbers.Real) and not isinstance(max_grad_norm, bool)
    value = float(max_grad_norm) if number else math.nan
    if not (math.isfinite(value) and value > 0):
        raise PlannerError(f"max_grad_norm={max_grad_norm!r} is not a positive finite number: "
                           "pass e.g. 1.0 (torchtitan's default), or None for no clipping")
    return value


def clip_grad_norm(named_params: Iterable[tuple[str, nn.Parameter]],
                   copies: Callable[[nn.Parameter], int], max_norm: float,
                   device: torch.device, held: frozenset[int] = frozenset(),
                   held_multiplier: float | torch.Tensor = 1.0,
                   tables: ShardedTables | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale this rank's gradients as single-device clip_grad_norm_(max_norm) would;
    returns (total norm, coefficient), 0-dim tensors on `device` (fp32, or the widest
    parameter dtype where wider: float64), the same on every rank. `copies(p)`: ranks
    holding each element of p's gradient; `held`: ids of parameters whose gradients are
    read times `held_multiplier` (a float or a tensor) and left unscaled (the caller applies the coefficient). A Partial (unreduced)
    gradient is refused, naming its parameter. `tables`: embedding tables whose sparse
    gradients are coalesced, counted and scaled as the module docstring says (their
    parameters in `named_params` are skipped).

    As torch's own (foreach) clip_grad_norm_: one `_foreach_norm` per group of gradients
    (device, dtype, held or not, copies) reads every gradient once, in fp32 or its
    own dtype where wider (a loss-scaled fp16 norm would overflow in fp16), summed in the
    widest dtype of the parameters (read from every parameter, with a gradient or not, so
    every rank all-reduces one dtype), and one `_foreach_mul_` per (device, dtype) scales
    them by the coefficient as a tensor: nothing is read to the host, except
    where gradients sit on the CPU (ZeRO-Offload): the coefficient is copied there, a
    device-to-host copy that waits for the device."""
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    scaled: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    table_ids = tables.parameter_ids() if tables is not None else set()
    total_dtype = torch.float32  # the sum's: the widest of fp32 and every parameter's
    for module in (tables.modules.values() if tables is not None else ()):
        total_dtype = torch.promote_types(total_dtype, module.weight.dtype)
    for name, p in named_params:
        total_dtype = torch.promote_types(total_dtype, p.dtype)
        if p.grad is None or id(p) in table_ids:  # frozen, unused this step, or a table's
            continue
        if isinstance(p.grad, DTensor) and any(isinstance(placement, Partial)
                                               for placement in p.grad.placements):
            raise PlannerError(f"{name}'s gradient is Partial (not yet reduced) at the clip: "
                               "its norm would be a piece's; reduce it before the step")
        g = local_tensor(p.grad)
        # each element's share: 1 / copies of it in the world
        groups[(g.device, g.dtype, id(p) in held, copies(p))].append(g)
        if id(p) not in held:
            scaled[(g.device, g.dtype)].append(g)
    world = dist.get_world_size() if dist.is_initialized() else 1
    for module in (tables.modules.values() if tables is not None else ()):
        if module.weight.grad is None:  # no shard here, or no id looked up
            continue
        grad = module.weight.grad = module.weight.grad.coalesce()  # duplicate ids summed
        values = grad.values()  # an alias: scaling it scales the gradient
        count = world if isinstance(module, ReplicatedEmbedding) else 1
        groups[(values.device, values.dtype, False, count)].append(values)
        scaled[(values.device, values.dtype)].append(values)
    # each group's norm in the wider of fp32 and its dtype, summed in `total_dtype`
    plain = torch.zeros((), dtype=total_dtype, device=device)
    multiplied = torch.zeros((), dtype=total_dtype, device=device)
    for (_, dtype, is_held, count), grads in groups.items():
        wide = torch.promote_types(dtype, torch.float32)
        norms = torch.stack(torch._foreach_norm(grads, 2, dtype=wide)).to(device, total_dtype)
        total = multiplied if is_held else plain
        total += norms.square().sum() / count
    squares = plain + multiplied * held_multiplier ** 2  # held ones still multiplied
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(squares)  # one scalar, SUM over the whole world
    total_norm = squares.sqrt()
    # torch multiplies by the clamped coefficient, 1 included
    coefficient = torch.clamp(max_norm / (total_norm + NORM_EPSILON), max=1.0)
    with torch.no_grad():
        for (grad_device, _), grads in scaled.items():
            torch._foreach_mul_(grads, coefficient.to(grad_device))
    return total_norm, coefficient
