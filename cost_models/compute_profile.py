"""Measured layer times from `planner profile MODEL --out profile.json`: one entry per
unique layer (structural hash, forward and backward seconds at a micro-batch). A profile
whose device and dtype match the cluster's stands in for the analytic compute model
(`cost_models.compute.layer_compute` scales it linearly to the micro-batch)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import Layer

from cost_models.gemm_efficiency import device_kind


@dataclass(frozen=True, slots=True)
class ProfiledLayer:
    name: str
    structural_hash: str
    forward_seconds: float
    backward_seconds: float
    micro_batch: int


@dataclass(frozen=True, slots=True)
class ComputeProfile:
    """Measured layer times from `planner profile` (keyed by structural hash, then name)."""

    device: str  # device type the profile ran on: "cpu" or "cuda"
    layers: tuple[ProfiledLayer, ...]
    device_name: str = ""  # e.g. "NVIDIA H100 80GB HBM3", or the CPU's name
    dtype: str = ""  # dtype the layers ran in

    def lookup(self, layer: Layer) -> ProfiledLayer | None:
        for entry in self.layers:
            if entry.structural_hash and entry.structural_hash == layer.structural_hash:
                return entry
        for entry in self.layers:
            if entry.name == layer.name:
                return entry
        return None

    def check_matches(self, cluster: ClusterSpec, compute_dtype: str) -> None:
        """A profile only stands in for the analytic model on the device and dtype it measured."""
        mine = device_kind(self.device_name or self.device)
        if self.device.lower() == "cpu":
            mine = "cpu"
        theirs = device_kind(cluster.device)
        if mine != theirs:
            raise PlannerError(f"the profile was measured on {self.device_name or self.device} "
                               f"but cluster {cluster.name} is {cluster.device}: profile on "
                               "the target device or drop --profile")
        if self.dtype and self.dtype != compute_dtype:
            raise PlannerError(f"the profile ran in {self.dtype} but the plan computes in "
                               f"{compute_dtype}: profile with the matching --dtype or change "
                               "--precision")

    @classmethod
    def from_dict(cls, data, source: str = "<profile>") -> ComputeProfile:
        if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
            raise PlannerError(f"{source}: a profile needs {{\"device\": str, \"layers\": [...]}}")
        entries = []
        for i, item in enumerate(data["layers"]):
            try:
                entries.append(ProfiledLayer(
                    name=str(item["name"]), structural_hash=str(item.get("structural_hash", "")),
                    forward_seconds=float(item["forward_seconds"]),
                    backward_seconds=float(item["backward_seconds"]),
                    micro_batch=int(item.get("micro_batch", 1))))
            except (KeyError, TypeError, ValueError) as exc:
                raise PlannerError(f"{source}: layers[{i}] is missing or has a bad field "
                                   f"({exc}); each needs name, structural_hash, "
                                   "forward_seconds, backward_seconds, micro_batch") from None
            if entries[-1].micro_batch < 1 or entries[-1].forward_seconds < 0:
                raise PlannerError(f"{source}: layers[{i}] has a non-positive micro_batch "
                                   "or negative time")
        return cls(device=str(data.get("device", "")), layers=tuple(entries),
                   device_name=str(data.get("device_name", "")),
                   dtype=str(data.get("dtype", "")))

    @classmethod
    def load(cls, path: str | os.PathLike) -> ComputeProfile:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise PlannerError(f"cannot read profile {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise PlannerError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") \
                from None
        return cls.from_dict(data, str(path))
