"""What a CPU memory kernel pays per loop beyond its bytes (`cost_models.kernel_time`'s
memory term), and the measured bandwidth tables both read.

ATen's TensorIterator runs an elementwise op as 2-D loop calls (`ir.tensor_iteration
.coalesced_sizes`): each call runs `loops_per_call` inner loops of `inner_run` elements.
On this CPU (one thread, 128 KiB fp32, thread clock, 2026-11-25) a copy in loops of 8
from a stride-0 middle dim cost, per loop over a contiguous copy, 5.6 ns at 2 loops per
call, 3.8 at 4, 2.8 at 8, 2.5 at 16: a fixed cost per loop plus one per call,

    seconds = loops x per_loop_s x min(run, 8) / 8  +  loops / loops_per_call x per_call_s

fitted where the calibration measured both copy probes ("short_run": 8 loops per call,
transposed; "short_outer": SHORT_OUTER_LOOPS_PER_CALL); a product with a broadcast
operand ("broadcast_binary", BROADCAST_BINARY_LOOPS_PER_CALL per call: 5.5 ns per loop
over an add, 9.6 at 2, 3.3 at 8) pays the copy's per loop and its own per call.
Calibrations without those probes price as before: the short_run probe's per-loop cost
(shorter loops per element). A middle-dim reduction pays per loop at "short_reduction"
(calls with no contiguous dim, `KernelRecord.strided_calls`, at "strided_reduction").
"""

from __future__ import annotations

import math

from ir.kernel_calibration import KernelCalibration
from ir.kernel_recorder import REDUCTION_OPS
from ir.kernel_records import KernelRecord

from cost_models.common import GB, dtype_bytes
from cost_models.device_grids import (BROADCAST_BINARY_LOOPS_PER_CALL,
                                      SHORT_OUTER_LOOPS_PER_CALL,
                                      SHORT_REDUCTION_PROBE_ELEMENTS, SHORT_RUN_PROBE_ELEMENTS)
from cost_models.id_memo import IdMemo

# A streaming op (copy, add, sum kinds) pays per innermost loop on top of its bytes: on
# this CPU (one thread, 2026-11-24) inner loops of 8 elements streamed ~5x slower than
# contiguous ones (a (16, 8, 32, 8) permuted clone 10.3 us, 128 KiB), loops of 32 within
# 15% (a transpose(1, 2) clone of (16, 8, 32, 32): 10.9 us against 9.6, 1 MiB).
SHORT_RUN_KINDS = frozenset({"copy", "add", "sum"})
# Loops per 2-D call of the short_run probe: (n, 8, 8) blocks transposed, 8 loops of 8.
SHORT_RUN_LOOPS_PER_CALL = SHORT_RUN_PROBE_ELEMENTS


def memory_gbps(cal: KernelCalibration | None, kernel: str, dtype: str, nbytes: float,
                default_gbps: float) -> float:
    """Bandwidth of a memory-bound kernel moving `nbytes`: the calibration's points for
    that kernel (its dtype, else any), linear in log(bytes) between the two around it,
    the end point beyond them; `default_gbps` without points."""
    points = () if cal is None else _kernel_points(cal, kernel, dtype)
    if not points:
        return default_gbps
    if nbytes <= points[0].nbytes:
        return points[0].gbps
    for lo, hi in zip(points, points[1:]):
        if nbytes <= hi.nbytes:
            if hi.nbytes == lo.nbytes:
                return max(lo.gbps, hi.gbps)
            x = math.log(nbytes / lo.nbytes) / math.log(hi.nbytes / lo.nbytes)
            return lo.gbps + x * (hi.gbps - lo.gbps)
    return points[-1].gbps


# A calibration's points by (calibration, kernel, dtype): memory_gbps is asked per kernel
# of every priced row, the filter and sort are the same each time.
_POINTS = IdMemo(max_entries=1024)


def _kernel_points(cal: KernelCalibration, kernel: str, dtype: str) -> tuple:
    """The calibration's points for `kernel` (its dtype's, else any dtype's) by bytes."""
    return _POINTS.get((id(cal), kernel, dtype), cal, _sorted_points, cal, kernel, dtype)


def _sorted_points(cal: KernelCalibration, kernel: str, dtype: str) -> tuple:
    points = [p for p in cal.memory_kernels if p.kernel == kernel]
    points = [p for p in points if p.dtype == dtype] or points
    return tuple(sorted(points, key=lambda p: p.nbytes))


# The kernels a calibration has points for: `measured` is asked per kernel of every
# priced row.
_KINDS = IdMemo(max_entries=1024)


def measured(cal: KernelCalibration | None, kernel: str) -> bool:
    if cal is None:
        return False
    return kernel in _KINDS.get(id(cal), cal, _kinds, cal)


def _kinds(cal: KernelCalibration) -> frozenset[str]:
    return frozenset(p.kernel for p in cal.memory_kernels)


def _probe_loop_seconds(cal: KernelCalibration, probe: str, reference: str, dtype: str,
                        nbytes: float, bytes_per_loop: float) -> float:
    """Seconds per loop the `probe` kind paid over the `reference` kind at `nbytes`, its
    loops being nbytes / bytes_per_loop (never below 0; 0 for an empty tensor)."""
    if nbytes <= 0 or bytes_per_loop <= 0:
        return 0.0
    probe_gbps = memory_gbps(cal, probe, dtype, nbytes, 1.0)
    reference_gbps = memory_gbps(cal, reference, dtype, nbytes, probe_gbps)
    return max(0.0, nbytes / (probe_gbps * GB) - nbytes / (reference_gbps * GB)) / (
        nbytes / bytes_per_loop)


