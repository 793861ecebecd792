"""Which slices of a full (checkpoint) tensor this rank's local tensor holds: ONE function,
`shard_pieces`, used by every reader and writer of full tensors (`executors.pretrained`,
`executors.pretrained_export`).

    for piece in shard_pieces(param, transform):
        local_tensor(param)[piece.local] = full[piece.full]     # load
        full[piece.full] = local_tensor(param)[piece.local]     # assemble

A parameter is a plain tensor (the whole tensor) or a DTensor sharded over a 1-D or 2-D
mesh (`Shard`, FSDP2's `_StridedShard` under TP, `Replicate`). Per tensor dim the local
tensor's positions map to global indices: DTensor's own shard arithmetic
(`torch.distributed.tensor._utils._get_shard_size_and_offsets`, what DCP's
`compute_local_shape_and_global_offset` is built on; that helper returns only the first
offset, which cannot describe a `_StridedShard` whose rows are not contiguous) gives the
explicit index list of each dim.

A layout transform then maps the STORED global index of one dim (the order the executor
keeps the rows in) to the CHECKPOINT index: identity by default; fused-projection TP
permutes a fused qkv weight's rows so that each TP rank holds its q, k and v heads
together (`executors.fused.FusedDim`, from `layout_transforms`). Each dim's index list is cut into maximal runs of
consecutive checkpoint indices; a piece is one run per dim (their product), so reading
and writing stay rectangular slices (safetensors' `get_slice(name)[a:b, c:d]`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import _get_shard_size_and_offsets
from torch.distributed.tensor.placement_types import _StridedShard

from ir.errors import PlannerError


class LayoutTransform(Protocol):
    """How a parameter's stored rows along `dim` map to the checkpoint's rows."""

    dim: int

    def checkpoint_index(self, stored: torch.Tensor, size: int) -> torch.Tensor:
        """Checkpoint indices (int64) of the stored indices `stored` of a dim of `size`."""

    def checkpoint_size(self, size: int) -> int:
        """The checkpoint's length of a stored dim of `size` (longer where stored rows
        repeat: a fused projection's shared parts)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """One rectangle: `local` indexes this rank's tensor, `full` the checkpoint tensor."""

    local: tuple[slice, ...]
    full: tuple[slice, ...]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.local:
            n *= s.stop - s.start
        return n


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """What this rank stores for `t` (a DTensor's local shard, aliased: writes change `t`)."""
    if isinstance(t, DTensor):
        with torch.no_grad():
            return t.to_local()
    return t


def stored_indices(t: torch.Tensor) -> list[torch.Tensor]:
    """Per dim, the global index of each local position of `t` (this rank's shard)."""
    shape = tuple(t.shape)
    if not isinstance(t, DTensor):
        return [torch.arange(n) for n in shape]
    mesh, placements = t.device_mesh, t.placements
    coordinate = mesh.get_coordinate()
    indices: dict[int, torch.Tensor] = {}
    local_shape = list(shape)
    for mesh_dim, placement in enumerate(placements):  # left to right, as DTensor shards
        if not isinstance(placement, (Shard, _StridedShard)):
            continue  # Replicate: every rank holds the whole dim
        dim = placement.dim
        size, index = _get_shard_size_and_offsets(local_shape[dim], mesh.size(mesh_dim),
                                                  coordinate[mesh_dim], placement,
                                                  indices.get(dim), shape[dim], False)
        local_shape[dim] = size
        indices[dim] = index[:size]  # an empty shard's index names one past the end
    out = [indices.get(d, torch.arange(n)) for d, n in enumerate(shape)]
    held = tuple(local_tensor(t).shape)
    if tuple(len(i) for i in out) != held:  # torch changed its shard arithmetic
        raise PlannerError(f"cannot map a local shard {list(held)} of a {list(shape)} tensor "
                           f"with placements {placements}: this torch version shards "
                           "differently; report it with your torch version")
    return out


def _runs(checkpoint: torch.Tensor) -> list[tuple[slice, slice]]:
    """Maximal runs of consecutive checkpoint indices: (local slice, checkpoint slice)."""
    if len(checkpoint) == 0:
        return []
    breaks = torch.nonzero(checkpoint[1:] != checkpoint[:-1] + 1).flatten() + 1
    bounds = [0] + breaks.tolist() + [len(checkpoint)]
    return [(slice(a, b), slice(int(checkpoint[a]), int(checkpoint[a]) + b - a))
            for a, b in zip(bounds, bounds[1:])]


def shard_pieces(t: torch.Tensor, transform: LayoutTransform | None = None) -> list[Piece]:
    """The rectangles of the checkpoint tensor this rank's local tensor of `t` holds (none
    for an empty shard; one piece, the empty slice tuple, for a 0-dim tensor)."""
    per_dim = stored_indices(t)
    if transform is not None:
        dim = transform.dim
        per_dim[dim] = transform.checkpoint_index(per_dim[dim], t.shape[dim])
    runs = [_runs(index) for index in per_dim]
    return [Piece(tuple(r[0] for r in combo), tuple(r[1] for r in combo))
            for combo in itertools.product(*runs)]


def checkpoint_shape(t: torch.Tensor, transform: LayoutTransform | None) -> tuple[int, ...]:
    """The checkpoint's shape of a (stored) tensor `t`."""
    shape = list(t.shape)
    if transform is not None:
        shape[transform.dim] = transform.checkpoint_size(shape[transform.dim])
    return tuple(shape)


def to_checkpoint_layout(full: torch.Tensor, transform: LayoutTransform | None) -> torch.Tensor:
    """A whole stored tensor in the checkpoint's order and shape (itself under the identity)."""
    if transform is None:
        return full
    out = full.new_empty(checkpoint_shape(full, transform))
    for piece in shard_pieces(full, transform):
        out[piece.full] = full[piece.local]
    return out
