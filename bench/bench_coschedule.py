"""What a TP collective costs when a node's processes outnumber its cores (issue 17), read
as `cost_models.coschedule_probes` reads it: `--nproc` gloo ranks in TP groups of `--tp`
consecutive ranks and DP groups across them (a tp x dp plan's placement), every process
at once, each timing loops of work alone, with a tiny TP-pair call after each gap, and
with every COUPLING_EVERY-th call across the pairs instead.

    .venv/bin/python bench/bench_coschedule.py [--nproc 4] [--tp 2]
        [--gaps 0.1,0.4,1.6]   # ms of the calling thread's CPU between calls

Prints, per gap, the mean over ranks of the seconds per call (`coschedule_summary`): the
wall a pair call adds to the work, the wall a call across the pairs adds beyond a pair
call, and the CPU a pair call costs the calling thread and gloo's threads; writes
bench/results/coschedule.json. Exits 1 when a pair call reads no wall time at all at any
gap (the probe would not be measuring a call). On a shared machine re-measure before
reading anything into the coupling column: at load 4-8 it moved 0.5-5 ms run to run.

Read on 2026-11-25, 2 cores, at load 5-8 (other agents' work), ms per call:
  4 processes: a pair call 1.0-1.5 at every gap (first version, plain dist.all_reduce:
  0.7-1.4 at 4 processes, 0.75-1.8 at 2, 1.2-4.4 at 8): no more than on 2 processes and
  about what a 4-process spec prices a TP call (fit + DTensor-form wait, 0.75-1.2); a call
  across the pairs added 2.5-3.7 at a 0.1 ms gap, 0.1-0.9 at 0.4, ~0 at 1.6 (two runs);
  the caller's CPU 0.12-0.23 and gloo's threads' 0.15-0.28 per call.
  8 processes: a pair call 1.3-2.0; a call across 9.3, 7.4, 4.3 at the three gaps.
Beside it, torch.profiler on rank 0 of gpt-tp2-dp2-sp (4 processes, load 7, profiler
on): per step 53 wait_tensor (69 ms) and 67 collective launches (~60 ms, 0.7-1.2 ms
each, wall inside the launching call; why, not measured) against 65 ms of tp + dp comm
priced; on 2 processes (gpt tp2 sp, dp1) launches were 1.1-1.4 ms each
too, so the launch's wall is not an effect of more processes than cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from cost_models.clusters import host_cores  # noqa: E402
from cost_models.coschedule_probes import (COUPLING_EVERY, coschedule_loops,  # noqa: E402
                                           coschedule_summary)
from dist_utils import spawn  # noqa: E402
from planner.fmt import table  # noqa: E402

PARTS = ("pair_call_s", "coupling_s", "caller_cpu_s", "other_threads_cpu_s")


def _rank(rank: int, world: int, payload) -> dict:
    tp, gaps_s = payload
    tp_group = dp_group = None
    for first in range(0, world, tp):  # every rank creates every group, in one order
        group = dist.new_group(list(range(first, first + tp)))
        if first <= rank < first + tp:
            tp_group = group
    for offset in range(tp):
        group = dist.new_group(list(range(offset, world, tp)))
        if rank % tp == offset:
            dp_group = group
    readings = coschedule_loops(dist, tp_group, dp_group, gaps_s)
    return {gap_s: dataclasses.asdict(coschedule_summary(gap_s, rounds))
            for gap_s, rounds in readings.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--gaps", default="0.1,0.4,1.6", help="ms of thread CPU")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "coschedule.json"))
    args = parser.parse_args(argv)
    gaps_s = tuple(float(g) * 1e-3 for g in args.gaps.split(","))
    if args.tp < 2 or args.nproc % args.tp or args.nproc // args.tp < 2:
        print(f"--tp {args.tp} must be >= 2 and divide --nproc {args.nproc} at least twice",
              file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    results = spawn(_rank, args.nproc, (args.tp, gaps_s), timeout_s=900)
    rows, records = [], []
    for gap_s in gaps_s:
        mean = {part: statistics.fmean(r[gap_s][part] for r in results) for part in PARTS}
        records.append({"gap_s": gap_s, **mean,
                        "pair_call_s_by_rank": [r[gap_s]["pair_call_s"] for r in results]})
        rows.append([f"{gap_s * 1e3:.2f}", *(f"{mean[part] * 1e3:.3f}" for part in PARTS)])
    cores = host_cores()
    print(f"{args.nproc} gloo ranks on {cores} cores, TP groups of {args.tp}, one call in "
          f"{COUPLING_EVERY} across them; load {load:.1f}; ms per call, mean over ranks")
    print(table(["gap ms", "pair call", "cross call extra", "caller CPU", "gloo CPU"], rows,
                right=set(range(5))))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"bench": "coschedule", "torch": torch.__version__, "cores": cores,
                   "nproc": args.nproc, "tp": args.tp, "coupling_every": COUPLING_EVERY,
                   "load": load, "rows": records}, fh, indent=2)
    failed = all(r["pair_call_s"] <= 0 for r in records)
    print(f"wrote {args.out}" + ("; check failed: a pair call added no wall time" if failed
                                 else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