def two_level_fit(cal: KernelCalibration | None, dtype: str,
                  nbytes: float) -> tuple[float, float, float] | None:
    """(per loop, per copy call, per binary call) seconds at `nbytes` (module docstring),
    from short_run, short_outer and broadcast_binary; None where short_outer was not
    measured; a binary call costs a copy's where broadcast_binary was not."""
    if not (measured(cal, "short_run") and measured(cal, "short_outer")):
        return None
    element, run = dtype_bytes(dtype), SHORT_RUN_PROBE_ELEMENTS
    wide = _probe_loop_seconds(cal, "short_run", "copy", dtype, nbytes, 2 * element * run)
    short = _probe_loop_seconds(cal, "short_outer", "copy", dtype, nbytes, 2 * element * run)
    # p(o) = per_loop + per_call / o at o = SHORT_RUN_ and SHORT_OUTER_LOOPS_PER_CALL
    per_call_s = max(0.0, (short - wide) / (1 / SHORT_OUTER_LOOPS_PER_CALL
                                            - 1 / SHORT_RUN_LOOPS_PER_CALL))
    per_loop_s = max(0.0, wide - per_call_s / SHORT_RUN_LOOPS_PER_CALL)
    binary_call_s = per_call_s
    if measured(cal, "broadcast_binary"):  # x (n, o, 8) times y (n, 1, 8), written out
        o = BROADCAST_BINARY_LOOPS_PER_CALL
        binary = _probe_loop_seconds(cal, "broadcast_binary", "add", dtype, nbytes,
                                     (2 + 1 / o) * element * run)
        binary_call_s = max(0.0, (binary - per_loop_s) * o)
    return per_loop_s, per_call_s, binary_call_s


def loop_seconds(r: KernelRecord, cal: KernelCalibration | None, dtype: str, nbytes: float,
                 loops: float) -> float:
    """Seconds `loops` inner loops of record `r` cost beyond its bytes (module docstring):
    per call where the record knows its loops per call and the calibration both copy
    probes, else per loop as before (`_loop_seconds`)."""
    op = r.op.split("::")[-1]
    run = 0 if r.transposing else r.inner_run
    fit = two_level_fit(cal, dtype, nbytes) if r.loops_per_call > 0 else None
    if fit is None or op in REDUCTION_OPS:
        per_loop_s = _loop_seconds(cal, dtype, nbytes, op, run)
        if op in REDUCTION_OPS and r.strided_calls and measured(cal, "strided_reduction"):
            strided_s = _loop_seconds(cal, dtype, nbytes, op, run, strided=True)
            per_loop_s += (strided_s - per_loop_s) * r.strided_calls / r.count
        return loops * per_loop_s
    per_loop_s, per_call_s, binary_call_s = fit
    scale = min(run, SHORT_RUN_PROBE_ELEMENTS) / SHORT_RUN_PROBE_ELEMENTS if run > 0 else 1.0
    # per loop + per 2-D loop call (ATen TensorIteratorBase::serial_for_each), as probed
    return loops * per_loop_s * scale + loops / r.loops_per_call * (
        binary_call_s if r.binary else per_call_s)


def _loop_seconds(cal: KernelCalibration | None, dtype: str, nbytes: float, op: str = "",
                  run: int = 0, strided: bool = False) -> float:
    """Seconds one innermost loop of `run` elements (0: not known) of a streaming op costs
    beyond its bytes. A reduction (REDUCTION_OPS) where "short_reduction" was measured:
    that probe's seconds over a sum's for the same bytes, per probe loop. Otherwise the
    "short_run" probe's seconds over a contiguous copy's, per loop (each moved element
    read and written, `dtype` wide), times run / SHORT_RUN_PROBE_ELEMENTS for a shorter
    loop: under ATen's vector step the loop is its scalar tail, paid per element (here,
    one thread, 2026-11-25: llama-tiny's rotary neg and cat in loops of 4 ran 1.7 ns per
    loop, the probe's loops of 8 3.5; a transposing copy's loops of 4, `run` 0 here, 3.0).
    `strided`: a reduction with no contiguous inner dim, at "strided_reduction" (the
    record's `strided_calls` share of its calls, `loop_seconds`). 0 where not measured."""
    if op in REDUCTION_OPS and measured(cal, "short_reduction"):
        probe = "strided_reduction" if strided else "short_reduction"
        # (n, r, w) read, (n, w) written: one loop per written element, priced as probed
        return _probe_loop_seconds(cal, probe, "sum", dtype, nbytes,
                                   dtype_bytes(dtype) * (SHORT_REDUCTION_PROBE_ELEMENTS + 1))
    if not measured(cal, "short_run"):
        return 0.0
    run = 0 if op in REDUCTION_OPS else run  # reductions: per loop, as before
    probe_run = SHORT_RUN_PROBE_ELEMENTS
    per_loop_s = _probe_loop_seconds(cal, "short_run", "copy", dtype, nbytes,
                                     2 * dtype_bytes(dtype) * probe_run)
    return per_loop_s * (min(run, probe_run) / probe_run if run > 0 else 1.0)
