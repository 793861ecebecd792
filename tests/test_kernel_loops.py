"""Inner loops of memory kernels (issue 17, round 2): the order TensorIterator walks a
permuted operand in (ir/tensor_iteration.py), loops shorter than the short_run probe's
paid per element, a middle-dim sum priced at its own probe ("short_reduction"), and a
scalar int op (batch norm's `num_batches_tracked += 1`) costing no kernel time.

Expected figures are worked out by hand from the case's numbers, not with the model's
helpers."""

from __future__ import annotations

import pytest
import torch

from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint
from ir.kernel_recorder import KernelRecorder, inner_loops
from ir.kernel_records import KernelKind, KernelRecord

from cost_models.common import GB
from cost_models.host_excess import HOST_EXCESS_OPS

from tests.test_kernel_rows import memory_s

KiB, MiB = 2**10, 2**20


def meta(*shape):
    return torch.empty(*shape, device="meta")


def test_a_permuted_dense_operand_runs_in_memory_order():
    """llama-tiny's rotary backward: the gradient of q.transpose(1, 2) is (16, 32, 8, 8)
    with strides (2048, 8, 256, 1) (dense, heads outside positions in memory); times cos
    (1, 32, 1, 8), out like the gradient. TensorIterator orders the dims by the output's
    strides (b, h, s, d): d and s merge (8 = 1 x 8) for all three operands, h does not for
    cos (stride 0 there): 128 loops of 256, not 4096 of 8 (measured alone: 1.0 us, where
    a contiguous-q product in loops of 8 took 20). A transposed clone into a contiguous
    output keeps loops of 8: the output decides the order, the input breaks the merge."""
    grad = meta(16, 8, 32, 8).transpose(1, 2)  # (16, 32, 8, 8), strides (2048, 8, 256, 1)
    assert grad.stride() == (2048, 8, 256, 1)
    cos = meta(1, 32, 1, 8)
    out = torch.empty_like(grad)  # keeps the permutation
    assert inner_loops("mul", (grad, cos), [grad, cos], [out]) == (256, 128)
    q = meta(16, 32, 8, 8)
    assert inner_loops("mul", (q, cos), [q, cos], [meta(16, 32, 8, 8)]) == (8, 4096)
    assert inner_loops("clone", (grad,), [grad], [meta(16, 32, 8, 8)]) == (8, 4096)
    # a fully transposed 2-D view copied into a like-strided output: one loop
    t = meta(64, 32).t()
    assert inner_loops("neg", (t,), [t], [torch.empty_like(t)]) == (2048, 1)


def short_run_cal(per_loop_s: float, **extra) -> KernelCalibration:
    """copy and add at 100 GB/s at 1 MiB; short_run made `per_loop_s` slower per loop of
    8 than the copy: 1 MiB / (2 x 4 bytes x 8) = 16384 probe loops."""
    copy_s = MiB / (100 * GB)
    short_gbps = MiB / (copy_s + MiB / (2 * 4 * 8) * per_loop_s) / GB
    points = (MemoryKernelPoint("copy", "float32", MiB, 100.0),
              MemoryKernelPoint("add", "float32", MiB, 100.0),
              MemoryKernelPoint("short_run", "float32", MiB, short_gbps))
    return KernelCalibration(measured_on="made up", memory_kernels=points + tuple(
        extra.get("points", ())))


def test_loops_shorter_than_the_probes_pay_per_element():
    """Rotary's neg of x[..., 4:] at (16, 32, 8, 4): 4096 loops of 4, 128 KiB moved. The
    probe's loops of 8 cost 3.5 ns over the copy: a loop of 4 costs 4/8 of it, 1.75 ns:
    128 KiB at 100 GB/s (1.3107 us) + 4096 x 1.75 ns (7.168 us) = 8.4787 us (measured
    alone, one thread: 8.1). Loops of 8 or more pay the probe's full 3.5 ns; a record
    whose loop length is not known (0) pays it too, as before."""
    cal = short_run_cal(3.5e-9)
    moved = 128 * KiB
    neg = KernelRecord("aten::neg", KernelKind.MEMORY, "float32", (16, 32, 8, 4), 1,
                       activation_bytes=moved, inner_loops=4096, inner_run=4)
    assert memory_s(neg, cal) == pytest.approx(1.31072e-6 + 4096 * 1.75e-9)
    for run in (8, 64, 0):
        r = KernelRecord("aten::neg", KernelKind.MEMORY, "float32", (16, 32, 8, 4), 1,
                         activation_bytes=moved, inner_loops=4096, inner_run=run)
        assert memory_s(r, cal) == pytest.approx(1.31072e-6 + 4096 * 3.5e-9)


