"""The kit's per-op-kind cold-code probe: what one op kind's call pays when other distinct
ops ran since its last call (its dispatch path, kernel code and branch history out of the
core's caches, its data small and warm), over the same call warm. `cost_models
.op_cold_code` prices it.

The kit's per-cold-op host figures (`cold_op_host_s`, `cold_backward_op_host_s`) are fits
on chains of small unary ops, 1.2-3.6 us an op; an op with a big kernel pays more
(bench/bench_op_cold_code.py, 2026-11-26, load 22-24, after 36 other distinct ops, first
call over warm: nll_loss_backward 10-15 us, _log_softmax_backward_data 20-28, mm 13-21).

The probe, per kind (the kinds the kernel records price: `gemm`, its one-row product
(GEMV_KIND), `conv`, `attention`, the oneDNN convolution's forward and backward
(ONEDNN_CONV_KIND, ..._BACKWARD_KIND), and each memory kind of `cost_models.kernel_time.memory_kind`, run as the cold-kernel probe
runs it, `cold_kernel.memory_kind_calls`; the ops of OWN_KIND_OPS under their own name)
and for REFERENCE_KIND (a small unary op, what the host fits read): warm it; then per
round run OTHER_OPS_COUNT distinct other ops (`other_ops`: none of them a kind's op, on
OTHER_ELEMENTS-element tensors, so their data evicts nothing), time the call, time it
again; the kind's seconds are the median over OP_COLD_ROUNDS of first minus second
(`KernelCalibration.op_cold_code`). One thread, this thread's CPU clock; ~0.3 s in all
(profile-device's budget: bench/bench_profile_device.py). CPU only.
"""

from __future__ import annotations

import time

from cost_models.cold_kernel import first_call_excess_s
from ir.kernel_calibration import OpColdCodePoint

# Distinct other ops run between two calls of a probed op: what `planner profile`'s cycle
# runs between two calls of one of a block's ops (its forward's 17-30 distinct ops, as
# many backward, its neighbours'; bench_kernel_model's rows, 2026-11-26), well past the 16
# after which a run of distinct ops leaves the first's code cold
# (`ir.op_count.COLD_WINDOW_DISTINCT_OPS`). (36 small unary ops, bench_op_cold_code's
# count, left a kind 0-1.7 us over the reference, 72 with reductions and sorts 1-7.6 us:
# one thread, load 7.4, 2026-11-26.)
OTHER_OPS_COUNT = 72
OTHER_ELEMENTS = 64  # the other ops' tensors: small, so their data displaces nothing
OP_COLD_ROUNDS = 21  # median of the differences: one slow spell does not decide
# The op the per-cold-op host figures were fitted on (`cold_entry_probes`' chains of unary
# ops, abs among them, on ENTRY_TOKENS x ENTRY_WIDTH fp32): `op_cold_code` prices each
# kind's excess over it.
REFERENCE_KIND = "reference"
# A small GEMM as gpt-tiny's head runs one (32 tokens x 64 hidden x 128 vocab).
GEMM_PROBE_MNK = (32, 128, 64)
# MKL runs a float32 GEMM whose output has one row or one column (a Linear's forward or
# grad input at micro-batch 1; a 1-logit head) on other code, a matrix-vector product's
# (`op_cold_code.runs_gemv`): ATen hands it to SGEMM as any other (MKL_VERBOSE), but its
# first call ever at m = 2 loaded code the m = 1 calls had not (92 us against 60, then
# 13 us at m = 4), and after the 72 other ops the zoo's small Linears read -1.9..+1.5 us
# over the reference at m = 1 (forward and grad input) against 4-8 forward and 2-6 grad
# input at m = 16 (bench/bench_gemm_cold_m.py, three runs, load 1.3-1.4, 2026-11-26).
# The probe: the GEMM's product with one row.
GEMV_PROBE_MNK = (1, GEMM_PROBE_MNK[1], GEMM_PROBE_MNK[2])
GEMV_KIND = "gemv"
# (batch, heads, seq, head_dim) of the attention probe and (batch, channels, side,
# kernel) of the convolution probe: small, their code is the point.
ATTENTION_PROBE_SHAPE = (1, 2, 32, 16)
CONV_PROBE_SHAPE = (1, 8, 16, 3)  # batch 1, 3x3, unpadded: ATen's im2col + GEMM runs it
# A float32 CPU convolution ATen runs on oneDNN (`conv_probes.runs_onednn`: batch > 1 here)
# pays far more cold than the im2col one "conv" probes: after the 72 other ops, cnn-small's
# 3x3 convs at 16 x 16 read 33-59 us over warm forward and 45-89 backward (both gradients)
# at batch 2-16, against 14-20 and 18-22 at batch 1 (one thread, thread clock, load 3.9,
# 2026-11-26): forward and backward (grad_input and grad_weight, a block's) probed apart,
# same-padded, on this small shape (64 KiB of input: its code is the point), with 16
# channels: oneDNN runs its AVX-512 kernels on 16-channel blocks there, as for cnn-small's
# blocks and stem, where 8 channels ran its AVX2 ones on 8-channel blocks (ONEDNN_VERBOSE).
ONEDNN_CONV_PROBE_SHAPE = (4, 16, 16, 3)
ONEDNN_CONV_KIND, ONEDNN_CONV_BACKWARD_KIND = "conv_onednn", "conv_onednn_backward"
# Ops probed under their own name: the loss a head runs, which the bandwidth tables price
# as a "sum" (`kernel_time.MEMORY_KERNEL_OF_OP`) but whose code is not a sum's (after the
# 72 other ops nll_loss_backward ran 7.9 us over warm, the kit's sum 2.6: load 6.9,
# 2026-11-26), on (LOSS_PROBE_TOKENS, LOSS_PROBE_CLASSES) log-probabilities (gpt-tiny's head).
OWN_KIND_OPS = ("nll_loss_forward", "nll_loss_backward")
LOSS_PROBE_TOKENS, LOSS_PROBE_CLASSES = 32, 128


