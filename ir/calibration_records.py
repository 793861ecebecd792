"""The typed records of a spec's calibration tables (`ir.calibration_tables` holds the
collection, its lookups and the spec file's keys): one frozen record type per table row,
each validated once in its `__post_init__`, which reading JSON goes through too.

    CollectiveFit       alpha-beta fit of one collective in one scope and group size
    DpOverhead          host seconds a data-parallel unit adds, by ZeRO mode and group size
    OptimizerStepCost   host seconds per parameter tensor of one optimizer step
    TpModuleOverhead    host seconds a tensor-parallel module (or, in the SP table, module
                        group) adds, by group size
    BlockingWait        seconds a blocking collective waits beyond its fitted time, as a
                        line in the message's bytes
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ir.errors import PlannerError
from ir.strategy import DPMode

# The collectives a fit or a wait can describe, and where the group lives.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
               "send_recv")
SCOPES = ("intra_node", "inter_node")
# Qualifier of an optimizer-step key measured on DTensor parameters ("adamw@dtensor").
DTENSOR_QUALIFIER = "dtensor"


def is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _check_seconds(what: str, seconds: Any) -> None:
    if not is_finite_number(seconds) or seconds < 0:
        raise PlannerError(f"{what} must be a number >= 0, got {seconds!r}")


def json_number(field: str, value: Any) -> float:
    """A JSON number as float (an integer may stand for a float); the error names `field`."""
    if not is_finite_number(value):
        raise PlannerError(f"field {field!r} must be a number, got {value!r}")
    return float(value)


def _split_key(key: str) -> tuple[str, str | None]:
    """File key "NAME@QUALIFIER" -> (NAME, QUALIFIER); "NAME" -> (NAME, None)."""
    name, at, qualifier = str(key).partition("@")
    return name, (qualifier if at else None)


def _join_key(name: str, qualifier: Any) -> str:
    return name if qualifier is None else f"{name}@{qualifier}"


def _wait_key_error(key: str, field: str = "blocking_wait_s") -> PlannerError:
    return PlannerError(f"{field} key {key!r} must be COLLECTIVE@GROUP_SIZE, e.g. "
                        f"\"all_reduce@2\" (collectives: {', '.join(COLLECTIVES)})")


# ---- the records ---------------------------------------------------------------------


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
        if not is_finite_number(self.alpha_s) or self.alpha_s < 0:
            raise PlannerError(f"collective fit {self.collective}: alpha_s must be a finite "
                               f"number >= 0, got {self.alpha_s!r}")
        if not is_finite_number(self.bytes_per_s) or self.bytes_per_s <= 0:
            raise PlannerError(f"collective fit {self.collective}: bytes_per_s must be > 0, "
                               f"got {self.bytes_per_s!r}")
        if not _is_count(self.measured_ranks, 0):
            raise PlannerError(f"collective fit {self.collective}: measured_ranks must be an "
                               f"integer >= 0, got {self.measured_ranks!r}")

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: Any, where: str) -> CollectiveFit:
        if not isinstance(data, dict):
            raise PlannerError(f"{where} must be an object")
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in names:
                raise PlannerError(f"{where}: unexpected keyword argument {key!r}; give each "
                                   f"fit only {', '.join(names)}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in data]
        if missing:
            raise PlannerError(f"{where}: missing {missing[0]!r}; give each fit "
                               f"{', '.join(names)}")
        values = dict(data)
        for f in dataclasses.fields(cls):  # JSON may write 1 for 1.0
            if f.type == "float" and f.name in values:
                values[f.name] = json_number(f"{where}.{f.name}", values[f.name])
        return cls(**values)

    def __str__(self) -> str:
        return (f"{self.collective}@{self.scope}: a={self.alpha_s * 1e6:.1f}us "
                f"B={self.bytes_per_s / 1e9:.2f}GB/s")


@dataclass(frozen=True, slots=True)
class DpOverhead:
    """Seconds one data-parallel unit (an FSDP2 / replicate module) adds per micro-batch on
    CPU processes in `mode`, for DP groups of `group_size` (None: the whole node's group,
    the fallback for sizes not measured): `per_unit_s` plus `per_tensor_s` per parameter
    tensor the unit holds (hooks and shard copies: the calling thread's CPU time outside
    the unit's collectives, which the comm model prices; the line through units of two
    sizes, measured with the node's processes running together; the compute model
    stretches it by the core share, `ClusterSpec.host_share`), plus `per_param_s` per
    parameter (FSDP2's copies of the parameters and gradients, which grow with them: the
    probe's wide unit against its narrow one of as many tensors; 0 in older specs), read
    on one micro-batch that reduced its gradients: the cost model splits it into the
    copies each micro-batch repeats and the reduction's once a step
    (`cost_models.dp_copies.cpu_param_copy_shares`)."""

    mode: DPMode
    group_size: int | None
    per_unit_s: float
    per_tensor_s: float
    per_param_s: float = 0.0

    def __post_init__(self) -> None:
        where = f"dp_unit_overhead_s[{_join_key(str(self.mode), self.group_size)}]"
        if not isinstance(self.mode, DPMode):
            raise PlannerError(f"{where}: mode must be one of "
                               f"{', '.join(m.value for m in DPMode)}, got {self.mode!r}")
        if self.group_size is not None and not _is_count(self.group_size, 1):
            raise PlannerError(f"{where}: the group size must be an integer >= 1, got "
                               f"{self.group_size!r}")
        _check_seconds(where, self.per_unit_s)
        _check_seconds(f"dp_tensor_overhead_s[{_join_key(str(self.mode), self.group_size)}]",
                       self.per_tensor_s)
        _check_seconds(f"dp_param_overhead_s[{_join_key(str(self.mode), self.group_size)}]",
                       self.per_param_s)

    def __str__(self) -> str:
        size = "node" if self.group_size is None else f"dp{self.group_size}"
        return (f"{self.mode}@{size}: {self.per_unit_s * 1e3:.2f}ms"
                f"+{self.per_tensor_s * 1e3:.3f}ms/tensor"
                f"+{self.per_param_s * 1e9:.2f}ns/param")

    def seconds(self, tensors: int, params: float = 0.0) -> float:
        """For a unit of `tensors` parameter tensors and `params` parameters (on this rank;
        the caller passes the share of them one micro-batch copies)."""
        return self.per_unit_s + tensors * self.per_tensor_s + params * self.per_param_s

    def scaled(self, factor: float) -> DpOverhead:
        return dataclasses.replace(self, per_unit_s=self.per_unit_s * factor,
                                   per_tensor_s=self.per_tensor_s * factor,
                                   per_param_s=self.per_param_s * factor)


@dataclass(frozen=True, slots=True)
class OptimizerStepCost:
    """Host CPU seconds one optimizer step (step + zero_grad) spends per parameter tensor
    on CPU processes, on plain or on DTensor parameters: the stepping thread's, with the
    node's processes stepping together (`cost_models.step_probes`); the compute model
    stretches it by the core share."""

    optimizer: str
    on_dtensor: bool
    seconds_per_tensor: float

    def __post_init__(self) -> None:
        where = f"optimizer_tensor_overhead_s[{self.key}]"
        if not isinstance(self.optimizer, str) or not self.optimizer or "@" in self.optimizer:
            raise PlannerError(f"{where}: the optimizer must be a name such as \"adamw\", got "
                               f"{self.optimizer!r}")
        if not isinstance(self.on_dtensor, bool):
            raise PlannerError(f"{where}: on_dtensor must be true or false")
        _check_seconds(where, self.seconds_per_tensor)

    @property
    def key(self) -> str:
        return _join_key(self.optimizer, DTENSOR_QUALIFIER if self.on_dtensor else None)

    def __str__(self) -> str:
        return f"{self.key}: {self.seconds_per_tensor * 1e6:.0f}us/tensor"

    def scaled(self, factor: float) -> OptimizerStepCost:
        return dataclasses.replace(self, seconds_per_tensor=self.seconds_per_tensor * factor)


@dataclass(frozen=True, slots=True)
class TpModuleOverhead:
    """Seconds a tensor-parallel module (column- or row-parallel Linear) adds per
    micro-batch on CPU processes beyond what the comm model prices, in TP groups of
    `group_size`: DTensor dispatch and re-layout bookkeeping, measured with the node's
    processes in groups of that size against the same collectives on plain tensors (the
    comm model prices the collectives and their waits: `cost_models.tp_probes`). The SP
    table (`field` "sp_group_overhead_s") holds the same per module group under
    sequence parallelism."""

    group_size: int
    seconds: float
    field: str = dataclasses.field(default="tp_module_overhead_s", compare=False)

    def __post_init__(self) -> None:
        if not _is_count(self.group_size, 1) or not is_finite_number(self.seconds) \
                or self.seconds < 0:
            raise PlannerError(f"{self.field}[{self.group_size}] must map a group "
                               f"size >= 1 to seconds >= 0, got {self.seconds!r}")

    def __str__(self) -> str:
        per = {"tp_module_overhead_s": "module", "sp_group_overhead_s": "group"}.get(
            self.field, "call")
        return f"tp{self.group_size}: {self.seconds * 1e3:.2f}ms/{per}"

    def scaled(self, factor: float) -> TpModuleOverhead:
        return dataclasses.replace(self, seconds=self.seconds * factor)


@dataclass(frozen=True, slots=True)
class BlockingWait:
    """Seconds a blocking `collective` call in groups of `group_size` waits beyond its
    fitted time on CPU processes whose peers compute between calls: `seconds` plus
    `seconds_per_byte` per byte of the message (the line through the waits profile-cluster
    measured at two sizes; 0 per byte in specs that measured one). The peer is late or
    descheduled, and a woken process waits for its core while gloo moves the message."""

    collective: str
    group_size: int
    seconds: float  # the wait at zero bytes
    seconds_per_byte: float = 0.0

    def __post_init__(self) -> None:
        key = _join_key(str(self.collective), self.group_size)
        if self.collective not in COLLECTIVES or not _is_count(self.group_size, 2):
            raise _wait_key_error(key)
        _check_seconds(f"blocking_wait_s[{key}]", self.seconds)
        _check_seconds(f"blocking_wait_s_per_byte[{key}]", self.seconds_per_byte)

    def __str__(self) -> str:
        return (f"{self.collective}@{self.group_size}: {self.seconds * 1e3:.2f}ms"
                f"+{self.seconds_per_byte * 2**20 * 1e3:.2f}ms/MiB")

    def at(self, nbytes: float) -> float:
        """The wait of one call on a message of `nbytes` (the size `comm.blocking_s` takes)."""
        return self.seconds + nbytes * self.seconds_per_byte


# ---- the collection ------------------------------------------------------------------
