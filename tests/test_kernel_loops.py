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


def test_the_recorder_notes_loops_per_2d_call():
    """llama-tiny's repeat_kv clone: (16, 32, 4, 1, 8) expanded to n_rep = 2, copied into
    a contiguous (16, 32, 4, 2, 8). Coalesced from the inside: d (8); n_rep, stride 0 in
    the source, starts a dim (2); kv heads, stride 8 in the source against 0 x 2, another
    (4); s and b merge onto it (source 32 = 8 x 4, 1024 = 32 x 32; output likewise): 512.
    So 4096 loops of 8, 2 per 2-D call. Rotary's k * cos, k (16, 32, 4, 8) and cos
    (1, 32, 1, 8): d (8), heads (4: cos stride 0), s (32: cos 8 against 0), b (16): 4
    loops per call, a binary op. A contiguous neg: one loop, 1 per call."""
    from ir.tensor_iteration import coalesced_sizes

    rec = KernelRecorder(weight_keys=set())
    src = meta(16, 32, 4, 1, 8).expand(16, 32, 4, 2, 8)
    rec.record(torch.ops.aten.clone.default, (src,), {}, meta(16, 32, 4, 2, 8))
    k, cos = meta(16, 32, 4, 8), meta(1, 32, 1, 8)
    rec.record(torch.ops.aten.mul.Tensor, (k, cos), {}, meta(16, 32, 4, 8))
    x = meta(16, 32, 64)
    rec.record(torch.ops.aten.neg.default, (x,), {}, meta(16, 32, 64))
    clone, mul, neg = rec.records()
    assert (clone.inner_run, clone.inner_loops, clone.loops_per_call, clone.binary) == \
        (8, 4096, 2, False)
    assert (mul.inner_run, mul.inner_loops, mul.loops_per_call, mul.binary) == (8, 2048, 4, True)
    assert (neg.inner_loops, neg.loops_per_call, neg.binary) == (1, 1, False)
    assert coalesced_sizes((16, 32, 4, 8), [(1024, 32, 8, 1), (1024, 32, 8, 1),
                                            (0, 8, 0, 1)]) == [8, 4, 32, 16]


def two_level_cal(**extra) -> KernelCalibration:
    """short_run 3.5 ns per loop at 8 loops per call (`short_run_cal`); short_outer 5.0 ns
    per loop at 2 per call: 1 MiB / (2 x 4 x 8) = 16384 loops over the copy's 10.486 us;
    broadcast_binary 5.5 ns per loop over the add at 4 per call: 1 MiB moved as x, out and
    a quarter of x, 1 MiB / ((2 + 1/4) x 4 x 8) = 14563.6 loops."""
    copy_s = MiB / (100 * GB)
    outer_gbps = MiB / (copy_s + MiB / (2 * 4 * 8) * 5.0e-9) / GB
    binary_gbps = MiB / (copy_s + MiB / (2.25 * 4 * 8) * 5.5e-9) / GB
    points = (MemoryKernelPoint("short_outer", "float32", MiB, outer_gbps),
              MemoryKernelPoint("broadcast_binary", "float32", MiB, binary_gbps))
    return short_run_cal(3.5e-9, points=points + tuple(extra.get("points", ())))


