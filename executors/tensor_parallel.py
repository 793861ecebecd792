"""Tensor and sequence parallelism of one layer with DTensor parallel styles (Megatron).

Per TP candidate of the layer IR (`Layer.tp_candidates`, paths relative to the layer):

    colwise  ColwiseParallel()                          q/k/v, MLP up/gate: split outputs
    rowwise  RowwiseParallel()                          attention out, MLP down: all-reduce
             RowwiseParallel(output_layouts=Shard(1))   ... reduce-scatter under SP

A Conv1D (GPT-2; weight stored (in, out)) gets the same styles with the weight split on
the transposed dim (`Conv1DColwise`: Shard(1), `Conv1DRowwise`: Shard(0)): parameter
names, shapes and layout stay the model's own, so state dicts, checkpoints, tied weights
and FSDP see what the single-device model has, and DTensor runs Conv1D's own addmm. A
fused [q | k | v] / [gate | up] module is reordered rank-major first (`executors.fused`);
one whose k and v stay whole on every rank (multi-query: Falcon's query_key_value) runs
`SharedPartsColwise` instead, which sums those parts' gradients over the TP group.
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

After the split, each attention module holding column-parallel projections gets its
LOCAL head counts and head-concatenated sizes (`num_heads`, `embed_dim`, ...; a config it
reads them from is replaced by the module's own copy), since attention code reshapes with
them (OPT, BART, Whisper: `view(B, T, self.num_heads, head_dim)`); other layers keep the
global counts. Parameter-owning modules inside a split parent (Qwen3's per-head q_norm)
see only their rank's heads: their weights stay replicated and their gradients are summed
over the TP group (a Partial gradient, reduced by `reduce_partial_grads`); so are the
key/value projections multi-query attention keeps whole (`SharedProjection`). A layer whose
TP degree > 1 has no TP candidates (a norm, a position embedding) runs replicated: every
rank of its TP group computes it on the same rows. `tp_problem` lists what cannot run.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (DTensor, Partial, Placement, Replicate, Shard,
                                     distribute_module, distribute_tensor)
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from executors.fused import FUSED_ATTR, FusedSplit, fused_split, reorder_for_split
from executors.layout import SEQ_DIM, map_main_input
from ir.dtensor_ops import in_split_parent, replicated_param_modules
from ir.layer import Layer, TPStyle
from ir.legality import is_tp_block, sequence_parallel_applies, sequence_parallel_problem
from ir.strategy import LayerStrategy
from ir.tp import HEAD_ATTRS, KV_HEAD_ATTRS, fused_shared, head_counts, is_conv1d

# Head-concatenated sizes attention code reshapes with next to its head counts (OPT/BART
# embed_dim, BERT all_head_size, GPT-2/Falcon split_size and hidden_size).
_LOCAL_SIZE_ATTRS = ("embed_dim", "all_head_size", "split_size", "hidden_size", "inner_dim")
# Tensor dim a replicated in-region module's input is declared split along: any dim but the
# one it normalises works, as the declaration only makes its weight gradient Partial.
_REGION_SPLIT_DIM = 0


def _norm_modules(layer: Layer, module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules of the layer that own parameters directly but are not TP candidates."""
    return replicated_param_modules(module, [c.module for c in layer.tp_candidates])


