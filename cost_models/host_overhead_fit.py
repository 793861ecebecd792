"""Turning host-probe readings into spec figures, less what the comm model prices.

A probe's reading holds its own collectives; the comm model charges those again for
the real layer, so each fitter prices the probe's traffic with the alpha-beta fits
measured at the same group size (`cost_models.collective_fit.PRICE`) and keeps the rest:
  blocking_wait        per collective and group size, what a blocking call took beyond
                       its price (`BlockingWait` records);
  dp_unit_overhead     per DP mode and group size, a fixed cost per unit and one per
                       parameter tensor (the line through two unit sizes; `DpOverhead`);
  tp_module_overhead   per group size, the cost of one tensor-parallel module
                       (`TpModuleOverhead`).
"""

from __future__ import annotations

from ir.calibration_tables import BlockingWait, CollectiveFit, DpOverhead, TpModuleOverhead
from ir.strategy import DPMode

from cost_models.collective_fit import FLOAT_BYTES, PRICE
from cost_models.collective_probes import BLOCKING_PROBE_BYTES
from cost_models.comm import Link, ring_all_reduce_s
from cost_models.host_probes import OP_OVERHEAD_WIDTH_TP


def blocking_wait(measured: dict[int, dict[str, float]],
                  fits: dict[tuple[str, int], CollectiveFit]) -> tuple[BlockingWait, ...]:
    """Per collective and group size, what a blocking call of the probe's message took
    beyond the comm model's price for it (the fit at that group size)."""
    waits = {}
    for size, by_collective in measured.items():
        for collective, seconds in by_collective.items():
            group = 2 if collective == "send_recv" else size
            fit = fits[collective, size]
            link = Link(fit.alpha_s, fit.bytes_per_s, spans_nodes=False)
            priced = PRICE[collective](BLOCKING_PROBE_BYTES, group, link)
            waits[collective, group] = max(seconds - priced, 0.0)
    return tuple(BlockingWait(collective, group, seconds)
                 for (collective, group), seconds in sorted(waits.items()))


# Collectives one probe unit issues per forward+backward as (collective, passes): FSDP2
# reshards after backward and the probe steps no optimizer, so every forward gathers.
DP_PROBE_TRAFFIC = {
    DPMode.REPLICATE: (("all_reduce", 1),),
    DPMode.ZERO1: (("all_reduce", 1),),  # ZeRO-1 runs replicate units (the probe has no step)
    DPMode.ZERO2: (("all_gather", 1), ("reduce_scatter", 1)),
    DPMode.ZERO3: (("all_gather", 2), ("reduce_scatter", 1)),
}


def dp_probe_traffic_s(mode: DPMode, tensors: int, size: int,
                       fits: dict[tuple[str, int], CollectiveFit]) -> float:
    """What the comm model charges for one probe unit's collectives (a unit of `tensors`
    parameter tensors of `host_probes.DP_UNIT_BLOCKS`-sized probe blocks) in groups of `size`, priced
    with the fits measured at that size."""
    from cost_models.clusters import _overhead_block

    block = list(_overhead_block().parameters())
    nbytes = tensors / len(block) * sum(p.numel() for p in block) * FLOAT_BYTES
    seconds = 0.0
    for collective, passes in DP_PROBE_TRAFFIC[mode]:
        fit = fits[collective, size]
        seconds += passes * PRICE[collective](nbytes, size,
                                              Link(fit.alpha_s, fit.bytes_per_s, False))
    return seconds


def dp_unit_overhead(measured: dict[int, dict[DPMode, dict[int, float]]],
                     fits: dict[tuple[str, int], CollectiveFit]) -> tuple[DpOverhead, ...]:
    """Per-unit and per-tensor overhead by DP mode and group size: the line through the two unit sizes measured, as measured with all N processes
    running in groups of that size (so it holds their sharing of the cores; the compute
    model does not stretch it again), less what the comm model prices for the unit's own
    collectives (`dp_probe_traffic_s`: it charges them again for the real layer); the
    whole-node group's figures are also the fallback (group size None)."""
    world = max(measured)
    rows = []
    for size, by_mode in measured.items():
        by_mode = {**by_mode, DPMode.ZERO1: by_mode[DPMode.REPLICATE]}  # replicate + ...
        for mode, by_tensors in by_mode.items():
            (few, few_s), (many, many_s) = sorted(
                (tensors, max(seconds - dp_probe_traffic_s(mode, tensors, size, fits), 0.0))
                for tensors, seconds in by_tensors.items())
            slope = max((many_s - few_s) / (many - few), 0.0)
            fixed = max(few_s - slope * few, 0.0)
            for group_size in [size] + ([None] if size == world else []):
                rows.append(DpOverhead(mode, group_size, fixed, slope))
    return tuple(sorted(rows, key=lambda r: (r.mode.stage, r.group_size or 0)))


def tp_module_overhead(measured: dict[int, float], fits: dict[tuple[str, int], CollectiveFit]
                       ) -> tuple[TpModuleOverhead, ...]:
    """Per-module TP overhead by group size, less what the comm model already prices:
    each module has one all-reduce of the probe's (2, width) activation (row-parallel
    output in forward, column-parallel input gradient in backward), priced with the fit
    measured at that group size."""
    out = []
    for size, seconds in sorted(measured.items()):
        fit = fits["all_reduce", size]
        priced = ring_all_reduce_s(2 * OP_OVERHEAD_WIDTH_TP * size * FLOAT_BYTES, size,
                                   Link(fit.alpha_s, fit.bytes_per_s, spans_nodes=False))
        out.append(TpModuleOverhead(size, max(seconds - priced, 0.0)))
    return tuple(out)
