"""What the hardware is: a cluster spec as plain frozen data, saved as JSON.

A `ClusterSpec` names the device, how many there are (nodes x devices per node), how much
memory each has, its peak FLOP/s per dtype, and the links between devices. Units are in
the field names: `*_bytes` are bytes, `*_gbps` are 10^9 BYTES per second (not bits),
`*_latency_s` and `alpha_s` are seconds, `*_flop_per_s` are FLOP per second.

Link bandwidths are what the alpha-beta model divides by: the achievable per-device
"bus bandwidth" of a collective (nccl-tests' busbw), not the datasheet's bidirectional
total. Measured fits from `planner profile-cluster`, when present, take precedence.

The spec is data only: JSON in and out (schema "planner.cluster/v1"), never pickle.

    >>> spec = ClusterSpec.load("spec.json")          # doctest: +SKIP
    >>> spec.with_nodes(num_nodes=4).world_size        # doctest: +SKIP
    32
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Any

from ir.errors import PlannerError
from ir.kernel_calibration import KernelCalibration
from ir.output_file import write_text_atomic
from ir.safe_json import parse_json, read_json

CLUSTER_SCHEMA = "planner.cluster/v1"

SPEC_FIX = "write one with `planner profile-cluster --out spec.json` or use a preset"
# More devices than any cluster has: a spec or flag beyond this is a typo.
MAX_DEVICES = 2**20

# The collectives a fit can describe, and where the group lives.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
               "send_recv")
SCOPES = ("intra_node", "inter_node")


@dataclass(frozen=True, slots=True)
class CollectiveFit:
    """A measured alpha-beta fit of one collective: t = steps(n)*alpha_s + volume(n, S)/bytes_per_s.

    `steps` and `volume` are the same algorithm factors the communication model uses
    (e.g. ring all-reduce: 2(n-1) steps, 2(n-1)/n*S bytes per rank), so a fit slots in
    for the spec's generic latency and bandwidth.
    """

    collective: str
    scope: str
    alpha_s: float
    bytes_per_s: float
    measured_ranks: int = 0  # group size the fit was measured with (0: unknown)

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise PlannerError(f"collective fit: unknown collective {self.collective!r}; "
                               f"use one of {', '.join(COLLECTIVES)}")
        if self.scope not in SCOPES:
            raise PlannerError(f"collective fit {self.collective}: scope must be one of "
                               f"{', '.join(SCOPES)}, got {self.scope!r}")
        if not (math.isfinite(self.alpha_s) and self.alpha_s >= 0):
            raise PlannerError(f"collective fit {self.collective}: alpha_s must be a finite "
                               f"number >= 0, got {self.alpha_s!r}")
        if not (math.isfinite(self.bytes_per_s) and self.bytes_per_s > 0):
            raise PlannerError(f"collective fit {self.collective}: bytes_per_s must be > 0, "
                               f"got {self.bytes_per_s!r}")

    def __str__(self) -> str:
        return (f"{self.collective}@{self.scope}: a={self.alpha_s * 1e6:.1f}us "
                f"B={self.bytes_per_s / 1e9:.2f}GB/s")


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
    collective_fits: tuple[CollectiveFit, ...] = ()
    # Host (framework) seconds per dispatched ATen op, and the extra per op on a DTensor.
    # On CPUs they add to the op's work; on GPUs they overlap it (kernels queue ahead).
    op_overhead_s: float = 0.0
    dtensor_op_overhead_s: float = 0.0
    # Device seconds per element a random-number op draws (dropout masks) on one CPU
    # thread; 0 where unmeasured (GPUs: memory-bound, priced by bytes).
    random_element_s: float = 0.0
    host_cores: int = 0  # cores the CPU "devices" of one node share; 0: devices are not CPUs
    # Seconds one data-parallel unit (an FSDP2 / replicate module) adds per micro-batch
    # on CPU processes, by DP mode ("zero3": ...): hooks, shard copies and its tiny
    # collectives' waits, measured by `planner profile-cluster` with the node's processes
    # running together.
    dp_unit_overhead_s: tuple[tuple[str, float], ...] = ()
    # ... plus this much per parameter tensor the unit holds (FSDP2 copies, views and
    # reduces tensor by tensor), by the same keys; the two come from one fit over units
    # of two sizes.
    dp_tensor_overhead_s: tuple[tuple[str, float], ...] = ()
    # Host seconds one optimizer step (step + zero_grad) spends per parameter tensor on
    # CPU processes, by optimizer ("adamw") and on DTensor parameters ("adamw@dtensor"),
    # measured by `planner profile-cluster` with the node's processes running together.
    optimizer_tensor_overhead_s: tuple[tuple[str, float], ...] = ()
    # Seconds a tensor-parallel module (column- or row-parallel Linear) adds per
    # micro-batch on CPU processes beyond what the comm model prices, by TP group size
    # ((2, s), (4, s), ...): DTensor dispatch, re-layouts and collective waits, measured
    # by `planner profile-cluster` with the node's processes in groups of that size.
    # JSON: {"2": s, "4": s}; a bare number (older specs) is the whole node's figure.
    tp_module_overhead_s: tuple[tuple[int, float], ...] = ()
    # Seconds a blocking collective call waits beyond its fitted time on CPU processes
    # whose peers compute between calls, by collective and group size ("all_reduce@2"):
    # the peer is late or descheduled, and a woken process waits for its core. Measured
    # by `planner profile-cluster` with every process computing between small calls.
    blocking_wait_s: tuple[tuple[str, float], ...] = ()
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
            if not _is_number(value) or value < 0:
                raise PlannerError(f"cluster {self.name}: {field} must be a number >= 0, "
                                   f"got {value!r}")
        if not self.peak_flops_by_dtype:
            raise PlannerError(f"cluster {self.name}: peak_flops_by_dtype is empty; give at "
                               "least one dtype, e.g. {\"float32\": 1.95e13}")
        for field in ("dp_unit_overhead_s", "dp_tensor_overhead_s", "optimizer_tensor_overhead_s",
                      "blocking_wait_s"):
            for mode, seconds in getattr(self, field):
                if not _is_number(seconds) or seconds < 0:
                    raise PlannerError(f"cluster {self.name}: {field}[{mode}] must be a "
                                       f"number >= 0, got {seconds!r}")
        for key, _ in self.blocking_wait_s:
            collective, _, size = key.partition("@")
            if collective not in COLLECTIVES or not size.isdigit() or int(size) < 2:
                raise PlannerError(f"cluster {self.name}: blocking_wait_s key {key!r} must be "
                                   "COLLECTIVE@GROUP_SIZE, e.g. \"all_reduce@2\" (collectives: "
                                   f"{', '.join(COLLECTIVES)})")
        for size, seconds in self.tp_module_overhead_s:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1 \
                    or not _is_number(seconds) or seconds < 0:
                raise PlannerError(f"cluster {self.name}: tp_module_overhead_s[{size}] must "
                                   f"map a group size >= 1 to seconds >= 0, got {seconds!r}")
        for dtype, flops in self.peak_flops_by_dtype:
            _check_text("peak_flops_by_dtype key", dtype)
            _check_positive(self.name, f"peak_flops_by_dtype[{dtype}]", flops)
        for field in ("pcie_gbps", "host_memory_gbps"):
            if not _is_number(getattr(self, field)) or getattr(self, field) < 0:
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
                _is_number(self.dp_overlap_efficiency) and 0 <= self.dp_overlap_efficiency <= 1):
            raise PlannerError(f"cluster {self.name}: dp_overlap_efficiency must be in [0, 1], "
                               f"got {self.dp_overlap_efficiency!r}")
        if self.matmul_efficiency is not None and not (
                _is_number(self.matmul_efficiency) and 0 < self.matmul_efficiency <= 1):
            raise PlannerError(f"cluster {self.name}: matmul_efficiency must be in (0, 1], "
                               f"got {self.matmul_efficiency!r}")
        if self.kernel_calibration is not None and not isinstance(self.kernel_calibration,
                                                                  KernelCalibration):
            raise PlannerError(f"cluster {self.name}: kernel_calibration must be a "
                               f"KernelCalibration, got {type(self.kernel_calibration).__name__}")
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

    @property
    def idle_core_share(self) -> float:
        """Share of a node's cores no process runs on (0 with a process on every core, or
        when the core count is unknown)."""
        if self.host_cores <= 0:
            return 0.0
        return max(0.0, 1.0 - self.devices_per_node / self.host_cores)

    def dp_unit_overhead(self, mode: str, group_size: int | None = None) -> float:
        """Seconds per micro-batch one DP unit in `mode` adds for a DP group of
        `group_size` ("mode@size" when measured, else the whole-node figure; 0 when not
        measured)."""
        return _by_mode(self.dp_unit_overhead_s, mode, group_size)

    def dp_tensor_overhead(self, mode: str, group_size: int | None = None) -> float:
        """Seconds per micro-batch each parameter tensor of a DP unit adds (same keys)."""
        return _by_mode(self.dp_tensor_overhead_s, mode, group_size)

    def optimizer_tensor_overhead(self, optimizer: str, on_dtensors: bool) -> float | None:
        """Measured host seconds per parameter tensor of one optimizer step, on plain or
        DTensor parameters; None when the spec has no such figure."""
        key = f"{optimizer}@dtensor" if on_dtensors else optimizer
        return dict(self.optimizer_tensor_overhead_s).get(key)

    def tp_module_overhead(self, group_size: int) -> float:
        """Seconds per micro-batch one TP module adds in a TP group of `group_size`: the
        figure measured with that size, else the nearest measured size (0 when none)."""
        figures = dict(self.tp_module_overhead_s)
        if not figures:
            return 0.0
        if group_size in figures:
            return figures[group_size]
        return figures[min(figures, key=lambda size: (abs(math.log2(size / group_size)), size))]

    def blocking_wait(self, collective: str, group_size: int) -> float:
        """Seconds a blocking `collective` call in a group of `group_size` waits beyond its
        fitted time (0 when not measured for that size)."""
        return dict(self.blocking_wait_s).get(f"{collective}@{group_size}", 0.0)

    def collective_fit(self, collective: str, scope: str,
                       group_size: int | None = None) -> CollectiveFit | None:
        """The measured fit for a collective in a scope, if the spec carries one: the one
        measured with groups of `group_size` when there is one, else the widest group's."""
        fits = [f for f in self.collective_fits if f.collective == collective and f.scope == scope]
        for fit in fits:
            if group_size is not None and fit.measured_ranks == group_size:
                return fit
        return max(fits, key=lambda f: f.measured_ranks, default=None)

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
        out["dp_unit_overhead_s"] = dict(self.dp_unit_overhead_s)
        out["dp_tensor_overhead_s"] = dict(self.dp_tensor_overhead_s)
        out["optimizer_tensor_overhead_s"] = dict(self.optimizer_tensor_overhead_s)
        out["tp_module_overhead_s"] = {str(size): s for size, s in self.tp_module_overhead_s}
        out["blocking_wait_s"] = dict(self.blocking_wait_s)
        out["collective_fits"] = [
            {f.name: getattr(fit, f.name) for f in dataclasses.fields(fit)}
            for fit in self.collective_fits]
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
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise PlannerError(f"{source}: unknown field {unknown[0]!r}; known fields: "
                               f"{', '.join(fields)}")
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
                (str(k), _number(f"peak_flops_by_dtype[{k}]", v)) for k, v in flops.items()))
            for field in ("dp_unit_overhead_s", "dp_tensor_overhead_s",
                          "optimizer_tensor_overhead_s", "blocking_wait_s"):
                units = data.get(field, {})
                if not isinstance(units, dict):
                    raise PlannerError(f"field {field!r} must be an object {{key: seconds}}")
                data[field] = tuple(sorted(
                    (str(k), _number(f"{field}[{k}]", v)) for k, v in units.items()))
            data["tp_module_overhead_s"] = _tp_module_figures(
                data.get("tp_module_overhead_s", {}), data.get("devices_per_node"))
            fits = data.get("collective_fits", [])
            if not isinstance(fits, list):
                raise PlannerError("field 'collective_fits' must be a list")
            parsed = []
            for i, fit in enumerate(fits):
                if not isinstance(fit, dict):
                    raise PlannerError(f"collective_fits[{i}] must be an object")
                fit = dict(fit)
                for name in ("alpha_s", "bytes_per_s"):
                    if name in fit:
                        fit[name] = _number(f"collective_fits[{i}].{name}", fit[name])
                ranks = fit.get("measured_ranks", 0)
                if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 0:
                    raise PlannerError(f"field 'collective_fits[{i}].measured_ranks' must be "
                                       f"an integer >= 0, got {ranks!r}")
                try:
                    parsed.append(CollectiveFit(**fit))
                except TypeError as exc:
                    raise PlannerError(f"collective_fits[{i}]: {exc}; give each fit only "
                                       "collective, scope, alpha_s, bytes_per_s and "
                                       "measured_ranks") from None
            data["collective_fits"] = tuple(parsed)
            for name in ("hbm_gbps", "intra_node_gbps", "inter_node_gbps",
                         "intra_node_latency_s", "inter_node_latency_s", "op_overhead_s",
                         "dtensor_op_overhead_s", "random_element_s", "pcie_gbps",
                         "host_memory_gbps"):
                if name in data:
                    data[name] = _number(name, data[name])
            for name in ("num_nodes", "devices_per_node", "device_memory_bytes",
                         "runtime_overhead_bytes", "host_cores", "host_memory_bytes"):
                value = data.get(name)
                if isinstance(value, float) and value.is_integer():
                    data[name] = int(value)  # JSON writers may print 8.0e10 for an integer
            if data.get("dp_overlap_efficiency") is not None:
                data["dp_overlap_efficiency"] = _number("dp_overlap_efficiency",
                                                        data["dp_overlap_efficiency"])
            if data.get("kernel_calibration") is not None:
                data["kernel_calibration"] = KernelCalibration.from_dict(
                    data["kernel_calibration"])
            if data.get("matmul_efficiency") is not None:
                data["matmul_efficiency"] = _number("matmul_efficiency",
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


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(field: str, value: Any) -> float:
    if not _is_number(value):
        raise PlannerError(f"field {field!r} must be a number, got {value!r}")
    return float(value)


def _check_positive(name: str, field: str, value: Any) -> None:
    if not _is_number(value) or value <= 0:
        raise PlannerError(f"cluster {name}: {field} must be a number > 0, got {value!r}")


def _check_text(field: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise PlannerError(f"cluster spec: {field} must be a non-empty string, got {value!r}")


def _by_mode(figures: tuple[tuple[str, float], ...], mode: str, group_size: int | None) -> float:
    """"mode@size" when measured for that DP group size, else the bare mode (the whole
    node's figure), else 0."""
    table = dict(figures)
    return table.get(f"{mode}@{group_size}", table.get(mode, 0.0))


def _tp_module_figures(value: Any, devices_per_node: Any) -> tuple[tuple[int, float], ...]:
    """JSON {"2": s, "4": s} -> ((2, s), (4, s)); a bare number (specs written before the
    per-group-size probe) was measured with the whole node as one TP group."""
    if _is_number(value):
        if not value:
            return ()
        if isinstance(devices_per_node, bool) or not isinstance(devices_per_node, (int, float)):
            raise PlannerError("field 'tp_module_overhead_s' as a number needs devices_per_node")
        return ((int(devices_per_node), float(value)),)
    if not isinstance(value, dict):
        raise PlannerError("field 'tp_module_overhead_s' must be an object "
                           "{tp_group_size: seconds}, e.g. {\"2\": 0.003}")
    figures = []
    for key, seconds in value.items():
        try:
            size = int(key)
        except (TypeError, ValueError):
            raise PlannerError(f"field 'tp_module_overhead_s': key {key!r} is not a TP group "
                               "size; use an integer such as \"2\"") from None
        figures.append((size, _number(f"tp_module_overhead_s[{key}]", seconds)))
    return tuple(sorted(figures))
