"""Per-row and per-loop terms of the kernel model (cost_models/kernel_time.py), the CPU
memory probe's per-call correction and per-row probe (cost_models/memory_probes.py), and
the recorder's loops for reductions and row-wise ops (ir/kernel_recorder.py).

Expected figures are worked out by hand from the case's numbers, not with the model's
helpers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint
from ir.kernel_records import KernelKind, KernelRecord

from cost_models.common import GB, StepConfig
from cost_models.kernel_time import pass_seconds
from ir.strategy import Precision

from tests.test_kernel_time import spec

KiB, MiB = 2**10, 2**20
NBYTES = 256 * KiB
# made-up tables: softmax and layer norm at 20 GB/s, layer norm backward at 40
POINTS = (MemoryKernelPoint("softmax", "float32", NBYTES, 20.0),
          MemoryKernelPoint("layer_norm", "float32", NBYTES, 20.0),
          MemoryKernelPoint("layer_norm_backward", "float32", NBYTES, 40.0),
          MemoryKernelPoint("add", "float32", NBYTES, 100.0))
ROWS = 2048  # 256 KiB of fp32 scores in rows of 32: 65536 elements / 32


def fp32_config(micro_batch: int = 1) -> StepConfig:
    return StepConfig(micro_batch=micro_batch, graph_micro_batch=1, graph_dtype="float32",
                      precision=Precision.FP32, seq_len=32)


def row_record(op: str, rows: int = ROWS) -> KernelRecord:
    return KernelRecord(op, KernelKind.MEMORY, "float32", (rows, 32), 1,
                        activation_bytes=NBYTES, inner_loops=rows)


def cpu_spec(cal: KernelCalibration):
    return dataclasses.replace(spec(cal), device="cpu",
                               peak_flops_by_dtype=(("float32", 1e11),), hbm_gbps=40.0)


def memory_s(r: KernelRecord, cal: KernelCalibration, micro_batch=1, share=1.0,
             backward=False) -> float:
    return pass_seconds((r,), cpu_spec(cal), fp32_config(micro_batch), share,
                        backward=backward).memory_s


def test_softmax_and_layer_norm_pay_per_row_where_measured():
    """The per-row figure is a slope from the table's rows of 4096 (ROW_ELEMENTS) down, so
    rows of 32 pay for 2048 x (1 - 32 / 4096) = 2032 rows beyond the table's 16.
    softmax: 256 KiB at 20 GB/s = 13.107 us, plus 2032 x 10 ns = 20.32 us: 33.43 us;
    at micro-batch 2 both double (66.85 us); a TP share of 1/2 halves both at micro-batch
    1 (16.71 us). layer norm: 13.107 us + 2032 x 20 ns = 40.64 us: 53.75 us. log_softmax
    is the softmax kernel. Without the per-row figures (a kit before them): bytes only."""
    cal = KernelCalibration(measured_on="made up", memory_kernels=POINTS,
                            softmax_row_s=10e-9, layer_norm_row_s=20e-9)
    bytes_s = NBYTES / (20 * GB)
    assert bytes_s == pytest.approx(13.1072e-6)
    softmax = row_record("aten::_softmax")
    assert memory_s(softmax, cal) == pytest.approx(33.4272e-6)
    assert memory_s(softmax, cal, micro_batch=2) == pytest.approx(2 * 33.4272e-6)
    assert memory_s(softmax, cal, share=0.5) == pytest.approx(33.4272e-6 / 2)
    assert memory_s(row_record("aten::_log_softmax"), cal) == pytest.approx(33.4272e-6)
    assert memory_s(row_record("aten::native_layer_norm"), cal) == pytest.approx(53.7472e-6)
    old = dataclasses.replace(cal, softmax_row_s=0.0, layer_norm_row_s=0.0)
    for op in ("aten::_softmax", "aten::native_layer_norm"):
        assert memory_s(row_record(op), old) == pytest.approx(bytes_s)


def test_rows_as_wide_as_the_tables_pay_no_row_term():
    """The bandwidth table ran its softmax and layer norm in rows of 4096: their per-row
    share is in its GB/s already. 256 KiB of fp32 in 16 rows of 4096 costs its bytes
    alone (13.107 us), as do 8 rows of 8192 (past the probed line: no credit); 32 rows
    of 2048 pay for 32 x (1 - 2048 / 4096) = 16 rows: + 160 ns of softmax, 320 of norm."""
    cal = KernelCalibration(measured_on="made up", memory_kernels=POINTS,
                            softmax_row_s=10e-9, layer_norm_row_s=20e-9)
    bytes_s = NBYTES / (20 * GB)

    def rows_of(op: str, width: int) -> KernelRecord:
        rows = NBYTES // 4 // width
        return KernelRecord(op, KernelKind.MEMORY, "float32", (rows, width), 1,
                            activation_bytes=NBYTES, inner_loops=rows)

    for op in ("aten::_softmax", "aten::native_layer_norm"):
        assert memory_s(rows_of(op, 4096), cal) == pytest.approx(bytes_s)
        assert memory_s(rows_of(op, 8192), cal) == pytest.approx(bytes_s)
    assert memory_s(rows_of("aten::_softmax", 2048), cal) == pytest.approx(bytes_s + 160e-9)
    assert memory_s(rows_of("aten::native_layer_norm", 2048), cal) == \
        pytest.approx(bytes_s + 320e-9)


def test_layer_norm_backward_takes_its_own_points_and_no_row_term():
    """256 KiB at the backward's 40 GB/s = 6.5536 us (the forward's per-row figure is not
    charged); a kit without backward points prices it as before, at layer norm's 20 GB/s."""
    cal = KernelCalibration(measured_on="made up", memory_kernels=POINTS, layer_norm_row_s=20e-9)
    r = row_record("aten::native_layer_norm_backward")
    assert memory_s(r, cal, backward=True) == pytest.approx(6.5536e-6)
    before = dataclasses.replace(cal, memory_kernels=tuple(
        p for p in POINTS if p.kernel != "layer_norm_backward"))
    assert memory_s(r, before, backward=True) == pytest.approx(13.1072e-6)


