"""BatchNorm over a layer's whole data-parallel micro-batch (SyncBatchNorm for gloo/CPU).

Under data parallelism each rank holds 1/dp of every global micro-batch
(`executors.data`), so a plain BatchNorm would normalise with its own slice's statistics
and train differently from one device. `sync_batch_norms(layer_module, group)` makes every
BatchNorm in a layer with dp > 1 normalise with the statistics of the global micro-batch
across the layer's data-parallel group — what one device computes on that micro-batch.

torch.nn.SyncBatchNorm would do this, but its forward refuses CPU tensors ("expected
input tensor to be on GPU") and its kernels (batch_norm_gather_stats...) are CUDA ones,
so the executor brings its own, for every backend:

    mean = SUM_group(sum x) / SUM_group(count)                  (one all-reduce)
    var  = SUM_group(sum (x - mean)^2) / SUM_group(count)       (two-pass: no cancellation)
    y    = (x - mean) / sqrt(var + eps) * weight + bias

The sums go through `_GroupSum`, whose backward all-reduces the gradient: every rank's
statistics depend on every rank's inputs, so d(loss)/dx sums the gradients of all ranks'
copies of the statistics. weight and bias get their local gradients, which the layer's
data-parallel unit sums like any other. The running statistics are updated as torch's
BatchNorm does (momentum, or a cumulative average when momentum is None; the unbiased
variance of the global micro-batch), identically on every rank. In eval mode (running
statistics) nothing is exchanged.

Activation checkpointing re-runs a layer's forward in backward, so a BatchNorm in it
would update its running statistics twice per micro-batch (num_batches_tracked too), at
any dp: `batchnorm_problem` refuses that.
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ir.strategy import Checkpoint, LayerStrategy

MIN_STATS_DTYPE = torch.float32  # sums of a bf16 micro-batch lose digits; torch's CPU BN uses fp32


class _GroupSum(torch.autograd.Function):
    """All-reduce (SUM) over `group`; the backward all-reduces the gradient."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        out = tensor.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.contiguous().clone()
        dist.all_reduce(out, group=ctx.group)
        return out, None


def _average_factor(bn: _BatchNorm) -> float:
    """torch's BatchNorm: count the batch, then momentum or 1 / batches seen."""
    if bn.num_batches_tracked is None:
        return bn.momentum or 0.0
    bn.num_batches_tracked.add_(1)
    return 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum


def _synced_forward(bn: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    uses_batch = bn.training or bn.running_mean is None
    if not uses_batch:  # eval: the running statistics, the same on every rank
        return type(bn).forward(bn, x)
    bn._check_input_dim(x)
    group = bn._planner_dp_group
    channels = x.shape[1]
    dims = [0] + list(range(2, x.dim()))  # every dim but the channels'
    shape = [1, channels] + [1] * (x.dim() - 2)  # (1, C, 1, ...) broadcasts over x
    dtype = torch.promote_types(x.dtype, MIN_STATS_DTYPE)  # fp64 stays fp64
    xs = x.to(dtype)
    count = torch.full((1,), x.numel() // channels, dtype=dtype, device=x.device)
    first = _GroupSum.apply(torch.cat([xs.sum(dims), count]), group)  # (C + 1,)
    total = first[channels]
    mean = first[:channels] / total  # (C,)
    centred = xs - mean.view(shape)
    var = _GroupSum.apply((centred * centred).sum(dims), group) / total  # biased, (C,)
    y = centred * torch.rsqrt(var + bn.eps).view(shape)
    if bn.affine:
        y = y * bn.weight.to(dtype).view(shape) + bn.bias.to(dtype).view(shape)
    if bn.training and bn.track_running_stats:
        with torch.no_grad():
            factor = _average_factor(bn)
            unbiased = var * (total / (total - 1).clamp(min=1))
            bn.running_mean.mul_(1 - factor).add_(mean.to(bn.running_mean.dtype), alpha=factor)
            bn.running_var.mul_(1 - factor).add_(unbiased.to(bn.running_var.dtype),
                                                 alpha=factor)
    return y.to(x.dtype)


def batchnorm_problem(module: nn.Module, strategy: LayerStrategy, layer_name: str = "") -> str | None:
    """Why this layer's BatchNorms cannot run under its strategy, or None. `layer_name`
    makes the message name the module by its full path."""
    if strategy.checkpoint is Checkpoint.NONE:
        return None
    for name, sub in module.named_modules():
        if isinstance(sub, _BatchNorm) and sub.track_running_stats:
            path = ".".join(n for n in (layer_name, name) if n)
            where = path or f"({type(sub).__name__}, the layer itself)"
            return (f"BatchNorm {where}: activation checkpointing ({strategy.checkpoint}) "
                    "would update its running statistics twice per step; use checkpoint "
                    "none for its layer")
    return None


def sync_batch_norms(module: nn.Module, group) -> list[str]:
    """Make every BatchNorm in `module` (itself included) normalise over `group`; their
    names. The modules stay where they are (a layer may itself be a BatchNorm)."""
    names = []
    for name, sub in module.named_modules():
        if isinstance(sub, _BatchNorm) and not hasattr(sub, "_planner_dp_group"):
            sub._planner_dp_group = group
            sub.forward = types.MethodType(_synced_forward, sub)
            names.append(name)
    return names
