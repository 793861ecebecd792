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
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ir.errors import PlannerError


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

    def stage_ranks(self, pp_rank: int) -> range:
        return range(pp_rank * self.stage_devices, (pp_rank + 1) * self.stage_devices)


class Meshes:
    """The DeviceMeshes of one run (built collectively: every rank builds all of them)."""

    def __init__(self, dims: ParallelDims, device_type: str):
        self.dims = dims
        self.device_type = device_type
        self.rank = dist.get_rank()
        self._world: dict[int, DeviceMesh] = {}
        names = (MeshAxis.PP.value, MeshAxis.DP.value, MeshAxis.TP.value)
        for tp in dims.tp_degrees:  # same order on every rank: group creation is collective
            ranks = torch.arange(dims.world_size).view(dims.pp, dims.dp(tp), tp)
            self._world[tp] = DeviceMesh(device_type, ranks, mesh_dim_names=names)

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
