"""The fresh-output price by where a freed block last lived: the last-level cache or DRAM
(issue 17: norms at micro-batch 16 over-predicted by 16-29%).

`cost_models.fresh_output` prices every output a CPU kernel writes in a layer's sequence
as written into lines that must first be fetched (write-allocate), at the rate its probe
measured on blocks rotating over twice the last-level cache: lines fetched from DRAM.
Where a freed block last lived depends on what ran since it was last touched (its reuse
distance, Mattson et al. 1970, "Evaluation techniques for storage hierarchies"): malloc
hands a pass blocks freed inside it or just before it, so that distance is about the
bytes the pass itself moves. A small pass (llama-tiny's RMS norm at micro-batch 16: ~1.5
MiB) writes into blocks still in the last-level cache; a transformer block at micro-batch
16 (15-27 MiB a pass) into blocks that left it.

Measured here (one thread, thread clock, 2026-11-25 07:11 UTC, load 3.5: /tmp probe,
re-run as `probe_fresh_output_llc`), an add writing 128 KiB into shuffled pre-faulted
blocks of a pool, over the same add into one hot block, ns per KiB written:

    pool      0.5 MiB   2 MiB   8 MiB   16 MiB   64 MiB   256 MiB
    32 KiB      1.4      8.0    10.1     23.5     25.1     24.4
    128 KiB     1.1      9.2    10.2     18.9     34.4     36.4
    512 KiB     0.3      0.5     0.7      3.7     14.8     16.5

(L2 1 MiB, LLC 32 MiB from sysfs): three tiers, hot in L2, ~10 in the LLC, 25-36 from
DRAM. A layer follows other layers (its step neighbour's pass evicts L2), so its blocks
are at best in the LLC. The probe: `fresh_output.probe_fresh_output` itself on a pool of
LLC / LLC_TIER_POOL_DIVISOR (kind `fresh_output_llc`, block sizes up to a quarter of the
pool); the spec records that pool (`KernelCalibration.fresh_output_llc_pool_bytes`) beside
the DRAM pool (`fresh_output_pool_bytes`). The price of one call's fresh outputs:

    s_llc  = bytes / rate_llc(bytes)         s_dram = bytes / rate_dram(bytes)
    x      = clamp(log(reuse / llc_pool) / log(dram_pool / llc_pool), 0, 1)
    seconds = s_llc + x * (s_dram - s_llc)       reuse = the pass's bytes moved

Specs without the LLC tier (older kits) price every fresh output at the DRAM rate, as
before; GPU specs carry neither kind and price none (`fresh_output_seconds`).

Not written by profile-device (2026-11-25): bench_fresh_tiers --layers priced the same
bench_kernel_model measurements with and without it, four runs: 44 / 52 / 44 / 33 layer
passes over 15% with it against 35 / 36 / 36 / 36 (loads 7.7 / 7.9 / 9.4 / 5.6). It fixed
the small blocks at micro-batch 1-4 (t5-tiny's +17..+20% to +11..+15%) and swung the
norms from over to under (llama-tiny's norm at mb 16 from -15..+30% to -6..-36%; at mb 4
from -1..-16% to -16..-27%): the reuse a pass's own bytes predicts is too short for a small
layer, whose blocks the layer before freed (bench_fresh_tiers --reuse: up to 5-13 MiB, not
the norm's own 0.9), and the DRAM rate had stood in for the norms' host under-price (their
micro-batch-1 passes, kernels ~0, read 14-33% under). Re-run on a quiet host before
writing it; a spec that carries it prices by tier.
"""

from __future__ import annotations

import math

from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint
from ir.kernel_records import KernelKind, KernelRecord

from cost_models.common import GB, StepConfig
from cost_models.fresh_output import (FRESH_OUTPUT_BYTES, KIND, fresh_output_seconds,
                                      last_level_cache_bytes, output_bytes,
                                      probe_fresh_output)
from cost_models.kernel_loops import measured, memory_gbps

