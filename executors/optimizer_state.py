"""Optimizer state in checkpoints, in the parameters' own global layout.

Every plan saves a parameter's state under `optim/<fqn>/<key>` with the parameter's
global shape (AdamW's exp_avg, exp_avg_sq; a scalar `step`), so DCP can load it into
any other plan's layout. A plain optimizer's state has its parameter's layout already
(a DTensor for TP / FSDP shards and replicated units, else a plain tensor).

A ZeRO-1 rank (`executors.zero1`) holds, for each parameter it touches, one piece: a
contiguous range of the flattened local tensor. `PieceTensor` shows DCP that range as
the rectangles it covers in the global tensor (`flat_range_boxes`, moved by the TP
shard's offset), each a view of the piece, through the checkpoint protocol DTensor
implements (`__create_write_items__`, `__create_chunk_list__`, `__get_tensor_shard__`):
DCP writes and reads the rectangles in place. Under mixed precision the piece of the
fp32 master weights is saved as `model/<fqn>` instead of the 16-bit parameter (its
rounding), so a resume is bit-identical and a plan keeping fp32 weights loads the
master.

A fused projection's parameter (`executors.fused`) is held rank-major; its states are
saved whole in the model's order like the parameter itself, so under ZeRO-1 its pieces
are first all-gathered over the data-parallel group (`_whole_in_model_order`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from executors.fused import FusedSplit, full_in_model_order, load_model_order
from executors.optimizer import ShardedOptimizer
from executors.zero1 import FlatShardGroup, flat_range_boxes, local_tensor

Fused = dict[str, tuple[FusedSplit, int]]  # fqn -> fused split and its dim (`executors.fused`)


class PieceTensor(torch.Tensor):
    """A parameter-shaped (global) tensor of which this rank holds one flat piece, for
    DCP only: no ATen op runs on it."""

    @staticmethod
    def __new__(cls, param: torch.Tensor, flat: torch.Tensor, lo: int, hi: int):
        out = torch.Tensor._make_wrapper_subclass(cls, param.shape, dtype=flat.dtype,
                                                  device=flat.device, requires_grad=False)
        local = local_tensor(param)
        base = global_offset(param)
        out._boxes = {}  # global offsets -> (sizes, view of flat)
        for offsets, sizes, first in flat_range_boxes(tuple(local.shape), lo, hi):
            start = first - lo
            view = flat[start:start + math.prod(sizes)].view(sizes)
            out._boxes[torch.Size(o + b for o, b in zip(offsets, base))] = (torch.Size(sizes), view)
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise TypeError(f"PieceTensor is a checkpoint view of a ZeRO-1 piece; {func} "
                        "cannot run on it")

    def __create_write_items__(self, fqn: str, _obj: Any) -> list[WriteItem]:
        return [WriteItem(index=MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                              properties=TensorProperties.create_from_tensor(view),
                              size=self.shape))
                for offsets, (sizes, view) in self._boxes.items()]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=o, sizes=s) for o, (s, _) in self._boxes.items()]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        return self._boxes[torch.Size(index.offset)][1]

    def __repr__(self) -> str:  # the default would run ops on the wrapper
        return f"PieceTensor(shape={tuple(self.shape)}, boxes={len(self._boxes)})"


def global_offset(p: torch.Tensor) -> tuple[int, ...]:
    """Where this rank's local tensor of `p` starts in the global tensor."""
    if isinstance(p, DTensor):
        return tuple(compute_local_shape_and_global_offset(p.shape, p.device_mesh,
                                                           p.placements)[1])
    return (0,) * p.dim()


def _inner(opt):
    return opt.inner if isinstance(opt, ShardedOptimizer) else opt


def _groups(opt) -> list:
    return opt.groups if isinstance(opt, ShardedOptimizer) else []


def _plain_params(opt) -> list[torch.Tensor]:
    """Optimizer parameters that are model parameters (not ZeRO-1 pieces)."""
    inner = _inner(opt)
    if inner is None:
        return []
    pieces = {id(t) for g in _groups(opt) for t in g.opt_params}
    return [p for group in inner.param_groups for p in group["params"] if id(p) not in pieces]


