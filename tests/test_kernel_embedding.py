"""An embedding's forward and backward priced as what runs (`cost_models.embedding_kernels`):
a measured line per call and per index, from `cost_models.item_probes`' probes."""

from __future__ import annotations

import dataclasses
import statistics
import time

import pytest
import torch

from cost_models.common import GB
from cost_models.kernel_time import GPU_MEMORY_KERNEL_BANDWIDTH_FRACTION, pass_seconds
from ir.kernel_calibration import MemoryKernelPoint
from ir.kernel_records import KernelKind, KernelRecord
from tests.test_kernel_time import CALIBRATION, HBM_GBPS, MiB, config, spec


def _lookup(shape, table_bytes):
    """An aten::embedding record: output `shape` (..., dim) in bf16, int64 ids."""
    ids = 1
    for d in shape[:-1]:
        ids *= d
    return KernelRecord("aten::embedding", KernelKind.MEMORY, "bfloat16", shape, 1,
                        weight_bytes=table_bytes, activation_bytes=ids * (shape[-1] * 2 + 8))


def test_an_embedding_forward_costs_per_call_and_per_index_where_measured():
    """(1, 32, 64) bf16 output = 32 ids at micro-batch 1, 64 at 2; calibration 1 us per
    call + 3 ns per id: 1e-6 + 32m x 3e-9. Rows of 192 (128 wider than the probe's 64) add
    a read and a write of 128 x 2 bytes per id at the copy point (800 GB/s at 1 MiB). A
    TP share of 1/3 narrows those rows to 64: no wider part. Without the figures: the
    record's bytes (table 8 KiB + 32 x (64 x 2 + 8)) as a copy, as before (no copy point:
    the GPU spec's 2000 GB/s times a copy's measured share of it)."""
    copy = MemoryKernelPoint("copy", "bfloat16", 1 * MiB, 800.0)
    cal = dataclasses.replace(CALIBRATION, memory_kernels=(*CALIBRATION.memory_kernels, copy),
                              embedding_call_s=1e-6, embedding_index_s=3e-9)
    table = 64 * 64 * 2
    narrow, wide = _lookup((1, 32, 64), table), _lookup((1, 32, 192), table)
    for m in (1, 2):
        ids = 32 * m
        assert pass_seconds((narrow,), spec(cal), config(m), 1.0, False).memory_s == \
            pytest.approx(1e-6 + ids * 3e-9)
        assert pass_seconds((wide,), spec(cal), config(m), 1.0, False).memory_s == \
            pytest.approx(1e-6 + ids * 3e-9 + 2 * ids * 128 * 2 / (800 * GB))
    assert pass_seconds((wide,), spec(cal), config(), 1 / 3, False).memory_s == \
        pytest.approx(1e-6 + 32 * 3e-9)
    plain = pass_seconds((narrow,), spec(CALIBRATION), config(), 1.0, False)
    copy_gbps = HBM_GBPS * GPU_MEMORY_KERNEL_BANDWIDTH_FRACTION["copy"]
    assert plain.memory_s == pytest.approx((table + 32 * (64 * 2 + 8)) / (copy_gbps * GB))


def test_embedding_forward_probe_is_a_line_less_a_tiny_add(monkeypatch):
    """Made-up timings through the timer the probe calls, two passes of (32 ids, 512 ids,
    tiny add): (4, 9, 1.5) then (3, 10, 1) us. The least of each: 3, 9, 1 us; slope
    6 us / 480 ids; intercept 3 - 32 x slope less the add's 1 us. A second case whose
    intercept falls below the add is floored at MIN_DEVICE_SHARE of the 32-id call."""
    from cost_models import conv_probes, item_probes, profile_device

    times = iter([4e-6, 9e-6, 1.5e-6, 3e-6, 10e-6, 1e-6])
    monkeypatch.setattr(profile_device, "seconds_per_call", lambda fn, device: (
        fn(0), next(times))[1])
    cost = item_probes.probe_embedding_forward("cpu", "float32")
    slope = 6e-6 / 480
    assert cost.index_s == pytest.approx(slope)
    assert cost.call_s == pytest.approx(3e-6 - 32 * slope - 1e-6)
    times = iter([2e-6, 2.5e-6, 3e-6] * 2)
    floored = item_probes.probe_embedding_forward("cpu", "float32")
    assert floored.call_s == pytest.approx(conv_probes.MIN_DEVICE_SHARE * 2e-6)


