"""A forward op given a Python number (`x * 2`, `x > 0`) wraps it into a tensor and pays
the host more per call: which calls do (`ir.scalar_operands`), the recorder marks them
(`KernelRecord.scalar_operand`), the forward and backward host models price them per
call by the record's dtype, and the probe measures the two figures (`cost_models.scalar_operand_probes`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from cost_models.host_dispatch import forward_host_seconds
from ir.kernel_recorder import KernelRecorder
from ir.kernel_records import KernelKind, KernelRecord
from ir.op_count import OpCounter
from ir.scalar_operands import wraps_python_number
from tests.test_forward_host import FORWARD_PARTS
from tests.test_host_split import PARTS, US, cpu, tiny_layer


class _Calls(TorchDispatchMode):
    """Each ATen call's overload name and the rule's answer, in order."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((str(func), wraps_python_number(func, args)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("expr, expected", [
    # the binding wraps a number given where the schema takes a Tensor
    (lambda x, i: x * 2.0, [("aten.mul.Tensor", True)]),
    (lambda x, i: 1.0 + x, [("aten.add.Tensor", True)]),
    (lambda x, i: x / 3, [("aten.div.Tensor", True)]),
    (lambda x, i: i * 16, [("aten.mul.Tensor", True)]),
    # a comparison's and rsub's `number` overloads wrap it inside ATen
    (lambda x, i: i > 0, [("aten.gt.Scalar", True)]),
    (lambda x, i: 1 - x, [("aten.rsub.Scalar", True)]),
    # tensors only; numbers ATen reads directly; a factory's fill; sizes and dims
    (lambda x, i: x * x, [("aten.mul.Tensor", False)]),
    (lambda x, i: x.pow(2), [("aten.pow.Tensor_Scalar", False)]),
    (lambda x, i: x.clamp(min=1.0), [("aten.clamp.default", False)]),
    (lambda x, i: torch.full((2,), 1.0), [("aten.full.default", False)]),
    (lambda x, i: x.sum(0), [("aten.sum.dim_IntList", False)]),
    (lambda x, i: x.view(4), [("aten.view.default", False)]),
    (lambda x, i: x.fill_(1.0), [("aten.fill_.Scalar", False)]),
])
def test_which_calls_wrap_a_python_number(expr, expected):
    x, i = torch.rand(2, 2), torch.arange(4).view(2, 2)
    with _Calls() as mode:
        expr(x, i)
    assert mode.calls == expected


def test_c_plus_plus_composites_wrapping_a_number_count_too():
    """nn.RMSNorm's eps: ATen's add_.Scalar from C++ (aten.add_.Scalar timed 2.2 us against
    add_.Tensor's 1.1 from Python's torch.ops here: the wrap is ATen's, not the binding's)."""
    norm, x = nn.RMSNorm(4, eps=1e-6), torch.rand(2, 4)
    with _Calls() as mode:
        norm(x)
    assert [name for name, wraps in mode.calls if wraps] == ["aten.add_.Scalar"]


def test_the_recorder_marks_and_counts_the_calls_apart():
    recorder = KernelRecorder(set())
    x, y = torch.rand(3, 4), torch.rand(3, 4)
    with OpCounter(recorder):
        x * 2.0
        x * 3.0
        x * y
        (torch.arange(4) > 1)
    marked = {(r.op, r.dtype, r.scalar_operand): r.count for r in recorder.records()
              if r.op in ("aten::mul", "aten::gt")}
    assert marked == {("aten::mul", "float32", True): 2, ("aten::mul", "float32", False): 1,
                      ("aten::gt", "int64", True): 1}


def test_forward_host_prices_each_wrapped_number_by_the_records_dtype():
    """tiny_layer plus 3 float32 and 2 int64 calls given a number: 3 x 1.5 + 2 x 0.5 =
    5.5 us over the same calls on tensors (its 5 ops priced as before, +5 ops at 2 us);
    0 in a kit without the figures."""
    layer = tiny_layer()

    def with_calls(marked: bool):
        records = layer.kernels.forward + (
            KernelRecord("aten::mul", KernelKind.MEMORY, "float32", (2, 8), 3,
                         activation_bytes=64, scalar_operand=marked),
            KernelRecord("aten::gt", KernelKind.MEMORY, "int64", (2, 8), 2,
                         activation_bytes=64, scalar_operand=marked))
        kernels = dataclasses.replace(layer.kernels, forward=records)
        return dataclasses.replace(layer, measured=dataclasses.replace(
            layer.measured, kernels=kernels, ops_fwd=layer.ops_fwd + 5))

    kit = dataclasses.replace(FORWARD_PARTS, scalar_operand_float_host_s=1.5 * US,
                              scalar_operand_int_host_s=0.5 * US)
    wrapped, plain = with_calls(True), with_calls(False)
    assert forward_host_seconds(wrapped, cpu(kit)) - forward_host_seconds(plain, cpu(kit)) \
        == pytest.approx(5.5 * US)
    assert forward_host_seconds(wrapped, cpu(FORWARD_PARTS)) \
        == pytest.approx(forward_host_seconds(plain, cpu(FORWARD_PARTS)))


def test_the_probe_reads_a_float_tensors_number_dearer_than_an_int_tensors():
    """This CPU: ~1.1-1.4 us a call on float32, ~0.4-0.6 on int64 (five runs, load 5,
    2026-11-25); both under 20 us, the float figure the larger (a cast on top of the wrap)."""
    from cost_models.scalar_operand_probes import scalar_operand_seconds

    cost = scalar_operand_seconds("cpu")
    assert 0 < cost.float_s < 20 * US and 0 <= cost.int_s < 20 * US
    assert cost.float_s > cost.int_s
    assert cost.calibration_fields() == {"scalar_operand_float_host_s": cost.float_s,
                                         "scalar_operand_int_host_s": cost.int_s}


def test_backward_formulas_numbers_are_marked_and_priced_per_call():
    """A backward's formulas wrap numbers too: llama-tiny's RMSNorm (traced) runs
    RsqrtBackward0's `mul.Scalar(-0.5)`, MeanBackward1's `div.Scalar(64)` and PowBackward0's
    `mul.Scalar(2.0)`, each a 0-dim tensor made with `aten::to` / `_to_copy` / `copy_`
    under the CPU profiler, as a Python number's. The C++ call's extra over the same op on
    two tensors read the forward figure's (mul.Scalar 1.17 us, div.Scalar 1.22, Python's
    `x * -0.5` 1.24; the kit's probe 1.46-1.64, one process, load 14, 2026-11-26 21:50 UTC,
    /tmp/head/bwd_scalar_probe.py of the head session), so the backward host model prices
    each marked backward call at the same figures: 3 x 1.5 us here."""
    from bench.bench_kernel_model import traced_graph
    from cost_models.host_dispatch import backward_host_seconds

    graph = traced_graph("llama-tiny", 1)[0]
    norm = next(layer for layer in graph.layers if layer.name == "norm")
    marked = sorted((r.op, r.count) for r in norm.kernels.backward if r.scalar_operand)
    assert marked == [("aten::div", 1), ("aten::mul", 1), ("aten::mul", 1)]
    kit = dataclasses.replace(PARTS, scalar_operand_float_host_s=1.5 * US,
                              scalar_operand_int_host_s=0.5 * US)
    assert backward_host_seconds(norm, cpu(kit)) - backward_host_seconds(
        norm, cpu(PARTS)) == pytest.approx(3 * 1.5 * US)
