"""Each ATen op of a layer's forward, timed where `planner profile` times the layer (the
profile's cycle: its step neighbours' forwards before, the backward window after,
`layer_profile.StepNeighbours`, as `time_layer` runs it) against the same forward run
right after an untimed one (warm), one CPU thread, thread clock, medians.

A dispatch mode below autograd clocks each op's call (its Python adds a few us per op to
both columns alike; the difference is the point). Blocks of ROUNDS_PER_BLOCK reps of one
mode alternate: a rep of the other mode in between would break the cycle.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_op_context.py \\
        cnn-small 16 head [--blocks 4]

Read here (2026-11-25, load 6.4-6.9; us, profile's cycle / warm, 4 blocks): cnn-small's
head at micro-batch 1: mean 45.5 / 14.3, addmm 18.9 / 6.2, _log_softmax 10.8 / 4.9,
nll_loss_forward 8.6 / 5.0; at 16: mean 86.6 / 34.5, addmm 45.4 / 14.6, _log_softmax
20.3 / 10.0, nll_loss_forward 14.5 / 7.3. gpt-tiny's head at 1, the same loss: t 19.4 /
4.2, mm 19.6 / 10.2, _log_softmax 12.6 / 7.7, nll_loss_forward 8.5 / 4.3: cold ops pay
4-15 us, the mean 31 (a composite on the CPU: sum, div_ and two to's inside, which the
dispatch mode and the layer's op count see as one op). cnn-small's stem at 1 (its
forward after the step's backward): convolution 55.9 / 27.7, native_batch_norm 23.2 /
16.3, relu 10.8 / 5.3. The whole head forward (no op clock, thread clock, load 10) at 1
read 104 us in the cycle and 145 with 4 MiB written just before it; at 16, 179 and 193.

--backward: the backward's ops, after the forward (untimed) in the cycle, or after a
forward and backward of its own (warm). gpt-tiny's head at 1 (2026-11-25, load 7-8, 3
blocks of 12): nll_loss_backward 67 / 14, _log_softmax_backward_data 17 / 10, the weight
gradient's mm (a transposed operand) 23 / 13, the input gradient's mm 10.5 / 7.5, detach
8 / 4 (load 5.5, 2 blocks: 26 / 12, 13 / 9, 18 / 13, 11 / 9, 7 / 4); at 4: 38 / 18,
21 / 16, 31 / 23, 20 / 19. Warm, nll_loss_backward alone in a loop
reads 2.9 us (its priced bytes: the logits-sized input it reads only for its shape and
the gradient its inner zero_ fills; `ir.composite_ops` counts the zero_): what the heads'
backward misses is cold code, not bytes. The weight gradient's mm (another layout than the
forward's) is not cold sgemm code for its layout: bench/bench_gemm_layout_cold.py read
the layouts sharing their ~2 us of cold code (2026-11-26), so its extra here is elsewhere.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_kernel_model import traced_graph  # noqa: E402
from cost_models.layer_profile import StepNeighbours  # noqa: E402
from ir.graph_measurer import _clear_grads  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402

ROUNDS_PER_BLOCK = 12  # reps of one mode in a row; the first two of each block untimed
WARMUP_PER_BLOCK = 2


class OpClock(TorchDispatchMode):
    """Records (op, thread-clock us) of each ATen call below autograd."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.thread_time_ns()
        out = func(*args, **(kwargs or {}))
        self.calls.append((str(func), (time.thread_time_ns() - start) * 1e-3))
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("micro_batch", type=int)
    parser.add_argument("layer")
    parser.add_argument("--blocks", type=int, default=4, help="blocks of each mode")
    parser.add_argument("--backward", action="store_true",
                        help="the backward's ops (its forward untimed before each)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    graph, measurer = traced_graph(args.model, args.micro_batch)
    i = next(j for j, layer in enumerate(graph.layers) if layer.name == args.layer)
    factory = real_factory("cpu")
    state = measurer.layer_state(i, factory)
    module = measurer.layer_module(i, state)
    neighbours = StepNeighbours(measurer, i, factory, graph.layers, "cpu")
    per_op = collections.defaultdict(list)  # (mode, position, op) -> us
    totals = collections.defaultdict(list)

    def backward(mode: str, clock=None) -> None:
        """The layer's forward untimed, then its backward (under `clock`), as `mode` runs it."""
        returned = module(*measurer.fresh_inputs(i, state, factory))
        ahead = neighbours.before_backward() if mode == "cycle" else []
        roots = [t for t in ahead + measurer.module_roots(i, returned) if t.requires_grad]
        seeds = [torch.ones_like(t) for t in roots]
        with clock if clock is not None else contextlib.nullcontext():
            torch.autograd.backward(roots, seeds)

    def rep_backward(mode: str, keep: bool) -> None:
        _clear_grads(state)
        if mode == "cycle":
            neighbours.before_forward()
        else:  # its forward and backward once, untimed, just before
            backward(mode)
            _clear_grads(state)
        clock = OpClock()
        start = time.thread_time_ns()
        backward(mode, clock)
        total_us = (time.thread_time_ns() - start) * 1e-3
        if mode == "cycle":
            neighbours.after_backward()
        if keep:
            totals[mode].append(total_us)
            for k, (op, us) in enumerate(clock.calls):
                per_op[(mode, k, op)].append(us)

    def rep(mode: str, keep: bool) -> None:
        if args.backward:
            return rep_backward(mode, keep)
        _clear_grads(state)
        if mode == "cycle":
            neighbours.before_forward()
        inputs = measurer.fresh_inputs(i, state, factory)
        if mode == "warm":  # the forward once, untimed, just before
            module(*inputs)
            inputs = measurer.fresh_inputs(i, state, factory)
        clock = OpClock()
        start = time.thread_time_ns()
        with clock:
            returned = module(*inputs)
        total_us = (time.thread_time_ns() - start) * 1e-3
        if mode == "cycle":  # the rest of the profile's rep: the window's, the backward
            roots = neighbours.before_backward() + measurer.module_roots(i, returned)
            roots = [t for t in roots if t.requires_grad]
            if roots:
                torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])
            neighbours.after_backward()
        if keep:
            totals[mode].append(total_us)
            for k, (op, us) in enumerate(clock.calls):
                per_op[(mode, k, op)].append(us)

    for _ in range(args.blocks):
        for mode in ("cycle", "warm"):
            for r in range(ROUNDS_PER_BLOCK):
                rep(mode, keep=r >= WARMUP_PER_BLOCK)
    print(f"{args.model} {args.layer} micro-batch {args.micro_batch}: "
          f"{'backward' if args.backward else 'forward'} "
          f"{statistics.median(totals['cycle']):.1f} us in the profile's cycle, "
          f"{statistics.median(totals['warm']):.1f} warm (under the op clock)")
    for (mode, k, op), us in per_op.items():
        if mode == "cycle":
            warm = per_op.get(("warm", k, op), [float("nan")])
            print(f"  {k:3d} {op:45s} {statistics.median(us):8.1f} {statistics.median(warm):8.1f}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
