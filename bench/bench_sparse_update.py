"""The sparse optimizer step costs what the batch touched, not what the table holds.

Sweep 1: tables of 1e5, 1e6 and 4e6 rows x 64 (fp32), the same 4096 touched rows (each
looked up twice: the step coalesces duplicates first). Sweep 2: a 1e6-row table, 1e3 to
1e5 touched rows. Each point is the fastest of REPEATS timed `SparseRowOptimizer.step()`
calls (coalesce + update) after a warm-up, each begun with the table evicted
from the caches (as between training steps), for row-wise SGD, row-wise Adagrad and lazy
Adam (Adam only to 1e6 rows: its two moments triple the table's 1 GB at 4e6).

    .venv/bin/python bench/bench_sparse_update.py [--repeats 20]

Prints a table, writes bench/results/bench_sparse_update.json, and exits 1 when, at
equal touched rows, the largest table's step takes more than MAX_SLOWDOWN x the
smallest's (a step that scanned the table would take ~40x).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from executors.sharded_embedding import ReplicatedEmbedding, ShardedTables  # noqa: E402
from executors.sparse_optimizer import SparseOptimizerSpec, SparseRowOptimizer  # noqa: E402
from ir.embedding_tables import EmbeddingTable, TablePlacement, TableSharding  # noqa: E402

DIM = 64
TABLE_ROWS = (100_000, 1_000_000, 4_000_000)
TOUCHED_ROWS = 4096  # a DLRM batch of 4096 one-hot lookups into one table, at most
TOUCHED_SWEEP = (1_000, 10_000, 100_000)
SWEEP_TABLE_ROWS = 1_000_000
LOOKUPS_PER_ROW = 2  # every touched row appears twice in the gradient: coalescing is timed
ADAM_MAX_ROWS = 1_000_000
MAX_SLOWDOWN = 2.0  # the bar: step time grows with touched rows, not table size
ADDRESS_SPACE_CAP_BYTES = 6 << 30  # the 4e6-row table is 1 GB; fail, not swap, beyond 6 GiB
# Written between timed steps so every step starts with the table out of the caches, as
# in training (forward, backward and the dense layers run in between); 64 MiB is over
# the last-level cache of the CPUs this runs on (lscpu: 32 MiB L3 or less).
EVICT_BYTES = 64 << 20
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "bench_sparse_update.json")


def _one_table(rows: int) -> ShardedTables:
    table = EmbeddingTable("bench", rows, DIM, "float32", "sum", 1)
    weight = torch.empty(rows, DIM).uniform_(-0.01, 0.01)  # every page written: a real table
    module = ReplicatedEmbedding(table, TablePlacement("bench", TableSharding.REPLICATED, (0,)),
                                 weight)
    return ShardedTables({"bench": module})


def time_step(kind: str, rows: int, touched: int, repeats: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one optimizer step touching `touched` random rows:
    the fastest of `repeats`. CPU time (this thread's, time.thread_time) is the measure:
    on a shared machine the wall clock also counts the time other processes held the
    core (seen here: 0.5 ms of work taking 2-15 ms of wall time at load 17 on 2 cores)."""
    tables = _one_table(rows)
    weight = tables.modules["bench"].weight
    opt = SparseRowOptimizer(tables, SparseOptimizerSpec(kind, lr=0.01))
    g = torch.Generator().manual_seed(rows + touched)
    cpu, wall = [], []
    evict = torch.zeros(EVICT_BYTES // 4)
    for i in range(repeats + 1):
        ids = torch.randperm(rows, generator=g)[:touched].repeat(LOOKUPS_PER_ROW)
        values = torch.randn(len(ids), DIM, generator=g)
        weight.grad = torch.sparse_coo_tensor(ids[None], values, weight.shape,
                                              check_invariants=False)
        evict.add_(1.0)  # the caches now hold this buffer, not the table
        start_wall, start_cpu = time.perf_counter(), time.thread_time()
        opt.step()
        if i:  # the first is the warm-up
            cpu.append(time.thread_time() - start_cpu)
            wall.append(time.perf_counter() - start_wall)
    return min(cpu), min(wall)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP_BYTES, hard))
    torch.set_num_threads(1)
    rows_out, failures = [], []
    print(f"{'optimizer':<16} {'table rows':>11} {'touched':>8} {'cpu ms':>8} {'wall ms':>8} "
          f"{'us/row':>7}")
    for kind in ("sgd", "rowwise_adagrad", "adam"):
        by_size = {}
        for rows in TABLE_ROWS:
            if kind == "adam" and rows > ADAM_MAX_ROWS:
                continue
            seconds, wall = time_step(kind, rows, TOUCHED_ROWS, args.repeats)
            by_size[rows] = seconds
            rows_out.append({"optimizer": kind, "table_rows": rows, "touched_rows": TOUCHED_ROWS,
                             "step_cpu_seconds": seconds, "step_wall_seconds": wall,
                             "sweep": "table_size"})
            print(f"{kind:<16} {rows:>11,} {TOUCHED_ROWS:>8,} {seconds * 1e3:>8.3f} "
                  f"{wall * 1e3:>8.3f} {seconds / TOUCHED_ROWS * 1e6:>7.3f}")
        small, large = min(by_size), max(by_size)
        ratio = by_size[large] / by_size[small]
        print(f"{'':<16} {large:,} rows / {small:,} rows: {ratio:.2f}x")
        if ratio > MAX_SLOWDOWN:
            failures.append(f"{kind}: {large:,}-row step {ratio:.2f}x the {small:,}-row step "
                            f"at {TOUCHED_ROWS} touched rows (bar {MAX_SLOWDOWN}x)")
        for touched in TOUCHED_SWEEP:
            seconds, wall = time_step(kind, SWEEP_TABLE_ROWS, touched, args.repeats)
            rows_out.append({"optimizer": kind, "table_rows": SWEEP_TABLE_ROWS,
                             "touched_rows": touched, "step_cpu_seconds": seconds,
                             "step_wall_seconds": wall, "sweep": "touched_rows"})
            print(f"{kind:<16} {SWEEP_TABLE_ROWS:>11,} {touched:>8,} {seconds * 1e3:>8.3f} "
                  f"{wall * 1e3:>8.3f} {seconds / touched * 1e6:>7.3f}")
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as fh:
        json.dump({"dim": DIM, "repeats": args.repeats, "max_slowdown": MAX_SLOWDOWN,
                   "torch": torch.__version__, "machine": platform.machine(),
                   "rows": rows_out, "failures": failures}, fh, indent=2)
    print(f"wrote {RESULTS}")
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