def test_loops_pay_per_2d_call_where_both_copy_probes_were_measured():
    """Per loop p(o) = l + c / o: 3.5 ns at o = 8, 5.0 at o = 2, so c = 1.5 / (1/2 - 1/8)
    = 4 ns per call and l = 3.5 - 4/8 = 3 ns per loop; broadcast_binary's 5.5 ns at o = 4
    gives a binary call (5.5 - 3) x 4 = 10 ns. repeat_kv's clone (256 KiB, 4096 loops of
    8, 2 per call): 2.6214 us of bytes + 4096 x 3 ns + 2048 x 4 ns = 22.9934 us (was
    2.6214 + 4096 x 3.5 ns = 16.9574). k * cos (132096 bytes, 2048 loops, 4 per call):
    1.32096 us + 2048 x 3 ns + 512 x 10 ns = 12.56896 us. A kit without short_outer, or
    a record without loops per call (0), prices as before."""
    cal = two_level_cal()
    clone = KernelRecord("aten::clone", KernelKind.MEMORY, "float32", (16, 32, 4, 2, 8), 1,
                         activation_bytes=256 * KiB, inner_loops=4096, inner_run=8,
                         loops_per_call=2)
    assert memory_s(clone, cal) == pytest.approx(2.62144e-6 + 4096 * 3e-9 + 2048 * 4e-9)
    mul = KernelRecord("aten::mul", KernelKind.MEMORY, "float32", (16, 32, 4, 8), 1,
                       activation_bytes=132096, inner_loops=2048, inner_run=8,
                       loops_per_call=4, binary=True)
    assert memory_s(mul, cal) == pytest.approx(1.32096e-6 + 2048 * 3e-9 + 512 * 10e-9)
    before = 2.62144e-6 + 4096 * 3.5e-9
    assert memory_s(clone, short_run_cal(3.5e-9)) == pytest.approx(before)
    unknown = KernelRecord("aten::clone", KernelKind.MEMORY, "float32", (16, 32, 4, 2, 8), 1,
                           activation_bytes=256 * KiB, inner_loops=4096, inner_run=8)
    assert memory_s(unknown, cal) == pytest.approx(before)
    # without broadcast_binary a binary call costs a copy's: 2048 x 3 ns + 512 x 4 ns
    copies_only = KernelCalibration(measured_on="made up", memory_kernels=tuple(
        p for p in cal.memory_kernels if p.kernel != "broadcast_binary"))
    assert memory_s(mul, copies_only) == pytest.approx(1.32096e-6 + 2048 * 3e-9 + 512 * 4e-9)


def test_a_sum_with_no_contiguous_dim_takes_the_strided_reduction_probe():
    """repeat_kv's backward sums over n_rep of a (16, 32, 4, 2, 8) gradient, twice: k's
    with strides (2048, 8, 512, 256, 1) (d contiguous: the output's last kept dim, ATen's
    vectorised outer reduction) and v's with (2048, 1, 512, 256, 32) (no contiguous dim:
    element by element; 42 vs 52 us alone here): one record of 2 calls, 1 strided (the
    layout splits no record: GPU sums stay as they were). A row sum and a bias gradient's
    sum over the tokens are vectorised. Priced per call: 192 KiB at 50 GB/s and 16384
    loops at short_reduction's 1.5 ns, or for the strided share strided_reduction's 2.5
    (each made that much slower per loop than the sum point): 2 x (3.9322 us + 16384 x
    (1.5 + 2.5) / 2 ns); without strided_reduction short_reduction's, as before."""
    strided = lambda strides: torch.empty_strided((16, 32, 4, 2, 8), strides,  # noqa: E731
                                                  device="meta")
    rec = KernelRecorder(weight_keys=set())
    out = meta(16, 32, 4, 1, 8)
    for strides in ((2048, 8, 512, 256, 1), (2048, 1, 512, 256, 32)):
        rec.record(torch.ops.aten.sum.dim_IntList, (strided(strides), [3], True), {}, out)
    x = meta(16, 32, 64)
    rec.record(torch.ops.aten.sum.dim_IntList, (x, [-1], True), {}, meta(16, 32, 1))
    rec.record(torch.ops.aten.sum.dim_IntList, (x, [0, 1], True), {}, meta(1, 1, 64))
    assert [(r.count, r.strided_calls) for r in rec.records()] == [(2, 1), (1, 0), (1, 0)]
    probe_bytes = MiB + MiB // 2
    sum_s = probe_bytes / (50 * GB)
    gbps = lambda per_loop_s: probe_bytes / (sum_s + 131072 * per_loop_s) / GB  # noqa: E731
    sums = (MemoryKernelPoint("sum", "float32", 256 * KiB, 50.0),
            MemoryKernelPoint("short_reduction", "float32", probe_bytes, gbps(1.5e-9)),
            MemoryKernelPoint("strided_reduction", "float32", probe_bytes, gbps(2.5e-9)))
    repeat_kv_sums = rec.records()[0]
    bytes_s = 192 * KiB / (50 * GB)
    cal = short_run_cal(3.5e-9, points=sums)
    assert memory_s(repeat_kv_sums, cal, backward=True) == pytest.approx(
        2 * (bytes_s + 16384 * 2.0e-9))
    before = short_run_cal(3.5e-9, points=sums[:2])
    assert memory_s(repeat_kv_sums, before, backward=True) == pytest.approx(
        2 * (bytes_s + 16384 * 1.5e-9))
