"""What a CPU memory-bound kernel pays, once per pass, for running its vectorised loop
with its code out of the core's caches (issue 17: kernels in a block ran 1.3-2.5x their
kit price).

Every memory probe repeats one op, so the op's code stays in L1i/L2. In a layer's pass
each op runs once among the others, whose code and data (MiBs at micro-batch 16) evict it
from the core's L2. Measured here (one thread, thread clock, 2026-11-25, load 5-7; scripts
in bench/bench_cold_kernel.py): gelu of (512, 256) fp32, the gpt-tiny MLP at micro-batch
16, ran 85 us in a block's op sequence (calls without a context switch), 48 alone; a
0-element gelu just before it (its host path warm) left 83, a 64-element one (its AVX-512
loop run) 65.5, the rest is the fresh output (`cost_models.fresh_output`). After a
context switch the cost per call was fixed, not per byte: gelu +45-57 us at 8 KiB-2 MiB,
layer norm +30-37, sum +21-26, add +12-16, of which a 64-element call of the same op
recovered most and a 0-element call about half.

The probe: each kind's kit call (`memory_probes._memory_kernel`, `math_kernels._call`)
on COLD_PROBE_BYTES, run after writing COLD_EVICT_L2_MULTIPLE x the core's L2
(`fresh_output.last_level_cache_bytes(level=2)`) and reading its operands back with
copy_ (their data warm, as a block's input just produced; the output's lines are
`fresh_output`'s), then again: the first call over the second, median of
COLD_PROBE_ROUNDS, is the kind's seconds (`KernelCalibration.cold_kernels`). From 256 B
to 1 MiB the figure was flat (gelu 22-38 us, layer norm 24-38, add 9-13 here, less the
fresh output's growth): a cost per call, not per byte. `cold_kernel_seconds` charges it
once per distinct memory op of a pass (its second call runs warm code) x the share of
the L2 the pass's own bytes displace: a layer profiled or run again evicts the code of
its ops only where its traffic fills the L2 (the tiny layers' ops stay warm, and the
host model prices their cold entry: `host_dispatch`); an op the work just before ran
(a block's ops after the block before's) x the share of the bytes run since, where fewer
(`recent_code_credit_seconds`: the excess falls off below an L2 since the op's last run,
and a first cold op re-warms the code the others share, which the host's entry prices
once: bench/bench_cold_code_between.py). CPU only.
"""

from __future__ import annotations

import statistics
import time

from ir.kernel_calibration import MEMORY_KERNELS, ColdKernelPoint

from cost_models.id_memo import IdMemo

# Bytes of the probe's tensors: small (its data is back in L2 after one call, while its
# code is the point), a multiple of device_grids.ROW_ELEMENTS rows of fp32.
COLD_PROBE_BYTES = 64 * 2**10
# Written before each cold call: twice the core's L2, as a layer's pass writes MiBs
# between two calls of one op (llama-tiny mb 16: 15-27 MiB of kernel traffic a pass).
COLD_EVICT_L2_MULTIPLE = 2
COLD_PROBE_ROUNDS = 15  # median of the differences: one slow spell does not decide
# Kinds whose kit call needs more than (x, y, out) (their own probes shape them): unprobed.
COLD_UNPROBED_KINDS = ("short_run", "broadcast_scalar")


