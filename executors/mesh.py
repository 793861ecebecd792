"""Where every rank sits: pipeline rank, data-parallel and tensor-parallel coordinates.

Ranks are laid out torchtitan style, tensor parallel innermost:

    rank = pp_rank * stage_devices + dp_index * tp + tp_index

so the `tp` ranks of a tensor-parallel group are consecutive (one node's NVLink domain
on GPUs) and the data-parallel replicas of a layer are strided by `tp`. Every pipeline
rank owns the same number of devices (`stage_devices`); a layer with TP degree `t` in a
stage of `D` devices has `D / t` data-parallel replicas.

For every TP degree the plan uses there is ONE world-spanning DeviceMesh of shape
(pp, D/t, t) named by `MeshAxis`; a layer takes its 1-D "dp" and "tp" submeshes from it,
and FSDP2 concatenates them for 2-D (FSDP + TP) sharding because they share a root.

    >>> dims = ParallelDims(world_size=8, pp=2, stage_devices=4, tp_degrees=(1, 2))
    >>> dims.coordinate(rank=6, tp=2)
    Coordinate(pp_rank=1, dp_index=1, tp_index=0)

Timeouts. torch gives a group made by `new_group` (every mesh axis that is not the whole
world) torch's own default of 30 minutes, not the default group's timeout; so each mesh
passes the default group's timeout to its sub-groups explicitly (`group_options`).
`init_distributed` sets that timeout: `pg_timeout_s`, or PLANNER_PG_TIMEOUT_S.

Stale meshes. DTensor caches each op's output sharding, DeviceMesh included, and two
meshes compare equal when their ranks and axis names do; a mesh of an earlier process
group (a process that destroyed its group and made another, as the real-model matrix
does per case) would come back from that cache, carrying the earlier group's sub-group
names: "Could not resolve the process group registered under the name 16", or a
collective on whatever group now has that name. New `Meshes` clear those caches first.
"""

from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard
from torch.distributed.tensor.debug import _clear_sharding_prop_cache

from ir.errors import PlannerError

# Seconds a collective may wait before it fails: long enough for a slow first step or
# checkpoint (minutes), far below torch's 30 minutes of silence.
PG_TIMEOUT_S = 600.0
PG_TIMEOUT_ENV = "PLANNER_PG_TIMEOUT_S"


def seconds_setting(value: float | None, name: str, env: str, default: float) -> float:
    """`value` (the argument `name`), else the environment variable `env`, else
    `default`; a finite number of seconds > 0, else PlannerError naming where it came from."""
    if value is None:
        source, value = (f"{env}={os.environ[env]!r}", os.environ[env]) if env in os.environ \
            else (name, default)
    else:
        source = f"{name}={value!r}"
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise PlannerError(f"{source} is not a positive number of seconds: pass {name} or set "
                           f"{env}, e.g. {default:g}")
    return seconds


def pg_timeout_s(timeout_s: float | None = None) -> float:
    """The process-group timeout: `timeout_s`, else PLANNER_PG_TIMEOUT_S, else PG_TIMEOUT_S."""
    return seconds_setting(timeout_s, "timeout_s", PG_TIMEOUT_ENV, PG_TIMEOUT_S)


def group_timeout(group: dist.ProcessGroup, device_type: str) -> timedelta:
    """The timeout `group` was made with (its backend for `device_type` keeps it)."""
    return group._get_backend(torch.device(device_type)).options._timeout


def group_options(device_type: str, timeout: timedelta):
    """Backend options that carry `timeout` to DeviceMesh's sub-groups (DeviceMesh reads
    `_timeout` from them; torch's own default otherwise)."""
    backend = dist.get_backend()
    if "nccl" in backend and device_type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
    elif "gloo" in backend:
        options = dist.ProcessGroupGloo._Options()
    else:
        raise PlannerError(f"process-group backend {backend!r} on {device_type}: the executor "
                           "sets sub-group timeouts for gloo and nccl only; use one of them")
    options._timeout = timeout
    return options


class MeshAxis(str, enum.Enum):
    """Names of the mesh axes ("axis" is a mesh axis, "dim" a tensor dimension)."""

    PP = "pp"
    DP = "dp"
    TP = "tp"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class Coordinate:
    pp_rank: int
    dp_index: int
    tp_index: int


