"""Which ATen calls wrap a Python number into a tensor: `x * 2`, `1.0 + x`, `x / d`,
`x > 0`, `torch.where(m, x, 0.0)`. The binding (a number where the schema takes a Tensor)
or the op (a comparison's, `rsub`'s, `where`'s `number` argument) makes a 0-dim tensor of
it and runs TensorIterator with a CPU scalar operand, which costs the host more than the
same op on two tensors: 0.85 -> 2.0 us a call for a float32 tensor with a Python number,
0.8 -> 1.3 for an int64 tensor with a Python int (one thread, 2x2 tensors, 2026-11-25,
load 5: /tmp experiments of the fwdcold session; `cost_models.scalar_operand_probes`
measures it per kit). `KernelRecord.scalar_operand` marks such a call.

    >>> import torch
    >>> wraps_python_number(torch.ops.aten.mul.Tensor, (torch.ones(2), 2.0))
    True
    >>> wraps_python_number(torch.ops.aten.mul.Tensor, (torch.ones(2), torch.ones(2)))
    False
"""

from __future__ import annotations

import numbers

# Ops whose `number` argument ATen reads as a number, not a wrapped tensor: pow's
# exponent (x.pow(2) +0.26 us over x.pow(x)), masked_fill's and fill_'s value (the same
# time with a Python float and a 0-dim tensor: 2.2, 0.76 us); the same experiments.
READS_NUMBER_DIRECTLY = frozenset({"pow", "pow_", "masked_fill", "masked_fill_", "fill",
                                   "fill_"})


def wraps_python_number(func, args) -> bool:
    """Whether this ATen call (an OpOverload and its positional arguments) is given a
    Python number (not a bool) that it wraps into a tensor: at a `Tensor` argument (the
    binding wrapped it), or at a `number` argument of a `*Scalar*` overload that does not
    read it directly (READS_NUMBER_DIRECTLY); only calls with a tensor argument (a
    factory's size or fill value is not an operand)."""
    if func.overloadpacket.__name__ in READS_NUMBER_DIRECTLY:
        return False
    schema_args = func._schema.arguments
    has_tensor = False
    wrapped = False
    for arg, value in zip(schema_args, args):
        kind = str(arg.type)
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            has_tensor = True
        elif isinstance(value, numbers.Number) and not isinstance(value, bool):
            if kind == "Tensor" or (kind == "number" and "Scalar" in func._overloadname):
                wrapped = True
    return has_tensor and wrapped
