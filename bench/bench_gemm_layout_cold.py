"""Does a GEMM pay cold code per operand layout, not per op name? One CPU thread, thread
clock, medians.

The cold-op counts (`ir.op_count`) count a pass's ops by overload name: a head's
backward whose forward ran `aten.mm` counts its two backward mms (dy @ W, both operands
contiguous; the weight gradient dy^T @ x, the first transposed) warm. The MKL/oneDNN
sgemm runs each transposition through its own packing code, so the forward's layout
(x @ W^T) may leave the backward's layouts cold. Each round: write EVICT_L2_MULTIPLE x
the L2 (code and data out), run a PRIME call of one layout on other tensors of the same
shape (its code warm, the target's data still out), then time the target call twice
(first, then warm). Every prime leaves the target's data equally cold, so the first
calls' differences between primes are code: the prime that matches the target's layout
leaves only the data's share; the forward's layout before a backward layout is the case
the counts call warm.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_gemm_layout_cold.py \\
        [--shapes 128x64x32,64x64x128] [--rounds 41]

Read here (2026-11-26, AMD EPYC, L2 2 MiB, 61 rounds, load 17; us, first / second call):
gpt-tiny's head weight gradient 128x64x32 (dy^T @ x) after an eviction and nothing 11.9
/ 9.5, after the forward's layout (x @ W^T) 9.9 / 9.2, after its own layout 9.9 / 9.2,
after dy @ W 10.5 / 9.2; its input gradient 32x64x128 (dy @ W) after nothing 10.0, after
x @ W^T 8.8, after itself 8.8; 64x128x32 alike (weight gradient 10.0 after the forward's
layout, 9.8 after itself). The sgemm's cold code is ~2 us a call and is shared by the
layouts: any mm run since the eviction warms the others to within 0.1-0.6 us. So the
in-cycle weight-gradient mm of gpt-tiny's head (18-23 us against 13 warm,
bench_op_context.py --backward) is not cold GEMM code for its layout, and counting the
cold ops by layout instead of by name would price ~0.1 us, not 5-10: not priced.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.fresh_output import last_level_cache_bytes  # noqa: E402
from bench.bench_op_cold_code import first_and_second_us  # noqa: E402
from cost_models.gemm_layouts import _layout_call  # noqa: E402

EVICT_L2_MULTIPLE = 2  # as cost_models.cold_kernel's probe: twice the L2
# (m, n, k): gpt-tiny's head at micro-batch 1 (32 tokens, hidden 64, vocab 128): its
# weight gradient (128 x 64 over 32 tokens) and input gradient (32 x 64 over 128), and a
# block's MLP weight gradient at micro-batch 16 (256 x 64 over 512 tokens)
SHAPES = ((128, 64, 32), (32, 64, 128), (256, 64, 512))
LAYOUTS = ("linear_nobias", "weight_grad", "mm")  # x @ W^T, dy^T @ x, dy @ W
PRIMES = ("none", *LAYOUTS)


def layout_cold(m: int, n: int, k: int, target: str, prime: str, rounds: int,
                evict: torch.Tensor) -> tuple[float, float]:
    """(median first call, median second call) of `target` after an eviction and `prime`."""
    call = _layout_call(target, m, n, k, torch.float32, "cpu")
    primer = _layout_call(prime, m, n, k, torch.float32, "cpu") if prime != "none" else None

    def before(r: int) -> None:
        evict.fill_(float(r))
        if primer is not None:
            primer(0)

    return first_and_second_us(lambda: call(0), before, rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    parser.add_argument("--rounds", type=int, default=41)
    args = parser.parse_args()
    torch.set_num_threads(1)
    evict = torch.empty(EVICT_L2_MULTIPLE * last_level_cache_bytes(level=2) // 4)
    print(f"load {os.getloadavg()[0]:.1f}; us: first / second call, median of {args.rounds}")
    for shape in args.shapes.split(","):
        m, n, k = map(int, shape.split("x"))
        for target in LAYOUTS:
            cells = []
            for prime in PRIMES:
                first_us, second_us = layout_cold(m, n, k, target, prime, args.rounds, evict)
                cells.append(f"{prime} {first_us:6.1f} / {second_us:5.1f}")
            print(f"{m}x{n}x{k} {target:13s} after: " + "; ".join(cells))
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
