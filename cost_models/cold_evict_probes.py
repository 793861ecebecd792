"""What a layer's forward pays for the bytes a step touched since it last ran, beyond the
cold entry `cold_entry_probes` measures: its code, Python objects and data pushed out of
the last-level cache by the other layers' tensors; one thread, the probe clock (issue 17).

`cold_entry_probes` times its probe layers after one small block's work (a few hundred
KiB touched). A step's layers touch more between a small layer's forwards, more at a
bigger micro-batch, while the small layer's own kernels do not grow: t5-tiny's
relative-position bias (16 KiB out at every micro-batch) ran 73 / 75 / 79 us
(encoder) and 81 / 85 / 97 (decoder) at micro-batches 1 / 4 / 16 after its profile
neighbours (quiet machine, 2026-11-25), and 72.6, 73.1, 77.3, 80.8, 98.2, 148, 176 us
with 0.5, 1, 4, 8, 16, 32, 64 MiB more written just before (load 5, thread clock; its
run right after itself: 45 us); a norm of one op 13.2 -> 15.8, 18.6, 32.0, 58.8 us at
+4, 16, 32, 64 MiB (gpt-tiny's), mlp-small's block 13.5 -> 16.6, 20.9, 45.8, 93.5
(/tmp experiments of the fwdcold session, 2026-11-25, load 4-6; bench/bench_small_layers'
evict variant: 3-4x at 64 MiB). Growth with the bytes, steeper for a layer of more
distinct ops: what comes back from memory is the lines of each op's code and data.

The probe (`cold_evict_chains`): `cold_entry_probes`' probe layers (a LayerNorm module
and k unary ops the step work does not run) after the same step work with a buffer of
EVICT_LLC_FRACTIONS x the CPU's last-level cache (`fresh_output.last_level_cache_bytes`,
sysfs) written before the layer before's forward, against the same with nothing
written, alternating. Written after that forward instead, the bytes evicted the ops the
neighbour had just run as well (its LayerNorm): here (load 5, 2026-11-25) nothing
measurable up to half the cache (-5..+5 us at 8 and 16 MiB), then 27, 37, 60 us at 32
MiB for 2, 7, 15 cold ops, which over-priced a step's layers whose ops their neighbours
run after their kernels' bytes (llama-tiny's embedding, one cold op, paid ~0 from
micro-batch 1 to 16); written before it, 0.2-1, 0.2-4, 1-8 us at 24, 32 MiB and 3-4,
11-12, 29-32 us at 64 MiB for 0, 4, 12 cold ops (two runs, load 4): ~0.06 us per MiB
per layer and ~0.045 per MiB per cold op beyond the knee (EVICT_KNEE_LLC_FRACTION).
`cold_evict_cost` fits the extra so, per layer and per cold op
(`Layer.cold_distinct_ops_fwd`: an op the layers just before ran had its code touched
after their bytes), and `evicted_host_seconds` prices a layer at the bytes its step's
kernels move between its forwards (`Layer.forward_gap_bytes`:
`ir.step_footprint.forward_gap_bytes`), up to EVICT_CAP_LLC_MULTIPLE x the cache (then
every line is out).

bench/bench_kernel_model.py, gpt/llama/bert/t5-tiny, three runs merged at each pass's
least measured time (load 4-6, 2026-11-25 07:31 UTC), the term on / off: 22 / 22 of 54
forward passes over 15%; t5-tiny's decoder_rel_bias at micro-batch 16 -50% / -64%, its
encoder's -40% / -47%, blocks within 2% of off (the rest of the rel_bias miss is its
warm price: 45-47 us run right after itself, ~28 priced). Loaded timings: re-measure on
a quiet machine (the probe's per-layer figure read 0.03-0.32 us per MiB across runs).

    >>> cost = cold_evict_cost(cold_evict_chains("cpu"))  # doctest: +SKIP
    >>> cost.entry_s_per_byte * 2**20, cost.op_s_per_byte * 2**20   # us-scale per MiB
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ir.kernel_calibration import KernelCalibration
from ir.layer import Layer

from cost_models.cold_entry_probes import _entry_layer, step_work
from cost_models.fresh_output import FRESH_POOL_LLC_MULTIPLE, last_level_cache_bytes
from cost_models.sequence_probes import _overloads

# Bytes written before the probe layer, as fractions of the last-level cache (32 MiB
# here: lscpu): beyond the knee, up to the cap (t5-tiny's gaps: 2-55 MiB at micro-batches
# 1-16); the fit runs through the knee.
EVICT_LLC_FRACTIONS = (0.75, 1.0, 2.0)
# Below half the cache written the probe layers paid nothing measurable (-5..+5 us at
# 8 and 16 MiB written after the neighbour, 27-60 us at 32; written before it, 0-2.5 us
# at 24 MiB: this CPU, load 4-5, 2026-11-25): what a step touched up to here leaves a
# small layer's lines in the cache. Re-measure on a quiet machine.
EVICT_KNEE_LLC_FRACTION = 0.5
# Probe layers (`cold_entry_probes._entry_layer`'s unary ops): a norm alone, a head's,
# a relative bias's; runs per (layer, size), medians (~1 s in all here at 32 MiB).
EVICT_COLD_OPS = (0, 4, 12)
EVICT_RUNS = 15
# Beyond this many caches' worth every line is out: the extra stops growing (the fresh-
# output probe's pool rule, `fresh_output.FRESH_POOL_LLC_MULTIPLE`).
EVICT_CAP_LLC_MULTIPLE = FRESH_POOL_LLC_MULTIPLE


@dataclass(frozen=True, slots=True)
class EvictReading:
    """One probe layer's cold ops (its overloads the step work did not run), the bytes
    written before it, and its median seconds over the same layer run with nothing
    written (the step work alone)."""

    cold_ops: int
    written_bytes: int
    extra_s: float


def cold_evict_chains(device: str = "cpu", llc_bytes: int | None = None) -> list[EvictReading]:
    """Each EVICT_COLD_OPS probe layer run after `cold_entry_probes.step_work`'s step
    work (its own last backward included) with EVICT_LLC_FRACTIONS x `llc_bytes`
    (default: sysfs's) written before the layer before's forward, and after the step
    work alone, alternating (a slow spell hits them alike), medians of EVICT_RUNS: one
    reading per (layer, size)."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    llc_bytes = llc_bytes or last_level_cache_bytes()
    sizes = [int(f * llc_bytes) for f in EVICT_LLC_FRACTIONS]
    clock = probe_clock(device)
    fresh, step_between, before = step_work(device)
    buffer = torch.empty(max(sizes) // 4, device=device)  # float32: 4 bytes an element
    buffer.fill_(0.0)  # its pages faulted in here, untimed
    readings = []
    with _one_thread(), torch.set_grad_enabled(True):
        block_ops = _overloads(lambda: before(fresh()))
        for k in EVICT_COLD_OPS:
            layer = _entry_layer(k).to(device)
            cold_ops = len(_overloads(lambda: layer(fresh())) - block_ops)
            for _ in range(3):  # allocator and autograd warm-up, untimed
                step_between(layer(fresh()))
            runs, out = {size: [] for size in [0, *sizes]}, None
            for _ in range(EVICT_RUNS):
                for size, times in runs.items():
                    # the bytes before the layer before's forward, whose ops (the probe
                    # layer's LayerNorm) a step's neighbour runs after its kernels' bytes
                    step_between(out, (lambda n=size // 4: buffer[:n].fill_(1.0)) if size
                                 else None)
                    x = fresh()
                    start = clock()
                    out = layer(x)
                    times.append(clock() - start)
            base = statistics.median(runs[0])
            readings += [EvictReading(cold_ops, size, statistics.median(runs[size]) - base)
                         for size in sizes]
    return readings


@dataclass(frozen=True, slots=True)
class ColdEvictCost:
    """Seconds per byte touched between a layer's forwards beyond `knee_bytes`, up to
    `cap_bytes`: per layer (`entry_s_per_byte`) and per cold op of it (`op_s_per_byte`)
    (`cold_evict_cost`)."""

    entry_s_per_byte: float
    op_s_per_byte: float
    knee_bytes: float
    cap_bytes: float
    residual_s: float  # the fit's root-mean-square miss per reading, for the record

    def calibration_fields(self) -> dict:
        """The `KernelCalibration` fields these figures fill."""
        return dict(cold_evict_entry_s_per_byte=self.entry_s_per_byte,
                    cold_evict_op_s_per_byte=self.op_s_per_byte,
                    cold_evict_knee_bytes=self.knee_bytes, cold_evict_cap_bytes=self.cap_bytes)


def cold_evict_cost(readings: list[EvictReading], llc_bytes: int | None = None) -> ColdEvictCost:
    """Least squares of extra = (bytes - knee) x (a + b x cold ops), through the knee
    (EVICT_KNEE_LLC_FRACTION x `llc_bytes`, default sysfs's: nothing extra up to it),
    a, b >= 0 (where one comes out below 0, the other is refitted alone); the cap
    EVICT_CAP_LLC_MULTIPLE x `llc_bytes`."""
    llc_bytes = llc_bytes or last_level_cache_bytes()
    knee = EVICT_KNEE_LLC_FRACTION * llc_bytes
    beyond = [(max(0.0, r.written_bytes - knee), r) for r in readings]
    rows = [(x, x * r.cold_ops, r.extra_s) for x, r in beyond]
    s11 = sum(x1 * x1 for x1, _, _ in rows)
    s22 = sum(x2 * x2 for _, x2, _ in rows)
    s12 = sum(x1 * x2 for x1, x2, _ in rows)
    s1y = sum(x1 * y for x1, _, y in rows)
    s2y = sum(x2 * y for _, x2, y in rows)
    det = s11 * s22 - s12 * s12
    a, b = ((s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det) if det else (0.0, 0.0)
    if det == 0 or a < 0 or b < 0:  # one term alone, the better of the two
        alone_a = (max(0.0, s1y / s11) if s11 else 0.0, 0.0)
        alone_b = (0.0, max(0.0, s2y / s22) if s22 else 0.0)
        a, b = min((alone_a, alone_b), key=lambda ab: sum(
            (y - ab[0] * x1 - ab[1] * x2) ** 2 for x1, x2, y in rows))
    sse = sum((y - a * x1 - b * x2) ** 2 for x1, x2, y in rows)
    return ColdEvictCost(a, b, float(knee), float(EVICT_CAP_LLC_MULTIPLE * llc_bytes),
                         (sse / len(rows)) ** 0.5 if rows else 0.0)


def evicted_bytes(layer: Layer, cal: KernelCalibration) -> float:
    """The bytes of `Layer.forward_gap_bytes` the price reads: those beyond the kit's
    knee, up to its cap (0 below the knee, and where the kit has no figure)."""
    return max(0.0, min(float(layer.forward_gap_bytes), cal.cold_evict_cap_bytes)
               - cal.cold_evict_knee_bytes)


def evicted_host_seconds(layer: Layer, cal: KernelCalibration) -> float:
    """Host seconds a forward pays for what its step touched since the layer last ran:
    (min(`Layer.forward_gap_bytes`, cap) - knee, at least 0) x (per byte + per byte per
    cold op x `Layer.cold_distinct_ops_fwd`); 0 where the kit has no figure (cap 0: GPU
    presets, older kits)."""
    # cost_models.cold_evict_probes.cold_evict_cost's line, flat where all lines are out
    return evicted_bytes(layer, cal) * (cal.cold_evict_entry_s_per_byte
                     + cal.cold_evict_op_s_per_byte * layer.cold_distinct_ops_fwd)
