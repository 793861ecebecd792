"""What the host probe's function chain pays for running its calls in order, over the
same calls each in a tight loop: the context the kit's forward per-op, per-node and
per-call figures are read in (`host_probes.host_op_seconds_by_pass`), which the host model
applies to layers of other mixes (`host_dispatch.forward_host_seconds`).

Chains of `clusters._overhead_block`'s calls as functions (F.linear, F.layer_norm, exact
F.gelu, F.relu) on the probe's 2 x 8 inputs, grad on (a layer's forward) and off (the
kit's per-op figure), each timed in order (min-of-rounds medians, the thread clock) and
against the sum of its calls' tight loops; the probe's own chain (lin-ln-gelu-lin, its 5
distinct ATen ops: `host_probes.HOST_OP_CHAIN_DISTINCT_OPS`) and the mixes of the small
layers the model over-prices at micro-batch 1 (mlp-small's and dlrm's Linear + ReLU).

Read here (2 cores shared with other sessions, load 2.3, 2026-11-26 13:50 UTC), in order
over tight loops, grad off / on: lin-ln-gelu-lin 1.55 / 1.53, lin-ln-relu-lin 1.49 /
1.44, lin-gelu 1.39 / 1.38, lin-relu 1.24 / 1.30, lin-lin 1.10 / 1.10, relu-relu 1.13 /
1.12; one block or eight in the chain, the same per block (not the working set). The
kit's figures thus hold ~1.5x the chain's calls' tight loops, while the layers it prices
run at 1.1-1.3x theirs, and the in-sequence line (`sequence_probes`, knee 0, 87 ns per op
per distinct op on the 13:43 kit) credits the chain's 5 distinct ops with 0.44 us an op
where it paid ~2.8. bench_small_pass_terms reads the consequence: every small layer's
warm part over-priced at every micro-batch, its entry under-priced more the larger the
batch (its docstring).

Read again 14:33 UTC (load 1.0), grad off / on: lin-ln-gelu-lin 1.24 / 1.22 (~0.84 us an
op over its loops, grad on), lin-relu 1.13 / 1.18, lin-lin 1.00 / 1.03: the premium moves
with the load. The two-segment in-sequence fit (`sequence_probes`, three draws of the
pool) reads ~0.37 us an op at the chain's 5 distinct ops; netting the chain's own reading
(~0.84) instead, as a what-if (the credited distinct ops raised to 18, where the fit reads
0.84), priced km_base's timings 37 -> 51 rows over 15% and the 14:29 fresh spec's 18 -> 24:
the layers' forward figures hold at the fit's level, not the chain's.

    .venv/bin/python bench/bench_chain_premium.py [--out bench/results/chain_premium.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.clusters import OP_OVERHEAD_WIDTH  # noqa: E402
from planner.fmt import table  # noqa: E402

CALLS, WARMUP, ROUNDS = 400, 30, 7  # calls per timing (hundreds of us), untimed, rounds
CHAINS = {"lin-ln-gelu-lin": ("lin1", "ln", "gelu", "lin2"),  # the kit's block
          "lin-ln-relu-lin": ("lin1", "ln", "relu", "lin2"), "lin-gelu": ("lin1", "gelu"),
          "lin-relu": ("lin1", "relu"), "lin-lin": ("lin1", "lin2"),
          "relu-relu": ("relu", "relu")}


def per_call_us(fn) -> float:
    """Median over ROUNDS of `fn`'s per-call thread-clock microseconds over CALLS calls."""
    rounds = []
    for _ in range(ROUNDS):
        for _ in range(WARMUP):
            fn()
        start = time.thread_time()
        for _ in range(CALLS):
            fn()
        rounds.append((time.thread_time() - start) / CALLS * 1e6)
    return statistics.median(rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "results", "chain_premium.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    width = OP_OVERHEAD_WIDTH
    x = torch.randn(2, width)
    lin1, lin2, norm = nn.Linear(width, width), nn.Linear(width, width), nn.LayerNorm(width)
    calls = {"lin1": lambda y: F.linear(y, lin1.weight, lin1.bias),
             "lin2": lambda y: F.linear(y, lin2.weight, lin2.bias),
             "ln": lambda y: F.layer_norm(y, (width,), norm.weight, norm.bias),
             "gelu": F.gelu, "relu": F.relu}
    rows, doc = [], {"bench": "chain_premium", "chains": {}}
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            tight = {name: per_call_us(lambda c=call: c(x)) for name, call in calls.items()}

            for name, chain in CHAINS.items():
                def in_order(chain=chain):
                    y = x
                    for key in chain:
                        y = calls[key](y)
                    return y

                order_us, loops_us = per_call_us(in_order), sum(tight[k] for k in chain)
                rows.append([name, "on" if grad else "off", f"{order_us:.2f}",
                             f"{loops_us:.2f}", f"{order_us / loops_us:.2f}"])
                doc["chains"][f"{name}/grad_{'on' if grad else 'off'}"] = dict(
                    in_order_us=order_us, tight_loops_us=loops_us)
    print(table(["chain", "grad", "in order us", "tight loops us", "ratio"], rows))
    doc["load_average_1min"] = os.getloadavg()[0]
    print(f"load average {doc['load_average_1min']:.1f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
