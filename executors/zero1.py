"""ZeRO-1 as the Megatron-LM distributed optimizer: one flat buffer per layer group.

ZeRO stage 1 (Rajbhandari et al. 2020, P_os) keeps 16-bit parameters and gradients
replicated and shards the optimizer states — fp32 master weights and moments — evenly
over the data-parallel group: 2Ψ + 2Ψ + KΨ/Nd bytes per rank (K = 12 for Adam). The
layout is the Megatron-LM distributed optimizer's (megatron/core/optimizer/
distrib_optimizer.py): a layer group's parameters (this rank's TP-local tensors, in
order) are laid end to end as one flat range, padded to a multiple of Nd, and rank r
of the group owns elements [r·S, (r+1)·S), S = ceil(Ψ_group / Nd). A parameter cut by a
boundary is split between ranks; each rank's part of one parameter is one `Piece`.

Per step, for each group (`FlatShardGroup`):
  1. gradients: FSDP2's `replicate` has already all-reduced them in backward (fp32
     reduction, stored in the parameter dtype). Each rank takes its pieces (`attach_grads`):
     under mixed precision copied into an fp32 buffer of S elements (the master
     weights' gradients, freed after the step); in fp32 views of the gradient itself.
  2. a real torch optimizer (any: AdamW, Adam, SGD with momentum) steps on the pieces —
     views into the fp32 master shard, or in fp32 training into the parameters
     themselves (the parameter is the master copy then). Element-wise optimizers give
     exactly the numbers of an unsharded one.
  3. all-gather: each rank's updated shard, cast to the parameter dtype, into one flat
     buffer of the group, then copied into every parameter (`all_gather_params`).

Why all-reduce and not reduce-scatter: the gradient reduction is FSDP2 `replicate`'s
(per layer, overlapped with backward, switched off for accumulating micro-batches and
pipeline stages by `set_requires_gradient_sync`), as the paper's P_os stage describes
(gradients averaged as in data parallelism, section 5.1). Reduce-scattering into the
shard would halve the gradient traffic (Megatron's 2Ψ in all, against 2Ψ + Ψ here) and
is left for later.

Mixed precision: `cast_to_working_dtype` runs before `replicate` wraps the layer; it
copies this rank's shard of the fp32 parameters into the master buffer and casts the
parameters to 16 bits. FSDP2 then computes in that dtype without a cast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

# Attribute under which `cast_to_working_dtype` hands a group's fp32 master shard to
# `executors.optimizer.build_optimizer` (set on the group's wrapped parameters).
MASTER_ATTR = "_planner_zero1_master_fp32"
# On a parameter stored as a 16-bit working copy: the model tensor's own dtype (stays
# set: `executors.state.full_state_dict` gathers it back in that dtype).
WORKING_COPY_ATTR = "_planner_zero1_working_copy"


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores for `t` (a DTensor's local shard, aliased: writes to it
    change `t`)."""
    if isinstance(t, DTensor):
        with torch.no_grad():  # to_local() returns the stored shard itself without autograd
            return t.to_local()
    return t


@dataclass(frozen=True, slots=True)
class Piece:
    """This rank's part of one parameter: elements [lo, hi) of its flattened local tensor,
    stored at [offset, offset + hi - lo) of the rank's shard."""

    index: int  # position of the parameter in its group
    lo: int
    hi: int
    offset: int

    @property
    def numel(self) -> int:
        return self.hi - self.lo


def shard_numel(numels: list[int], dp: int) -> int:
    """S: elements each rank of the group owns (the flat buffer padded to dp · S)."""
    return math.ceil(sum(numels) / dp) if numels else 0


def rank_pieces(numels: list[int], dp: int, rank: int) -> list[Piece]:
    """The pieces of the flat range [rank·S, (rank+1)·S) (Megatron's `_build_model_gbuf_
    param_range_map`: each parameter's intersection with the rank's range)."""
    size = shard_numel(numels, dp)
    start, end = rank * size, (rank + 1) * size
    pieces, base = [], 0
    for i, n in enumerate(numels):
        lo, hi = max(start, base), min(end, base + n)
        if lo < hi:
            pieces.append(Piece(i, lo - base, hi - base, lo - start))
        base += n
    return pieces


def flat_range_boxes(shape: tuple[int, ...], lo: int, hi: int
                     ) -> list[tuple[tuple[int, ...], tuple[int, ...], int]]:
    """Elements [lo, hi) of a row-major tensor of `shape` as rectangular boxes
    (offsets, sizes, first flat index), each contiguous in flat order, in order."""
    if lo >= hi:
        return []
    if len(shape) <= 1:
        return [((lo,), (hi - lo,), lo)] if shape else [((), (), lo)]
    inner = math.prod(shape[1:])
    if inner == 0:
        return []
    first, last = lo // inner, (hi - 1) // inner
    if first == last:  # inside one row
        return [((first,) + o, (1,) + s, first * inner + f)
                for o, s, f in flat_range_boxes(shape[1:], lo - first * inner, hi - first * inner)]
    boxes = []
    if lo % inner:  # the partial first row
        boxes += flat_range_boxes(shape, lo, (first + 1) * inner)
        first += 1
    full_end = hi // inner  # rows [first, full_end) are whole
    if full_end > first:
        boxes.append(((first,) + (0,) * (len(shape) - 1), (full_end - first,) + tuple(shape[1:]),
                      first * inner))
    if hi % inner:  # the partial last row
        boxes += flat_range_boxes(shape, full_end * inner, hi)
    return boxes