def test_the_recorder_notes_each_loops_length():
    """rotary's cat((-x2, x1), -1) of two (16, 32, 8, 4) halves: 8192 loops of 4."""
    rec = KernelRecorder(weight_keys=set())
    x = meta(16, 32, 8, 8)
    a, b = x[..., 4:], x[..., :4]
    out = meta(16, 32, 8, 8)
    rec.record(torch.ops.aten.cat.default, ([a, b], -1), {}, out)
    (r,) = rec.records()
    assert (r.inner_loops, r.inner_run) == (8192, 4)


def test_a_middle_dim_sum_takes_the_short_reduction_probe():
    """repeat_kv's backward sum: 16384 loops of 2, 128 KiB read + 64 KiB written. The
    short_reduction probe at 1 MiB read in (n, 2, 8) blocks: 1 MiB + 512 KiB moved,
    131072 loops (one per written element), made 1.5 ns per loop slower than the sum
    point (50 GB/s): priced 192 KiB at 50 GB/s (3.9322 us) + 16384 x 1.5 ns (24.576 us).
    Without the probe: the short_run price per loop (3.5 ns), the loop length ignored
    for reductions, as before."""
    probe_bytes = MiB + MiB // 2
    sum_s = probe_bytes / (50 * GB)
    reduction_gbps = probe_bytes / (sum_s + 131072 * 1.5e-9) / GB
    sums = (MemoryKernelPoint("sum", "float32", 256 * KiB, 50.0),
            MemoryKernelPoint("short_reduction", "float32", probe_bytes, reduction_gbps))
    cal = short_run_cal(3.5e-9, points=sums)
    moved = 192 * KiB
    r = KernelRecord("aten::sum", KernelKind.MEMORY, "float32", (16, 32, 4, 1, 8), 1,
                     activation_bytes=moved, inner_loops=16384, inner_run=2)
    bytes_s = moved / (50 * GB)
    assert memory_s(r, cal, backward=True) == pytest.approx(bytes_s + 16384 * 1.5e-9)
    before = short_run_cal(3.5e-9, points=sums[:1])
    assert memory_s(r, before, backward=True) == pytest.approx(bytes_s + 16384 * 3.5e-9)


def test_a_scalar_int_add_is_dispatch_only():
    """Training batch norm's `num_batches_tracked.add_(1)`: a 0-dim int64 tensor, 8 bytes
    read and 8 written, no loops: 16 bytes at the add point's 100 GB/s = 0.16 ns of kernel
    (the host model charges its dispatch, `aten::add_` has no excess), no per-loop term
    even where short_run is measured."""
    rec = KernelRecorder(weight_keys=set())
    counter = torch.zeros((), dtype=torch.int64, device="meta")
    rec.record(torch.ops.aten.add_.Tensor, (counter, 1), {}, counter)
    (r,) = rec.records()
    assert (r.dtype, r.activation_bytes, r.inner_loops) == ("int64", 16, 0)
    assert memory_s(r, short_run_cal(3.5e-9)) == pytest.approx(16 / (100 * GB))
    assert "aten::add_" not in HOST_EXCESS_OPS


def test_a_transposing_copy_pays_the_probes_full_loop_price():
    """rotary's backward slice_backward: the gradient of x[..., 4:] (16, 32, 8, 4), read
    through q's transpose (strides (2048, 8, 256, 1)), is copied into a slice of a
    contiguous (16, 32, 8, 8): the output orders the walk (b, s, h, d), where the source
    jumps (stride 8 outside 256): transposing. Its 4096 loops of 4 pay the probe's 3.5 ns
    each, not 1.75 (measured alone, one thread: 16 us with the zero fill, where the
    in-order one of half the loops took 4.8). The in-order source, and a neg of the
    same gradient into a like-permuted output, are not transposing."""
    from ir.kernel_recorder import transposing

    grad = meta(16, 8, 32, 8).transpose(1, 2)[..., 4:]
    assert grad.stride() == (2048, 8, 256, 1)
    full = meta(16, 32, 8, 8)
    assert transposing("slice_backward", (grad, (16, 32, 8, 8), -1, 4, 8, 1), [grad], [full])
    in_order = meta(16, 32, 8, 8)[..., 4:]
    assert not transposing("slice_backward", (in_order, (16, 32, 8, 8), -1, 4, 8, 1),
                           [in_order], [full])
    assert not transposing("neg", (grad,), [grad], [torch.empty_like(grad)])
    assert transposing("clone", (grad,), [grad], [meta(16, 32, 8, 4)])
    cal = short_run_cal(3.5e-9)
    r = KernelRecord("aten::slice_backward", KernelKind.MEMORY, "float32", (16, 32, 8, 8), 1,
                     activation_bytes=192 * KiB, inner_loops=4096, inner_run=4,
                     transposing=True)
    assert memory_s(r, cal, backward=True) == pytest.approx(
        192 * KiB / (100 * GB) + 4096 * 3.5e-9)
