"""The convolution probe of `planner profile-device` (`cost_models.profile_device`): 2-D
convolutions' forward and backward seconds on a grid of shapes (`device_grids`).

A convolution is not a GEMM of its im2col shape on every device: oneDNN on a CPU picks
direct, Winograd or GEMM-based kernels by shape, and a 3-channel RGB stem runs far from
the rate of a GEMM of the same (m, n, k) (here, one thread: 23 GFLOP/s for cnn-small's
stem at batch 1 and 4 against ~100 for square GEMMs). So the kit times each shape as it
runs: ATen `convolution`, and `convolution_backward` twice, with only grad_input and
with only grad_weight requested (a network's first conv computes no grad_input: its
input is the data). Both halves together ran within 5% of their sum here.

    probe_conv("cpu", [(1, 3, 16, 16, 3)], "float32", 2e-6)   # doctest: +SKIP
"""

from __future__ import annotations

from ir.kernel_calibration import ConvPoint

# Each time is the least of this many medians (`seconds_per_call`): a shared host only
# ever slows a kernel down (the rule `ir.gemm_table.fastest_points` states).
CONV_PROBE_PASSES = 2
# A guard, not a measurement: a probe's seconds less one tiny op's dispatch never go
# below this share of them. It does not bind on this CPU: the dispatch (1.9 us) was 20%
# of the smallest grid conv (cnn-small's stem at batch 1, 9.7 us; 2026-11-24).
MIN_DEVICE_SHARE = 0.1
# ATen's choice of a float32 CPU convolution's algorithm (aten/src/ATen/native/
# Convolution.cpp, ConvParams::use_mkldnn, torch 2.13; tests/test_conv_cold_code.py checks
# it against torch._C._select_conv_backend): oneDNN where (strided, dilated, batch >=
# ONEDNN_1X1_MIN_BATCH, a kernel other than 1x1, or more than one thread) and (groups > 1,
# both kernel sides > ONEDNN_SMALL_KERNEL_SIDE, batch > 1, or more input elements than
# ONEDNN_MIN_INPUT_ELEMENTS); else ATen's own im2col + GEMM (slow_conv2d).
ONEDNN_1X1_MIN_BATCH = 16
ONEDNN_SMALL_KERNEL_SIDE = 3
ONEDNN_MIN_INPUT_ELEMENTS = 20480


def runs_onednn(groups: int, batch: int, in_channels: int, positions: int,
                kernel_area: int) -> bool:
    """Whether ATen runs a float32 CPU convolution of this shape on oneDNN at one thread
    (the planner's CPU processes and the kit run one), as a kernel record describes it
    (`ir.kernel_records`: output positions, kernel area): read as stride 1, no dilation,
    square kernels, input positions = output positions (the zoo's same-padded convs)."""
    one_by_one = kernel_area == 1
    big_kernel = kernel_area > ONEDNN_SMALL_KERNEL_SIDE ** 2
    input_elements = batch * in_channels * groups * positions
    return ((batch >= ONEDNN_1X1_MIN_BATCH or not one_by_one)
            and (groups > 1 or big_kernel or batch > 1
                 or input_elements > ONEDNN_MIN_INPUT_ELEMENTS))


def probe_conv(device: str, shapes, dtype: str, dispatch_s: float,
               progress=None) -> list[ConvPoint]:
    """Seconds of forward, input backward and weight backward per (batch, in_channels,
    out_channels, spatial, kernel) shape, each less `dispatch_s` (one tiny op's host
    dispatch, `profile_device.probe_launch`; on a GPU pass 0: events time the device)."""
    import torch

    from cost_models.profile_device import _random, seconds_per_call

    aten = torch.ops.aten
    points = []
    for batch, c_in, c_out, spatial, kernel in shapes:
        x = _random((batch, c_in, spatial, spatial), dtype, device)
        w = _random((c_out, c_in, kernel, kernel), dtype, device)
        pad = [kernel // 2] * 2
        conv_args = ([1, 1], pad, [1, 1], False, [0, 0], 1)  # stride, padding, dilation, ...
        grad = _random((batch, c_out, spatial, spatial), dtype, device)
        calls = (lambda i: aten.convolution(x, w, None, *conv_args),
                 lambda i: aten.convolution_backward(grad, x, w, None, *conv_args,
                                                     [True, False, False]),
                 lambda i: aten.convolution_backward(grad, x, w, None, *conv_args,
                                                     [False, True, False]))
        seconds = []
        for call in calls:
            best_s = min(seconds_per_call(call, device) for _ in range(CONV_PROBE_PASSES))
            seconds.append(max(best_s - dispatch_s, MIN_DEVICE_SHARE * best_s))
        points.append(ConvPoint(dtype, batch, c_in, c_out, spatial, kernel, *seconds))
        if progress:
            progress(str(points[-1]))
        del x, w, grad
    return points