def _group_rank(group: dist.ProcessGroup) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def cast_to_working_dtype(module: nn.Module, group: dist.ProcessGroup,
                          dtype: torch.dtype) -> None:
    """Before `replicate` wraps `module`: keep this rank's shard of its fp32 trainable
    parameters as the master weights, then store every floating parameter in `dtype`.
    `attach_master` hands the shard to the optimizer once the layer is wrapped."""
    params = [p for p in module.parameters() if p.requires_grad]
    locals_ = [local_tensor(p) for p in params]
    dp, rank = _group_rank(group)
    pieces = rank_pieces([t.numel() for t in locals_], dp, rank)
    master = torch.empty(sum(x.numel for x in pieces), dtype=torch.float32,
                         device=locals_[0].device if locals_ else None)
    with torch.no_grad():
        for x in pieces:
            master[x.offset:x.offset + x.numel].copy_(locals_[x.index].reshape(-1)[x.lo:x.hi])
        cast: dict[int, nn.Parameter] = {}  # a parameter registered twice stays one
        originals: dict[str, torch.dtype] = {}  # each cast one's dtype, by qualified name
        # new Parameters: `p.data =` keeps a DTensor's local dtype
        for prefix, sub in module.named_modules(remove_duplicate=False):
            for name, p in list(sub._parameters.items()):
                if p is not None and p.is_floating_point() and p.dtype != dtype:
                    if id(p) not in cast:
                        cast[id(p)] = nn.Parameter(p.detach().to(dtype),
                                                   requires_grad=p.requires_grad)
                    sub._parameters[name] = cast[id(p)]
                    originals[f"{prefix}.{name}" if prefix else name] = p.dtype
    module.__dict__[MASTER_ATTR] = master
    module.__dict__[WORKING_COPY_ATTR] = originals


def attach_master(module: nn.Module) -> None:
    """After `replicate`: put the master shard on the wrapped parameters, where
    `build_optimizer` (which sees only parameters) finds it."""
    master = module.__dict__.pop(MASTER_ATTR, None)
    originals = module.__dict__.pop(WORKING_COPY_ATTR, {})
    if master is not None:
        for name, p in module.named_parameters(remove_duplicate=False):
            if p.requires_grad:
                setattr(p, MASTER_ATTR, master)
            if name in originals:  # only those `cast_to_working_dtype` cast
                setattr(p, WORKING_COPY_ATTR, originals[name])


class FlatShardGroup:
    """One ZeRO-1 layer group on one rank: its pieces, the tensors the optimizer updates
    (`opt_params`, one per piece) and the all-gather that rebuilds the parameters."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup):
        self.params = params
        self.group = group
        self.dp, self.rank = _group_rank(group)
        locals_ = [local_tensor(p) for p in params]
        self.numels = [t.numel() for t in locals_]
        self.shard = shard_numel(self.numels, self.dp)
        self.pieces = rank_pieces(self.numels, self.dp, self.rank)
        self.master: torch.Tensor | None = getattr(params[0], MASTER_ATTR, None) if params else None
        for p in params:
            if hasattr(p, MASTER_ATTR):
                delattr(p, MASTER_ATTR)
        if self.master is not None:  # mixed precision: views into the fp32 master shard
            self.opt_params = [self.master[x.offset:x.offset + x.numel].detach()
                               for x in self.pieces]
        else:  # fp32: the parameters are their own master copy
            self.opt_params = [locals_[x.index].detach().view(-1)[x.lo:x.hi] for x in self.pieces]

    def attach_grads(self, multiplier: float | torch.Tensor = 1.0) -> None:
        """Give each piece its part of the (all-reduced) gradient, in fp32; the copies of
        16-bit gradients are multiplied by `multiplier` (fp16's unscale times the clip's
        coefficient, in fp32; a tensor stays on the device, no host read)."""
        multiply = isinstance(multiplier, torch.Tensor) or multiplier != 1.0
        grads = [local_tensor(p.grad) if p.grad is not None else None for p in self.params]
        buf = None
        if self.master is not None and self.pieces:
            buf = torch.empty_like(self.master)  # the master weights' gradient shard
        for x, t in zip(self.pieces, self.opt_params):
            g = grads[x.index]
            if g is None:
                t.grad = None
            elif buf is None:
                t.grad = g.reshape(-1)[x.lo:x.hi]
            else:
                t.grad = buf[x.offset:x.offset + x.numel]
                t.grad.copy_(g.reshape(-1)[x.lo:x.hi])
                if multiply:
                    t.grad.mul_(multiplier)

    def release_grads(self) -> None:
        for t in self.opt_params:
            t.grad = None

    @torch.no_grad()
    def all_gather_params(self) -> None:
        """Every rank's updated shard into every parameter (one all-gather of dp · S)."""
        if not self.params:
            return
        locals_ = [local_tensor(p) for p in self.params]
        dtype, device = locals_[0].dtype, locals_[0].device
        send = torch.zeros(self.shard, dtype=dtype, device=device)
        for x, t in zip(self.pieces, self.opt_params):
            send[x.offset:x.offset + x.numel].copy_(t)
        flat = torch.empty(self.shard * self.dp, dtype=dtype, device=device)
        _all_gather_single(flat, send, self.group)
        del send
        offset = 0
        for t, n in zip(locals_, self.numels):
            t.view(-1).copy_(flat[offset:offset + n])
            offset += n


def _all_gather_single(out: torch.Tensor, shard: torch.Tensor, group) -> None:
    """`dist.all_gather_single` from torch 2.13 on; torch 2.11 (what the lent GPU machines
    run) has only its older name `all_gather_into_tensor` (2.13 forwards that to it)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, shard, group=group)
