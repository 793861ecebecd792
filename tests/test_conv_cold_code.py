"""A convolution's cold code is priced at the algorithm ATen runs it with: a float32 CPU
convolution at micro-batch > 1 (or with a big kernel or input) runs oneDNN, whose first
call after other ops paid 35-90 us over warm here, where a batch-1 3x3 one runs ATen's
own im2col + GEMM (slow_conv2d), ~10-20 us, and the kit's "conv" kind probes the latter
(`cost_models.op_cold_probe`). `conv_probes.runs_onednn` states ATen's choice, checked
here against ATen's own (`torch._C._select_conv_backend`); `op_cold_code.op_cold_kind`
prices a oneDNN convolution at the kit's oneDNN kinds (forward and backward apart), at
"conv" where the kit did not measure them (older kits: as before)."""

from __future__ import annotations

import dataclasses

import pytest

import torch

from ir.kernel_calibration import KernelCalibration, OpColdCodePoint
from ir.kernel_records import KernelKind, KernelRecord, KernelRecords

from cost_models.conv_probes import runs_onednn
from cost_models.op_cold_code import layer_cold_code_seconds, op_cold_kind, pass_cold_code_seconds
from cost_models.op_cold_probe import (CONV_PROBE_SHAPE, ONEDNN_CONV_BACKWARD_KIND,
                                       ONEDNN_CONV_KIND, ONEDNN_CONV_PROBE_SHAPE, REFERENCE_KIND,
                                       kind_calls)
from tests.cpu_specs import US, linear_layer, one_cpu_process

# (batch, in_channels, side, kernel, groups): stride 1, padding kernel // 2, as the zoo's
SHAPES = ((1, 3, 16, 3, 1), (2, 3, 16, 3, 1), (4, 16, 16, 3, 1), (16, 16, 16, 3, 1),
          (1, 8, 16, 3, 1), (1, 80, 16, 3, 1), (1, 81, 16, 3, 1),  # 20480 input elements
          (1, 256, 14, 1, 1), (15, 256, 14, 1, 1), (16, 256, 14, 1, 1), (4, 64, 8, 1, 1),
          (1, 3, 112, 7, 1), (1, 16, 8, 5, 1), (1, 8, 8, 3, 2), (1, 8, 8, 1, 2))


