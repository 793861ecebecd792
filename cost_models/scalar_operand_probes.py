"""What a forward op pays for a Python-number operand (and a backward formula's call for
a number it wraps, `aten::mul.Scalar(grad, -0.5)`: the same extra from C++,
`host_dispatch.backward_host_seconds`): `x * 2`, `1.0 + x`, `x / d`,
`x > 0` wrap the number into a 0-dim tensor (`ir.scalar_operands.wraps_python_number`)
and run TensorIterator with a CPU scalar, beyond the per-op figure of the function chain
(`host_probes.host_op_seconds_by_pass`: linear, layer norm, GELU, tensors only).

t5-tiny's relative-position bias (22 ATen ops on (32, 32) index tensors, 7 of them with
a Python number) ran 45-47 us right after itself against ~31 priced warm (host 22.6 +
kernels 8.4; one thread, load 5, 2026-11-25); its ops one by one (2x2 tensors): a float32
tensor with a Python number 2.0-2.1 us a call against 0.83-0.85 with a tensor (mul, div,
radd, gt), an int64 tensor with a Python int 1.15-1.31 against 0.78-0.85 (mul, gt), an
int64 tensor with a Python float 2.65 (/tmp experiments of the fwdcold session). So two
figures, by the record's dtype (`KernelRecord.dtype`: its first floating operand's):
per call on a floating tensor and on an integer one. (An earlier wrapped-number figure,
`wrapped_number_host_s`, went with the per-Python-call forward pricing it came in with,
which profile-device never turned on: `ir.kernel_calibration._RETIRED_SCALARS`.)

bench_kernel_model's forwards, each timing priced with and without the two figures (7
models x micro-batches 1/4/16, load 4-6, 2026-11-25 08:05 UTC; /tmp/fwdcold2/paired3.py
of the fwdcold session): 1.13 / 0.40 us, 45 / 45 of 90 over 15%, closer on 13 rows,
further on 2 (by more than a point); 1.09 / 0.41 us, 29 / 29, closer on 10, further on 5
(each further row within 15% both ways: +7 -> +9%). t5-tiny's relative biases 3-6
points closer (encoder -26 -> -20% at micro-batch 1), llama-tiny's norm -9 -> -4%. What
still misses on the biases is their cold start (88-106 us measured after their
neighbours at micro-batch 1 against 45 right after themselves).

The probe (`scalar_operand_seconds`): SCALAR_OPS called on a small tensor with a Python
number and with a same-shape tensor, alternating, per call the median of SCALAR_ROUNDS
rounds' difference over the ops; one thread, grad mode off (the extra is the binding's
and TensorIterator's, not autograd's), the probe clock.

    >>> cost = scalar_operand_seconds("cpu")  # doctest: +SKIP
    >>> cost.float_s * 1e6, cost.int_s * 1e6   # ~1.2 and ~0.4 here
"""

from __future__ import annotations

import operator
import statistics
from dataclasses import dataclass

# The binary ops models write with a Python number (scales, offsets, masks, bucket
# arithmetic); each is timed with the number and with a tensor in its place.
SCALAR_OPS = (operator.mul, operator.add, operator.sub, operator.truediv, operator.gt,
              operator.lt)
# Integer tensors: true division promotes to float (an int64 tensor / 2 is the float
# case's price and more), so the integer figure leaves it out.
INT_SCALAR_OPS = tuple(op for op in SCALAR_OPS if op is not operator.truediv)
SCALAR_SHAPE = (2, 2)  # kernels of a few elements: the host's share alone
SCALAR_CALLS = 200  # calls of each op per round (~0.2 ms)
SCALAR_ROUNDS = 15  # rounds, alternating number / tensor operand; the median difference
SCALAR_WARMUP_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class ScalarOperandCost:
    """Host seconds a call with a Python-number operand pays over the same call on two
    tensors: on a floating tensor (`float_s`), on an integer one (`int_s`)."""

    float_s: float
    int_s: float

    def calibration_fields(self) -> dict:
        """The `KernelCalibration` fields these figures fill."""
        return dict(scalar_operand_float_host_s=self.float_s,
                    scalar_operand_int_host_s=self.int_s)


def _extra_per_call_s(x, number, ops, clock) -> float:
    """Median over rounds of (ops with `number` - ops with a tensor) per call."""
    import torch

    other = torch.full_like(x, number)
    diffs = []
    for i in range(SCALAR_WARMUP_ROUNDS + SCALAR_ROUNDS):
        times = []
        for operand in (number, other):
            start = clock()
            for _ in range(SCALAR_CALLS):
                for op in ops:
                    op(x, operand)
            times.append(clock() - start)
        if i >= SCALAR_WARMUP_ROUNDS:
            diffs.append((times[0] - times[1]) / (SCALAR_CALLS * len(ops)))
    return statistics.median(diffs)


def scalar_operand_seconds(device: str = "cpu") -> ScalarOperandCost:
    """The two figures, each floored at 0 (a loaded host can read the difference below)."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    clock = probe_clock(device)
    with _one_thread(), torch.no_grad():
        floats = torch.rand(SCALAR_SHAPE, device=device) + 1.0  # no division by zero
        ints = torch.arange(1, 1 + SCALAR_SHAPE[0] * SCALAR_SHAPE[1],
                            device=device).view(SCALAR_SHAPE)  # int64
        float_s = _extra_per_call_s(floats, 3.0, SCALAR_OPS, clock)
        int_s = _extra_per_call_s(ints, 3, INT_SCALAR_OPS, clock)
    return ScalarOperandCost(max(0.0, float_s), max(0.0, int_s))