def _pieces(opt, names: dict[int, str]):
    """(fqn, model parameter, its piece, the optimizer tensor, group) of every parameter
    of every ZeRO-1 group; piece and tensor are None where this rank holds none of it."""
    for g in _groups(opt):
        mine = {x.index: (x, t) for x, t in zip(g.pieces, g.opt_params)}
        for i, p in enumerate(g.params):
            x, t = mine.get(i, (None, None))
            yield names[id(p)], p, x, t, g


def _master(p: torch.Tensor, x, t) -> PieceTensor:
    """The fp32 master piece as `model/<fqn>` (no rectangle where the rank has none)."""
    if x is None:
        return PieceTensor(p, torch.empty(0), 0, 0)
    return PieceTensor(p, t, x.lo, x.hi)


def _as_tensor(value) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.tensor(value)


def _elementwise(value, like: torch.Tensor) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == like.shape


@torch.no_grad()
def _whole_in_model_order(g: FlatShardGroup, index: int, pieces: dict[int, torch.Tensor],
                          fused: tuple[FusedSplit, int]) -> torch.Tensor:
    """Parameter `index` of ZeRO-1 group `g`, or a state of its shape, whole and in the
    model's order, from every rank's pieces (pieces: piece position -> its values). A
    collective over the group (and the TP mesh): every rank calls it alike."""
    p = g.params[index]
    dtype = next(iter(pieces.values())).dtype if pieces else torch.float32
    send = torch.zeros(g.shard, dtype=dtype)
    for k, x in enumerate(g.pieces):
        if k in pieces:
            send[x.offset:x.offset + x.numel].copy_(pieces[k])
    flat = torch.empty(g.shard * g.dp, dtype=dtype)
    dist.all_gather_into_tensor(flat, send, group=g.group)
    start = sum(g.numels[:index])
    local = flat[start:start + g.numels[index]].view(local_tensor(p).shape).clone()
    if isinstance(p, DTensor):
        local = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False)
    return full_in_model_order(local, *fused)


def checkpoint_state(opt, names: dict[int, str], fused: Fused | None = None
                     ) -> dict[str, torch.Tensor]:
    """What this rank saves of the optimizer: `optim/<fqn>/<key>` per parameter and, for
    mixed-precision ZeRO-1, `model/<fqn>` as the fp32 master (overriding the 16-bit copy).
    names: id(model parameter) -> its fqn; fused: states of these saved in model order."""
    inner = _inner(opt)
    out: dict[str, torch.Tensor] = {}
    fused = fused or {}
    if inner is None:
        return out
    for p in _plain_params(opt):
        fqn = names[id(p)]
        for key, value in (inner.state.get(p) or {}).items():
            out[f"optim/{fqn}/{key}"] = (full_in_model_order(value, *fused[fqn])
                                         if fqn in fused and _elementwise(value, p)
                                         else _as_tensor(value))
    for g in _groups(opt):  # fused parameters under ZeRO-1: gathered whole
        mine = dict(zip(range(len(g.pieces)), g.opt_params))
        for index, p in enumerate(g.params):
            fqn = names[id(p)]
            if fqn not in fused:
                continue
            own = {k: t for k, t in mine.items() if g.pieces[k].index == index}
            if g.master is not None:
                out[f"model/{fqn}"] = _whole_in_model_order(g, index, own, fused[fqn])
            for key in _state_keys(inner, g):
                values = {k: inner.state[t][key] for k, t in own.items()}
                out[f"optim/{fqn}/{key}"] = _whole_in_model_order(g, index, values, fused[fqn])
            for key, value in _first_piece_state(inner, g).items():
                if not _elementwise(value, g.opt_params[0]):  # AdamW's step: pieces alike
                    out[f"optim/{fqn}/{key}"] = _as_tensor(value)
    for fqn, p, x, t, g in _pieces(opt, names):
        if fqn in fused:
            continue
        if g.master is not None:  # every rank: no 16-bit copy beside the master's pieces
            out[f"model/{fqn}"] = _master(p, x, t)
        if x is None:
            continue
        for key, value in (inner.state.get(t) or {}).items():
            out[f"optim/{fqn}/{key}"] = (PieceTensor(p, value, x.lo, x.hi)
                                         if _elementwise(value, t) else _as_tensor(value))
    return out


def _first_piece_state(inner, g: FlatShardGroup) -> dict:
    """The optimizer state of this rank's first piece of group g ({} if none)."""
    return (inner.state.get(g.opt_params[0]) or {}) if g.opt_params else {}


