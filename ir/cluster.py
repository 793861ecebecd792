"""What the hardware is: a cluster spec as plain frozen data, saved as JSON.

A `ClusterSpec` names the device, how many there are (nodes x devices per node), how much
memory each has, its peak FLOP/s per dtype, and the links between devices. Units are in
the field names: `*_bytes` are bytes, `*_gbps` are 10^9 BYTES per second (not bits),
`*_latency_s` and `alpha_s` are seconds, `*_flop_per_s` are FLOP per second.

Link bandwidths are what the alpha-beta model divides by: the achievable per-device
"bus bandwidth" of a collective (nccl-tests' busbw), not the datasheet's bidirectional
total. Measured fits from `planner profile-cluster`, when present, take precedence.

What `planner profile-cluster` measured (collective fits, host overheads) lives in
`calibration`, typed records from `ir.calibration_tables`; the JSON keeps their keys at
the top level. The spec is data only: JSON in and out (schema "planner.cluster/v1"),
never pickle.

    >>> spec = ClusterSpec.load("spec.json")          # doctest: +SKIP
    >>> spec.with_nodes(num_nodes=4).world_size        # doctest: +SKIP
    32
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from ir.calibration_tables import (COLLECTIVES, JSON_KEYS, CalibrationTables,  # noqa: F401
                                   CollectiveFit, is_finite_number, json_number)
from ir.errors import PlannerError
from ir.kernel_calibration import KernelCalibration
from ir.output_file import write_text_atomic
from ir.safe_json import parse_json, read_json

CLUSTER_SCHEMA = "planner.cluster/v1"

SPEC_FIX = "write one with `planner profile-cluster --out spec.json` or use a preset"
# What a spec without `backward_op_overhead_s` (written before it was measured) charges a
# backward op: the forward per-op figure, which over-prices autograd's C++ dispatch (the
# model's behaviour before the field existed).
BACKWARD_OP_OVERHEAD_FALLBACK = "op_overhead_s"
# More devices than any cluster has: a spec or flag beyond this is a typo.
MAX_DEVICES = 2**20


def collective_ceiling_bytes_per_s(hbm_gbps: float) -> float:
    """The most bytes per second a collective can move per rank: the device's memory
    bandwidth (`hbm_gbps`, 10^9 bytes/s; on CPU processes one thread's measured copy rate,
    bytes read + written). A GPU writes every byte it receives to its memory at least once;
    loopback gloo copies each byte twice (into the socket and out: 4 bytes of memory
    traffic) on at most two threads (the rank's and gloo's I/O thread), so B <= hbm / 2 there.
    A fitted bandwidth above it was not determined by its data (a clamped slope)."""
    return hbm_gbps * 1e9

@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """Nodes, devices, memory, peak FLOP/s and links of one (homogeneous) cluster."""

    name: str
    device: str  # device model, e.g. "H100-SXM5-80GB" or "cpu"
    num_nodes: int
    devices_per_node: int
    device_memory_bytes: int  # memory of ONE device
    peak_flops_by_dtype: tuple[tuple[str, float], ...]  # (("bfloat16", 9.89e14), ...), dense
    hbm_gbps: float  # device memory bandwidth, 10^9 bytes/s
    intra_node_gbps: float  # achievable per-device bus bandwidth inside a node, 10^9 bytes/s
    inter_node_gbps: float  # achievable per-device bus bandwidth across nodes, 10^9 bytes/s
    intra_node_latency_s: float  # alpha: per-step latency of a collective inside a node
    inter_node_latency_s: float  # alpha across nodes
    runtime_overhead_bytes: int  # per-device memory the runtime takes (context, comm buffers)
    matmul_efficiency: float | None = None  # best measured fraction of peak on large GEMMs
    # Host (framework) seconds per dispatched ATen op, and the extra per op on a DTensor.
    # On CPUs they add to the op's work; on GPUs they overlap it (kernels queue ahead).
    op_overhead_s: float = 0.0
    dtensor_op_overhead_s: float = 0.0
    # Host seconds per ATen op autograd's engine dispatches in backward (from C++, no
    # Python per op: a fraction of op_overhead_s on CPU). None (specs written before it
    # was measured): backward ops are charged `op_overhead_s`, see `backward_host_op_s`.
    backward_op_overhead_s: float | None = None
    # Device seconds per element a random-number op draws (dropout masks) on one CPU
    # thread; 0 where unmeasured (GPUs: memory-bound, priced by bytes).
    random_element_s: float = 0.0
    host_cores: int = 0  # cores the CPU "devices" of one node share; 0: devices are not CPUs
    # Share of a compute window that overlapped data-parallel traffic can hide; None takes
    # the default of cost_models.estimate.overlap_efficiency (GPUs 0.8, CPU processes the
    # idle cores' share). A figure measured elsewhere may be set here.
    dp_overlap_efficiency: float | None = None
    # Kernel tables `planner profile-device` measured (GEMM by shape, memory-bound kernels,
    # SDPA backends, launch overhead); None when the spec carries none.
    kernel_calibration: KernelCalibration | None = None
    # Host side, for CPU offload (ZeRO-Offload); 0 means unknown and offload is not offered.
    pcie_gbps: float = 0.0  # host<->device copy bandwidth of one device, one direction
    host_memory_bytes: int = 0  # host memory of ONE node (shared by its devices)
    host_memory_gbps: float = 0.0  # host memory bandwidth of ONE node (CPU optimizer step)
    # What `planner profile-cluster` measured: collective fits and, on CPU processes, the
    # DP-unit, TP-module, optimizer-step and blocking-wait figures (empty: not measured).
    calibration: CalibrationTables = CalibrationTables()
    notes: str = ""  # provenance: datasheet, measured on which host, ...

    def __post_init__(self) -> None:
        _check_text("name", self.name)
        _check_text("device", self.device)
        for field in ("num_nodes", "devices_per_node", "device_memory_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlannerError(f"cluster {self.name}: {field} must be a positive "
                                   f"integer, got {value!r}")
        if self.num_nodes * self.devices_per_node > MAX_DEVICES:
            raise PlannerError(f"cluster {self.name}: {self.num_nodes} nodes x "
                               f"{self.devices_per_node} devices is over {MAX_DEVICES:,} "
                               "devices; give realistic num_nodes and devices_per_node")
        if isinstance(self.runtime_overhead_bytes, bool) or not isinstance(
                self.runtime_overhead_bytes, int) or self.runtime_overhead_bytes < 0:
            raise PlannerError(f"cluster {self.name}: runtime_overhead_bytes must be an "
                               f"integer >= 0, got {self.runtime_overhead_bytes!r}")
        for field in ("hbm_gbps", "intra_node_gbps", "inter_node_gbps"):
            _check_positive(self.name, field, getattr(self, field))
        for field in ("intra_node_latency_s", "inter_node_latency_s", "op_overhead_s",
                      "dtensor_op_overhead_s", "random_element_s"):
            value = getattr(self, field)
            if not is_finite_number(value) or value < 0:
                raise PlannerError(f"cluster {self.name}: {field} must be a number >= 0, "
                                   f"got {value!r}")
        if self.backward_op_overhead_s is not None and not (
                is_finite_number(self.backward_op_overhead_s) and self.backward_op_overhead_s >= 0):
            raise PlannerError(f"cluster {self.name}: backward_op_overhead_s must be a number "
                               f">= 0 or absent, got {self.backward_op_overhead_s!r}")
        if not self.peak_flops_by_dtype:
            raise PlannerError(f"cluster {self.name}: peak_flops_by_dtype is empty; give at "
                               "least one dtype, e.g. {\"float32\": 1.95e13}")
        if not isinstance(self.calibration, CalibrationTables):
            raise PlannerError(f"cluster {self.name}: calibration must be CalibrationTables, "
                               f"got {type(self.calibration).__name__}")
        for dtype, flops in self.peak_flops_by_dtype:
            _check_text("peak_flops_by_dtype key", dtype)
            _check_positive(self.name, f"peak_flops_by_dtype[{dtype}]", flops)
        for field in ("pcie_gbps", "host_memory_gbps"):
            if not is_finite_number(getattr(self, field)) or getattr(self, field) < 0:
                raise PlannerError(f"cluster {self.name}: {field} must be a number >= 0 "
                                   f"(0: unknown), got {getattr(self, field)!r}")
        if isinstance(self.host_memory_bytes, bool) or not isinstance(
                self.host_memory_bytes, int) or self.host_memory_bytes < 0:
            raise PlannerError(f"cluster {self.name}: host_memory_bytes must be an integer "
                               f">= 0 (0: unknown), got {self.host_memory_bytes!r}")
        if isinstance(self.host_cores, bool) or not isinstance(self.host_cores, int) \
                or self.host_cores < 0:
            raise PlannerError(f"cluster {self.name}: host_cores must be an integer >= 0, "
                               f"got {self.host_cores!r}")
        if self.dp_overlap_efficiency is not None and not (
                is_finite_number(self.dp_overlap_efficiency) and 0 <= self.dp_overlap_efficiency <= 1):
            raise PlannerError(f"cluster {self.name}: dp_overlap_efficiency must be in [0, 1], "
                               f"got {self.dp_overlap_efficiency!r}")
        if self.matmul_efficiency is not None and not (
                is_finite_number(self.matmul_efficiency) and 0 < self.matmul_efficiency <= 1):
            raise PlannerError(f"cluster {self.name}: matmul_efficiency must be in (0, 1], "
                               f"got {self.matmul_efficiency!r}")
        if self.kernel_calibration is not None and not isinstance(self.kernel_calibration,
                                                                  KernelCalibration):
            raise PlannerError(f"cluster {self.name}: kernel_calibration must be a "
                               f"KernelCalibration, got {type(self.kernel_calibration).__name__}")
        ceiling = collective_ceiling_bytes_per_s(self.hbm_gbps)
        for fit in self.calibration.collective_fits:
            if fit.bytes_per_s > ceiling:
                raise PlannerError(
                    f"cluster {self.name}: collective fit {fit.collective}@{fit.scope} "
                    f"({fit.measured_ranks} ranks) claims {fit.bytes_per_s / 1e9:.3g} GB/s, above "
                    f"the memory bandwidth hbm_gbps {self.hbm_gbps:.3g} no collective can "
                    f"beat (a fit its data did not determine); re-measure it with `planner "
                    f"profile-cluster --nproc {self.devices_per_node} --out spec.json`")
        if self.runtime_overhead_bytes >= self.device_memory_bytes:
            raise PlannerError(f"cluster {self.name}: runtime_overhead_bytes "
                               f"({self.runtime_overhead_bytes}) must be below "
                               f"device_memory_bytes ({self.device_memory_bytes})")

    # ---- queries -------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.devices_per_node

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for a dtype name ("bfloat16", "float32", ...)."""
        for name, flops in self.peak_flops_by_dtype:
            if name == dtype:
                return flops
        known = ", ".join(name for name, _ in self.peak_flops_by_dtype)
        raise PlannerError(f"cluster {self.name} has no peak FLOP/s for {dtype}; it knows "
                           f"{known}: pick a precision it supports or add the dtype to the spec")

    @property
    def backward_host_op_s(self) -> float:
        """Host seconds per backward op: the measured `backward_op_overhead_s`, else (a spec
        without it) the fallback BACKWARD_OP_OVERHEAD_FALLBACK names, `op_overhead_s`."""
        if self.backward_op_overhead_s is None:
            return getattr(self, BACKWARD_OP_OVERHEAD_FALLBACK)
        return self.backward_op_overhead_s

    @property
    def offload_known(self) -> bool:
        """The spec gives PCIe, host memory and host memory bandwidth: offload is priceable."""
        return self.pcie_gbps > 0 and self.host_memory_bytes > 0 and self.host_memory_gbps > 0

    @property
    def host_bound(self) -> bool:
        """Devices are CPU processes: framework overhead adds to compute instead of hiding
        behind asynchronously queued kernels."""
        return self.host_cores > 0 or self.device.lower() == "cpu"

    @property
    def host_share(self) -> float:
        """How many devices of a node share one core (>= 1): CPU processes on fewer cores
        than processes take turns, so their busy time stretches by this factor."""
        if self.host_cores <= 0:
            return 1.0
        return max(1.0, self.devices_per_node / self.host_cores)

    def with_calibration(self, **tables: Any) -> ClusterSpec:
        """The same spec with some calibration tables replaced (`CalibrationTables` fields)."""
        return dataclasses.replace(self, calibration=dataclasses.replace(self.calibration,
                                                                         **tables))

    def with_nodes(self, num_nodes: int | None = None,
                   devices_per_node: int | None = None) -> ClusterSpec:
        """The same hardware with a different node count or devices per node."""
        changes: dict[str, Any] = {}
        if num_nodes is not None:
            changes["num_nodes"] = num_nodes
        if devices_per_node is not None:
            changes["devices_per_node"] = devices_per_node
        return dataclasses.replace(self, **changes) if changes else self

    def __str__(self) -> str:
        return (f"{self.name}: {self.num_nodes}x{self.devices_per_node} {self.device}, "
                f"{self.device_memory_bytes / 2**30:.1f} GiB each")

    # ---- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": CLUSTER_SCHEMA}
        for f in dataclasses.fields(self):
            out[f.name] = getattr(self, f.name)
        out["peak_flops_by_dtype"] = dict(self.peak_flops_by_dtype)
        del out["calibration"]
        out.update(self.calibration.to_json())
        if self.backward_op_overhead_s is None:
            del out["backward_op_overhead_s"]  # unmeasured: read back as the fallback
        if self.kernel_calibration is None:
            del out["kernel_calibration"]  # specs without tables read as before
        else:
            out["kernel_calibration"] = self.kernel_calibration.to_dict()
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> ClusterSpec:
        """Build and validate a spec; every error names `source` and the bad field."""
        if not isinstance(data, dict):
            raise PlannerError(f"{source}: a cluster spec must be a JSON object, "
                               f"got {type(data).__name__}")
        data = dict(data)
        schema = data.pop("schema", CLUSTER_SCHEMA)
        if schema != CLUSTER_SCHEMA:
            raise PlannerError(f"{source}: schema {schema!r} is not {CLUSTER_SCHEMA!r}; "
                               f"{SPEC_FIX}")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "calibration"}
        unknown = sorted(set(data) - set(fields) - set(JSON_KEYS))
        if unknown:
            raise PlannerError(f"{source}: unknown field {unknown[0]!r}; known fields: "
                               f"{', '.join([*fields, *JSON_KEYS])}")
        required = [name for name, f in fields.items()
                    if f.default is dataclasses.MISSING and name not in data]
        if required:
            raise PlannerError(f"{source}: missing field {required[0]!r}; add it, or "
                               f"{SPEC_FIX}")
        try:
            flops = data["peak_flops_by_dtype"]
            if not isinstance(flops, dict):
                raise PlannerError("field 'peak_flops_by_dtype' must be an object "
                                   "{dtype: flop_per_s}")
            data["peak_flops_by_dtype"] = tuple(sorted(
                (str(k), json_number(f"peak_flops_by_dtype[{k}]", v)) for k, v in flops.items()))
            data["calibration"] = CalibrationTables.from_json(
                {key: data.pop(key) for key in JSON_KEYS if key in data},
                data.get("devices_per_node"))
            for name in ("hbm_gbps", "intra_node_gbps", "inter_node_gbps",
                         "intra_node_latency_s", "inter_node_latency_s", "op_overhead_s",
                         "dtensor_op_overhead_s", "random_element_s", "pcie_gbps",
                         "host_memory_gbps"):
                if name in data:
                    data[name] = json_number(name, data[name])
            for name in ("num_nodes", "devices_per_node", "device_memory_bytes",
                         "runtime_overhead_bytes", "host_cores", "host_memory_bytes"):
                value = data.get(name)
                if isinstance(value, float) and value.is_integer():
                    data[name] = int(value)  # JSON writers may print 8.0e10 for an integer
            if data.get("dp_overlap_efficiency") is not None:
                data["dp_overlap_efficiency"] = json_number("dp_overlap_efficiency",
                                                        data["dp_overlap_efficiency"])
            if data.get("backward_op_overhead_s") is not None:
                data["backward_op_overhead_s"] = json_number("backward_op_overhead_s",
                                                             data["backward_op_overhead_s"])
            if data.get("kernel_calibration") is not None:
                data["kernel_calibration"] = KernelCalibration.from_dict(
                    data["kernel_calibration"])
            if data.get("matmul_efficiency") is not None:
                data["matmul_efficiency"] = json_number("matmul_efficiency",
                                                    data["matmul_efficiency"])
            return cls(**data)
        except PlannerError as exc:
            raise PlannerError(f"{source}: {exc}") from None

    @classmethod
    def from_json(cls, text: str, source: str = "<json>") -> ClusterSpec:
        data = parse_json(text, source, "cluster spec", SPEC_FIX)
        return cls.from_dict(data, source)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ClusterSpec:
        """Read a spec file: a regular, bounded, UTF-8 JSON file of finite numbers."""
        source = os.fspath(path)
        return cls.from_dict(read_json(source, "cluster spec", SPEC_FIX), source)

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (a temporary file in the same folder, then a rename that keeps
        an old file's mode)."""
        write_text_atomic(path, self.to_json() + "\n", "cluster spec")


def _check_positive(name: str, field: str, value: Any) -> None:
    if not is_finite_number(value) or value <= 0:
        raise PlannerError(f"cluster {name}: {field} must be a number > 0, got {value!r}")


def _check_text(field: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise PlannerError(f"cluster spec: {field} must be a non-empty string, got {value!r}")
