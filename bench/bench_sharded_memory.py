"""A DLRM whose tables total 3x what one process may hold trains on 4 gloo ranks.

Each rank caps its address space (RLIMIT_AS) at its footprint after start-up plus
BUDGET_BYTES, builds the model on the meta device, materializes only its shard of each
table (row-range, row-hash, column-wise, row-range reversed) from the counter-based
initializer, and trains MEMORY_STEPS steps with row-wise Adagrad; no rank could hold
the tables (3 x its budget), nor one whole table beside its shards. The test
(tests/test_sharded_embedding.py) runs the same phase at 64 MiB; this is the GB scale.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_sharded_memory.py [--budget-mib 512]

Prints each rank's held bytes and peak RSS and writes bench/results/bench_sharded_memory.json;
exits 1 when a rank's peak RSS grew past its budget or a loss is not finite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from planner.zoo import dlrm  # noqa: E402
from tests.dist_utils import spawn  # noqa: E402
from tests.sharded_phases import memory_phase  # noqa: E402

WORLD = 4
DIM = 32
TABLES = 4
BUDGET_MIB = 512  # 4 ranks x (3/4 x 512 MiB of shards + ~350 MiB of torch) ~ 3 GB in all
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "bench_sharded_memory.json")


def _worker(rank: int, world: int, payload: dict) -> dict:
    config = dlrm.Config(num_tables=TABLES, rows_per_table=payload["rows"], embedding_dim=DIM,
                         bottom_mlp=(32,), top_mlp=(32,), lookups_per_table=4)
    return memory_phase(rank, world, config, payload["budget_bytes"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-mib", type=int, default=BUDGET_MIB)
    args = parser.parse_args()
    budget = args.budget_mib << 20
    rows = 3 * budget // (TABLES * DIM * 4)  # the tables total exactly 3 budgets
    start = time.perf_counter()
    ranks = spawn(_worker, WORLD, {"rows": rows, "budget_bytes": budget}, timeout_s=1200)
    seconds = time.perf_counter() - start
    total = ranks[0]["tables_bytes"]
    print(f"{TABLES} tables x {rows:,} rows x {DIM} fp32 = {total / 2**20:,.0f} MiB; "
          f"budget {args.budget_mib} MiB per rank; {WORLD} ranks; {seconds:.0f} s")
    print(f"{'rank':>4} {'held MiB':>9} {'RSS start MiB':>14} {'peak RSS MiB':>13} "
          f"{'growth MiB':>11} {'losses':>20}")
    failures = []
    for rank, r in enumerate(ranks):
        growth = r["peak_rss_bytes"] - r["rss_start_bytes"]
        print(f"{rank:>4} {r['held_bytes'] / 2**20:>9.1f} {r['rss_start_bytes'] / 2**20:>14.0f} "
              f"{r['peak_rss_bytes'] / 2**20:>13.0f} {growth / 2**20:>11.0f} "
              f"{' '.join(f'{x:.4f}' for x in r['losses']):>20}")
        if growth >= budget or not all(math.isfinite(x) for x in r["losses"]):
            failures.append(f"rank {rank}: grew {growth / 2**20:.0f} MiB (budget "
                            f"{args.budget_mib}), losses {r['losses']}")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as fh:
        json.dump({"world": WORLD, "rows_per_table": rows, "dim": DIM, "tables": TABLES,
                   "budget_bytes": budget, "seconds": seconds, "ranks": ranks,
                   "failures": failures}, fh, indent=2)
    print(f"wrote {RESULTS}")
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
