"""Turning host-probe readings into spec figures, less what the comm model prices.

A blocking call's reading holds its collective; the comm model charges that again for
the real call, so the fitter prices it with the alpha-beta fit measured at the same
group size (`cost_models.collective_fit.PRICE`) and keeps the rest:
  blocking_wait        per collective and group size, what a blocking call took beyond
                       its price, as the non-negative line in bytes through the probe's
                       two sizes (`BlockingWait` records);
  dp_unit_overhead     per DP mode and group size, a fixed cost per unit, one per
                       parameter tensor (the non-negative line through two unit sizes)
                       and one per parameter (a wide unit against a narrow one;
                       `DpOverhead`), from CPU-time readings that leave the unit's
                       collectives out (`dp_unit_probe.dp_unit_seconds`): kept as measured.
A tensor-parallel module's probe (`cost_models.tp_probes`) times the same collectives on
both sides, so its reading holds none of them and is kept as measured too.
"""

from __future__ import annotations

from ir.calibration_tables import BlockingWait, CollectiveFit, DpOverhead
from ir.errors import PlannerError
from ir.strategy import DPMode

from cost_models.collective_fit import PRICE
from cost_models.comm import Link


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


def dp_unit_overhead(measured: dict[int, dict[DPMode, dict[tuple[int, int], float]]]
                     ) -> tuple[DpOverhead, ...]:
    """Per-unit, per-tensor and per-parameter overhead by DP mode and group size, from
    readings keyed (tensors, parameters) per unit: the line through the two narrow units
    (the fewest parameters for their tensor count; `unit_line`), and the wide unit's
    reading above the narrow one of as many tensors over the parameters it adds (>= 0: a
    wide unit read below the narrow is noise about nothing; none without a wide unit), as
    measured with all N processes running in groups of that size. The readings are the
    calling thread's CPU seconds outside the unit's collectives
    (`dp_unit_probe.dp_unit_seconds`): they hold none of the traffic the comm model
    prices, so nothing is taken out, and none of the cores' sharing, which the compute
    model applies (`ClusterSpec.host_share`). The whole-node group's figures are also the
    fallback (group size None); ZeRO-1 runs replicate units (the probe steps no
    optimizer). (Before, wall-clock readings less the priced collectives: at the probe's
    latency-bound messages that price, 2 alpha + the blocking wait ~0.9 ms a unit on 2
    processes, took the whole fixed part and the per-unit figure fitted 0: issue 17.)"""
    world = max(measured)
    rows = []
    for size, by_mode in measured.items():
        by_mode = {**by_mode, DPMode.ZERO1: by_mode[DPMode.REPLICATE]}  # replicate units
        for mode, by_unit in by_mode.items():
            narrow = {}  # tensors -> (parameters, seconds) of the fewest parameters
            for (tensors, params), seconds in sorted(by_unit.items(), reverse=True):
                narrow[tensors] = (params, max(seconds, 0.0))
            (few, (_, few_s)), (many, (_, many_s)) = sorted(narrow.items())
            fixed, slope = unit_line(few, few_s, many, many_s)
            wide = [(params - narrow[tensors][0], seconds - narrow[tensors][1])
                    for (tensors, params), seconds in by_unit.items()
                    if params > narrow[tensors][0]]
            per_param = max(wide[0][1] / wide[0][0], 0.0) if wide else 0.0
            for group_size in [size] + ([None] if size == world else []):
                rows.append(DpOverhead(mode, group_size, fixed, slope, per_param))
    return tuple(sorted(rows, key=lambda r: (r.mode.stage, r.group_size or 0)))
