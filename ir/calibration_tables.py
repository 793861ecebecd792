"""What `planner profile-cluster` measured on top of a spec's datasheet figures: the
typed records of `ir.calibration_records`, one table each, read and written by one pair
of functions here:

    collective_fits     CollectiveFit per collective, scope and group size
    dp_overheads        DpOverhead per ZeRO mode and group size
    optimizer_steps     OptimizerStepCost per optimizer (on plain tensors or DTensors)
    tp_modules          TpModuleOverhead per TP group size
    sp_groups           TpModuleOverhead per TP group size, per SP module group
    vocab_embeddings    TpModuleOverhead per TP group size, per vocab-parallel embedding,
                        forward and backward apart (`VOCAB_EDGE_FIELDS`)
    loss_parallels      the same per loss-parallel cross-entropy (`LOSS_EDGE_FIELDS`)
    tp_selectives       TpModuleOverhead per TP group size, per TP module and per SP
                        module group, under selective checkpointing (`SELECTIVE_FIELDS`)
    sp_block_selectives TpModuleOverhead per TP group size, per SP module group of a
                        whole block under selective checkpointing, forward+backward and
                        forward (`SP_BLOCK_SELECTIVE_FIELDS`, `block_probes`)
    blocking_waits      BlockingWait as a plain `dist.<collective>` call (DP, pipeline)
    tp_blocking_waits   BlockingWait as DTensor issues it (TP: funcol collective +
                        wait_tensor under a redistribution)

`CalibrationTables` holds the eleven tables and answers the cost models' lookups (each with
its fallback, once). The spec file keeps its shape (schema "planner.cluster/v1"):

    "collective_fits": [{"collective": "all_reduce", "scope": "intra_node", "alpha_s": ...,
                         "bytes_per_s": ..., "measured_ranks": 2}],
    "dp_unit_overhead_s": {"zero3": s, "zero3@4": s},  "dp_tensor_overhead_s": {same keys},
    "dp_param_overhead_s": {same keys}  (absent in older specs: 0 per parameter)
    "optimizer_tensor_overhead_s": {"adamw": s, "adamw@dtensor": s},
    "tp_module_overhead_s": {"2": s, "4": s},  "blocking_wait_s": {"all_reduce@2": s},
    "sp_group_overhead_s": {"2": s}  (absent in older specs: SP modules price as TP's)
    "vocab_embedding_forward_overhead_s": {"2": s}, "..._backward_overhead_s": {"2": s},
    "loss_parallel_forward_overhead_s": {"2": s}, "..._backward_overhead_s": {"2": s}
        (absent in older specs: the embedding prices as a TP module, the loss at nothing)
    "tp_module_selective_overhead_s": {"2": s}, "sp_group_selective_overhead_s": {"2": s}
        (absent in older specs: a selective recompute adds nothing for its TP modules)
    "sp_block_selective_overhead_s": {"2": s}, "sp_block_selective_forward_overhead_s":
        {"2": s}  (absent in older specs: an SP layer's selective figure is
        `sp_group_selective_overhead_s`' Linear pairs', all in the recompute)
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

from ir.calibration_records import (COLLECTIVES, DTENSOR_QUALIFIER, SCOPES,  # noqa: F401
                                    BlockingWait, CollectiveFit, DpOverhead,
                                    OptimizerStepCost, TpModuleOverhead, _join_key,
                                    _split_key, _wait_key_error, is_finite_number,
                                    json_number)
from ir.errors import PlannerError
from ir.strategy import DPMode

# ---- the collection ------------------------------------------------------------------


# The zeros `CalibrationTables.dp_overhead` answers for a mode not measured, made once (the
# search asks per priced row; a record checks its figures when made).
_UNMEASURED_DP = {mode: DpOverhead(mode, None, 0.0, 0.0) for mode in DPMode}

@dataclass(frozen=True, slots=True)
class CalibrationTables:
    """A spec's measured tables (all empty for a datasheet spec) and their lookups."""

    collective_fits: tuple[CollectiveFit, ...] = ()
    dp_overheads: tuple[DpOverhead, ...] = ()
    optimizer_steps: tuple[OptimizerStepCost, ...] = ()
    tp_modules: tuple[TpModuleOverhead, ...] = ()
    # Per SP module group (column- then row-parallel module, the sequence gathered before
    # and reduce-scattered after): `tp_probes.sp_module_seconds`; empty in older specs
    sp_groups: tuple[TpModuleOverhead, ...] = ()
    blocking_waits: tuple[BlockingWait, ...] = ()
    # The same waits in DTensor's form (`profile_cluster.dtensor_form_seconds`)
    tp_blocking_waits: tuple[BlockingWait, ...] = ()
    # The DP-unit and optimizer figures' clock: "thread_cpu" (profile-cluster since
    # 2026-11-25; CPU processes sharing cores stretch them by `ClusterSpec.host_share`) or
    # "wall" (older specs: the node's processes timed together, the sharing inside).
    host_figures_clock: str = "wall"
    # Per vocab-parallel embedding / loss-parallel cross-entropy, a forward and a backward
    # row per group size (`cost_models.vocab_probes`); empty in older specs
    vocab_embeddings: tuple[TpModuleOverhead, ...] = ()
    loss_parallels: tuple[TpModuleOverhead, ...] = ()
    # Per TP module / SP group, what SAC adds on DTensors (`tp_probes.selective_seconds`)
    tp_selectives: tuple[TpModuleOverhead, ...] = ()
    # Per SP group, what SAC adds on DTensors to a whole TP+SP block
    # (`cost_models.block_probes.sp_block_selective_seconds`); empty in older specs
    sp_block_selectives: tuple[TpModuleOverhead, ...] = ()

    def __post_init__(self) -> None:
        if self.host_figures_clock not in HOST_FIGURE_CLOCKS:
            raise PlannerError(f"calibration host_figures_clock must be one of "
                               f"{', '.join(HOST_FIGURE_CLOCKS)}, got {self.host_figures_clock!r}")
        for field, record_type, key in _TABLES:
            rows = getattr(self, field)
            if not isinstance(rows, tuple) or not all(isinstance(r, record_type) for r in rows):
                raise PlannerError(f"calibration table {field} must be a tuple of "
                                   f"{record_type.__name__} records")
            fields = _ROW_FIELDS.get(field)
            if fields and any(r.field not in fields for r in rows):
                raise PlannerError(f"calibration table {field} holds rows of "
                                   f"{', '.join(fields)} only")
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
        unmeasured = _UNMEASURED_DP.get(mode) if type(mode) is DPMode else None
        return by_key.get((mode, group_size)) or by_key.get((mode, None)) \
            or unmeasured or DpOverhead(mode, None, 0.0, 0.0)

    def optimizer_seconds_per_tensor(self, optimizer: str, on_dtensor: bool) -> float | None:
        """Measured host seconds per parameter tensor of one step; None when not measured."""
        for row in self.optimizer_steps:
            if row.optimizer == optimizer and row.on_dtensor == on_dtensor:
                return row.seconds_per_tensor
        return None

    def tp_module_seconds(self, group_size: int) -> float:
        """Per TP module in groups of `group_size`: the figure measured with that size, else
        the nearest measured size on a log scale (ties: the smaller; 0 when none)."""
        nearest = _nearest_size(self.tp_modules, group_size)
        return 0.0 if nearest is None else nearest.seconds

    def sp_group_seconds(self, group_size: int) -> float | None:
        """Per SP module group in TP groups of `group_size`, as `tp_module_seconds` looks
        it up; None where the spec has no SP figure (older specs: SP modules price as TP
        modules)."""
        nearest = _nearest_size(self.sp_groups, group_size)
        return None if nearest is None else nearest.seconds

    def vocab_embedding_seconds(self, group_size: int) -> tuple[float, float] | None:
        """(forward, backward) per vocab-parallel embedding in TP groups of `group_size`,
        looked up as `tp_module_seconds`; None where the spec has no such figure (older
        specs: the embedding prices as a TP module)."""
        return _by_pass(self.vocab_embeddings, VOCAB_EDGE_FIELDS, group_size)

    def loss_parallel_seconds(self, group_size: int) -> tuple[float, float] | None:
        """(forward, backward) per loss-parallel cross-entropy, as
        `vocab_embedding_seconds` (None: older specs price it at nothing)."""
        return _by_pass(self.loss_parallels, LOSS_EDGE_FIELDS, group_size)

    def selective_seconds(self, group_size: int) -> tuple[float, float] | None:
        """(per TP module, per SP group) under selective checkpointing in TP groups of
        `group_size`, looked up as `tp_module_seconds` (None: older specs)."""
        return _by_pass(self.tp_selectives, SELECTIVE_FIELDS, group_size)

    def sp_block_selective_seconds(self, group_size: int) -> tuple[float, float] | None:
        """(forward+backward, forward) per SP module group of a whole block under selective
        checkpointing in TP groups of `group_size`, looked up as `tp_module_seconds`
        (None: older specs)."""
        return _by_pass(self.sp_block_selectives, SP_BLOCK_SELECTIVE_FIELDS, group_size)

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
            tp_modules=tuple(r.scaled(factor) for r in self.tp_modules),
            sp_groups=tuple(r.scaled(factor) for r in self.sp_groups),
            vocab_embeddings=tuple(r.scaled(factor) for r in self.vocab_embeddings),
            loss_parallels=tuple(r.scaled(factor) for r in self.loss_parallels),
            tp_selectives=tuple(r.scaled(factor) for r in self.tp_selectives),
            sp_block_selectives=tuple(r.scaled(factor) for r in self.sp_block_selectives))

    # ---- JSON ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The spec file's calibration keys (module docstring)."""
        dp_key = {id(r): _join_key(r.mode.value, r.group_size) for r in self.dp_overheads}
        return {
            "collective_fits": [fit.to_json() for fit in self.collective_fits],
            "dp_unit_overhead_s": {dp_key[id(r)]: r.per_unit_s for r in self.dp_overheads},
            "dp_tensor_overhead_s": {dp_key[id(r)]: r.per_tensor_s for r in self.dp_overheads},
            "dp_param_overhead_s": {dp_key[id(r)]: r.per_param_s for r in self.dp_overheads},
            "optimizer_tensor_overhead_s": {r.key: r.seconds_per_tensor
                                            for r in self.optimizer_steps},
            "tp_module_overhead_s": {str(r.group_size): r.seconds for r in self.tp_modules},
            "sp_group_overhead_s": {str(r.group_size): r.seconds for r in self.sp_groups},
            "blocking_wait_s": {_join_key(r.collective, r.group_size): r.seconds
                                for r in self.blocking_waits},
            "blocking_wait_s_per_byte": {_join_key(r.collective, r.group_size):
                                         r.seconds_per_byte for r in self.blocking_waits},
            "tp_blocking_wait_s": {_join_key(r.collective, r.group_size): r.seconds
                                   for r in self.tp_blocking_waits},
            "tp_blocking_wait_s_per_byte": {_join_key(r.collective, r.group_size):
                                            r.seconds_per_byte for r in self.tp_blocking_waits},
            "host_figures_clock": self.host_figures_clock,
            **{field: {str(r.group_size): r.seconds for r in rows if r.field == field}
               for rows, fields in ((self.vocab_embeddings, VOCAB_EDGE_FIELDS),
                                    (self.loss_parallels, LOSS_EDGE_FIELDS),
                                    (self.tp_selectives, SELECTIVE_FIELDS),
                                    (self.sp_block_selectives, SP_BLOCK_SELECTIVE_FIELDS))
               for field in fields},
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
                  ("dp_unit_overhead_s", "dp_tensor_overhead_s", "dp_param_overhead_s",
                   "optimizer_tensor_overhead_s",
                   "blocking_wait_s", "blocking_wait_s_per_byte", "tp_blocking_wait_s",
                   "tp_blocking_wait_s_per_byte")}
        units, tensors, params = (tables[key] for key in (
            "dp_unit_overhead_s", "dp_tensor_overhead_s", "dp_param_overhead_s"))
        extra = sorted(set(params) - set(units) - set(tensors))
        if extra:  # its unit's fixed parts would read 0: a typo, or a table cut short
            raise PlannerError(f"dp_param_overhead_s key {extra[0]!r} has no "
                               "dp_unit_overhead_s entry; add one or drop the key")
        return cls(
            collective_fits=tuple(CollectiveFit.from_json(fit, f"collective_fits[{i}]")
                                  for i, fit in enumerate(fits)),
            dp_overheads=tuple(_dp_overhead(key, *(_with_fallback(table, key)
                                                   for table in (units, tensors, params)))
                               for key in sorted(set(units) | set(tensors))),
            optimizer_steps=tuple(_optimizer_step(key, s) for key, s in
                                  tables["optimizer_tensor_overhead_s"].items()),
            tp_modules=_tp_modules(data.get("tp_module_overhead_s", {}), devices_per_node),
            sp_groups=_tp_modules(data.get("sp_group_overhead_s", {}), None,
                                  "sp_group_overhead_s"),
            blocking_waits=_blocking_waits(tables, "blocking_wait_s"),
            tp_blocking_waits=_blocking_waits(tables, "tp_blocking_wait_s"),
            host_figures_clock=data.get("host_figures_clock", "wall"),
            vocab_embeddings=_edge_rows(data, VOCAB_EDGE_FIELDS),
            loss_parallels=_edge_rows(data, LOSS_EDGE_FIELDS),
            tp_selectives=_edge_rows(data, SELECTIVE_FIELDS),
            sp_block_selectives=_edge_rows(data, SP_BLOCK_SELECTIVE_FIELDS))


