"""What one ATen op's call pays after other distinct ops ran (its dispatch path and kernel
code out of the caches, its data small and warm) against after an L2-sized data write
(its data out, `cost_models.cold_kernel`'s eviction), per op: one CPU thread, thread
clock, the first call's median over rounds, the second call beside it.

The kit prices a cold op per count (`cold_op_host_s`, `cold_backward_op_host_s`: fits on
chains of small unary ops, 1.2-3.6 us an op) and a memory kernel's cold code by L2 data
eviction (`cold_kernel`); the heads' backward ran nll_loss_backward 26-67 us in the
profile's cycle against 12-14 warm (bench/bench_op_context.py --backward). Whether an
op's cold cost is per op (the counts) or per kernel (its code's size) is what this reads.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_op_cold_code.py [--rounds 41]

Read here (2026-11-26, AMD EPYC, L2 2 MiB, load 24, 41 rounds; us, first call / warm):
gpt-tiny's head shapes (32 tokens, vocab 128): nll_loss_backward warm 3.9, after 4 MiB
written 6.8, after 36 other distinct ops 14.2, after both 17.4; _log_softmax_backward_data
7.6 / 14.8 / 27.4 / 33.1; mm 32x64x128 16.5 / 23.5 / 29.5 / 34.3; a second run (load
22): 4.0 / 6.5 / 18.7 / 33.4, 10.4 / 17.4 / 38.0 / 39.3, 11.0 / 17.1 / 32.0 / 43.1. Other
ops' code displaces an op's more than L2 data does, and by kernel: 10-15, 20-28 and
13-21 us over warm for these three, ~5-10x the count's per-op figure, which the fits
read on unary ops whose kernels are small (the load inflates all of it: re-measure
quiet). (Those runs used 36 other ops of their own; the other ops are now the kit's
probe's, `cost_models.op_cold_probe.other_ops`.)

With the kit's 72 other ops (load 6.9, 2026-11-26): nll_loss_backward 2.8 / 3.2 / 11.0 /
11.3, _log_softmax_backward_data 3.6 / 4.1 / 12.6 / 12.7, mm 6.9 / 7.3 / 13.5 / 13.7.
At load 7.5 the old 36 small ops left 7.6, 9.5 and 10.9: what evicts an op's code is the
other code run (its kind and amount), and the load inflates it. The kit now probes this
per op kind (`cost_models.op_cold_probe`) and prices the excess over a small unary op's
(`cost_models.op_cold_code`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.cold_kernel import first_and_second_ns  # noqa: E402
from cost_models.fresh_output import last_level_cache_bytes  # noqa: E402
from cost_models.op_cold_probe import OTHER_ELEMENTS, other_ops  # noqa: E402

EVICT_L2_MULTIPLE = 2  # as cost_models.cold_kernel's probe: twice the L2
TOKENS, VOCAB, HIDDEN = 32, 128, 64  # gpt-tiny's head at micro-batch 1


def timed_ops() -> dict:
    aten = torch.ops.aten
    log_probs = torch.log_softmax(torch.randn(TOKENS, VOCAB), 1)
    target = torch.randint(0, VOCAB, (TOKENS,))
    grad, total, ones = torch.tensor(1.0), torch.tensor(float(TOKENS)), torch.ones(TOKENS, VOCAB)
    a, b = torch.randn(TOKENS, VOCAB), torch.randn(VOCAB, HIDDEN)
    return {"nll_loss_backward": lambda: aten.nll_loss_backward(grad, log_probs, target, None,
                                                                1, -100, total),
            "_log_softmax_backward_data": lambda: aten._log_softmax_backward_data(
                ones, log_probs, 1, torch.float32),
            f"mm {TOKENS}x{HIDDEN}x{VOCAB}": lambda: torch.mm(a, b)}


def first_and_second_us(call, before, rounds: int) -> tuple[float, float]:
    """Medians of the first and the second call after `before` (cold_kernel's loop), us."""
    call(), call()
    # the thread's CPU time: a switch away does not count
    times = first_and_second_ns(call, before, rounds, time.thread_time_ns)
    return (statistics.median(t[0] for t in times) * 1e-3,
            statistics.median(t[1] for t in times) * 1e-3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    args = parser.parse_args()
    torch.set_num_threads(1)
    evict = torch.empty(EVICT_L2_MULTIPLE * last_level_cache_bytes(level=2) // 4)
    others, small = other_ops(), torch.randn(OTHER_ELEMENTS)
    befores = {"warm": lambda r: None,
               "after L2 written": lambda r: evict.fill_(float(r)),
               f"after {len(others)} other ops": lambda r: [op(small) for op in others],
               "after both": lambda r: (evict.fill_(float(r)), [op(small) for op in others])}
    print(f"load {os.getloadavg()[0]:.1f}; us, first / second call, median of {args.rounds}")
    for name, call in timed_ops().items():
        cells = [f"{b} {'%.1f / %.1f' % first_and_second_us(call, before, args.rounds)}"
                 for b, before in befores.items()]
        print(f"{name}: " + "; ".join(cells))
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
