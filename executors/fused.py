"""Fused projections under tensor parallelism: the one place their row order is defined.

A fused column-parallel module packs several projections side by side along its output
features (`TPCandidate.fused`: GPT-2's c_attn is [q | k | v], Phi-3's gate_up_proj is
[gate | up]). A plain contiguous split would hand rank 0 all of q and part of k. So at
apply time the output features are reordered RANK-MAJOR,

    model order   [q_0 q_1 | k_0 k_1 | v_0 v_1]          (tp = 2, x_r: rank r's piece)
    rank-major    [q_0 k_0 v_0 | q_1 k_1 v_1]

and a plain `Shard` gives rank r [q_r | k_r | v_r]: its own heads of each projection,
which the module's forward unpacks with its local sizes (`localize_heads`). DTensor's
_StridedShard would express the same without a copy, but FSDP2's full state dicts do
not keep its order; a plain Shard composes with FSDP2, DCP and `full_tensor()`.

A part may instead be held WHOLE by every rank (`FusedSplit.shared`): multi-query
attention's one key and one value head (Falcon's query_key_value is [q | k | v] with
k = v = one head) beside split query heads. Each rank then stores [q_r | k | v], so the
stored (rank-major) tensor is longer than the model's, holding k and v once per rank:

    model order   [q_0 q_1 | k | v]                       (tp = 2, k and v shared)
    rank-major    [q_0 k v | q_1 k v]

Each rank's copy of a shared part gets only its own query heads' share of the gradient;
`SharedPartsColwise` (executors.tensor_parallel) sums it over the TP group in backward,
so the copies step alike; converting back takes rank 0's copy.

Everything that crosses the boundary of the parallel model converts back: full state
dicts (`executors.state`), checkpoints (`executors.checkpoint`) and the self-check
(`executors.tp_check`) see the model's own order. The record sits on the module
(`FUSED_ATTR`) and says which dim of which parameter is the output-feature dim: 0 for
nn.Linear's weight and any bias, 1 for a Conv1D weight (stored (in, out)).

    >>> split = FusedSplit(parts=(4, 2, 2), tp=2, dims=(("weight", 0),))
    >>> split.order().tolist()   # rank-major position -> model-order feature
    [0, 1, 4, 6, 2, 3, 5, 7]
    >>> FusedSplit((4, 1, 1), 2, (("weight", 0),), shared=(False, True, True)).order().tolist()
    [0, 1, 4, 5, 2, 3, 4, 5]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from ir.errors import PlannerError

FUSED_ATTR = "tp_fused_split"  # attribute of a fused projection module after apply_tp


@dataclass(frozen=True, slots=True)
class FusedSplit:
    """How one fused module's output features are reordered for `tp` ranks."""

    parts: tuple[int, ...]  # output features per packed projection, in the model's order
    tp: int
    dims: tuple[tuple[str, int], ...]  # (parameter name, its output-feature dim)
    shared: tuple[bool, ...] = ()  # per part: held whole by every rank; () = none

    def __str__(self) -> str:
        parts = [f"{n}{'(whole)' if self.is_shared(k) else ''}" for k, n in enumerate(self.parts)]
        return f"fused[{'|'.join(parts)}]/tp{self.tp}"

    def is_shared(self, k: int) -> bool:
        return bool(self.shared) and self.shared[k]

    def local_parts(self) -> tuple[int, ...]:
        """Output features of each part one rank holds, in order."""
        return tuple(n if self.is_shared(k) else n // self.tp for k, n in enumerate(self.parts))

    @property
    def model_features(self) -> int:
        return sum(self.parts)

    @property
    def stored_features(self) -> int:
        """Length of the rank-major dim: the model's, plus a copy of each shared part per
        rank after the first."""
        return self.tp * sum(self.local_parts())

    def model_shape(self, stored_shape, dim: int) -> tuple[int, ...]:
        """The model's shape of a tensor stored with `stored_shape` (its dim `dim` fused)."""
        shape = list(stored_shape)
        if shape[dim] != self.stored_features:
            raise PlannerError(f"{self} does not describe a dim of {shape[dim]}")
        shape[dim] = self.model_features
        return tuple(shape)

    def order(self) -> torch.Tensor:
        """Rank-major position -> the model-order output feature it holds."""
        starts = torch.tensor((0,) + self.parts[:-1]).cumsum(0).tolist()
        pieces = [torch.arange(start, start + n) if self.is_shared(k) else
                  torch.arange(start + r * (n // self.tp), start + (r + 1) * (n // self.tp))
                  for r in range(self.tp)
                  for k, (start, n) in enumerate(zip(starts, self.parts))]
        return torch.cat(pieces)

    def model_positions(self) -> torch.Tensor:
        """Model-order feature -> the first rank-major position holding it (rank 0's
        copy of a shared part); the inverse of `order` where that is a permutation."""
        order = self.order()
        first = torch.full((self.model_features,), len(order), dtype=torch.long)
        return first.scatter_reduce(0, order, torch.arange(len(order)), reduce="amin")

    def to_rank_major(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """A full tensor in the model's order -> rank-major (each rank's pieces together)."""
        return tensor.index_select(dim, self.order().to(tensor.device))

    def to_model_order(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """The inverse of `to_rank_major` (a shared part: rank 0's copy)."""
        return tensor.index_select(dim, self.model_positions().to(tensor.device))


def fused_split(parts: tuple[int, ...], tp: int, module: nn.Module,
                conv1d: bool, shared: tuple[bool, ...] = ()) -> FusedSplit:
    dims = [("weight", 1 if conv1d else 0)]
    if getattr(module, "bias", None) is not None:
        dims.append(("bias", 0))
    return FusedSplit(tuple(parts), tp, tuple(dims), tuple(shared) if any(shared) else ())


@torch.no_grad()
def reorder_for_split(module: nn.Module, split: FusedSplit) -> None:
    """Before the split: reorder the module's own (whole) parameters rank-major, and
    record how (`FUSED_ATTR`). With shared parts the stored tensor is longer: a new
    parameter replaces the model's."""
    for name, dim in split.dims:
        param = getattr(module, name)
        stored = split.to_rank_major(param.detach(), dim)
        if stored.shape == param.shape:
            param.copy_(stored)
        else:
            module.register_parameter(name, nn.Parameter(stored,
                                                         requires_grad=param.requires_grad))
    setattr(module, FUSED_ATTR, split)


def fused_parameters(modules) -> dict[str, tuple[FusedSplit, int]]:
    """Fully qualified parameter name -> (its fused split, its output-feature dim), over
    the given (stage) modules."""
    out: dict[str, tuple[FusedSplit, int]] = {}
    for module in modules:
        for path, sub in module.named_modules():
            split = getattr(sub, FUSED_ATTR, None)
            if isinstance(split, FusedSplit):
                for name, dim in split.dims:
                    out[f"{path}.{name}" if path else name] = (split, dim)
    return out


@dataclass(frozen=True, slots=True)
class FusedDim:
    """One fused parameter as `executors.shard_slices` reads layouts: the dim its packed
    features lie along, and where each stored (rank-major) position sits in the model's
    order, which is the order checkpoints and `from_pretrained` use."""

    split: FusedSplit
    dim: int

    def checkpoint_index(self, stored: torch.Tensor, size: int) -> torch.Tensor:
        if self.split.stored_features != size:
            raise PlannerError(f"{self.split} does not describe a dim of {size}")
        return self.split.order()[stored]

    def checkpoint_size(self, size: int) -> int:
        """The checkpoint's length of the stored dim of `size`."""
        return self.split.model_shape((size,), 0)[0]


def layout_transforms(modules) -> dict[str, FusedDim]:
    """Fully qualified parameter name -> its `FusedDim`, for every fused parameter of the
    given (stage) modules; other parameters are stored in the model's order."""
    return {name: FusedDim(split, dim) for name, (split, dim) in fused_parameters(modules).items()}


def full_in_model_order(tensor: torch.Tensor, split: FusedSplit, dim: int) -> torch.Tensor:
    """A parameter (or a state of its shape) as held by this rank -> the full tensor in
    the model's order (collective over its mesh when it is a DTensor)."""
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return split.to_model_order(full.detach(), dim)


@torch.no_grad()
def load_shard(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's shard of the full tensor `full` into `target` (a DTensor
    parameter or optimizer state, or a plain tensor); no communication."""
    full = full.to(target.device, target.dtype)
    if isinstance(target, DTensor):
        mesh = target.device_mesh
        whole = DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False)
        target.to_local().copy_(whole.redistribute(mesh, target.placements).to_local())
    else:
        target.copy_(full)


def load_model_order(target: torch.Tensor, full: torch.Tensor, split: FusedSplit,
                     dim: int) -> None:
    """`load_shard` of a full tensor in the model's order into a rank-major `target`."""
    load_shard(target, split.to_rank_major(full, dim))