@dataclass(frozen=True, slots=True)
class ParallelDims:
    """The degrees of one run. Construction checks that they multiply to the world size."""

    world_size: int
    pp: int  # pipeline ranks
    stage_devices: int  # devices per pipeline rank (tp * dp of every layer on it)
    tp_degrees: tuple[int, ...]  # every distinct TP degree the plan uses, ascending

    def __post_init__(self) -> None:
        if self.pp * self.stage_devices != self.world_size:
            raise PlannerError(
                f"the plan needs pp={self.pp} x stage_devices={self.stage_devices} = "
                f"{self.pp * self.stage_devices} ranks but the process group has "
                f"{self.world_size}: launch {self.pp * self.stage_devices} processes or re-plan "
                f"for {self.world_size}")
        for tp in self.tp_degrees:
            if self.stage_devices % tp:
                raise PlannerError(f"tp={tp} does not divide the {self.stage_devices} devices "
                                   "of a pipeline stage")

    def coordinate(self, rank: int, tp: int) -> Coordinate:
        local = rank % self.stage_devices
        return Coordinate(rank // self.stage_devices, local // tp, local % tp)

    def dp(self, tp: int) -> int:
        return self.stage_devices // tp

    def stage_copies(self, t: torch.Tensor) -> int:
        """How many ranks hold each element of `t`, a reduced gradient (or a parameter)
        of this rank's pipeline stage: every layer of a stage spans all its
        `stage_devices` ranks, and a DTensor's Shard placements cut it into distinct
        pieces, each held by the rest (Replicate mesh axes, and the stage's ranks outside
        a smaller mesh: a layer's data-parallel replicas, or its TP group around a
        dp-only unit). Ask with the gradient: its placements may differ from the
        parameter's (a vocab-split embedding's Shard(0) weight gets a Replicate
        gradient). The one count `executors.grad_clip` divides by (which refuses a
        Partial gradient before asking: its placements are not reduced)."""
        if not isinstance(t, DTensor):
            return self.stage_devices
        pieces = math.prod(t.device_mesh.size(axis) for axis, placement
                           in enumerate(t.placements)
                           if isinstance(placement, (Shard, _StridedShard)))  # FSDP2 under TP
        return self.stage_devices // pieces

    def stage_ranks(self, pp_rank: int) -> range:
        return range(pp_rank * self.stage_devices, (pp_rank + 1) * self.stage_devices)


class Meshes:
    """The DeviceMeshes of one run (built collectively: every rank builds all of them)."""

    def __init__(self, dims: ParallelDims, device_type: str):
        self.dims = dims
        self.device_type = device_type
        self.rank = dist.get_rank()
        self._world: dict[int, DeviceMesh] = {}
        _clear_sharding_prop_cache()  # no cached sharding may name another group's mesh
        names = (MeshAxis.PP.value, MeshAxis.DP.value, MeshAxis.TP.value)
        # sub-groups wait as long as the default group (module docstring: Timeouts)
        self.timeout = group_timeout(dist.group.WORLD, device_type)
        override = ((None, group_options(device_type, self.timeout)),) * len(names)
        for tp in dims.tp_degrees:  # same order on every rank: group creation is collective
            ranks = torch.arange(dims.world_size).view(dims.pp, dims.dp(tp), tp)
            self._world[tp] = DeviceMesh(device_type, ranks, mesh_dim_names=names,
                                         backend_override=override)

    def world(self, tp: int) -> DeviceMesh:
        return self._world[tp]

    def dp_mesh(self, tp: int) -> DeviceMesh:
        """This rank's 1-D data-parallel submesh for layers of TP degree `tp`."""
        return self._world[tp][MeshAxis.DP.value]

    def tp_mesh(self, tp: int) -> DeviceMesh:
        """This rank's 1-D tensor-parallel submesh (consecutive ranks)."""
        return self._world[tp][MeshAxis.TP.value]

    def tp_group(self, tp: int) -> dist.ProcessGroup:
        return self.tp_mesh(tp).get_group()

    def pp_group(self) -> dist.ProcessGroup:
        """Ranks with the same position in every pipeline stage (pipelining P2P)."""
        return self._world[self.dims.tp_degrees[0]][MeshAxis.PP.value].get_group()

    def coordinate(self, tp: int) -> Coordinate:
        return self.dims.coordinate(self.rank, tp)

    @property
    def pp_rank(self) -> int:
        return self.rank // self.dims.stage_devices
