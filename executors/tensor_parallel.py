"""Tensor and sequence parallelism of one layer with DTensor parallel styles (Megatron).

Per TP candidate of the layer IR (`Layer.tp_candidates`, paths relative to the layer):

    colwise  ColwiseParallel()                          q/k/v, MLP up/gate: split outputs
    rowwise  RowwiseParallel()                          attention out, MLP down: all-reduce
             RowwiseParallel(output_layouts=Shard(1))   ... reduce-scatter under SP
    vocab    RowwiseParallel() on the embedding         table split over the vocabulary
    head     the model's last layer: ColwiseParallel(output_layouts=Shard(-1),
             use_local_output=False): the logits stay split over the vocabulary as a
             DTensor and the loss runs under `loss_parallel()` (a vocab-parallel
             cross-entropy: no rank holds the full (B, T, V) logits). This needs a
             cross-entropy loss (`F.cross_entropy`, any ignore_index, no label
             smoothing); `apply(..., loss_parallel=False)` gathers the logits instead
             (ColwiseParallel(output_layouts=Replicate())) for any other loss, as it
             does for a head that is not the last layer.

Sequence parallelism (Korthikanti et al. 2022) keeps the residual stream split along the
sequence (tensor dim 1) between the TP regions: the layer's norms run under
`SequenceParallel` (their weight gradients come out Partial: `reduce_partial_grads`
all-reduces them once per step), the parent module
of the column-parallel linears (the attention or MLP module) gets its input all-gathered
along the sequence as a Replicate DTensor (reduce-scatter in backward), and the
row-parallel linears reduce-scatter their output. The layer's input is split and its
output gathered by `executors.layout` only where the neighbouring layer is not SP.

Attention modules must infer their local head count from the projections' output
(`view(B, T, -1, head_dim)`), as the zoo and Hugging Face models do. A layer whose TP
degree > 1 has no TP candidates (a norm, a position embedding) runs replicated: every rank
of its TP group computes it on the same rows. `tp_problem` lists what cannot run.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from executors.layout import SEQ_DIM, map_main_input
from ir.layer import Layer, TPStyle
from ir.legality import is_tp_block, sequence_parallel_applies, sequence_parallel_problem
from ir.strategy import LayerStrategy
from ir.tp import FUSED_PROJECTIONS  # [q | k | v], [gate | up]: never split column-wise


def _norm_modules(layer: Layer, module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules of the layer that own parameters directly but are not TP candidates."""
    candidates = [c.module for c in layer.tp_candidates]
    out = []
    for path, sub in module.named_modules():
        if not any(True for _ in sub.parameters(recurse=False)):
            continue
        if any(path == c or path.startswith(c + ".") or c == "" for c in candidates):
            continue
        out.append((path, sub))
    return out


def _parents(paths: list[str]) -> list[str]:
    return sorted({p.rsplit(".", 1)[0] if "." in p else "" for p in paths})


def uses_sequence_parallel(layer: Layer, strategy: LayerStrategy) -> bool:
    """SP runs on this layer (`ir.legality.sequence_parallel_applies`: a TP block whose
    non-TP modules are norms); on an embedding, head or norm the flag changes nothing."""
    return sequence_parallel_applies(layer, strategy)


def tp_problem(layer: Layer, module: nn.Module, strategy: LayerStrategy,
               seq_len: int | None) -> str | None:
    """Why this layer cannot run with its TP degree / SP, or None."""
    tp = strategy.tp
    if tp == 1 or not layer.tp_candidates:
        return None
    problem = layer.tp_violation(tp)
    if problem:
        return problem
    for cand in layer.tp_candidates:
        sub = module.get_submodule(cand.module) if cand.module else module
        leaf = cand.module.rsplit(".", 1)[-1]
        want = nn.Embedding if cand.style is TPStyle.VOCAB else nn.Linear
        if not isinstance(sub, want):
            return (f"layer {layer.name}: {cand.module or '(the layer)'} is a "
                    f"{type(sub).__name__}; DTensor {cand.style} parallelism here splits "
                    f"{want.__name__} only; use tp=1 for this layer")
        if leaf in FUSED_PROJECTIONS and cand.style is TPStyle.COLWISE:
            return (f"layer {layer.name}: {cand.module} is a fused projection; a column "
                    f"split would mix heads across ranks; use tp=1 for this layer")
    if strategy.sequence_parallel and is_tp_block(layer.tp_candidates):
        problem = sequence_parallel_problem(layer.name, module, layer.tp_candidates)
        if problem:
            return problem
        if seq_len is None or seq_len % tp:
            return (f"layer {layer.name}: sequence parallel needs the sequence length "
                    f"({seq_len}) divisible by tp={tp}")
    return None


