"""Turning host-probe readings into spec figures, less what the comm model prices.

A probe's reading holds its own collectives; the comm model charges those again for
the real layer, so each fitter prices the probe's traffic with the alpha-beta fits
measured at the same group size (`cost_models.collective_fit.PRICE`) and keeps the rest:
  blocking_wait        per collective and group size, what a blocking call took beyond
                       its price, as the non-negative line in bytes through the probe's
                       two sizes (`BlockingWait` records);
  dp_unit_overhead     per DP mode and group size, a fixed cost per unit and one per
                       parameter tensor (the non-negative line through two unit sizes;
                       `DpOverhead`); a unit read at or below the price of its own
                       collectives has overhead 0 (the priced collectives hold it all).
A tensor-parallel module's probe (`cost_models.tp_probes`) times the same collectives on
both sides, so its reading holds none of them and is kept as measured.
"""

from __future__ import annotations

from ir.calibration_tables import BlockingWait, CalibrationTables, CollectiveFit, DpOverhead
from ir.errors import PlannerError
from ir.strategy import DPMode

from cost_models.collective_fit import FLOAT_BYTES, PRICE
from cost_models.comm import GRADIENT_SYNC, Link


def blocking_wait(measured: dict[int, dict[str, list[tuple[int, float]]]],
                  fits: dict[tuple[str, int], CollectiveFit]) -> tuple[BlockingWait, ...]:
    """Per collective and group size, what a blocking call took beyond the comm model's
    price for it (the fit at that group size), as a line in the message's bytes: the
    non-negative least-squares line through the probe's two sizes (`unit_line`: a wait
    that falls with size is noise about a constant, so it becomes one)."""
    waits = {}
    for size, by_collective in measured.items():
        for collective, readings in by_collective.items():
            group = 2 if collective == "send_recv" else size
            fit = fits[collective, size]
            link = Link(fit.alpha_s, fit.bytes_per_s, spans_nodes=False)
            excess = sorted((nbytes, max(seconds - PRICE[collective](nbytes, group, link), 0.0))
                            for nbytes, seconds in readings)
            if len(excess) != 2 or excess[0][0] == excess[1][0]:
                raise PlannerError(f"blocking wait of {collective} over {size} ranks: need "
                                   f"readings at two message sizes, got {excess}")
            waits[collective, group] = unit_line(*excess[0], *excess[1])
    return tuple(BlockingWait(collective, group, fixed, per_byte)
                 for (collective, group), (fixed, per_byte) in sorted(waits.items()))


# Collectives one probe unit issues per forward+backward as (collective, passes): FSDP2
# reshards after backward and the probe steps no optimizer, so every forward gathers.
DP_PROBE_TRAFFIC = {
    DPMode.REPLICATE: (("all_reduce", 1),),
    DPMode.ZERO1: (("all_reduce", 1),),  # ZeRO-1 runs replicate units (the probe has no step)
    DPMode.ZERO2: (("all_gather", 1), ("reduce_scatter", 1)),
    DPMode.ZERO3: (("all_gather", 2), ("reduce_scatter", 1)),
}


def dp_probe_traffic_s(mode: DPMode, tensors: int, size: int,
                       fits: dict[tuple[str, int], CollectiveFit],
                       waits: tuple[BlockingWait, ...] = ()) -> float:
    """What the comm model charges for one probe unit's collectives (a unit of `tensors`
    parameter tensors of `host_probes.DP_UNIT_BLOCKS`-sized probe blocks) in groups of
    `size`, priced with the fits measured at that size, plus the blocking wait of its
    gradient sync (`comm.dp_comm_s` charges it with `comm.blocking_s`)."""
    from cost_models.clusters import _overhead_block

    block = list(_overhead_block().parameters())
    nbytes = tensors / len(block) * sum(p.numel() for p in block) * FLOAT_BYTES
    lookup = CalibrationTables(blocking_waits=waits)
    seconds = 0.0
    for collective, passes in DP_PROBE_TRAFFIC[mode]:
        fit = fits[collective, size]
        seconds += passes * PRICE[collective](nbytes, size,
                                              Link(fit.alpha_s, fit.bytes_per_s, False))
        if collective == GRADIENT_SYNC[mode]:
            seconds += passes * lookup.blocking_wait_seconds(collective, size, nbytes)
    return seconds



def unit_line(few: int, few_s: float, many: int, many_s: float) -> tuple[float, float]:
    """(per-unit s, per-tensor s) >= 0 of the line through (few, few_s), (many, many_s)
    fitted by non-negative least squares (Lawson & Hanson 1974, ch. 23): a unit with more
    tensors cannot cost less, so a falling pair (its per-tensor share below the probe's
    noise) puts the mean in the per-unit term; a line whose intercept would be negative
    goes through the origin instead (least squares over both points)."""
    slope = (many_s - few_s) / (many - few)
    fixed = few_s - slope * few
    if slope < 0:
        return (few_s + many_s) / 2, 0.0
    if fixed < 0:
        return 0.0, (few * few_s + many * many_s) / (few * few + many * many)
    return fixed, slope


def dp_unit_overhead(measured: dict[int, dict[DPMode, dict[int, float]]],
                     fits: dict[tuple[str, int], CollectiveFit],
                     waits: tuple[BlockingWait, ...] = ()) -> tuple[DpOverhead, ...]:
    """Per-unit and per-tensor overhead by DP mode and group size: the line through the two
    unit sizes measured (`unit_line`), as measured with all N processes running in groups
    of that size (so it holds their sharing of the cores; the compute model does not
    stretch it again), less what the comm model prices for the unit's own collectives
    (`dp_probe_traffic_s`, with the gradient sync's blocking wait `waits`: it charges
    them again for the real layer); the whole-node group's figures are also the fallback
    (group size None). A reading at or below its priced traffic is not a measurement of
    the unit (the old fit clipped it to 0, which hid clamped collective fits pricing a
    probe unit's all-reduce at 6 alpha; collective fits are now refused when the data
    cannot determine them, `collective_fit.fit_alpha_beta`). What remains is a unit whose
    whole cost the priced collectives already hold: with the gradient sync's blocking wait
    priced, 8 processes on 2 cores measure a replicate unit at 17-20 ms and the wait alone
    prices more. Such a unit's overhead is 0 (non-negative least squares' answer for a
    reading at or below zero), not an error. A per-unit 0 from `unit_line` is the constrained optimum, not a clip:
    readings proportional to the tensor count (6 tensors 1.2 and 1.5 ms, 24 tensors 9.2
    and 15.5 ms in two runs at load 12-18 here) hold no fixed part the probe resolves."""
    world = max(measured)
    rows = []
    for size, by_mode in measured.items():
        by_mode = {**by_mode, DPMode.ZERO1: by_mode[DPMode.REPLICATE]}  # replicate + ...
        for mode, by_tensors in by_mode.items():
            net = sorted((tensors, seconds - dp_probe_traffic_s(mode, tensors, size, fits,
                                                                waits))
                         for tensors, seconds in by_tensors.items())
            (few, few_s), (many, many_s) = net
            fixed, slope = unit_line(few, max(few_s, 0.0), many, max(many_s, 0.0))
            for group_size in [size] + ([None] if size == world else []):
                rows.append(DpOverhead(mode, group_size, fixed, slope))
    return tuple(sorted(rows, key=lambda r: (r.mode.stage, r.group_size or 0)))