def test_a_middle_dim_sum_pays_per_loop_of_its_reduced_dim():
    """llama-tiny's repeat_kv backward: a sum over dim 3 of (16, 32, 4, 2, 8) runs its
    reduced dim (2 elements, stride 8) innermost: 16*32*4*8 = 16384 loops of 2 (a keepdim
    output, 0 stride over dim 3, so dim 4 cannot merge in). A bias gradient's sum over
    the 512 tokens of (512, 64) runs 64 loops of 512; a last-dim sum of (16, 32, 64) 512
    loops of 64; a full sum one loop. Priced: 128 KiB read + 64 KiB written at the sum
    point's 50 GB/s, plus 16384 loops x 2 ns (the "short_run" point is made 2 ns per
    8-element loop slower than the copy point) = 32.77 us."""
    from ir.kernel_recorder import inner_loops

    def m(*shape):
        return torch.empty(*shape, device="meta")

    x = m(16, 32, 4, 2, 8)
    assert inner_loops("sum", (x, [3], True), [x], [m(16, 32, 4, 1, 8)]) == (2, 16384)
    assert inner_loops("sum", (x, [3]), [x], [m(16, 32, 4, 8)]) == (2, 16384)
    b = m(512, 64)
    assert inner_loops("sum", (b, [0], True), [b], [m(1, 64)]) == (512, 64)
    y = m(16, 32, 64)
    assert inner_loops("mean", (y, [-1], True), [y], [m(16, 32, 1)]) == (64, 512)
    assert inner_loops("sum", (y,), [y], [m(())]) == (16 * 32 * 64, 1)

    # short_run: 1 MiB as a copy (10.49 us at 100 GB/s) plus 1 MiB / (2 x 4 bytes x 8) =
    # 16384 probe loops x 2 ns
    per_loop_s = 2e-9
    copy_s = MiB / (100 * GB)
    loops_in_probe = MiB / (2 * 4 * 8)
    short_gbps = MiB / (copy_s + loops_in_probe * per_loop_s) / GB
    cal = KernelCalibration(measured_on="made up", memory_kernels=(
        MemoryKernelPoint("sum", "float32", NBYTES, 50.0),
        MemoryKernelPoint("copy", "float32", MiB, 100.0),
        MemoryKernelPoint("short_run", "float32", MiB, short_gbps)))
    moved = 128 * KiB + 64 * KiB
    r = KernelRecord("aten::sum", KernelKind.MEMORY, "float32", (16, 32, 4, 1, 8), 1,
                     activation_bytes=moved, inner_loops=16384)
    # the per-loop figure is read at the record's bytes: one point each, so flat
    assert memory_s(r, cal, backward=True) == pytest.approx(
        moved / (50 * GB) + 16384 * per_loop_s)