def aten_runs_onednn(batch, c_in, side, kernel, groups) -> bool:
    image = torch.empty(batch, c_in, side, side)
    weight = torch.empty(16, c_in // groups, kernel, kernel)
    backend = torch._C._select_conv_backend(image, weight, None, [1, 1], [kernel // 2] * 2,
                                            [1, 1], False, [0, 0], groups)
    return backend == torch._C._ConvBackend.Mkldnn


def test_runs_onednn_is_atens_choice_at_one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the planner's CPU processes and the kit run
    try:
        expected = [aten_runs_onednn(*shape) for shape in SHAPES]
    finally:
        torch.set_num_threads(threads)
    assert any(expected) and not all(expected)
    assert [runs_onednn(groups, batch, c_in // groups, side * side, kernel * kernel)
            for batch, c_in, side, kernel, groups in SHAPES] == expected


def test_the_probes_convolutions_run_the_algorithm_they_stand_for():
    batch, channels, side, kernel = ONEDNN_CONV_PROBE_SHAPE
    assert runs_onednn(1, batch, channels, side * side, kernel * kernel)
    batch, channels, side, kernel = CONV_PROBE_SHAPE
    assert not runs_onednn(1, batch, channels, side * side, kernel * kernel)
    calls = kind_calls()
    calls[ONEDNN_CONV_KIND](), calls[ONEDNN_CONV_BACKWARD_KIND]()


def conv(batch: int, backward: bool = False, dtype: str = "float32") -> KernelRecord:
    """cnn-small's stem convolution (3 -> 16 channels, 16 x 16, 3 x 3) at `batch`."""
    op = "aten::convolution_backward" if backward else "aten::convolution"
    return KernelRecord(op, KernelKind.CONV, dtype, (1, batch, 3, 16, 256, 9, 2 if backward
                                                     else 0), 1,
                        flops=2 * batch * 256 * 16 * 3 * 9)


# made up: the reference 2 us cold, the im2col conv 5, oneDNN's forward 40, backward 50
CAL = KernelCalibration(measured_on="made up for the test", op_cold_code=(
    OpColdCodePoint(REFERENCE_KIND, "float32", 2 * US), OpColdCodePoint("conv", "float32", 5 * US),
    OpColdCodePoint(ONEDNN_CONV_KIND, "float32", 40 * US),
    OpColdCodePoint(ONEDNN_CONV_BACKWARD_KIND, "float32", 50 * US)))
OLD_KIT = dataclasses.replace(CAL, op_cold_code=CAL.op_cold_code[:2])


def test_a_onednn_convolution_pays_the_onednn_kinds_and_a_batch_1_one_the_im2col_kind():
    assert op_cold_kind(conv(4), CAL) == ONEDNN_CONV_KIND
    assert op_cold_kind(conv(16, backward=True), CAL) == ONEDNN_CONV_BACKWARD_KIND
    assert op_cold_kind(conv(1), CAL) == op_cold_kind(conv(1, backward=True), CAL) == "conv"
    assert op_cold_kind(conv(4, dtype="bfloat16"), CAL) == "conv"  # ATen's rule is fp32's
    # a graph traced at batch 1 priced at 4 runs oneDNN
    assert op_cold_kind(conv(1), CAL, batch_scale=4.0) == ONEDNN_CONV_KIND
    assert op_cold_kind(conv(4), OLD_KIT) == "conv"  # a kit without them: as before
    assert pass_cold_code_seconds((conv(4),), CAL, 0.5) == pytest.approx(19 * US)  # (40-2)/2
    assert pass_cold_code_seconds((conv(1),), CAL, 0.5) == pytest.approx(1.5 * US)
    assert pass_cold_code_seconds((conv(1, backward=True),), CAL, 1.0,
                                  batch_scale=16.0) == pytest.approx(48 * US)
    assert pass_cold_code_seconds((conv(4),), OLD_KIT, 1.0) == pytest.approx(3 * US)


def conv_layer(**changes):
    """A stem-like layer traced at batch 4: its forward's convolution and its backward's,
    no op cold by name (the layers around it ran convolutions too), 4 distinct ops a pass."""
    base = linear_layer()
    measured = dataclasses.replace(
        base.measured, distinct_ops_fwd=4,
        kernels=KernelRecords(forward=(conv(4),), backward=(conv(4, backward=True),)),
        backward_overloads=frozenset(("aten.convolution_backward.default", "aten.add.Tensor",
                                      "aten.mul.Tensor", "aten.view.default")))
    return dataclasses.replace(base, measured=measured, cold_distinct_ops_fwd=0,
                               cold_distinct_ops_bwd=1, **changes)


def test_a_onednn_forward_pays_in_full_unless_the_same_code_ran_just_before():
    """oneDNN runs a kernel made for each shape: the op-name count of cold ops (0 here: the
    layer before ran a convolution) does not see that the layer before ran another shape's.
    The backward keeps the op-name share (1 of 4)."""
    assert layer_cold_code_seconds(conv_layer(), one_cpu_process(CAL)) == pytest.approx(
        (38 * US, 48 * US / 4))
    assert layer_cold_code_seconds(conv_layer(same_code_before=True), one_cpu_process(
        CAL)) == pytest.approx((0.0, 48 * US / 4))
    # placed after a backward (a 1F1B forward), the block before ran other code: in full
    assert layer_cold_code_seconds(conv_layer(same_code_before=True,
                                              forward_after_backward=True),
                                   one_cpu_process(CAL)) == pytest.approx((38 * US, 48 * US / 4))
    # traced at batch 4, priced at a micro-batch of 1: ATen's im2col conv, the op-name share
    assert layer_cold_code_seconds(conv_layer(), one_cpu_process(CAL), 0.25) == pytest.approx(
        (0.0, 3 * US / 4))