LLC_KIND = "fresh_output_llc"
# The LLC tier's pool: an eighth of the last-level cache (4 MiB of this CPU's 32 MiB:
# 4x its 1 MiB L2, the 2-8 MiB plateau of the table above, ~10 ns per KiB).
LLC_TIER_POOL_DIVISOR = 8
# Block sizes the LLC tier probes: FRESH_OUTPUT_BYTES up to a quarter of its pool (at
# least four blocks rotate, so a block is never the one just written).
LLC_TIER_MIN_BLOCKS = 4


def llc_pool_bytes(cache_dir: str | None = None) -> int:
    """Bytes the LLC tier's fresh blocks rotate over on this CPU."""
    llc = last_level_cache_bytes() if cache_dir is None else last_level_cache_bytes(cache_dir)
    return llc // LLC_TIER_POOL_DIVISOR


def probe_fresh_output_llc(device: str, seconds_per_call,
                           pool_bytes: int) -> list[MemoryKernelPoint]:
    """The `fresh_output_llc` points of a CPU (none elsewhere): the fresh-output probe on
    blocks rotating over `pool_bytes` (`llc_pool_bytes`), each size whose blocks fit
    LLC_TIER_MIN_BLOCKS times in it; `seconds_per_call` as `probe_fresh_output` takes it."""
    sizes = tuple(b for b in FRESH_OUTPUT_BYTES if b * LLC_TIER_MIN_BLOCKS <= pool_bytes)
    return [MemoryKernelPoint(LLC_KIND, p.dtype, p.nbytes, p.gbps) for p in
            probe_fresh_output(device, seconds_per_call, pool_bytes, sizes=sizes)]


def tiered(cal: KernelCalibration | None) -> bool:
    """Whether a calibration prices fresh outputs by tier: both kinds and both pools."""
    return (measured(cal, LLC_KIND) and measured(cal, KIND)
            and 0 < cal.fresh_output_llc_pool_bytes < cal.fresh_output_pool_bytes)


def pass_reuse_bytes(records: tuple[KernelRecord, ...], config: StepConfig,
                     share: float) -> float:
    """Bytes one pass of these records moves after the micro-batch change and the TP
    split (reads plus writes, as the records count them: `KernelRecord.activation_bytes`
    grows with the micro-batch, `weight_bytes` with the dtype only): the reuse distance
    of the blocks its outputs are written into (module docstring)."""
    return sum(r.count * (r.weight_bytes * config.dtype_scale
                          + r.activation_bytes * config.activation_scale) * share
               for r in records if r.kind is not KernelKind.VIEW)


def dram_share(cal: KernelCalibration, reuse_bytes: float) -> float:
    """x of the module docstring: 0 at or below the LLC tier's pool, 1 at or above the
    DRAM probe's, linear in log(reuse bytes) between."""
    low, high = cal.fresh_output_llc_pool_bytes, cal.fresh_output_pool_bytes
    if reuse_bytes <= low:
        return 0.0
    return min(1.0, math.log(reuse_bytes / low) / math.log(high / low))


def tiered_fresh_output_seconds(r: KernelRecord, cal: KernelCalibration | None,
                                config: StepConfig, share: float, backward: bool,
                                reuse_bytes: float) -> float:
    """Seconds ONE call of a record adds writing its outputs into lines not in L2, at the
    rate of the tier its pass's reuse distance (`pass_reuse_bytes`) puts them in; a
    calibration without the LLC tier: `fresh_output_seconds` (DRAM, as before)."""
    if not tiered(cal):
        return fresh_output_seconds(r, cal, config, share, backward)
    nbytes = output_bytes(r, config, share, backward)
    if nbytes <= 0:
        return 0.0
    dtype = config.precision.compute_dtype
    llc_s = nbytes / (memory_gbps(cal, LLC_KIND, dtype, nbytes, 1.0) * GB)
    dram_s = nbytes / (memory_gbps(cal, KIND, dtype, nbytes, 1.0) * GB)
    # write-allocate from the level that holds the line (Hennessy & Patterson 6th ed.
    # §B.1), the level by reuse distance (Mattson et al. 1970), log-interpolated between
    # the two probed pools
    return llc_s + dram_share(cal, reuse_bytes) * (dram_s - llc_s)
