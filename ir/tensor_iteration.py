"""How ATen's TensorIterator walks an op's elements on a CPU: the order of the dims and the
length of the innermost loop (aten/src/ATen/TensorIterator.cpp), read from shapes and
strides alone (meta tensors do). `ir.kernel_recorder.inner_loops` records the loops; the
CPU pays per loop as well as per byte (`cost_models.kernel_time`).

    >>> iteration_order(2, [(1, 8)])  # a transposed (8, 8) view runs its dim 0 innermost
    [1, 0]
"""

from __future__ import annotations

import torch


def coalesced_sizes(shape: tuple[int, ...],
                    strides_by_operand: list[tuple[int, ...]]) -> list[int]:
    """Sizes of the loop nest over `shape` (dims outermost first), innermost first:
    size-1 dims skipped, a dim merged into the one inside it while every operand's stride
    continues it (TensorIterator's coalescing, aten/src/ATen/TensorIterator.cpp
    `coalesce_dimensions`). The CPU runs the first two as one 2-D loop call
    (`TensorIteratorBase::serial_for_each`): [inner run, inner loops per call, ...]."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    if not dims:
        return [1]
    sizes, inner = [shape[dims[-1]]], dims[-1]
    for d in reversed(dims[:-1]):
        if all(strides[d] == strides[inner] * shape[inner] for strides in strides_by_operand):
            sizes[-1] *= shape[d]
        else:
            sizes.append(shape[d])
        inner = d
    return sizes


def trailing_run(shape: tuple[int, ...], strides_by_operand: list[tuple[int, ...]]) -> int:
    """Elements of the innermost loop over `shape` (`coalesced_sizes`' first)."""
    return coalesced_sizes(shape, strides_by_operand)[0]


def broadcast_strides(t: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """`t`'s strides read as the iteration `shape` (a broadcast dim has stride 0); None
    when `t` does not broadcast to it."""
    if t.dim() > len(shape):
        return None
    lead = len(shape) - t.dim()
    strides = [0] * lead
    for size, stride, want in zip(t.shape, t.stride(), shape[lead:]):
        if size == want:
            strides.append(stride if want != 1 else 0)
        elif size == 1:
            strides.append(0)
        else:
            return None
    return tuple(strides)


def iteration_order(ndim: int, strides_by_operand: list[tuple[int, ...]]) -> list[int]:
    """Dims outermost first in the order TensorIterator walks them: an insertion sort
    that moves a dim inwards while the first operand (outputs first) whose strides of the
    two dims are both non-zero has the smaller stride there (`reorder_dimensions` in
    aten/src/ATen/TensorIterator.cpp): a permuted but dense tensor (a transposed gradient)
    runs in memory order, one long loop, not loops of its logical last dim."""
    def should_swap(dim0: int, dim1: int) -> int:
        for strides in strides_by_operand:
            stride0, stride1 = strides[dim0], strides[dim1]
            if stride0 == 0 or stride1 == 0:
                continue
            return (stride0 > stride1) - (stride0 < stride1)
        return 0

    perm = list(reversed(range(ndim)))  # innermost first
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[dim0], perm[dim1])
            if comparison > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif comparison < 0:
                break
    return perm[::-1]


def walks_out_of_order(shape: tuple[int, ...], strides_by_operand: list[tuple[int, ...]]) -> bool:
    """Whether some operand's strides (size-1 and broadcast dims aside) grow inwards along
    the order the iteration runs (`iteration_order`): a transposing access (a permuted
    gradient copied into a slice of a contiguous one) whose loops jump in memory."""
    order = iteration_order(len(shape), strides_by_operand)
    for strides in strides_by_operand:
        walked = [strides[d] for d in order if shape[d] != 1 and strides[d] != 0]
        if any(outer < inner for outer, inner in zip(walked, walked[1:])):
            return True
    return False


def elementwise_strides(inputs: list[torch.Tensor], outputs: list[torch.Tensor]):
    """(iteration shape, each operand's strides read as it, outputs first as ATen orders
    them) of an elementwise op; None where an operand does not broadcast to it."""
    tensors = [t for t in outputs + inputs if t.numel() > 1]
    if not tensors or not outputs:
        return None
    shape = tuple(max(tensors, key=lambda t: t.numel()).shape)
    strides = [broadcast_strides(t, shape) for t in tensors]
    return None if any(s is None for s in strides) else (shape, strides)


def loops_per_call(shape: tuple[int, ...], strides_by_operand: list[tuple[int, ...]]) -> int:
    """Inner loops one 2-D loop call runs over `shape` in TensorIterator's order
    (`coalesced_sizes`' second; 1 where the iteration is one loop). The CPU pays per call
    as well as per loop (`cost_models.kernel_loops`)."""
    order = iteration_order(len(shape), strides_by_operand)
    sizes = coalesced_sizes(tuple(shape[d] for d in order),
                            [tuple(s[d] for d in order) for s in strides_by_operand])
    return sizes[1] if len(sizes) > 1 else 1
