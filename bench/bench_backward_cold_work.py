"""What a backward's cold ops cost by the work between its forward and its backward (issue
17): `cold_backward_probes.cold_backward_layers` run with one Linear's forward and backward
as the neighbour ("small") and with a transformer block's ("block"), alternating, ROUNDS
rounds in one process; per round each fit's figures (`cold_backward_cost`) and its chains'
(cold ops, cold inner ops, cold - warm us), then the medians and ranges. One thread.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_backward_cold_work.py [ROUNDS]

Read here (2026-11-25 11:38 UTC, load 4.8, 6 rounds): small 0.52 us a cold op (0.41-0.74),
0.26 an inner op (0.25-0.29); block 3.34 (3.07-3.40), 1.76 (1.57-1.81). The embedding bag
(1 + 19 inner) 5-6 us cold after the Linear, 32-37 after the block; 17 unary ops 8-15 vs
51-56. So the kit probes both (`cold_backward_calibration`'s points) and a layer's price
is read at its backward window's ops (`Layer.backward_after_ops`).
"""

from __future__ import annotations

import os
import resource
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.cold_backward_probes import cold_backward_cost, cold_backward_layers  # noqa: E402

MEMORY_CAP_BYTES = 6 << 30


def main(rounds: int) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))
    res = {"small": [], "block": []}
    for r in range(rounds):
        for kind in ("small", "block") if r % 2 == 0 else ("block", "small"):
            chains = cold_backward_layers("cpu", kind)
            cost = cold_backward_cost(chains)
            res[kind].append(cost)
            print(r, kind, f"op {cost.op_s * 1e6:.2f} inner {cost.inner_op_s * 1e6:.2f} rms "
                  f"{cost.residual_s * 1e6:.2f}", [(c.cold_ops, c.cold_inner_ops,
                                                    round(c.extra_s * 1e6, 1)) for c in chains],
                  flush=True)
    for kind, costs in res.items():
        ops, inner = [c.op_s * 1e6 for c in costs], [c.inner_op_s * 1e6 for c in costs]
        print(f"{kind}: {statistics.median(ops):.2f} us a cold op ({min(ops):.2f}-"
              f"{max(ops):.2f}), {statistics.median(inner):.2f} an inner op ({min(inner):.2f}-"
              f"{max(inner):.2f}); load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 6))
