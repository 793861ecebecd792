"""Activation layouts between layers, and the autograd-correct re-layouts between them.

A `Layout` says how one micro-batch's activation is spread over the ranks of a pipeline
stage (local index i = rank - first rank of the stage):

    batch   split into `dp` contiguous blocks; local index i holds block i // tp
    tp      the `tp` consecutive ranks of a block hold the same rows (replicated), or,
    seq     under sequence parallelism, each holds sequence chunk i % tp (tensor dim 1)

A layer with TP degree t in a stage of D devices has Layout(dp=D/t, tp=t, seq=its SP).
Where two consecutive layers disagree, the consumer's forward pre-hook re-lays its input
out (`relayout`): gather the sequence, re-split the batch, split the sequence. Going to
a smaller TP group (more replicas) narrows the batch locally and all-gathers the gradient
in backward; going to a larger TP group all-gathers the batch and keeps its own block of
the gradient. Both sides of every collective are inside the larger TP group.

A re-layout keeps the global row order: block k of Layout(dp=a) is the concatenation of
blocks k*f .. k*f+f-1 of Layout(dp=a*f); `executors.data` slices batches the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from executors.mesh import Meshes

SEQ_DIM = 1  # tensor dim the sequence runs along in (batch, seq, hidden) activations
BATCH_DIM = 0


@dataclass(frozen=True, slots=True)
class Layout:
    dp: int
    tp: int
    seq_sharded: bool = False

    def __str__(self) -> str:
        return f"dp{self.dp}·tp{self.tp}" + ("·seq" if self.seq_sharded else "")

    @property
    def full_sequence(self) -> "Layout":
        return Layout(self.dp, self.tp, False)


def _gather(x: torch.Tensor, group: dist.ProcessGroup) -> list[torch.Tensor]:
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return parts


class _GatherDim(torch.autograd.Function):
    """Concatenate the distinct pieces held in `group` along `dim`; member k holds piece
    k // stride (pieces repeat `stride` times). Backward keeps this member's piece of the
    gradient, which is correct because the consumer's gradient is replicated in `group`."""

    @staticmethod
    def forward(ctx, x, dim: int, group, stride: int):
        ctx.dim, ctx.stride = dim, stride
        ctx.pieces = dist.get_world_size(group) // stride
        ctx.index = dist.get_rank(group) // stride
        parts = _gather(x, group)
        return torch.cat(parts[::stride], dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.pieces, dim=ctx.dim)[ctx.index].contiguous(), None, None, None


class _SplitDim(torch.autograd.Function):
    """Keep this member's piece (k // stride of size/pieces) of a tensor replicated in
    `group`; backward all-gathers the pieces' gradients into the full gradient."""

    @staticmethod
    def forward(ctx, x, dim: int, group, stride: int):
        ctx.dim, ctx.group, ctx.stride = dim, group, stride
        pieces = dist.get_world_size(group) // stride
        return x.chunk(pieces, dim=dim)[dist.get_rank(group) // stride].contiguous()

    @staticmethod
    def backward(ctx, grad):
        parts = _gather(grad, ctx.group)
        return torch.cat(parts[::ctx.stride], dim=ctx.dim), None, None, None


def gather_dim(x: torch.Tensor, dim: int, group, stride: int = 1) -> torch.Tensor:
    return _GatherDim.apply(x, dim, group, stride)


def split_dim(x: torch.Tensor, dim: int, group, stride: int = 1) -> torch.Tensor:
    return _SplitDim.apply(x, dim, group, stride)


def relayout(x: torch.Tensor, src: Layout, dst: Layout, meshes: Meshes) -> torch.Tensor:
    """`x` (local, laid out as `src`) laid out as `dst`, on the same stage's ranks."""
    if src == dst:
        return x
    if src.seq_sharded and not (dst.seq_sharded and dst.tp == src.tp):
        x = gather_dim(x, SEQ_DIM, meshes.tp_group(src.tp))
        src = src.full_sequence
    if src.tp != dst.tp:
        if dst.tp < src.tp:  # more replicas: narrow the batch; members of src's TP group differ
            x = split_dim(x, BATCH_DIM, meshes.tp_group(src.tp), stride=dst.tp)
        else:  # fewer replicas: all-gather the batch blocks inside dst's TP group
            x = gather_dim(x, BATCH_DIM, meshes.tp_group(dst.tp), stride=src.tp)
    if dst.seq_sharded and not src.seq_sharded:
        x = split_dim(x, SEQ_DIM, meshes.tp_group(dst.tp))
    return x


def map_main_input(args: tuple, kwargs: dict, fn: Callable[[torch.Tensor], torch.Tensor]):
    """Apply `fn` to a layer's main input: the first positional tensor, else the
    `hidden_states` keyword (Hugging Face), else the first tensor keyword."""
    for i, value in enumerate(args):
        if isinstance(value, torch.Tensor):
            return args[:i] + (fn(value),) + args[i + 1:], kwargs
    keys = ["hidden_states"] if isinstance(kwargs.get("hidden_states"), torch.Tensor) else []
    keys += [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    if keys:
        kwargs = dict(kwargs)
        kwargs[keys[0]] = fn(kwargs[keys[0]])
    return args, kwargs


def map_main_output(output: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply `fn` to a layer's output tensor (or the first element of a tuple output)."""
    if isinstance(output, torch.Tensor):
        return fn(output)
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return (fn(output[0]), *output[1:])
    return output


def add_input_relayout(module: nn.Module, src: Layout, dst: Layout, meshes: Meshes):
    """Forward pre-hook on `module`: its main input arrives as `src`, it needs `dst`."""

    def hook(_module, args, kwargs):
        return map_main_input(args, kwargs, lambda x: relayout(x, src, dst, meshes))

    # prepend: run before a DTensor style's own input hook when the layer module is itself
    # parallelised (an embedding or head), so the style sees the re-laid-out local tensor
    return module.register_forward_pre_hook(hook, with_kwargs=True, prepend=True)


def add_output_relayout(module: nn.Module, src: Layout, dst: Layout, meshes: Meshes):
    """Forward hook on `module`: its output is `src`, the caller needs `dst`."""

    def hook(_module, _args, output):
        return map_main_output(output, lambda x: relayout(x, src, dst, meshes))

    return module.register_forward_hook(hook)
