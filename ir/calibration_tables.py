"""What `planner profile-cluster` measured on top of a spec's datasheet figures, as typed
records: one frozen record type per table, each validated once (its `__post_init__`, which
reading JSON goes through too) and read and written by one pair of functions.

    CollectiveFit       alpha-beta fit of one collective in one scope and group size
    DpOverhead          host seconds a data-parallel unit adds, by ZeRO mode and group size
    OptimizerStepCost   host seconds per parameter tensor of one optimizer step
    TpModuleOverhead    host seconds a tensor-parallel module adds, by group size
    BlockingWait        seconds a blocking collective waits beyond its fitted time, as a
                        line in the message's bytes; kept twice: as a plain
                        `dist.<collective>` call (DP, pipeline) and as DTensor issues it
                        (TP: funcol collective + wait_tensor under a redistribution)

`CalibrationTables` holds the six tables and answers the cost models' lookups (each with
its fallback, once). The spec file keeps its shape (schema "planner.cluster/v1"):

    "collective_fits": [{"collective": "all_reduce", "scope": "intra_node", "alpha_s": ...,
                         "bytes_per_s": ..., "measured_ranks": 2}],
    "dp_unit_overhead_s": {"zero3": s, "zero3@4": s},  "dp_tensor_overhead_s": {same keys},
    "optimizer_tensor_overhead_s": {"adamw": s, "adamw@dtensor": s},
    "tp_module_overhead_s": {"2": s, "4": s},  "blocking_wait_s": {"all_reduce@2": s},
    "blocking_wait_s_per_byte": {"all_reduce@2": s}  (absent in older specs: a constant wait)
    "tp_blocking_wait_s": {"all_reduce@2": s}, "tp_blocking_wait_s_per_byte": {same keys}
        (absent in older specs, or a collective not measured in DTensor's form: TP pays
        the plain call's wait, the pricing before the DTensor-form probe)

The "NAME@QUALIFIER" keys exist only in that file format: `_split_key` / `_join_key` turn
them into the records' typed fields and back.
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
    stretches it by the core share, `ClusterSpec.host_share`)."""

    mode: DPMode
    group_size: int | None
    per_unit_s: float
    per_tensor_s: float

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

    def __str__(self) -> str:
        size = "node" if self.group_size is None else f"dp{self.group_size}"
        return (f"{self.mode}@{size}: {self.per_unit_s * 1e3:.2f}ms"
                f"+{self.per_tensor_s * 1e3:.3f}ms/tensor")

    def seconds(self, tensors: int) -> float:
        """Per micro-batch, for a unit of `tensors` parameter tensors."""
        return self.per_unit_s + tensors * self.per_tensor_s

    def scaled(self, factor: float) -> DpOverhead:
        return dataclasses.replace(self, per_unit_s=self.per_unit_s * factor,
                                   per_tensor_s=self.per_tensor_s * factor)


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
    comm model prices the collectives and their waits: `cost_models.tp_probes`)."""

    group_size: int
    seconds: float

    def __post_init__(self) -> None:
        if not _is_count(self.group_size, 1) or not is_finite_number(self.seconds) \
                or self.seconds < 0:
            raise PlannerError(f"tp_module_overhead_s[{self.group_size}] must map a group "
                               f"size >= 1 to seconds >= 0, got {self.seconds!r}")

    def __str__(self) -> str:
        return f"tp{self.group_size}: {self.seconds * 1e3:.2f}ms/module"

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


@dataclass(frozen=True, slots=True)
class CalibrationTables:
    """A spec's measured tables (all empty for a datasheet spec) and their lookups."""

    collective_fits: tuple[CollectiveFit, ...] = ()
    dp_overheads: tuple[DpOverhead, ...] = ()
    optimizer_steps: tuple[OptimizerStepCost, ...] = ()
    tp_modules: tuple[TpModuleOverhead, ...] = ()
    blocking_waits: tuple[BlockingWait, ...] = ()
    # The same waits in DTensor's form (`profile_cluster.dtensor_form_seconds`)
    tp_blocking_waits: tuple[BlockingWait, ...] = ()
    # The DP-unit and optimizer figures' clock: "thread_cpu" (profile-cluster since
    # 2026-11-25; CPU processes sharing cores stretch them by `ClusterSpec.host_share`) or
    # "wall" (older specs: the node's processes timed together, the sharing inside).
    host_figures_clock: str = "wall"

    def __post_init__(self) -> None:
        if self.host_figures_clock not in HOST_FIGURE_CLOCKS:
            raise PlannerError(f"calibration host_figures_clock must be one of "
                               f"{', '.join(HOST_FIGURE_CLOCKS)}, got {self.host_figures_clock!r}")
        for field, record_type, key in _TABLES:
            rows = getattr(self, field)
            if not isinstance(rows, tuple) or not all(isinstance(r, record_type) for r in rows):
                raise PlannerError(f"calibration table {field} must be a tuple of "
                                   f"{record_type.__name__} records")
            keys = [key(r) for r in rows]
            if len(set(keys)) != len(keys):
                twice = next(k for k in keys if keys.count(k) > 1)
                raise PlannerError(f"calibration table {field} lists {twice} twice; keep one")

    # ---- lookups ---------------------------------------------------------------------

    def collective_fit(self, collective: str, scope: str,
                       group_size: int | None = None) -> CollectiveFit | None:
        """The measured fit for a collective in a scope, if any: the one measured with
        groups of `group_size` when there is one, else the widest group's."""
        fits = [f for f in self.collective_fits if f.collective == collective and f.scope == scope]
        for fit in fits:
            if group_size is not None and fit.measured_ranks == group_size:
                return fit
        return max(fits, key=lambda f: f.measured_ranks, default=None)

    def dp_overhead(self, mode: DPMode, group_size: int | None = None) -> DpOverhead:
        """The figures measured for `mode` with DP groups of `group_size`, else the whole
        node's, else zeros (not measured)."""
        by_key = {(r.mode, r.group_size): r for r in self.dp_overheads}
        return by_key.get((mode, group_size)) or by_key.get((mode, None)) \
            or DpOverhead(mode, None, 0.0, 0.0)

    def optimizer_seconds_per_tensor(self, optimizer: str, on_dtensor: bool) -> float | None:
        """Measured host seconds per parameter tensor of one step; None when not measured."""
        for row in self.optimizer_steps:
            if row.optimizer == optimizer and row.on_dtensor == on_dtensor:
                return row.seconds_per_tensor
        return None

    def tp_module_seconds(self, group_size: int) -> float:
        """Per TP module in groups of `group_size`: the figure measured with that size, else
        the nearest measured size on a log scale (ties: the smaller; 0 when none)."""
        if not self.tp_modules:
            return 0.0
        return min(self.tp_modules, key=lambda r: (abs(math.log2(r.group_size / group_size)),
                                                   r.group_size)).seconds

    def blocking_wait_seconds(self, collective: str, group_size: int,
                              nbytes: float = 0.0) -> float:
        """Measured wait of a blocking call on `nbytes` at that group size (0 when not
        measured)."""
        for row in self.blocking_waits:
            if row.collective == collective and row.group_size == group_size:
                return row.at(nbytes)
        return 0.0

    def tp_blocking_wait_seconds(self, collective: str, group_size: int,
                                 nbytes: float = 0.0) -> float:
        """Measured wait of a TP collective as DTensor issues it, on `nbytes` at that group
        size; where that form was not measured, the plain call's (`blocking_wait_seconds`)."""
        for row in self.tp_blocking_waits:
            if row.collective == collective and row.group_size == group_size:
                return row.at(nbytes)
        return self.blocking_wait_seconds(collective, group_size, nbytes)

    def with_host_overheads_scaled(self, factor: float) -> CalibrationTables:
        """Every framework-overhead figure (DP unit and tensor, TP module, optimizer per
        tensor) times `factor`; collective fits and blocking waits unchanged."""
        return dataclasses.replace(
            self, dp_overheads=tuple(r.scaled(factor) for r in self.dp_overheads),
            optimizer_steps=tuple(r.scaled(factor) for r in self.optimizer_steps),
            tp_modules=tuple(r.scaled(factor) for r in self.tp_modules))

    # ---- JSON ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The spec file's calibration keys (module docstring)."""
        dp_key = {id(r): _join_key(r.mode.value, r.group_size) for r in self.dp_overheads}
        return {
            "collective_fits": [fit.to_json() for fit in self.collective_fits],
            "dp_unit_overhead_s": {dp_key[id(r)]: r.per_unit_s for r in self.dp_overheads},
            "dp_tensor_overhead_s": {dp_key[id(r)]: r.per_tensor_s for r in self.dp_overheads},
            "optimizer_tensor_overhead_s": {r.key: r.seconds_per_tensor
                                            for r in self.optimizer_steps},
            "tp_module_overhead_s": {str(r.group_size): r.seconds for r in self.tp_modules},
            "blocking_wait_s": {_join_key(r.collective, r.group_size): r.seconds
                                for r in self.blocking_waits},
            "blocking_wait_s_per_byte": {_join_key(r.collective, r.group_size):
                                         r.seconds_per_byte for r in self.blocking_waits},
            "tp_blocking_wait_s": {_join_key(r.collective, r.group_size): r.seconds
                                   for r in self.tp_blocking_waits},
            "tp_blocking_wait_s_per_byte": {_join_key(r.collective, r.group_size):
                                            r.seconds_per_byte for r in self.tp_blocking_waits},
            "host_figures_clock": self.host_figures_clock,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], devices_per_node: Any) -> CalibrationTables:
        """Read the spec file's calibration keys (`JSON_KEYS`; absent ones are empty); a
        bare number for "tp_module_overhead_s" (older specs) is the whole node's figure;
        a wait without a "blocking_wait_s_per_byte" entry (older specs) is a constant; no
        "tp_blocking_wait_s" (older specs): TP pays the plain call's wait; no
        "host_figures_clock" (older specs): "wall"."""
        fits = data.get("collective_fits", [])
        if not isinstance(fits, list):
            raise PlannerError("field 'collective_fits' must be a list")
        tables = {key: _seconds_table(key, data.get(key, {})) for key in
                  ("dp_unit_overhead_s", "dp_tensor_overhead_s", "optimizer_tensor_overhead_s",
                   "blocking_wait_s", "blocking_wait_s_per_byte", "tp_blocking_wait_s",
                   "tp_blocking_wait_s_per_byte")}
        units, tensors = tables["dp_unit_overhead_s"], tables["dp_tensor_overhead_s"]
        return cls(
            collective_fits=tuple(CollectiveFit.from_json(fit, f"collective_fits[{i}]")
                                  for i, fit in enumerate(fits)),
            dp_overheads=tuple(_dp_overhead(key, *(_with_fallback(table, key)
                                                   for table in (units, tensors)))
                               for key in sorted(set(units) | set(tensors))),
            optimizer_steps=tuple(_optimizer_step(key, s) for key, s in
                                  tables["optimizer_tensor_overhead_s"].items()),
            tp_modules=_tp_modules(data.get("tp_module_overhead_s", {}), devices_per_node),
            blocking_waits=_blocking_waits(tables, "blocking_wait_s"),
            tp_blocking_waits=_blocking_waits(tables, "tp_blocking_wait_s"),
            host_figures_clock=data.get("host_figures_clock", "wall"))


