"""Measured kernel tables of one device, as plain frozen data inside a cluster spec.

`planner profile-device` fills a `KernelCalibration`: GEMM throughput by (m, n, k, dtype)
(CPUs: also in the operand layouts a Linear runs, `cost_models.gemm_layouts`), bandwidth
of memory-bound kernels (copy, elementwise, reductions, softmax, layer norm, batch norm)
by size, the scaled-dot-product-attention backends that ran and their times,
2-D convolutions' forward and backward times by shape, the launch overhead of a kernel,
and (CPUs) the host's dispatch in parts: forward views, ops and module calls; backward
views, ops and autograd nodes; the per-call excess of the ops that have a fixed cost
beyond dispatch (`HostOpExcess`). It travels in a cluster spec JSON
(`ClusterSpec.kernel_calibration`), data only, validated on load. Specs written before a
field existed still load: a missing scalar reads 0 and a missing table empty, "not
measured" (the host functions then fall back to `op_overhead_s` / `backward_op_overhead_s`).

The tables' rows and the names they may use are `ir.kernel_points`. Units are in the
field names: `flop_per_s` FLOP per second, `gbps` 10^9 BYTES per second
(bytes read plus bytes written), `*_s` seconds, `*_bytes` bytes.

    >>> GemmPoint(m=4096, n=4096, k=4096, dtype="bfloat16", flop_per_s=7.0e14)
    GemmPoint(m=4096, n=4096, k=4096, dtype='bfloat16', flop_per_s=700000000000000.0)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ir import gemm_table
from ir.errors import PlannerError
# The rows are defined in ir.kernel_points; importing them from here keeps working.
from ir.kernel_points import (APART_MEMORY_KERNELS, GEMM_TIE_LOG2_DISTANCE,  # noqa: F401
                              MEMORY_KERNELS, SDPA_BACKENDS, ColdBackwardPoint,
                              ColdEntryPoint, ColdKernelPoint, ConvPoint, GemmPoint, HostOpExcess,
                              MemoryKernelPoint, OpColdCodePoint, SdpaPoint, _is_number, _text)

# The calibration's single figures (numbers >= 0; 0 where not measured).
_SCALARS = ("launch_host_s", "launch_device_s", "burst_gemm_flop_per_s",
            "sustained_gemm_flop_per_s", "forward_host_op_s", "module_call_host_s",
            "view_host_op_s", "embedding_backward_index_s", "backward_view_host_op_s",
            "backward_nonview_host_op_s", "backward_node_host_s", "python_node_host_s",
            "forward_node_host_s", "in_sequence_op_host_s", "in_sequence_knee_distinct_ops",
            "in_sequence_low_op_host_s",
            "cold_op_host_s", "cold_backward_op_host_s", "autograd_call_host_s",
            "pipeline_action_host_s", "loss_sum_host_s", "optimizer_entry_host_s",
            "grad_accumulate_host_s", "train_loop_host_s", "train_loop_param_host_s",
            "embedding_bag_call_s", "embedding_bag_index_s", "embedding_bag_backward_call_s",
            "embedding_bag_backward_index_s", "embedding_bag_multi_bag_s",
            # activation checkpointing's host machinery (`cost_models.checkpoint_probes`)
            "checkpoint_call_forward_s", "checkpoint_call_recompute_s",
            "checkpoint_op_forward_s", "checkpoint_op_recompute_s",
            "checkpoint_saved_forward_s", "checkpoint_saved_recompute_s", "selective_call_s",
            "selective_forward_op_s", "selective_forward_kept_op_s", "selective_recompute_op_s",
            # per-row kernel costs (`cost_models.memory_probes.probe_row_seconds`)
            "softmax_row_s", "layer_norm_row_s",
            # SELECTIVE's per-call figure in its two measured halves (multirank block, below)
            "selective_call_forward_s", "selective_call_recompute_s",
            "selective_forward_op_sized_s",
            # an embedding's forward (`item_probes.probe_embedding_forward`)
            "embedding_call_s", "embedding_index_s",
            # the pool the fresh-output probe's blocks rotated over (`cost_models.fresh_output`)
            "fresh_output_pool_bytes",
            # what a forward pays per layer for starting after other layers' work
            # (`cost_models.cold_entry_probes`)
            "cold_entry_host_s", "cold_entry_after_backward_host_s",
            "cold_entry_same_code_host_s",
            # tied copies' gradient sum after backward (`cost_models.tied_sync`)
            "tied_sum_host_s", "tied_sum_s_per_byte", "tied_sum_small_host_s",
            "tied_sum_small_s_per_byte",
            # a backward run after other layers' backwards (`cost_models.cold_backward_probes`)
            "cold_backward_inner_op_host_s",
            # a view a layer's fx node calls from Python (`host_excess.InternalDispatch`)
            "python_view_host_op_s",
            # a forward op given a Python number (`cost_models.scalar_operand_probes`)
            "scalar_operand_float_host_s", "scalar_operand_int_host_s",
            # the range of the spec's per-op host figure over profile-device's readings
            "op_overhead_min_s", "op_overhead_max_s")

# Figures kits of 2026-11-24 wrote, always as 0 (per-call forward pricing, which
# profile-device never turned on and which was removed: bench/bench_host_ab.py); a spec
# carrying them at 0 loads as before, one carrying a measured value is refused.
_RETIRED_SCALARS = ("python_call_host_s", "inner_op_host_s", "wrapped_number_host_s",
                    "cast_wrapped_number_host_s")


@dataclass(frozen=True, slots=True)
class KernelCalibration:
    """What `planner profile-device` measured on one device."""

    measured_on: str  # device name, torch version, date
    gemm: tuple[GemmPoint, ...] = ()
    # The same products in the operand layouts a layer's records run
    # (`cost_models.gemm_layouts`): (); None measured prices them as `gemm` does.
    gemm_linear: tuple[GemmPoint, ...] = ()
    gemm_linear_nobias: tuple[GemmPoint, ...] = ()
    gemm_weight_grad: tuple[GemmPoint, ...] = ()
    gemm_layout_mm: tuple[GemmPoint, ...] = ()  # plain mm, timed in the layouts' passes
    memory_kernels: tuple[MemoryKernelPoint, ...] = ()
    sdpa: tuple[SdpaPoint, ...] = ()
    conv: tuple[ConvPoint, ...] = ()
    # Host seconds to dispatch one tiny eager op (the launch cost the framework pays).
    launch_host_s: float = 0.0
    # The least and most of profile-device's repeated readings of the spec's per-op host
    # figure (`ClusterSpec.op_overhead_s`, their median); 0 where not recorded.
    op_overhead_min_s: float = 0.0
    op_overhead_max_s: float = 0.0
    # Device seconds per tiny kernel replayed back to back from a CUDA graph (the GPU's own
    # floor per kernel); 0 where not measured (CPUs).
    launch_device_s: float = 0.0
    # A large bf16 GEMM run back to back before the grid: its rate over the first and the
    # last window (a GPU boosts, then settles under its power and thermal limits; the
    # grid is measured in the settled state). 0 where not measured (CPUs).
    burst_gemm_flop_per_s: float = 0.0
    sustained_gemm_flop_per_s: float = 0.0
    # Forward host seconds, in parts (`cost_models.host_probes.host_op_seconds_by_pass`):
    # per ATen op (not a view) called as a function with autograd recording, per nn.Module
    # call on top of its ops, per view op. 0 where not measured (`op_overhead_s` applies).
    # With `python_node_host_s` > 0 the per-op figure is net of the ops' per-call excess
    # (`host_op_excess`, charged apart) and each fx call node that dispatches nothing pays
    # `python_node_host_s` (`cost_models.host_excess.python_node_seconds`); 0 (kits before
    # it): the per-op figure holds the probe chain's excess on average.
    forward_host_op_s: float = 0.0
    module_call_host_s: float = 0.0
    view_host_op_s: float = 0.0
    python_node_host_s: float = 0.0
    # Per view called from Python, one fx node each, grad mode off (`view_host_op_s` is a
    # C++ caller's: F.linear's t; `host_excess.internal_dispatch_seconds`); a layer's
    # view-only nodes (`Layer.python_view_nodes_fwd`) pay the difference once each; 0
    # where not measured.
    python_view_host_op_s: float = 0.0
    # Per autograd node the forward records (a grad_fn and its saved inputs), measured as a
    # chain's forward with grad mode on less off (`host_probes.host_op_seconds_by_pass`).
    # Where > 0, `forward_host_op_s` and `view_host_op_s` are the grad-off figures (an op
    # recording nothing: ints, no gradient needed); 0 (kits before it): they record.
    forward_node_host_s: float = 0.0
    # Forward ops run in order, distinct ones after one another, cost more than the same
    # ops each in a tight loop: per op, `in_sequence_low_op_host_s` per distinct op of the
    # layer from 1 up to `in_sequence_knee_distinct_ops`, `in_sequence_op_host_s` per one
    # beyond (grad mode on: `cost_models.sequence_probes.in_sequence_cost`; the host probe
    # chain's figures above hold their own: `host_dispatch.forward_host_seconds`); 0 where
    # not measured (the low segment: kits before it, priced by the slope alone).
    in_sequence_op_host_s: float = 0.0
    in_sequence_knee_distinct_ops: float = 0.0
    in_sequence_low_op_host_s: float = 0.0
    # Per distinct forward op the layer before did not run (`Layer.cold_distinct_ops_fwd`),
    # what it pays run once after other ops over run right after itself, its code and data
    # out of the caches (`cost_models.cold_entry_probes.cold_entry_cost`); 0 where not measured.
    cold_op_host_s: float = 0.0
    # ... and per distinct backward op the layers after's backwards did not run
    # (`Layer.cold_distinct_ops_bwd`; `cost_models.cold_backward_probes`, see
    # `cold_backward_inner_op_host_s`); 0 where not measured (kits before that probe).
    cold_backward_op_host_s: float = 0.0
    # Host seconds one `torch.autograd.backward` call costs beyond its nodes (the engine's
    # start, `host_probes.autograd_call_s`), which every backward figure above leaves out:
    # a step pays it once per backward call (`cost_models.step_host`); 0 where not measured.
    autograd_call_host_s: float = 0.0
    # Host seconds torch.distributed.pipelining's runtime adds per stage action (a forward
    # or backward of one micro-batch) beyond the layers and the engine call
    # (`cost_models.pipeline_probes`); 0 where not measured.
    pipeline_action_host_s: float = 0.0
    # Host seconds a step pays once outside its layers (`cost_models.step_loop_probes`,
    # `step_host.step_loop_s`): the loop's scalar loss all-reduce, started and waited on;
    # AdamW's step right after a backward more than back to back (the optimizer's entry);
    # the loop's own work around one micro-batch timed cold in the real `train_step`, and
    # its walk per parameter tensor of the rank (`planner.train_loop_probe`;
    # `step_host.param_walk_s`). 0 where not measured.
    loss_sum_host_s: float = 0.0
    optimizer_entry_host_s: float = 0.0
    train_loop_host_s: float = 0.0
    train_loop_param_host_s: float = 0.0
    # Per parameter tensor, what a backward pays more adding into an existing gradient (a
    # step's micro-batches 2..m) than with none (`step_loop_probes.grad_accumulate_host_s`,
    # priced by `step_host.grad_accumulation_s`); 0 where not measured.
    grad_accumulate_host_s: float = 0.0
    # Device seconds per index of an embedding's backward (a scatter-add of one gradient
    # row per index), over what the rows' bytes cost; 0 where not measured.
    embedding_backward_index_s: float = 0.0
    # Backward host seconds in parts (`host_op_seconds_by_pass`): per view op (no kernel:
    # view, t, detach, ...) and per other op as a backward formula dispatches them (grad
    # mode off), per autograd node the engine runs, autograd's engine start left out; 0
    # where not measured (`backward_op_overhead_s` then prices every backward op).
    backward_view_host_op_s: float = 0.0
    backward_nonview_host_op_s: float = 0.0
    backward_node_host_s: float = 0.0
    # Per-call fixed host excess of the ops that have one (CPUs); empty where not measured.
    host_op_excess: tuple[HostOpExcess, ...] = ()
    # An embedding bag's forward and backward (sort, cumsum, index_select, index_add_ ...
    # inside ATen): device seconds per call beyond one op's dispatch, and per index
    # (`cost_models.item_probes.probe_embedding_bag`); 0 where not measured.
    embedding_bag_call_s: float = 0.0
    embedding_bag_index_s: float = 0.0
    embedding_bag_backward_call_s: float = 0.0
    embedding_bag_backward_index_s: float = 0.0
    # What a forward of more than one bag pays beyond a one-bag call of the same ids (ATen's
    # make_bag_size_out slices and subtracts the offsets only when bags != 1): the forward
    # line is timed at several bags, a one-bag call pays it less; 0 where not measured.
    embedding_bag_multi_bag_s: float = 0.0
    # Host seconds of non-reentrant checkpointing's machinery (`cost_models.checkpoint_probes`
    # names each part): per call, forward and recompute; per op under its hooks, the same
    # (beyond the op's forward price); per saved tensor, pack and recompute's pack + unpack;
    # SELECTIVE's per call on top, per op through its caching (recomputed, kept) and cached
    # modes. 0 where not measured (GPU specs before 2026-11-25): only the recompute is paid.
    checkpoint_call_forward_s: float = 0.0
    checkpoint_call_recompute_s: float = 0.0
    checkpoint_op_forward_s: float = 0.0
    checkpoint_op_recompute_s: float = 0.0
    checkpoint_saved_forward_s: float = 0.0
    checkpoint_saved_recompute_s: float = 0.0
    selective_call_s: float = 0.0
    selective_forward_op_s: float = 0.0
    selective_forward_kept_op_s: float = 0.0
    selective_recompute_op_s: float = 0.0
    # SAC's forward per recomputed op again among a zoo block's activations (0: not
    # measured, the tiny figures above price every layer): `checkpoint_probes`' sized chains
    selective_forward_op_sized_s: float = 0.0

    # ---- per-row costs of row-wise kernels (`cost_models.memory_probes.probe_row_seconds`)
    # Device seconds per row of a softmax (forward) and a layer norm (forward) beyond their
    # bytes at the table's bandwidth (measured on rows of `device_grids.ROW_ELEMENTS`):
    # the difference of the same bytes in short rows and in long ones, per extra row.
    # 0 where not measured (previous pricing: bytes only).
    softmax_row_s: float = 0.0
    layer_norm_row_s: float = 0.0

    # ---- SELECTIVE's per-call host seconds, forward and recompute apart ----------------
    # (`cost_models.checkpoint_probes.checkpoint_host_seconds` fits them apart: the SAC
    # context's caching mode entered in forward, its cached mode in the recompute).
    # `selective_call_s` keeps their sum for specs and readers before the halves; a spec
    # with 0 in both reads the sum halved (`selective_call_halves`).
    selective_call_forward_s: float = 0.0
    selective_call_recompute_s: float = 0.0

    # ---- an embedding's forward (`cost_models.item_probes
    # .probe_embedding_forward`): device seconds per call beyond one op's dispatch (the
    # reshape, index_select and view ATen's embedding runs inside) and per index (one row
    # of `item_probes.EMBEDDING_PROBE_DIM`); 0 where not measured (bytes at copy speed).
    embedding_call_s: float = 0.0
    embedding_index_s: float = 0.0
    # Bytes the fresh-output probe's blocks rotated over (`cost_models.fresh_output
    # .fresh_pool_bytes`: twice the CPU's last-level cache, read from sysfs), for the
    # record; 0 where not measured (GPUs; CPU kits before it).
    fresh_output_pool_bytes: float = 0.0
    # Per memory kind, a call's extra seconds with its code cold (`cost_models.cold_kernel`)
    cold_kernels: tuple[ColdKernelPoint, ...] = ()
    op_cold_code: tuple[OpColdCodePoint, ...] = ()  # per op kind (`cost_models.op_cold_code`)

    # ---- a forward started after other layers' work (`cost_models.cold_entry_probes
    # .cold_entry_cost`): host seconds per layer over the same forward run right after
    # itself, its code and objects out of the caches, whatever its cold ops; where > 0,
    # `cold_op_host_s` is the same fit's slope per cold op. 0 where not measured (kits
    # before it: `cold_op_host_s` alone, a median per cold op).
    cold_entry_host_s: float = 0.0
    # ... the entry of a forward that follows a backward (a step's first layer:
    # `Layer.forward_after_backward`), probed after a backward alone; 0 where not
    # measured (`cold_entry_host_s` then prices it too).
    cold_entry_after_backward_host_s: float = 0.0
    # ... the same fit after several amounts of work after (`ColdEntryPoint`s: a small or
    # a block layer after, ops counted), which `host_dispatch.cold_entry_seconds` reads at
    # a layer's `Layer.after_ops`; ()
    # where not measured (the two figures above then price every layer).
    cold_entry_points: tuple[ColdEntryPoint, ...] = ()
    # ... with the layer before running the probe layer's own code (a table after a table;
    # `Layer.same_code_before`); 0 where not measured.
    cold_entry_same_code_host_s: float = 0.0
    # ---- tied copies' gradient sum after backward (`cost_models.tied_sync
    # .probe_tied_sum`): `executors.tied.TiedGradients.sync` on two fresh gradients, fitted
    # as seconds per call + seconds per byte it moves (reads and writes:
    # `tied_sync.sum_traffic_bytes`), for gradients above `tied_sync.FRESH_PAGES_ABOVE_BYTES`
    # (fresh pages, out of the caches) and, `small`, at or below it (warm); 0 where not
    # measured (GPU presets, older kits: the sum is then not priced).
    tied_sum_host_s: float = 0.0
    tied_sum_s_per_byte: float = 0.0
    tied_sum_small_host_s: float = 0.0
    tied_sum_small_s_per_byte: float = 0.0
    # ---- a backward run after the layers after's backwards (`cost_models
    # .cold_backward_probes.cold_backward_cost`): host seconds per ATen op a composite
    # backward runs inside its CPU kernel that they did not run (`Layer.cold_inner_ops_bwd`);
    # `cold_backward_op_host_s` is the same fit's figure per cold backward op. 0 where not
    # measured (GPU presets, older kits: inner ops unpriced); a step that stays in the
    # caches (`Layer.step_warm`) prices no backward op cold.
    cold_backward_inner_op_host_s: float = 0.0
    # ... both figures after several amounts of work between (`ColdBackwardPoint`s: a
    # small or a block layer's forward and backward, ops counted), which `host_dispatch
    # .backward_host_seconds` reads at `Layer.backward_after_ops`; () where not measured
    # (the two figures above, a block's, then price every layer).
    cold_backward_points: tuple[ColdBackwardPoint, ...] = ()
    # ---- a forward op given a Python number it wraps into a tensor (`KernelRecord
    # .scalar_operand`: `x * 2`, `x > 0`; `cost_models.scalar_operand_probes`): host
    # seconds per call over the same op on two tensors, on a floating tensor and on an
    # integer one. 0 where not measured (GPU presets, older kits: not priced).
    scalar_operand_float_host_s: float = 0.0
    scalar_operand_int_host_s: float = 0.0

    def __post_init__(self) -> None:
        _text("kernel calibration", "measured_on", self.measured_on)
        for field, kind in _TABLES:
            for item in getattr(self, field):
                if not isinstance(item, kind):
                    raise PlannerError(f"kernel calibration: {field} holds a "
                                       f"{type(item).__name__}, not a {kind.__name__}")
        for field in _SCALARS:
            value = getattr(self, field)
            if not _is_number(value) or value < 0:
                raise PlannerError(f"kernel calibration: {field} must be a number >= 0, "
                                   f"got {value!r}")

    # ---- queries -------------------------------------------------------------------------

    @property
    def sdpa_backends(self) -> tuple[str, ...]:
        """Backends that ran on at least one shape ("default" left out)."""
        return tuple(sorted({p.backend for p in self.sdpa if p.backend != "default"}))

    def selective_call_halves(self) -> tuple[float, float]:
        """(forward, recompute) host seconds of one SELECTIVE call's machinery: the halves
        the probe measured, else (a spec written before them) `selective_call_s` / 2 each."""
        if self.selective_call_forward_s > 0 or self.selective_call_recompute_s > 0:
            return self.selective_call_forward_s, self.selective_call_recompute_s
        return self.selective_call_s / 2, self.selective_call_s / 2

    def cold_kernel(self, kind: str, dtype: str) -> ColdKernelPoint | None:
        """The cold-code point of a memory kind (None unmeasured)."""
        return next((p for p in self.cold_kernels if p.kernel == kind and p.dtype == dtype),
                    None)

    def host_excess_s(self, op: str) -> float:
        """The measured per-call host excess of `op` ("aten::gelu"); 0 for an op not listed."""
        return next((p.seconds for p in self.host_op_excess if p.op == op), 0.0)

    def best_gemm(self, dtype: str) -> GemmPoint | None:
        """The fastest measured GEMM of a dtype."""
        return max((p for p in self.gemm if p.dtype == dtype), key=lambda p: p.flop_per_s,
                   default=None)

    # The table lookups live in `ir.gemm_table` (nearest shape by log2 distance).
    def nearest_gemm(self, m: int, n: int, k: int, dtype: str) -> GemmPoint | None:
        return gemm_table.nearest_gemm(self.gemm, m, n, k, dtype)

    def gemm_flop_per_s(self, m: int, n: int, k: int, dtype: str) -> float | None:
        return gemm_table.gemm_flop_per_s(self.gemm, m, n, k, dtype)

    def gemm_layout_factor(self, m: int, n: int, k: int, dtype: str, layout: str,
                           charged_s: float = 0.0) -> float:
        """Seconds of the product in `layout` (`GEMM_LAYOUT_TABLES`) over the plain mm's
        timed in the same passes (`gemm_layout_mm`); 1.0 where not measured."""
        return gemm_table.gemm_layout_factor(getattr(self, GEMM_LAYOUT_TABLES[layout]),
                                             self.gemm_layout_mm, m, n, k, dtype, charged_s)

    def nearest_conv(self, batch: int, in_channels: int, out_channels: int, positions: int,
                     kernel_area: int, dtype: str) -> list[ConvPoint]:
        return gemm_table.nearest_conv(self.conv, batch, in_channels, out_channels,
                                       positions, kernel_area, dtype)

    # ---- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        def rows(items) -> list[dict[str, Any]]:
            return [{f.name: getattr(i, f.name) for f in dataclasses.fields(i)} for i in items]

        return {"measured_on": self.measured_on,
                **{field: getattr(self, field) for field in _SCALARS},
                "gemm": rows(self.gemm),
                **{field: rows(getattr(self, field)) for field in GEMM_LAYOUT_TABLES.values()},
                "memory_kernels": rows(self.memory_kernels),
                "sdpa": rows(self.sdpa), "conv": rows(self.conv),
                "host_op_excess": rows(self.host_op_excess),
                "cold_kernels": rows(self.cold_kernels), "op_cold_code": rows(self.op_cold_code),
                "cold_entry_points": rows(self.cold_entry_points),
                "cold_backward_points": rows(self.cold_backward_points)}

    @classmethod
    def from_dict(cls, data: Any) -> KernelCalibration:
        if not isinstance(data, dict):
            raise PlannerError("field 'kernel_calibration' must be an object")
        for field in _RETIRED_SCALARS:
            if data.get(field, 0.0) != 0.0:
                raise PlannerError(f"kernel_calibration.{field} is no longer priced (per-call "
                                   "forward pricing was removed); delete the field or re-run "
                                   "planner profile-device")
        known = {f.name for f in dataclasses.fields(cls)} | set(_RETIRED_SCALARS)
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlannerError(f"kernel_calibration: unknown field {unknown[0]!r}; known "
                               f"fields: {', '.join(sorted(known))}")
        tables = {}
        for field, kind in _TABLES:
            items = data.get(field, [])
            if not isinstance(items, list):
                raise PlannerError(f"kernel_calibration.{field} must be a list")
            tables[field] = tuple(_row(kind, f"kernel_calibration.{field}[{i}]", item)
                                  for i, item in enumerate(items))
        scalars = {}
        for field in _SCALARS:
            value = data.get(field, 0.0)
            if not _is_number(value):
                raise PlannerError(f"kernel_calibration.{field} must be a number, got {value!r}")
            scalars[field] = float(value)
        return cls(measured_on=data.get("measured_on", ""), **tables, **scalars)


# Each layout's table field (`cost_models.gemm_layouts` names and measures the layouts).
GEMM_LAYOUT_TABLES = {"linear": "gemm_linear", "linear_nobias": "gemm_linear_nobias",
                      "weight_grad": "gemm_weight_grad", "mm": "gemm_layout_mm"}
_TABLES = (("gemm", GemmPoint), *((field, GemmPoint) for field in GEMM_LAYOUT_TABLES.values()),
           ("memory_kernels", MemoryKernelPoint), ("sdpa", SdpaPoint),
           ("conv", ConvPoint), ("host_op_excess", HostOpExcess),
           ("cold_kernels", ColdKernelPoint), ("op_cold_code", OpColdCodePoint),
           ("cold_entry_points", ColdEntryPoint), ("cold_backward_points", ColdBackwardPoint))


def _row(kind, where: str, item: Any):
    """One table row from JSON: exact field names, integers where the type says int."""
    if not isinstance(item, dict):
        raise PlannerError(f"{where} must be an object")
    item = dict(item)
    for f in dataclasses.fields(kind):
        value = item.get(f.name)
        if f.type == "float" and _is_number(value):
            item[f.name] = float(value)
        elif f.type == "int" and isinstance(value, float) and value.is_integer():
            item[f.name] = int(value)
    try:
        return kind(**item)
    except TypeError as exc:
        raise PlannerError(f"{where}: {exc}") from None
    except PlannerError as exc:
        raise PlannerError(f"{where}: {exc}") from None
