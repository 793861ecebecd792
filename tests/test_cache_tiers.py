"""Fresh outputs priced by cache tier (`cost_models.cache_tiers`): hand arithmetic of the
tier mix by a pass's reuse distance, the pass's bytes read off its records, the probe on
the LLC tier's pool, the figures a spec stores, and specs without the tier (older CPU
kits, GPU presets) priced exactly as before."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint
from ir.kernel_records import KernelKind, KernelRecord
from ir.strategy import Precision

from cost_models.cache_tiers import (LLC_KIND, dram_share, llc_pool_bytes, pass_reuse_bytes,
                                     probe_fresh_output_llc, tiered,
                                     tiered_fresh_output_seconds)
from cost_models.clusters import get_cluster
from cost_models.common import StepConfig
from cost_models.fresh_output import fresh_output_seconds
from cost_models.kernel_time import kernel_call_seconds, pass_seconds
from tests.cpu_specs import one_cpu_process
from tests.test_fresh_output_weights import _cache

KiB, MiB = 2**10, 2**20
FLOAT = 4
# A kit with both tiers at one point each (the rate at every size): DRAM 10 GB/s, the LLC
# 40 GB/s; pools 4 MiB (LLC tier) and 64 MiB (DRAM), 16x apart.
OLD = KernelCalibration(
    measured_on="made up for the test",
    memory_kernels=(MemoryKernelPoint("add", "float32", 8 * KiB, 50.0),
                    MemoryKernelPoint("fresh_output", "float32", 8 * KiB, 10.0)),
    fresh_output_pool_bytes=64 * MiB)
TIERED = dataclasses.replace(
    OLD, memory_kernels=OLD.memory_kernels + (MemoryKernelPoint(LLC_KIND, "float32", 8 * KiB,
                                                                40.0),),
    fresh_output_llc_pool_bytes=4 * MiB)


def config(micro_batch: int = 1) -> StepConfig:
    return StepConfig(micro_batch=micro_batch, graph_micro_batch=1, graph_dtype="float32",
                      precision=Precision.FP32, seq_len=None, device_type="cpu")


def add(elements: int, count: int = 1) -> KernelRecord:
    """An add of two (elements,) fp32 tensors: reads 2, writes 1."""
    return KernelRecord("aten::add", KernelKind.MEMORY, "float32", (elements,), count,
                        activation_bytes=3 * elements * FLOAT, inner_loops=1)


def test_the_tier_follows_the_pass_reuse_distance_by_hand():
    """A 32 KiB output (8192 floats): 32768 / 40e9 s from the LLC, 32768 / 10e9 from DRAM.
    Reuse 1 MiB (under the 4 MiB pool): the LLC rate; 64 MiB and past: DRAM; 16 MiB, half
    way in log between 4 and 64 MiB: the mean of the two."""
    r = add(8192)
    llc_s, dram_s = 32 * KiB / 40e9, 32 * KiB / 10e9

    def price(reuse: float) -> float:
        return tiered_fresh_output_seconds(r, TIERED, config(), 1.0, False, reuse)

    assert price(1 * MiB) == pytest.approx(llc_s)
    assert price(4 * MiB) == pytest.approx(llc_s)
    assert price(16 * MiB) == pytest.approx((llc_s + dram_s) / 2)
    assert price(64 * MiB) == pytest.approx(dram_s)
    assert price(1024 * MiB) == pytest.approx(dram_s)
    assert dram_share(TIERED, 8 * MiB) == pytest.approx(math.log(2) / math.log(16))


def test_a_pass_reads_its_reuse_distance_off_its_records():
    """Two adds: 3 x 4096 x 4 bytes once, 3 x 1024 x 4 three times = 49152 + 36864 bytes;
    at micro-batch 4 activations grow 4x; a TP share of a half halves them; a view moves
    nothing."""
    view = KernelRecord("aten::view", KernelKind.VIEW, "float32", (4096,), 5,
                        activation_bytes=10**9)
    records = (add(4096), add(1024, count=3), view)
    assert pass_reuse_bytes(records, config(), 1.0) == 49152 + 36864
    assert pass_reuse_bytes(records, config(4), 1.0) == 4 * (49152 + 36864)
    assert pass_reuse_bytes(records, config(4), 0.5) == 2 * (49152 + 36864)


def test_pass_seconds_prices_a_small_pass_at_the_llc_rate_and_a_large_one_at_dram():
    """One add of 8192 floats: its own bytes 96 KiB, under the LLC pool: the kernel plus
    its 32 KiB output at 40 GB/s. Scaled to micro-batch 1024 (96 MiB moved, past the DRAM
    pool): the 32 MiB output at 10 GB/s."""
    r = add(8192)
    spec = one_cpu_process(TIERED)
    for micro_batch, rate in ((1, 40e9), (1024, 10e9)):
        cfg = config(micro_batch)
        kernel_s = kernel_call_seconds(r, spec, cfg, 1.0, False)
        total_s = pass_seconds((r,), spec, cfg, 1.0, backward=False).total_s
        assert total_s == pytest.approx(kernel_s + micro_batch * 32 * KiB / rate)


def test_specs_without_the_tier_price_as_before():
    """An older CPU kit (no LLC points, pool 0) and a kit with points but no pool: every
    fresh output at the DRAM rate, whatever the pass moves; a GPU preset carries neither."""
    r = add(8192)
    for cal in (OLD, dataclasses.replace(TIERED, fresh_output_llc_pool_bytes=0)):
        assert not tiered(cal)
        for reuse in (1 * MiB, 1024 * MiB):
            assert tiered_fresh_output_seconds(r, cal, config(), 1.0, False, reuse) == \
                fresh_output_seconds(r, cal, config(), 1.0, False) == \
                pytest.approx(32 * KiB / 10e9)
    h100 = get_cluster("h100-80g")
    assert not tiered(h100.kernel_calibration)
    assert tiered_fresh_output_seconds(r, h100.kernel_calibration, config(), 1.0, False,
                                       1 * MiB) == 0.0


def test_the_llc_probe_runs_the_fresh_probe_on_its_pool():
    """The fresh probe's stand-in clock (1 us per distinct block a call writes over 64
    turns): a 256 KiB pool takes blocks up to a quarter of it, 8 KiB (32 blocks: 31 us
    over the hot call) and 32 KiB (8 blocks: 7 us), as kind fresh_output_llc."""
    def seconds_per_call(call, device):
        return 1e-6 * len({call(i).data_ptr() for i in range(64)})

    points = probe_fresh_output_llc("cpu", seconds_per_call, 256 * KiB)
    assert [(p.kernel, p.nbytes) for p in points] == [(LLC_KIND, 8 * KiB), (LLC_KIND, 32 * KiB)]
    assert points[0].gbps == pytest.approx(8 * KiB / 31e-6 / 1e9)
    assert points[1].gbps == pytest.approx(32 * KiB / 7e-6 / 1e9)
    assert probe_fresh_output_llc("cuda", seconds_per_call, 256 * KiB) == []


def test_the_llc_pool_is_an_eighth_of_the_last_level_cache(tmp_path):
    here = _cache(tmp_path, (1, "Data", "48K"), (2, "Unified", "1024K"),
                  (3, "Unified", "32768K"))
    assert llc_pool_bytes(here) == 4 * MiB


def test_the_spec_stores_the_tier_and_reads_it_back():
    again = KernelCalibration.from_dict(TIERED.to_dict())
    assert again.fresh_output_llc_pool_bytes == 4 * MiB
    assert [p for p in again.memory_kernels if p.kernel == LLC_KIND] == \
        [MemoryKernelPoint(LLC_KIND, "float32", 8 * KiB, 40.0)]
    assert tiered(again)
    older = OLD.to_dict()
    older.pop("fresh_output_llc_pool_bytes", None)  # a kit written before the field
    assert KernelCalibration.from_dict(older).fresh_output_llc_pool_bytes == 0