def layer_tp_plan(layer: Layer, module: nn.Module, strategy: LayerStrategy,
                  loss_parallel: bool = False) -> dict[str, ParallelStyle]:
    """module path (relative to the layer) -> DTensor parallel style."""
    sp = uses_sequence_parallel(layer, strategy)
    plan: dict[str, ParallelStyle] = {}
    for cand in layer.tp_candidates:
        if cand.style is TPStyle.COLWISE:
            plan[cand.module] = ColwiseParallel()
        elif cand.style is TPStyle.ROWWISE:
            plan[cand.module] = RowwiseParallel(
                output_layouts=Shard(SEQ_DIM) if sp else Replicate())
        elif cand.style is TPStyle.VOCAB:
            plan[cand.module] = RowwiseParallel(input_layouts=Replicate(),
                                                output_layouts=Replicate())
        elif cand.style is TPStyle.HEAD and loss_parallel:
            plan[cand.module] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
        elif cand.style is TPStyle.HEAD:
            plan[cand.module] = ColwiseParallel(output_layouts=Replicate())
    if sp:
        for path, _ in _norm_modules(layer, module):
            plan[path] = SequenceParallel(sequence_dim=SEQ_DIM, use_local_output=True)
    return plan


def _gather_sequence_hook(mesh: DeviceMesh):
    """Pre-hook: local sequence chunk -> full-sequence Replicate DTensor (reduce-scatter
    of the gradient in backward), so attention sees every position."""

    def to_full(x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, DTensor):
            return x.redistribute(mesh, (Replicate(),))
        return DTensor.from_local(x, mesh, (Shard(SEQ_DIM),), run_check=False).redistribute(
            mesh, (Replicate(),))

    def hook(_module, args, kwargs):
        return map_main_input(args, kwargs, to_full)

    return hook


# Partial reductions one bucketed all-reduce does (sum, then / group size for avg); a
# gradient Partial under another op is left to DTensor.
_BUCKETED_REDUCE_OPS = ("sum", "avg")


@torch.no_grad()
def reduce_partial_grads(params: Iterable[nn.Parameter]) -> None:
    """Give every Partial gradient (the weights of SequenceParallel norms, replicated
    biases under SP) its parameter's placements, with one all-reduce per mesh, dtype and
    Partial dimensions. Left Partial, each optimizer op on it redistributes again: one
    all-reduce per op per tensor (AdamW: four), which on gloo costs more than the step."""
    buckets: dict[tuple, list[nn.Parameter]] = {}
    for p in params:
        grad = p.grad
        if not isinstance(grad, DTensor):
            continue
        partial = tuple((i, pl.reduce_op) for i, pl in enumerate(grad.placements)
                        if pl.is_partial())
        if partial and all(op in _BUCKETED_REDUCE_OPS for _, op in partial):
            key = (id(grad.device_mesh), grad.dtype, partial)
            buckets.setdefault(key, []).append(p)
    for (_, _, partial), bucket in buckets.items():
        mesh = bucket[0].grad.device_mesh
        shards = [p.grad.to_local() for p in bucket]
        flat = torch.cat([t.reshape(-1) for t in shards])
        for dim, op in partial:
            dist.all_reduce(flat, group=mesh.get_group(dim))
            if op == "avg":
                flat /= mesh.size(dim)
        reduced = {dim for dim, _ in partial}
        for p, shard, chunk in zip(bucket, shards, flat.split([t.numel() for t in shards])):
            grad = p.grad
            placements = [Replicate() if i in reduced else pl
                          for i, pl in enumerate(grad.placements)]
            full = DTensor.from_local(chunk.view_as(shard), mesh, placements, run_check=False,
                                      shape=grad.shape, stride=grad.stride())
            p.grad = full if tuple(placements) == tuple(p.placements) else \
                full.redistribute(mesh, p.placements)


def is_loss_parallel_head(layer: Layer, strategy: LayerStrategy, is_last: bool) -> bool:
    """A vocab-split head whose logits go straight to the loss."""
    return (is_last and strategy.tp > 1
            and any(c.style is TPStyle.HEAD for c in layer.tp_candidates))


def apply_tp(module: nn.Module, layer: Layer, strategy: LayerStrategy, mesh: DeviceMesh,
             loss_parallel: bool = False) -> None:
    """Split `module` (the layer) over the 1-D TP mesh `mesh`, in place. `loss_parallel`:
    this is the last layer's head and the loss runs under `loss_parallel()`."""
    if strategy.tp == 1 or not layer.tp_candidates:
        return
    plan = layer_tp_plan(layer, module, strategy, loss_parallel)
    whole = plan.pop("", None)  # a candidate that is the layer itself (an embedding, a head)
    if whole is not None:
        parallelize_module(module, mesh, whole, src_data_rank=None)
    if plan:
        # src_data_rank=None: every rank built the same weights, so each keeps its shard
        # without a scatter from rank 0.
        parallelize_module(module, mesh, plan, src_data_rank=None)
    if uses_sequence_parallel(layer, strategy):
        colwise = [c.module for c in layer.tp_candidates if c.style is TPStyle.COLWISE]
        for parent in _parents(colwise):
            module.get_submodule(parent).register_forward_pre_hook(
                _gather_sequence_hook(mesh), with_kwargs=True)
