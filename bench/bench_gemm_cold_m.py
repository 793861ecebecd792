"""A small GEMM's cold code at m = 1 against m > 1: the excess `op_cold_probe` measures (the
call's first run after its OTHER_OPS_COUNT other distinct ops, over the run right after,
this thread's CPU clock, median of rounds) of the zoo's small Linear layers' ATen calls at
m (the micro-batch) = 1, 2, 4 and 16, minus the reference kind's (a small abs, what the
host's flat per-cold-op figure was fitted on), all kinds interleaved round by round so a
slow spell hits them alike:

    fwd    addmm(bias, x (m, k), weight.t() (k, n))      nn.Linear's forward
    dx     mm(grad (m, n), weight (n, k))                its grad input: m rows
    dw     mm(grad.t() (n, m), x (m, k))                 its grad weight: inner dim m

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_gemm_cold_m.py

Readings (2026-11-26 17:22 UTC, three runs of 31-41 rounds, load 1.3-1.4, reference
5.3-5.6 us, the kit's gemm probe 0.9-2.7 over it), us over the reference:
  fwd, n = 64 (mlp-small's first and hidden, dlrm's bottom first and top first):
      m = 1 -0.7..+1.5, m = 2 -0.4..+6.4, m = 4 3.9..8.3, m = 16 3.9..9.0
  fwd, n = 10 / 16 / 1: ~0 at m <= 4 (n = 1: at every m); n = 16 at m = 16 3-7
  dx: m = 1 -1.9..-1.3 in every layer, m = 16 -1.1..+5.9 (mostly ~2)
  dw: 1.3-5.7 at every m, m = 1 included (an outer product: MKL's GEMM code); the
      n = 1 layer's (a one-row output) -1.8..-0.2 at every m
Every call is MKL's SGEMM (MKL_VERBOSE=1; no oneDNN); a first call ever at m = 2 loaded
code m = 1 had not (92 us against 60; m = 4 then 13). Without the `call()` before the
other ops (another GEMM kind ran last) every kind read 1-10 us UNDER the reference: the
GEMM code that another shape ran stays partly warm across the 72 other ops.
A Linear's forward layout (addmm, bias + x @ weight.t()) read more than the plain mm the
kit's "gemm" probes (at 32 x 128 x 64: 7.4-9.1 us over the reference against the kit
probe's 0.7-0.9; 4 x 64 x 26: 4.8-5.3 against mm's 1.9-2.3; load 1.4). Priced as a kind of
its own (addmm at GEMM_PROBE_MNK, added by add_op_cold_code.py --kinds at load 1.6: 2.4 /
2.9 us over the reference against the saved gemm's 5.9 / 1.0), over 15% stayed 37 / 56 on
the two baselines, median |error| 7.9 -> 7.8% / 9.6 -> 9.8%: not kept.
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
from cost_models.op_cold_probe import (GEMM_PROBE_MNK, OTHER_ELEMENTS,  # noqa: E402
                                       REFERENCE_KIND, kind_calls, other_ops)

# (n, k) = (out_features, in_features) of the zoo's small layers: mlp-small's first,
# hidden and head (32 -> 64 -> 64 -> 10), dlrm-small's bottom (13 -> 64 -> 32 -> 16) and
# top (26 -> 64 -> 32 -> 1) first and last ones.
LAYER_NK = ((64, 32), (64, 64), (10, 64), (64, 13), (16, 32), (64, 26), (1, 32))
BATCHES = (1, 2, 4, 16)


def gemm_calls(batches, layer_nk) -> dict:
    """Per (pass, n, k, m), one call of the layer's ATen GEMM on warm tensors."""
    aten = torch.ops.aten
    calls = {}
    for n, k in layer_nk:
        weight, bias = torch.randn(n, k), torch.randn(n)
        for m in batches:
            x, grad = torch.randn(m, k), torch.randn(m, n)
            calls[("fwd", n, k, m)] = (lambda x=x, w=weight, b=bias: aten.addmm(b, x, w.t()))
            calls[("dx", n, k, m)] = (lambda g=grad, w=weight: aten.mm(g, w))
            calls[("dw", n, k, m)] = (lambda g=grad, x=x: aten.mm(g.t(), x))
    return calls


def measure(calls: dict, rounds: int) -> dict:
    """Per call, the median over `rounds` of its first-over-second CPU ns after the other ops,
    the calls interleaved within each round, each run once right before its other ops (as
    the kit's probe's rounds follow the kind's own last call, not another GEMM's)."""
    others, small = other_ops(), torch.randn(OTHER_ELEMENTS)
    clock = time.thread_time_ns
    extra = {key: [] for key in calls}
    for call in calls.values():
        call(), call()
    for _ in range(rounds):
        for key, call in calls.items():
            def before(_round, call=call):
                call()  # as in the kit's probe, its own call ran last before the other ops
                for op in others:
                    op(small)
            [(first, second)] = first_and_second_ns(call, before, 1, clock)
            extra[key].append(first - second)
    return {key: statistics.median(v) * 1e-3 for key, v in extra.items()}


def main(rounds: int) -> int:
    torch.set_num_threads(1)
    kit = kind_calls()
    calls = {("reference",): kit[REFERENCE_KIND], ("kit gemm",): kit["gemm"],
             **gemm_calls(BATCHES, LAYER_NK)}
    print(f"load before {os.getloadavg()[0]:.2f}; rounds {rounds}; torch {torch.__version__}")
    us = measure(calls, rounds)
    ref = us[("reference",)]
    print(f"reference {ref:.1f} us; kit gemm {GEMM_PROBE_MNK} excess over reference "
          f"{us[('kit gemm',)] - ref:.1f} us")
    print("cold excess over the reference, us (median of rounds)")
    print(f"{'pass':4} {'n':>3} {'k':>3} " + " ".join(f"m={m:<5}" for m in BATCHES))
    for n, k in LAYER_NK:
        for p in ("fwd", "dx", "dw"):
            print(f"{p:4} {n:3d} {k:3d} " + " ".join(f"{us[(p, n, k, m)] - ref:7.1f}"
                                                 for m in BATCHES))
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    sys.exit(main(parser.parse_args().rounds))