def test_memory_points_lose_what_the_host_charges_their_probe_call():
    """The host charges 2 us per call (gelu 3 us: 1 us of excess). copy at 64 KiB in 2 us
    and 512 KiB in 5 us: 3 us per 448 KiB, so a call of no bytes costs 2 - 3 x 64/448 =
    1.5714 us, under the 2 charged: each point loses 1.5714 us (0.4286 and 3.4286 us
    left). gelu: 10 us at 64 KiB, 10.5 at 512 KiB, intercept 9.93 us, above its 3 us
    charge: each loses 3 us (7 and 7.5 us left). add: 1 us at 64 KiB, 1.1 at 512 KiB,
    intercept 0.9857 us: 0.0143 us left at 64 KiB, under the 10% floor (0.1 us); 0.1143
    at 512 KiB. A kind measured at one size (softmax) is kept."""
    from cost_models.memory_probes import net_of_call_cost

    def point(kind, nbytes, seconds):
        return MemoryKernelPoint(kind, "float32", nbytes, nbytes / seconds / 1e9)

    points = [point("copy", 64 * KiB, 2e-6), point("copy", 512 * KiB, 5e-6),
              point("softmax", 64 * KiB, 7e-6), point("gelu", 64 * KiB, 10e-6),
              point("gelu", 512 * KiB, 10.5e-6), point("add", 64 * KiB, 1e-6),
              point("add", 512 * KiB, 1.1e-6)]
    net = {(p.kernel, p.nbytes): p.nbytes / (p.gbps * 1e9)
           for p in net_of_call_cost(points, 2e-6, {"gelu": 3e-6})}
    assert net[("copy", 64 * KiB)] == pytest.approx(0.4285714e-6)
    assert net[("copy", 512 * KiB)] == pytest.approx(3.4285714e-6)
    assert net[("softmax", 64 * KiB)] == pytest.approx(7e-6)
    assert net[("gelu", 64 * KiB)] == pytest.approx(7e-6)
    assert net[("gelu", 512 * KiB)] == pytest.approx(7.5e-6)
    assert net[("add", 64 * KiB)] == pytest.approx(0.1e-6)
    assert net[("add", 512 * KiB)] == pytest.approx(0.1142857e-6)


def test_short_rows_cost_more_per_byte_on_this_cpu():
    """The probe itself, here (one thread): the same bytes in the zoo's short rows take
    longer than in 4096-wide rows for softmax and layer norm (measured 2026-11-24: ~9.6
    and ~20 ns per extra row), so both figures come out positive, and well under the
    whole call (a row of 32 floats is not microseconds)."""
    from cost_models.clusters import _one_thread
    from cost_models.memory_probes import probe_row_seconds

    with _one_thread():
        row_s = probe_row_seconds("cpu", "float32")
    assert set(row_s) == {"softmax", "layer_norm"}
    for kind, seconds in row_s.items():
        assert 0 < seconds < 1e-6, (kind, seconds)


def test_calibrations_written_before_the_row_figures_still_load():
    """A kit's JSON without the new fields reads 0 for both (bytes-only pricing); with
    them, and a layer_norm_backward point, it round-trips."""
    old = {"measured_on": "an older kit", "memory_kernels": [
        {"kernel": "softmax", "dtype": "float32", "nbytes": 1024, "gbps": 10.0}]}
    cal = KernelCalibration.from_dict(old)
    assert (cal.softmax_row_s, cal.layer_norm_row_s) == (0.0, 0.0)
    new = dataclasses.replace(cal, softmax_row_s=9.6e-9, layer_norm_row_s=2e-8, memory_kernels=(
        *cal.memory_kernels, MemoryKernelPoint("layer_norm_backward", "float32", 1024, 5.0)))
    assert KernelCalibration.from_dict(new.to_dict()) == new


def test_a_scalar_over_a_broadcast_column_is_marked_and_priced_unvectorised():
    """A mean's backward divides its gradient, expanded along the innermost dim (stride 0
    there), by n: marked. Not marked: a contiguous tensor times a scalar, an expanded
    tensor times a tensor, a scalar over a tensor broadcast along a middle dim (its
    innermost loop is contiguous). Priced: 512 KiB at the "broadcast_scalar" point's
    10 GB/s = 52.43 us where measured, else at the op's own kind (add, 100 GB/s: 5.24 us)."""
    from ir.kernel_recorder import scalar_over_broadcast

    def m(*shape):
        return torch.empty(*shape, device="meta")

    grad = m(16, 16, 1, 1).expand(16, 16, 16, 16)
    out = [m(16, 16, 16, 16)]
    assert scalar_over_broadcast((grad, 256), [grad], out)
    assert scalar_over_broadcast((grad, m(())), [grad, m(())], out)
    assert not scalar_over_broadcast((m(16, 16, 16, 16), 256), [m(16, 16, 16, 16)], out)
    assert not scalar_over_broadcast((grad, m(16, 16, 16, 16)), [grad, m(16, 16, 16, 16)], out)
    middle = m(2, 1, 8).expand(2, 3, 8)
    assert not scalar_over_broadcast((middle, 2.0), [middle], [m(2, 3, 8)])

    nbytes = 512 * KiB
    r = KernelRecord("aten::div", KernelKind.MEMORY, "float32", (16, 16, 16, 16), 1,
                     activation_bytes=nbytes, unvectorized=True)
    measured = KernelCalibration(measured_on="made up", memory_kernels=(
        *POINTS, MemoryKernelPoint("broadcast_scalar", "float32", NBYTES, 10.0)))
    bare = KernelCalibration(measured_on="made up", memory_kernels=POINTS)
    assert memory_s(r, measured, backward=True) == pytest.approx(52.4288e-6)
    assert memory_s(r, bare, backward=True) == pytest.approx(5.24288e-6)