def other_ops() -> list:
    """OTHER_OPS_COUNT distinct ops that no probed kind runs (no add, copy, sum, mul,
    gelu, tanh, softmax, norm, masked fill, matmul; abs is the reference): unary math,
    then reductions, scans, sorts and binary ops, whose bigger kernels evict more code."""
    import torch
    import torch.nn.functional as F

    unary = [torch.sin, torch.cos, torch.tan, torch.exp, torch.exp2, torch.expm1, torch.log2,
             torch.log10, torch.log1p, torch.sigmoid, torch.relu, torch.neg, torch.sqrt,
             torch.rsqrt, torch.erf, torch.erfc, torch.floor, torch.ceil, torch.round,
             torch.trunc, torch.frac, torch.sign, torch.square, torch.reciprocal, torch.atan,
             torch.asin, torch.acos, torch.sinh, torch.cosh, torch.asinh, F.silu, F.softplus,
             F.elu, F.hardtanh, F.leaky_relu, F.mish, F.hardswish, F.logsigmoid, torch.lgamma,
             torch.digamma, torch.erfinv, torch.i0, torch.sinc, torch.nan_to_num]
    heavier = [lambda x: torch.cumsum(x, 0), lambda x: torch.topk(x, 3)[0],
               lambda x: x.var(), lambda x: x.argmax(), lambda x: torch.sort(x)[0],
               lambda x: torch.cumprod(x, 0), lambda x: torch.logcumsumexp(x, 0),
               lambda x: x.std(), lambda x: x.median(), lambda x: x.kthvalue(3)[0],
               lambda x: x.argmin(), lambda x: x.min(), lambda x: x.prod(),
               lambda x: x.mean(), lambda x: x.amax(), lambda x: x.clamp(-0.5, 0.5),
               lambda x: F.log_softmax(x, 0), lambda x: torch.cummax(x, 0)[0],
               lambda x: torch.flip(x, (0,)), lambda x: torch.roll(x, 1),
               lambda x: torch.pow(x, 3), lambda x: torch.remainder(x, 0.3),
               lambda x: torch.fmod(x, 0.3), lambda x: torch.atan2(x, x),
               lambda x: torch.hypot(x, x), lambda x: torch.maximum(x, x),
               lambda x: torch.minimum(x, x), lambda x: torch.diff(x)]
    return unary + heavier