def test_the_measured_line_prices_a_real_lookup_with_its_tiny_op():
    """On this CPU: the probe's call and per-index figures are positive and small, and
    line + one tiny add (what the host model charges per op) comes within a factor of
    1.5 of `torch.embedding` timed here at 256 ids, grad off, on the thread clock."""
    from cost_models.item_probes import (EMBEDDING_PROBE_DIM, EMBEDDING_PROBE_ROWS,
                                         probe_embedding_forward)

    torch.set_num_threads(1)
    cost = probe_embedding_forward("cpu", "float32")
    assert 0 < cost.call_s < 1e-4 and 0 < cost.index_s < 1e-6

    def per_call_s(fn, calls=400):
        for _ in range(20):
            fn()
        rounds = []
        for _ in range(7):
            start = time.thread_time()
            for _ in range(calls):
                fn()
            rounds.append((time.thread_time() - start) / calls)
        return statistics.median(rounds)

    weight = torch.randn(EMBEDDING_PROBE_ROWS, EMBEDDING_PROBE_DIM)
    index = torch.randint(0, EMBEDDING_PROBE_ROWS, (256,))
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    with torch.no_grad():
        timed_s = per_call_s(lambda: torch.embedding(weight, index))
        add_s = per_call_s(lambda: torch.add(x, y))
    priced_s = cost.call_s + 256 * cost.index_s + add_s
    assert timed_s / 1.5 < priced_s < timed_s * 1.5


def test_the_embedding_figures_round_trip_and_older_kits_load_without_them():
    from ir.kernel_calibration import KernelCalibration

    cal = dataclasses.replace(CALIBRATION, embedding_call_s=1e-6, embedding_index_s=3e-9)
    back = KernelCalibration.from_dict(cal.to_dict())
    assert (back.embedding_call_s, back.embedding_index_s) == (1e-6, 3e-9)
    older = {k: v for k, v in cal.to_dict().items()
             if k not in ("embedding_call_s", "embedding_index_s")}
    loaded = KernelCalibration.from_dict(older)
    assert (loaded.embedding_call_s, loaded.embedding_index_s) == (0.0, 0.0)


def test_an_embedding_backward_of_narrow_rows_costs_the_narrow_probes_figure_per_index():
    """The scatter's per-index cost depends on the row's width below the wide probe's 64
    (measured here, one thread, 2026-11-26, load 3: 39 ns per index at 4- and 16-wide
    fp32 rows, 48 at 64-wide; T5's relative-bias table is 4 wide, one column per head).
    1024 ids into a 32 x 4 bf16 table with 40 ns per index measured at 64 wide and 32 at
    4 wide: 1024 x 32 ns at width 4, halfway (36 ns) at width 34, 40 ns at 64 and past
    it; a kit without the narrow figure (0) prices every width at the wide one. The
    table's fill and the rows' bytes are priced as before (a copy, an add)."""
    from cost_models.item_probes import EMBEDDING_NARROW_PROBE_DIM, EMBEDDING_PROBE_DIM

    assert (EMBEDDING_NARROW_PROBE_DIM, EMBEDDING_PROBE_DIM) == (4, 64)
    ids, wide_s, narrow_s = 1024, 40e-9, 32e-9

    def priced(dim: int, narrow: float) -> float:
        record = KernelRecord("aten::embedding_dense_backward", KernelKind.MEMORY, "bfloat16",
                              (32, dim), 1, weight_bytes=32 * dim * 2,
                              activation_bytes=ids * (dim * 2 + 8))
        cal = dataclasses.replace(CALIBRATION, embedding_backward_index_s=wide_s,
                                  embedding_backward_narrow_index_s=narrow)
        with_slope = pass_seconds((record,), spec(cal), config(), 1.0, backward=True).memory_s
        no_slope = pass_seconds((record,), spec(dataclasses.replace(
            cal, embedding_backward_index_s=1e-30, embedding_backward_narrow_index_s=1e-30)),
            config(), 1.0, backward=True).memory_s
        return (with_slope - no_slope) / ids  # the per-index part

    assert priced(4, narrow_s) == pytest.approx(narrow_s, rel=1e-6)
    assert priced(34, narrow_s) == pytest.approx((narrow_s + wide_s) / 2, rel=1e-6)
    assert priced(64, narrow_s) == pytest.approx(wide_s, rel=1e-6)
    assert priced(256, narrow_s) == pytest.approx(wide_s, rel=1e-6)
    assert priced(4, 0.0) == pytest.approx(wide_s, rel=1e-6)


def test_the_narrow_embedding_backward_probe_reads_a_per_index_slope():
    """`probe_embedding_backward` at the narrow width: a positive per-index slope below a
    microsecond, as at the wide one."""
    from cost_models.item_probes import EMBEDDING_NARROW_PROBE_DIM, probe_embedding_backward

    assert 0 < probe_embedding_backward("cpu", "float32", EMBEDDING_NARROW_PROBE_DIM) < 1e-6
