"""Seconds per call of an ATen op called from C++, as a backward formula calls it (the
autograd engine runs each node's formula in C++), not through `torch.ops` from Python.

A probe that times a backward op through `torch.ops.aten` pays Python's call and the
schema-driven parsing and boxing of every argument, which no training step's backward
pays: `_embedding_bag_backward` (12 arguments) read 10.7 us a call that way at 8 ids and
6.7 from a C++ loop, where a tiny add read 0.87 through its C binding and 0.61 from the
loop (one thread, thread clock, load 6.5, 2026-11-26), so subtracting one tiny C-bound
op's dispatch (`profile_device.probe_launch`: 2.1 us) left ~2.5 us of Python in the op's
per-call figure (the kit's line read 0.71x of it from C++, medians of 5 runs, load 6).
The loops here are TorchScript functions: the interpreter calls each op boxed from C++,
and the same loop around a tiny add is the reference a probe subtracts (one op's
dispatch from C++, as `host_excess.internal_dispatch_seconds` times the host model's
per-op backward figure). CPU only: on a GPU device events time the kernels whoever
launches them.

    loops = bag_backward_loops(grad, index, offsets, offset2bag, bag_size, max_indices, 128)
    seconds_per_cpp_call(loops)   # {"op": s, "reference": s}   # doctest: +SKIP
"""

from __future__ import annotations

import functools
import statistics
import warnings

# Calls per timed loop and rounds (each round times every loop in turn, on the probe
# clock; the median round is kept, as `profile_device.seconds_per_call` keeps its
# median batch): 200 calls of a ~7 us op is ~1.4 ms a loop, well above the clock's grain.
CPP_LOOP_CALLS = 200
CPP_LOOP_ROUNDS = 9
CPP_LOOP_WARMUP_CALLS = 20


@functools.lru_cache(maxsize=None)
def _scripted():
    """The TorchScript loops, compiled once (`torch.jit.script` warns that it is
    deprecated in favour of torch.compile, which would compile the op into generated code;
    the interpreter is what calls an op from C++ as it stands)."""
    from typing import List

    import torch

    def bag_backward(calls: int, grads: List[torch.Tensor], index: torch.Tensor,
                     offsets: torch.Tensor, offset2bag: torch.Tensor, bag_size: torch.Tensor,
                     max_indices: torch.Tensor, rows: int) -> List[torch.Tensor]:
        kept: List[torch.Tensor] = []  # appended and popped: the op is not dead code
        for i in range(calls):
            kept.append(torch.ops.aten._embedding_bag_backward(
                grads[i % 2], index, offsets, offset2bag, bag_size, max_indices, rows, False,
                0, False, None, -1))
            kept.pop()
        return kept

    def add(calls: int, xs: List[torch.Tensor], y: torch.Tensor) -> List[torch.Tensor]:
        kept: List[torch.Tensor] = []
        for i in range(calls):
            kept.append(torch.add(xs[i % 2], y))
            kept.pop()
        return kept

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(bag_backward), torch.jit.script(add)


def bag_backward_loops(grad, index, offsets, offset2bag, bag_size, max_indices,
                       rows: int) -> dict:
    """{"op": `_embedding_bag_backward` (sum mode, dense gradient) on these tensors,
    "reference": a tiny add}, each a function of the number of calls to make from C++."""
    import torch

    bag_backward, add = _scripted()
    grads = [grad, grad.clone()]  # alternated: no call sees the same inputs twice running
    xs, y = [torch.randn(2, 8, device=grad.device) for _ in range(2)], torch.randn(
        2, 8, device=grad.device)
    return {"op": lambda calls: bag_backward(calls, grads, index, offsets, offset2bag,
                                             bag_size, max_indices, rows),
            "reference": lambda calls: add(calls, xs, y)}


def seconds_per_cpp_call(loops: dict) -> dict[str, float]:
    """Median seconds per call of each loop over CPP_LOOP_ROUNDS rounds of CPP_LOOP_CALLS
    calls, the loops taking turns within each round on the probe clock (a slow spell of a
    shared host hits them alike)."""
    from cost_models.host_probes import probe_clock

    clock = probe_clock("cpu")
    for loop in loops.values():
        loop(CPP_LOOP_WARMUP_CALLS)
    rounds = {name: [] for name in loops}
    for _ in range(CPP_LOOP_ROUNDS):
        for name, loop in loops.items():
            start = clock()
            loop(CPP_LOOP_CALLS)
            rounds[name].append((clock() - start) / CPP_LOOP_CALLS)
    return {name: statistics.median(seconds) for name, seconds in rounds.items()}
