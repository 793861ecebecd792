"""BatchNorm over a layer's whole data-parallel micro-batch (SyncBatchNorm for gloo/CPU).

Under data parallelism each rank holds 1/dp of every global micro-batch
(`executors.data`), so a plain BatchNorm would normalise with its own slice's statistics
and train differently from one device. `prepare_batch_norms(layer, group, checkpoint)`
makes every BatchNorm in a layer with dp > 1 normalise with the statistics of the global
micro-batch across the layer's data-parallel group — what one device computes on it. A
user's torch SyncBatchNorm is handled the same way at any dp.

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

Activation checkpointing re-runs a layer's forward in backward, where torch's BatchNorm
would update its running statistics (and num_batches_tracked) a second time, at any dp.
In a checkpointed layer every BatchNorm therefore recomputes with the batch statistics
only and leaves the running ones alone (a forward run by the autograd engine, i.e. with
a current graph task, is a recomputation).
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from executors.checkpointing import apply_ac
from ir.strategy import Checkpoint

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


def _recomputing() -> bool:
    """Inside backward: activation checkpointing re-running a forward."""
    return torch._C._current_graph_task_id() != -1  # -1: no backward running on this thread


def _forward(bn: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    uses_batch = bn.training or bn.running_mean is None
    if not uses_batch:  # eval: the running statistics, the same on every rank
        return _BatchNorm.forward(bn, x)  # torch's, also for a SyncBatchNorm
    group = bn._planner_dp_group
    if group is None:  # dp = 1: torch's own, without a second update when recomputing
        if not _recomputing():
            return _BatchNorm.forward(bn, x)  # torch's, also for a SyncBatchNorm
        bn._check_input_dim(x)
        # the same op as the first forward, as checkpointing requires (same saved tensors;
        # selective checkpointing replays op by op); its update lands in scratch tensors
        return F.batch_norm(x, *bn._planner_scratch, bn.weight, bn.bias, True, 0.0, bn.eps)
    return _synced(bn, x, group)


def _synced(bn: _BatchNorm, x: torch.Tensor, group) -> torch.Tensor:
    bn._check_input_dim(x)
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
    if bn.training and bn.track_running_stats and not _recomputing():
        with torch.no_grad():
            factor = _average_factor(bn)
            unbiased = var * (total / (total - 1).clamp(min=1))
            bn.running_mean.mul_(1 - factor).add_(mean.to(bn.running_mean.dtype), alpha=factor)
            bn.running_var.mul_(1 - factor).add_(unbiased.to(bn.running_var.dtype),
                                                 alpha=factor)
    return y.to(x.dtype)


def prepare_batch_norms(module: nn.Module, group, checkpoint: Checkpoint) -> list[str]:
    """Make every BatchNorm in layer `module` (itself included) normalise over `group`
    (None: the rank's own batch, dp = 1) and update its running statistics once when
    `checkpoint` recomputes it; the names of those changed (a plain BatchNorm with neither
    stays as it is). The modules stay where they are."""
    names = []
    for name, sub in module.named_modules():
        # a torch SyncBatchNorm is replaced at any dp: it would sync over the whole world
        # (TP and pipeline ranks too), and refuses CPU tensors
        plain = (group is None and checkpoint is Checkpoint.NONE
                 and not isinstance(sub, nn.SyncBatchNorm))
        if isinstance(sub, _BatchNorm) and not plain and not hasattr(sub, "_planner_dp_group"):
            sub._planner_dp_group = group
            sub._planner_scratch = tuple(None if t is None else torch.zeros_like(t)
                                         for t in (sub.running_mean, sub.running_var))
            sub.forward = types.MethodType(_forward, sub)
            if sub is module:  # the layer is the BatchNorm: checkpoint the new forward
                apply_ac(sub, checkpoint)
            names.append(name)
    return names