def kind_calls() -> dict:
    """Per probed kind (and REFERENCE_KIND), one call of it on small warm tensors."""
    import torch
    import torch.nn.functional as F

    from cost_models.cold_entry_probes import ENTRY_TOKENS, ENTRY_WIDTH
    from cost_models.cold_kernel import COLD_PROBE_BYTES, memory_kind_calls

    n = COLD_PROBE_BYTES // 4
    x, y, out = (torch.rand(n) * 2 - 1 for _ in range(3))  # uniform(-1, 1)
    entry = torch.randn(ENTRY_TOKENS, ENTRY_WIDTH)
    calls = {REFERENCE_KIND: lambda: torch.abs(entry), **memory_kind_calls(x, y, out)}
    m, n_, k = GEMM_PROBE_MNK
    a, b = torch.randn(m, k), torch.randn(k, n_)
    calls["gemm"] = lambda: torch.mm(a, b)
    row = torch.randn(GEMV_PROBE_MNK[0], k)
    calls[GEMV_KIND] = lambda: torch.mm(row, b)
    q = torch.randn(*ATTENTION_PROBE_SHAPE)
    calls["attention"] = lambda: F.scaled_dot_product_attention(q, q, q)
    batch, channels, side, kernel = CONV_PROBE_SHAPE
    image, weight = torch.randn(batch, channels, side, side), torch.randn(channels, channels,
                                                                          kernel, kernel)
    calls["conv"] = lambda: F.conv2d(image, weight)
    batch, channels, side, kernel = ONEDNN_CONV_PROBE_SHAPE
    conv_args = ([1, 1], [kernel // 2] * 2, [1, 1], False, [0, 0], 1)  # stride, padding, ...
    # own names: the lambdas read them when called, after the loss's below are bound
    conv_in, conv_weight, conv_grad = (torch.randn(batch, channels, side, side),
                                       torch.randn(channels, channels, kernel, kernel),
                                       torch.randn(batch, channels, side, side))
    aten = torch.ops.aten
    calls[ONEDNN_CONV_KIND] = lambda: aten.convolution(conv_in, conv_weight, None, *conv_args)
    calls[ONEDNN_CONV_BACKWARD_KIND] = lambda: aten.convolution_backward(
        conv_grad, conv_in, conv_weight, None, *conv_args, [True, True, False])
    log_probs = torch.log_softmax(torch.randn(LOSS_PROBE_TOKENS, LOSS_PROBE_CLASSES), 1)
    target = torch.randint(0, LOSS_PROBE_CLASSES, (LOSS_PROBE_TOKENS,))
    grad, total = torch.tensor(1.0), torch.tensor(float(LOSS_PROBE_TOKENS))
    calls["nll_loss_forward"] = lambda: aten.nll_loss_forward(log_probs, target, None, 1, -100)
    calls["nll_loss_backward"] = lambda: aten.nll_loss_backward(grad, log_probs, target, None,
                                                                1, -100, total)
    return calls


def probe_op_cold_code(device: str, dtype: str = "float32",
                       rounds: int = OP_COLD_ROUNDS) -> list[OpColdCodePoint]:
    """Per kind, the seconds its first call after OTHER_OPS_COUNT other distinct ops takes
    over its next call (none off the CPU)."""
    import torch

    if device != "cpu":
        return []
    others, small = other_ops(), torch.randn(OTHER_ELEMENTS)
    clock = time.thread_time_ns  # this thread's CPU time: a switch away does not count
    points = []
    def run_others(_round: int) -> None:
        for op in others:
            op(small)

    for kind, call in kind_calls().items():
        call(), call()
        points.append(OpColdCodePoint(kind, dtype, first_call_excess_s(call, run_others,
                                                                       rounds, clock)))
    return points