def probe_cold_kernel(device: str, dtype: str = "float32") -> list[ColdKernelPoint]:
    """Per memory kind, the seconds its first call after an L2 eviction takes over its
    next call (none off the CPU)."""
    import torch

    from cost_models.fresh_output import last_level_cache_bytes

    if device != "cpu":
        return []
    n = COLD_PROBE_BYTES // 4
    x, y, out, scratch = (torch.rand(n) * 2 - 1 for _ in range(4))  # uniform(-1, 1)
    kinds_calls = memory_kind_calls(x, y, out)
    l2_bytes = last_level_cache_bytes(level=2)
    evict = torch.empty(COLD_EVICT_L2_MULTIPLE * l2_bytes // 4)
    clock = time.thread_time_ns  # this thread's CPU time: a switch away does not count
    cold_s = []
    def evict_data(r: int) -> None:
        evict.fill_(float(r))
        scratch.copy_(x), scratch.copy_(y), scratch.copy_(out)  # operands back in L2

    for kind, call in kinds_calls.items():
        call()
        cold_s.append(ColdKernelPoint(
            kind, dtype, first_call_excess_s(call, evict_data, COLD_PROBE_ROUNDS, clock),
            l2_bytes))
    return cold_s


def first_and_second_ns(call, before, rounds: int, clock) -> list[tuple[int, int]]:
    """Per round, `call`'s first call after `before(round)` and the call right after it,
    each in `clock`'s nanoseconds."""
    times = []
    for r in range(rounds):
        before(r)
        t0 = clock()
        call()
        t1 = clock()
        call()
        t2 = clock()
        times.append((t1 - t0, t2 - t1))
    return times


def first_call_excess_s(call, before, rounds: int, clock) -> float:
    """Median over `rounds` of how much longer the first call takes than the second
    (`first_and_second_ns`), in seconds, >= 0."""
    extra = [(first - second) * 1e-9
             for first, second in first_and_second_ns(call, before, rounds, clock)]
    return max(0.0, statistics.median(extra))


def memory_kind_calls(x, y, out) -> dict:
    """Per memory kind the probes price cold, its kit call (`memory_probes._memory_kernel`,
    `math_kernels._call`) on x, y and out (fp32 of COLD_PROBE_BYTES each)."""
    from cost_models.math_kernels import MATH_KINDS, _call
    from cost_models.memory_probes import _memory_kernel

    kinds_calls = {kind: _memory_kernel(kind, x, y, out)[0] for kind in MEMORY_KERNELS
                   if kind not in COLD_UNPROBED_KINDS}
    kinds_calls.update({kind: _call(kind, x, y) for kind in MATH_KINDS})
    return kinds_calls


def cold_kernel_seconds(records, cluster, config, share: float,
                        recent: dict[str, float] | None = None) -> float:
    """Seconds a pass of `records` adds for its distinct memory ops' cold code: each op's
    kind's point x min(1, bytes / the L2 the point's probe evicted), at the pass's own
    bytes, or where the work just before ran the op (`recent`: op -> bytes run since, at
    the step's shape) at those where fewer (its code was run that recently)."""
    from ir.kernel_records import KernelKind

    from cost_models.kernel_time import memory_kind, recorded_bytes  # it imports this module

    cal = cluster.kernel_calibration
    if cal is None or not cal.cold_kernels:
        return 0.0
    # bytes the pass moves, as kernel_time's roofline counts them
    moved = sum(r.count * recorded_bytes(r, config) * share for r in records)
    recent = recent or {}
    seconds, seen = 0.0, set()
    for r in records:
        if r.kind is not KernelKind.MEMORY or r.op in seen:
            continue
        seen.add(r.op)
        point = cal.cold_kernel(memory_kind(r, cal), config.precision.compute_dtype)
        if point is not None and point.l2_bytes > 0:
            # LRU: an op's lines leave the L2 once the L2's bytes were touched since it ran
            since = min(moved, recent.get(r.op, moved))
            seconds += point.seconds * min(1.0, since / point.l2_bytes)
    return seconds


def recent_code_credit_seconds(layer, cluster, config, share: float) -> tuple[float, float]:
    """(forward, backward) seconds by which a layer's passes pay less cold code than
    `kernel_time.pass_seconds` charges them (each op at the pass's own bytes) for the ops
    the work just before ran (`Layer.recent_ops_fwd` / `recent_ops_bwd`,
    `ir.op_count.recent_code_bytes`): there at the bytes run since, where fewer (a block
    after a block: the op's code ran one block's traffic ago, less than the L2 at small
    micro-batches). The work between that ran other code is the host's cold entry
    (`host_dispatch.cold_entry_seconds`: a first cold op re-warms the dispatch and loop code
    the next ones share, so an op's cold point read alone is not charged again for it:
    bench/bench_cold_code_between.py). (0, 0) without cold points (GPU presets)."""
    cal = cluster.kernel_calibration
    if (cal is None or not cal.cold_kernels or layer.kernels is None
            or not (layer.recent_ops_fwd or layer.recent_ops_bwd)):
        return 0.0, 0.0
    return _MEMO.get((id(layer), id(cluster), config.micro_batch, config.graph_micro_batch,
                      config.graph_dtype, config.precision, share), (layer, cluster),
                     _credit_seconds, layer, cluster, config, share)


# Results per (layer, cluster, step shape, TP share): the search prices a layer many times.
_MEMO = IdMemo(max_entries=4096)


def _credit_seconds(layer, cluster, config, share: float) -> tuple[float, float]:
    from cost_models.kernel_time import cold_code_records  # it imports this module

    def credit(records, recent) -> float:
        if not recent:
            return 0.0
        kept = cold_code_records(records, cluster)
        since = {op: (weight * config.dtype_scale + activation * config.activation_scale)
                 * share for op, weight, activation in recent}
        return (cold_kernel_seconds(kept, cluster, config, share)
                - cold_kernel_seconds(kept, cluster, config, share, since))

    return (credit(layer.kernels.forward, layer.recent_ops_fwd),
            credit(layer.kernels.backward, layer.recent_ops_bwd))