def _state_keys(inner, g: FlatShardGroup) -> list[str]:
    """The element-wise state keys of a ZeRO-1 group's pieces (the same on every rank:
    they stepped alike), sorted so every rank gathers them in one order."""
    state = _first_piece_state(inner, g)
    return sorted(k for k, v in state.items() if _elementwise(v, g.opt_params[0]))


def load_targets(opt, names: dict[int, str], metadata: dict, fused: Fused | None = None
                 ) -> tuple[dict[str, torch.Tensor], Callable[[], None]]:
    """Tensors DCP fills on load (zeros in this rank's layout, keyed as `checkpoint_state`
    keys them; metadata: the checkpoint's `state_dict_metadata`) and a function that
    installs them in the optimizer once loaded (ZeRO-1: then all-gathers the parameters
    from the loaded master weights). fused: states of these are read whole in model
    order and cut into this rank's shard or piece afterwards."""
    inner = _inner(opt)
    targets: dict[str, torch.Tensor] = {}
    fused = fused or {}
    if inner is None:
        return targets, lambda: None
    slots: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
    cut: list[tuple[torch.Tensor, torch.Tensor, tuple[FusedSplit, int], Callable]] = []

    def saved_shape(p: torch.Tensor, fqn: str) -> tuple[int, ...]:
        """The shape `p`'s states were saved in: the model's (a fused parameter with shared
        parts is stored longer, `executors.fused`)."""
        return fused[fqn][0].model_shape(p.shape, fused[fqn][1]) if fqn in fused \
            else tuple(p.shape)

    def whole(shaped_like: torch.Tensor, dtype, fqn: str, into: torch.Tensor, piece=None):
        """A model-order buffer DCP fills; `into` gets this rank's shard (or piece) of it."""
        buffer = torch.zeros(saved_shape(shaped_like, fqn), dtype=dtype)
        cut.append((buffer, into, fused[fqn], piece))
        return buffer

    def add(t: torch.Tensor, fqn: str, shape: tuple, make_elementwise) -> None:
        prefix, mine = f"optim/{fqn}/", {}
        for key, meta in metadata.items():
            if not key.startswith(prefix):
                continue
            size, dtype = tuple(meta.size), meta.properties.dtype
            if size == shape:  # a per-element state: this rank's layout of it
                mine[key[len(prefix):]], targets[key] = make_elementwise(dtype)
            else:  # a scalar such as AdamW's step
                mine[key[len(prefix):]] = targets[key] = torch.zeros(size, dtype=dtype)
        if mine:
            slots.append((t, mine))

    for p in _plain_params(opt):
        def plain(dtype, p=p):
            value = torch.zeros_like(p.detach(), dtype=dtype)
            fqn = names[id(p)]
            return value, (whole(p, dtype, fqn, value) if fqn in fused else value)
        add(p, names[id(p)], saved_shape(p, names[id(p)]), plain)
    for fqn, p, x, t, g in _pieces(opt, names):
        if g.master is not None:  # the fp32 master, read straight into its shard
            targets[f"model/{fqn}"] = (whole(p, g.master.dtype, fqn, t, (p, x)) if fqn in fused
                                       else _master(p, x, t))
        if x is None:
            continue

        def piece(dtype, p=p, x=x, t=t, fqn=fqn):
            value = torch.zeros(x.numel, dtype=dtype, device=t.device)
            if fqn in fused:
                return value, whole(p, dtype, fqn, value, (p, x))
            return value, PieceTensor(p, value, x.lo, x.hi)
        add(t, fqn, saved_shape(p, fqn), piece)

    def install() -> None:
        for buffer, into, (split, dim), piece in cut:
            if piece is None:  # a state with its parameter's layout
                load_model_order(into, buffer, split, dim)
                continue
            p, x = piece  # a ZeRO-1 piece: this rank's shard of p, then the piece's range
            if x is None:  # this rank holds none of p
                continue
            shard = torch.zeros_like(p.detach(), dtype=buffer.dtype)
            load_model_order(shard, buffer, split, dim)
            into.copy_(local_tensor(shard).reshape(-1)[x.lo:x.hi])
        for t, state in slots:
            inner.state[t] = state
        for g in _groups(opt):
            if g.master is not None:  # the 16-bit parameters from the loaded masters
                g.all_gather_params()

    return targets, install