def _parents(paths: list[str]) -> list[str]:
    return sorted({p.rsplit(".", 1)[0] if "." in p else "" for p in paths})


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
        want = nn.Embedding if cand.style is TPStyle.VOCAB else nn.Linear
        block_conv1d = cand.style in (TPStyle.COLWISE, TPStyle.ROWWISE) and is_conv1d(sub)
        if not isinstance(sub, want) and not block_conv1d:
            return (f"layer {layer.name}: {cand.module or '(the layer)'} is a "
                    f"{type(sub).__name__}; DTensor {cand.style} parallelism here splits "
                    f"{want.__name__} only; use tp=1 for this layer")
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
    sp = sequence_parallel_applies(layer, strategy)
    plan: dict[str, ParallelStyle] = {}
    for cand in layer.tp_candidates:
        conv1d = is_conv1d(module.get_submodule(cand.module)) if cand.module else False
        if cand.style is TPStyle.COLWISE and _shared_parts(module, cand.module, cand.fused):
            plan[cand.module] = SharedPartsColwise()
        elif cand.style is TPStyle.COLWISE:
            plan[cand.module] = Conv1DColwise() if conv1d else ColwiseParallel()
        elif cand.style is TPStyle.ROWWISE:
            rowwise = Conv1DRowwise if conv1d else RowwiseParallel
            plan[cand.module] = rowwise(output_layouts=Shard(SEQ_DIM) if sp else Replicate())
        elif cand.style is TPStyle.VOCAB:
            plan[cand.module] = RowwiseParallel(input_layouts=Replicate(),
                                                output_layouts=Replicate())
        elif cand.style is TPStyle.HEAD and loss_parallel:
            plan[cand.module] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
        elif cand.style is TPStyle.HEAD:
            plan[cand.module] = ColwiseParallel(output_layouts=Replicate())
    for path, sub in _norm_modules(layer, module):
        if _shared_projection(layer, path, sub):  # MQA's one key/value head
            plan[path] = SharedProjection()
        elif sp:  # norms run on the sequence chunk
            plan[path] = SequenceParallel(sequence_dim=SEQ_DIM, use_local_output=True)
        elif _in_split_parent(layer, path):  # a per-head norm (Qwen3 q_norm), this rank's heads
            plan[path] = SequenceParallel(sequence_dim=_REGION_SPLIT_DIM, use_local_output=True)
    return plan


def _in_split_parent(layer: Layer, path: str) -> bool:
    """`path` sits inside a module whose column-parallel projections are split (not the
    layer itself): it sees this rank's heads / features only."""
    return in_split_parent([c.module for c in layer.tp_candidates
                            if c.style is TPStyle.COLWISE], path)


def _shared_projection(layer: Layer, path: str, sub: nn.Module) -> bool:
    """A Linear left whole inside a split attention: multi-query attention's key/value."""
    return isinstance(sub, nn.Linear) and _in_split_parent(layer, path)


def _distribute_params(module: nn.Module, mesh: DeviceMesh, placements: dict[str, Placement],
                       src_data_rank) -> None:
    for name, param in list(module.named_parameters(recurse=False)):
        module.register_parameter(name, nn.Parameter(
            distribute_tensor(param, mesh, [placements[name]], src_data_rank=src_data_rank),
            requires_grad=param.requires_grad))