def _seconds_table(field: str, value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        raise PlannerError(f"field {field!r} must be an object {{key: seconds}}")
    return {str(k): json_number(f"{field}[{k}]", v) for k, v in sorted(value.items())}


def _with_fallback(table: dict[str, float], key: str) -> float:
    """A key one of the two DP tables lacks reads as its bare mode's figure (else 0), as
    the lookup falls back for a group size not measured."""
    return table.get(key, table.get(_split_key(key)[0], 0.0))


def _dp_overhead(key: str, per_unit_s: float, per_tensor_s: float,
                 per_param_s: float) -> DpOverhead:
    mode, size = _split_key(key)
    if mode not in {m.value for m in DPMode} or not (size is None or size.isdigit()):
        raise PlannerError(f"dp_unit/tensor/param_overhead_s key {key!r} must be MODE or "
                           f"MODE@GROUP_SIZE, "
                           f"e.g. \"zero3@4\" (modes: {', '.join(m.value for m in DPMode)})")
    return DpOverhead(DPMode(mode), None if size is None else int(size), per_unit_s,
                      per_tensor_s, per_param_s)


def _optimizer_step(key: str, seconds: float) -> OptimizerStepCost:
    optimizer, qualifier = _split_key(key)
    if qualifier not in (None, DTENSOR_QUALIFIER):
        raise PlannerError(f"optimizer_tensor_overhead_s key {key!r} must be OPTIMIZER or "
                           f"OPTIMIZER@{DTENSOR_QUALIFIER}, e.g. \"adamw@{DTENSOR_QUALIFIER}\"")
    return OptimizerStepCost(optimizer, qualifier is not None, seconds)


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


def _tp_modules(value: Any, devices_per_node: Any, field: str = "tp_module_overhead_s"
                ) -> tuple[TpModuleOverhead, ...]:
    """JSON {"2": s, "4": s}; a bare number (specs written before the per-group-size
    probe) was measured with the whole node as one TP group."""
    if is_finite_number(value):
        if not value:
            return ()
        if isinstance(devices_per_node, bool) or not isinstance(devices_per_node, (int, float)):
            raise PlannerError(f"field {field!r} as a number needs devices_per_node; "
                               "give an object {tp_group_size: seconds}")
        return (TpModuleOverhead(int(devices_per_node), float(value), field),)
    if not isinstance(value, dict):
        raise PlannerError(f"field {field!r} must be an object "
                           "{tp_group_size: seconds}, e.g. {\"2\": 0.003}")
    rows = []
    for key, seconds in value.items():
        try:
            size = int(key)
        except (TypeError, ValueError):
            raise PlannerError(f"field {field!r}: key {key!r} is not a TP group "
                               "size; use an integer such as \"2\"") from None
        rows.append(TpModuleOverhead(size, json_number(f"{field}[{key}]", seconds), field))
    return tuple(sorted(rows, key=lambda r: r.group_size))


def _nearest_size(rows, group_size: int):
    """The row measured in groups of `group_size`, else the nearest size on a log scale
    (ties: the smaller); None when there is none."""
    return min(rows, key=lambda r: (abs(math.log2(r.group_size / group_size)), r.group_size),
               default=None)


def _by_pass(rows, fields: tuple[str, str], group_size: int) -> tuple[float, float] | None:
    """The two figures (forward, backward; module, group) of a table whose rows carry
    `fields`, each the nearest measured group size's."""
    if not rows:
        return None
    forward, backward = (_nearest_size([r for r in rows if r.field == f], group_size)
                         for f in fields)
    return (forward.seconds if forward else 0.0, backward.seconds if backward else 0.0)


def _edge_rows(data: dict[str, Any], fields: tuple[str, str]) -> tuple[TpModuleOverhead, ...]:
    """The two tables `fields` of the spec file as one tuple of rows."""
    return tuple(row for field in fields
                 for row in _tp_modules(data.get(field, {}), None, field))


# (field, record type, the key that identifies a row): what the collection checks.
_TABLES = (
    ("collective_fits", CollectiveFit, lambda r: (r.collective, r.scope, r.measured_ranks)),
    ("dp_overheads", DpOverhead, lambda r: (r.mode, r.group_size)),
    ("optimizer_steps", OptimizerStepCost, lambda r: r.key),
    ("tp_modules", TpModuleOverhead, lambda r: r.group_size),
    ("sp_groups", TpModuleOverhead, lambda r: r.group_size),
    ("blocking_waits", BlockingWait, lambda r: (r.collective, r.group_size)),
    ("tp_blocking_waits", BlockingWait, lambda r: (r.collective, r.group_size)),
    ("vocab_embeddings", TpModuleOverhead, lambda r: (r.field, r.group_size)),
    ("loss_parallels", TpModuleOverhead, lambda r: (r.field, r.group_size)),
    ("tp_selectives", TpModuleOverhead, lambda r: (r.field, r.group_size)),
    ("sp_block_selectives", TpModuleOverhead, lambda r: (r.field, r.group_size)),
)
# The spec file's keys of the vocabulary-parallel ends' figures, (forward, backward)
# (`cost_models.vocab_probes`)
VOCAB_EDGE_FIELDS = ("vocab_embedding_forward_overhead_s", "vocab_embedding_backward_overhead_s")
LOSS_EDGE_FIELDS = ("loss_parallel_forward_overhead_s", "loss_parallel_backward_overhead_s")
# ... and of SAC's on DTensors, (per TP module, per SP group) (`tp_probes.selective_seconds`)
SELECTIVE_FIELDS = ("tp_module_selective_overhead_s", "sp_group_selective_overhead_s")
# ... and of SAC's on a whole TP+SP block, per SP group, (forward+backward, forward)
# (`cost_models.block_probes`)
SP_BLOCK_SELECTIVE_FIELDS = ("sp_block_selective_overhead_s",
                             "sp_block_selective_forward_overhead_s")
_ROW_FIELDS = {"vocab_embeddings": VOCAB_EDGE_FIELDS, "loss_parallels": LOSS_EDGE_FIELDS,
               "tp_selectives": SELECTIVE_FIELDS,
               "sp_block_selectives": SP_BLOCK_SELECTIVE_FIELDS}
HOST_FIGURE_CLOCKS = ("thread_cpu", "wall")  # `CalibrationTables.host_figures_clock`
# The spec file's keys `CalibrationTables.to_json` writes and `from_json` reads.
JSON_KEYS = tuple(CalibrationTables().to_json())
