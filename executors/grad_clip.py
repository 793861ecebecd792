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
their coefficient goes into that multiplier, so the fp32 copy is clipped instead.

Sharded embedding tables are refused (`clip_problem`, by `ir.legality.clip_tables_problem`,
the rule the plan and the search keep too).
"""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from executors.zero1 import local_tensor
from ir.errors import PlannerError
from ir.legality import clip_tables_problem
from ir.plan import ParallelPlan

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


def clip_problem(plan: ParallelPlan, max_grad_norm: float | None) -> str | None:
    """Why `plan` cannot clip (None: it can, or no clipping asked):
    `ir.legality.clip_tables_problem`."""
    tables = plan.embeddings.tables if plan.embeddings is not None else ()
    return clip_tables_problem(max_grad_norm is not None, (t.table.name for t in tables))


def clip_grad_norm(params: Iterable[nn.Parameter], copies: Callable[[nn.Parameter], int],
                   max_norm: float, device: torch.device, held: frozenset[int] = frozenset(),
                   held_multiplier: float = 1.0) -> tuple[float, float]:
    """Scale this rank's gradients as single-device clip_grad_norm_(max_norm) would;
    returns (total norm, coefficient), the same on every rank. `copies(p)`: ranks holding
    each element of p's gradient; `held`: ids of parameters whose gradients are read
    times `held_multiplier` and left unscaled (the caller applies the coefficient).

    As torch's own (foreach) clip_grad_norm_: one `_foreach_norm` per (device, dtype)
    group reads every gradient once, in fp32 (a loss-scaled fp16 norm would overflow),
    and one `_foreach_mul_` per group scales them; the norm is read to the host once."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    weights: dict[tuple[torch.device, torch.dtype], list[float]] = defaultdict(list)
    scaled: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for p in params:
        if p.grad is None:  # frozen, or unused this step
            continue
        g = local_tensor(p.grad)
        key = (g.device, g.dtype)
        groups[key].append(g)
        # each element's share: 1 / copies of it in the world; held ones still multiplied
        weights[key].append((held_multiplier ** 2 if id(p) in held else 1.0) / copies(p))
        if id(p) not in held:
            scaled[key].append(g)
    squares = torch.zeros((), dtype=torch.float32, device=device)
    for key, grads in groups.items():
        norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)).to(device)
        share = torch.tensor(weights[key], dtype=torch.float32).to(device)
        squares += (norms.square() * share).sum()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(squares)  # one scalar, SUM over the whole world
    total_norm = float(squares.sqrt())
    coefficient = min(max_norm / (total_norm + NORM_EPSILON), 1.0)
    with torch.no_grad():  # torch multiplies by the clamped coefficient, 1 included
        for grads in scaled.values():
            torch._foreach_mul_(grads, coefficient)
    return total_norm, coefficient