class Conv1DColwise(ColwiseParallel):
    """ColwiseParallel for a Conv1D: output features are the weight's dim 1."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def partition(_name, mod, mesh):
            _distribute_params(mod, mesh, {"weight": Shard(1), "bias": Shard(0)},
                               self.src_data_rank)

        return distribute_module(
            module, device_mesh, partition,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class Conv1DRowwise(RowwiseParallel):
    """RowwiseParallel for a Conv1D: input features are the weight's dim 0."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.desired_input_layouts = (Shard(-1),)

        def partition(_name, mod, mesh):
            _distribute_params(mod, mesh, {"weight": Shard(0), "bias": Replicate()},
                               self.src_data_rank)

        return distribute_module(
            module, device_mesh, partition,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class SharedProjection(ParallelStyle):
    """A projection kept whole on every rank of a split attention (multi-query attention's
    one key/value head). Its input is the replicated hidden state; each rank's query heads
    use its output, so the output's gradient is a partial sum: declared Partial, it makes
    the weight gradient Partial (summed by `reduce_partial_grads`) and the input gradient
    all-reduced where the input entered as Replicate."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def replicate_params(_name, mod, mesh):
            for name, param in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(name, nn.Parameter(
                    DTensor.from_local(param, mesh, [Replicate()], run_check=False)))

        def replicated_input(_mod, inputs, mesh):
            x = inputs[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, mesh, (Replicate(),), run_check=False)
            return (x, *inputs[1:])

        def partial_grad_output(_mod, output, _mesh):
            return output.to_local(grad_placements=(Partial(),))

        return distribute_module(module, device_mesh, replicate_params, replicated_input,
                                 partial_grad_output)


def _shared_parts(module: nn.Module, path: str, parts: tuple[int, ...]) -> tuple[bool, ...]:
    """Per part of the fused module at `path`: held whole by every rank (`ir.tp.fused_shared`,
    read while the attention still has its global head counts)."""
    if not parts or "." not in path:
        return ()
    return fused_shared(parts, module.get_submodule(path.rsplit(".", 1)[0]))


class _SumGradOverGroup(torch.autograd.Function):
    """Identity forward; backward sums the gradient over `group` (Megatron's f)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _with_shared_grads(param: torch.Tensor, split: FusedSplit, dim: int, group) -> torch.Tensor:
    """This rank's [split pieces | shared parts] of `param` as one local tensor whose
    shared parts' gradients are summed over `group` in backward (each rank's copy sees
    only its own query heads' share)."""
    local = param.to_local() if isinstance(param, DTensor) else param
    pieces = local.split(split.local_parts(), dim)
    return torch.cat([_SumGradOverGroup.apply(x, group) if split.is_shared(k) else x
                      for k, x in enumerate(pieces)], dim)


def _shared_parts_forward(module: nn.Module, mesh: DeviceMesh, x: torch.Tensor) -> torch.Tensor:
    """A fused Linear's forward on this rank's [q_r | k | v] rows (`SharedPartsColwise`)."""
    split: FusedSplit = getattr(module, FUSED_ATTR)
    group = mesh.get_group()
    if isinstance(x, DTensor):  # gathered for sequence parallelism: its grad is a partial sum
        x = x.to_local(grad_placements=(Partial(),))
    else:  # replicated over the group: the input gradient is a partial sum, all-reduced
        x = _SumGradOverGroup.apply(x, group)
    dims = dict(split.dims)
    weight = _with_shared_grads(module.weight, split, dims["weight"], group)
    bias = _with_shared_grads(module.bias, split, dims["bias"], group) if "bias" in dims else None
    # (B, T, in) @ (in, local_out): a Conv1D weight is stored (in, out), a Linear's (out, in)
    return torch.nn.functional.linear(x, weight.t() if dims["weight"] == 1 else weight, bias)


class SharedPartsColwise(ParallelStyle):
    """A fused column-parallel module some of whose parts every rank holds whole
    (`executors.fused.FusedSplit.shared`: multi-query attention's k and v beside split
    query heads). Its rank-major parameters are split plainly (`Shard` of the output
    features: rank r holds [q_r | k | v]); its forward computes this rank's outputs from
    them, summing the shared parts' gradients over the TP group in backward, so their
    copies step alike, and the input's gradient too (as ColwiseParallel does). The
    output is this rank's local features, as `use_local_output` gives."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        split: FusedSplit = getattr(module, FUSED_ATTR)

        def partition(_name, mod, mesh):
            _distribute_params(mod, mesh, {name: Shard(dim) for name, dim in split.dims},
                               None)

        distribute_module(module, device_mesh, partition)
        module.forward = partial(_shared_parts_forward, module, device_mesh)
        return module


def _own_output(_module, _args, output):
    """Forward hook: a row-parallel output as a tensor of its own. DTensor hands back a
    view made inside an autograd Function, and code that adds into it in place (Falcon's
    `mlp_output += attention_output`) is refused by autograd; one copy per row-parallel
    module (2 per block, one activation each) avoids that."""
    if isinstance(output, torch.Tensor) and not isinstance(output, DTensor) \
            and output._base is not None:
        return output.clone()
    return output


def _local(value, tp: int):
    """value // tp for a positive int count divisible by tp, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0 and value % tp == 0:
        return value // tp
    return None


def localize_heads(attention: nn.Module, tp: int) -> None:
    """Give a split attention module its local head counts and sizes, on the instance: its
    own attributes, and a copy of its config (the shared config stays global)."""
    kv_split = any(_local(vars(attention).get(k), tp) for k in KV_HEAD_ATTRS)
    config = getattr(attention, "config", None)
    if config is not None and not isinstance(config, nn.Module):
        counts = {k: _local(getattr(config, k, None), tp) for k in HEAD_ATTRS + KV_HEAD_ATTRS}
        counts = {k: v for k, v in counts.items() if v is not None}
        kv_split = kv_split or any(k in counts for k in KV_HEAD_ATTRS)
        if counts:
            own = copy.copy(config)
            for key, value in counts.items():
                setattr(own, key, value)
            attention.config = own
    for name in HEAD_ATTRS + KV_HEAD_ATTRS + _LOCAL_SIZE_ATTRS:
        local = _local(vars(attention).get(name), tp)
        if local is not None:
            setattr(attention, name, local)
    groups = _local(vars(attention).get("num_key_value_groups"), tp)
    if groups is not None and not kv_split:  # whole KV heads: fewer query heads per KV head
        attention.num_key_value_groups = groups


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


def _aliased_names(module: nn.Module) -> list[tuple[int, list[str]]]:
    """(tensor id, its names) for every parameter the layer holds under several names
    (BERT's `cls.predictions.bias` is `cls.predictions.decoder.bias`)."""
    names: dict[int, list[str]] = {}
    for fqn, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(fqn)
    return [(pid, fqns) for pid, fqns in names.items() if len(fqns) > 1]


def _retie(module: nn.Module, aliases: list[tuple[int, list[str]]]) -> None:
    """parallelize_module replaces a parameter under the one name it splits; the layer's
    other names of that tensor would keep the unsplit original, never trained. Point
    them at the split parameter."""
    for pid, fqns in aliases:
        current = [module.get_parameter(f) for f in fqns]
        replaced = [p for p in current if id(p) != pid]
        if not replaced:
            continue
        for fqn in fqns:
            path, _, attr = fqn.rpartition(".")
            (module.get_submodule(path) if path else module).register_parameter(attr, replaced[0])


def apply_tp(module: nn.Module, layer: Layer, strategy: LayerStrategy, mesh: DeviceMesh,
             loss_parallel: bool = False) -> None:
    """Split `module` (the layer) over the 1-D TP mesh `mesh`, in place. `loss_parallel`:
    this is the last layer's head and the loss runs under `loss_parallel()`."""
    if strategy.tp == 1 or not layer.tp_candidates:
        return
    plan = layer_tp_plan(layer, module, strategy, loss_parallel)
    aliases = _aliased_names(module)
    for cand in layer.tp_candidates:
        if cand.fused:  # [q | k | v] -> [q_r k_r v_r] per rank, before the plain split
            sub = module.get_submodule(cand.module)
            reorder_for_split(sub, fused_split(cand.fused, strategy.tp, sub, is_conv1d(sub),
                                               _shared_parts(module, cand.module, cand.fused)))
    whole = plan.pop("", None)  # a candidate that is the layer itself (an embedding, a head)
    if whole is not None:
        parallelize_module(module, mesh, whole, src_data_rank=None)
    if plan:
        # src_data_rank=None: every rank built the same weights, so each keeps its shard
        # without a scatter from rank 0.
        parallelize_module(module, mesh, plan, src_data_rank=None)
    _retie(module, aliases)
    for cand in layer.tp_candidates:
        if cand.style is TPStyle.ROWWISE:
            module.get_submodule(cand.module).register_forward_hook(_own_output)
    colwise = [c.module for c in layer.tp_candidates if c.style is TPStyle.COLWISE]
    for parent in _parents(colwise):
        if parent and head_counts(module.get_submodule(parent)):  # an attention module
            localize_heads(module.get_submodule(parent), strategy.tp)
    if sequence_parallel_applies(layer, strategy):
        for parent in _parents(colwise):
            module.get_submodule(parent).register_forward_pre_hook(
                _gather_sequence_hook(mesh), with_kwargs=True)