def _seconds_table(field: str, value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise PlannerError(f"field {field!r} must be an object {{key: seconds}}")
    return {str(k): json_number(f"{field}[{k}]", v) for k, v in sorted(value.items())}


def _with_fallback(table: dict[str, float], key: str) -> float:
    """A key one of the two DP tables lacks reads as its bare mode's figure (else 0), as
    the lookup falls back for a group size not measured."""
    return table.get(key, table.get(_split_key(key)[0], 0.0))


def _dp_overhead(key: str, per_unit_s: float, per_tensor_s: float) -> DpOverhead:
    mode, size = _split_key(key)
    if mode not in {m.value for m in DPMode} or not (size is None or size.isdigit()):
        raise PlannerError(f"dp_unit_overhead_s key {key!r} must be MODE or MODE@GROUP_SIZE, "
                           f"e.g. \"zero3@4\" (modes: {', '.join(m.value for m in DPMode)})")
    return DpOverhead(DPMode(mode), None if size is None else int(size), per_unit_s,
                      per_tensor_s)


def _optimizer_step(key: str, seconds: float) -> OptimizerStepCost:
    optimizer, qualifier = _split_key(key)
    if qualifier not in (None, DTENSOR_QUALIFIER):
        raise PlannerError(f"optimizer_tensor_overhead_s key {key!r} must be OPTIMIZER or "
                           f"OPTIMIZER@{DTENSOR_QUALIFIER}, e.g. \"adamw@{DTENSOR_QUALIFIER}\"")
    return OptimizerStepCost(optimizer, qualifier is not None, seconds)


def _wait_key_error(key: str, field: str = "blocking_wait_s") -> PlannerError:
    return PlannerError(f"{field} key {key!r} must be COLLECTIVE@GROUP_SIZE, e.g. "
                        f"\"all_reduce@2\" (collectives: {', '.join(COLLECTIVES)})")


def _blocking_waits(tables: dict[str, dict[str, float]], field: str
                    ) -> tuple[BlockingWait, ...]:
    """The wait tables `field` and `field`_per_byte, row by key; a per-byte figure needs
    its zero-byte one."""
    seconds, per_byte = tables[field], tables[f"{field}_per_byte"]
    rows = []
    for key, s in seconds.items():
        collective, size = _split_key(key)
        if size is None or not size.isdigit() or collective not in COLLECTIVES:
            raise _wait_key_error(key, field)
        rows.append(BlockingWait(collective, int(size), s, per_byte.get(key, 0.0)))
    extra = sorted(set(per_byte) - set(seconds))
    if extra:
        raise PlannerError(f"{field}_per_byte key {extra[0]!r} has no {field} "
                           "entry; give both (the wait at zero bytes and per byte)")
    return tuple(rows)


def _tp_modules(value: Any, devices_per_node: Any) -> tuple[TpModuleOverhead, ...]:
    """JSON {"2": s, "4": s}; a bare number (specs written before the per-group-size
    probe) was measured with the whole node as one TP group."""
    if is_finite_number(value):
        if not value:
            return ()
        if isinstance(devices_per_node, bool) or not isinstance(devices_per_node, (int, float)):
            raise PlannerError("field 'tp_module_overhead_s' as a number needs devices_per_node")
        return (TpModuleOverhead(int(devices_per_node), float(value)),)
    if not isinstance(value, dict):
        raise PlannerError("field 'tp_module_overhead_s' must be an object "
                           "{tp_group_size: seconds}, e.g. {\"2\": 0.003}")
    rows = []
    for key, seconds in value.items():
        try:
            size = int(key)
        except (TypeError, ValueError):
            raise PlannerError(f"field 'tp_module_overhead_s': key {key!r} is not a TP group "
                               "size; use an integer such as \"2\"") from None
        rows.append(TpModuleOverhead(size, json_number(f"tp_module_overhead_s[{key}]", seconds)))
    return tuple(sorted(rows, key=lambda r: r.group_size))


# (field, record type, the key that identifies a row): what the collection checks.
_TABLES = (
    ("collective_fits", CollectiveFit, lambda r: (r.collective, r.scope, r.measured_ranks)),
    ("dp_overheads", DpOverhead, lambda r: (r.mode, r.group_size)),
    ("optimizer_steps", OptimizerStepCost, lambda r: r.key),
    ("tp_modules", TpModuleOverhead, lambda r: r.group_size),
    ("blocking_waits", BlockingWait, lambda r: (r.collective, r.group_size)),
    ("tp_blocking_waits", BlockingWait, lambda r: (r.collective, r.group_size)),
)
HOST_FIGURE_CLOCKS = ("thread_cpu", "wall")  # `CalibrationTables.host_figures_clock`
# The spec file's keys `CalibrationTables.to_json` writes and `from_json` reads.
JSON_KEYS = tuple(CalibrationTables().to_json())
