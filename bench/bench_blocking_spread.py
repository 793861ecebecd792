"""How far the blocking-wait probe's reading, and with it a plan's predicted DP term, moves
between profiles, at two probe lengths (issue 17: gpt-ddp2's dp_comm read 8.6-14.3 ms
between profile-cluster runs; its gradient all-reduces pay `comm.blocking_s`, the fit
plus the wait `collective_probes.blocking_seconds` measured).

On --nproc gloo ranks, --repeats times over, the all-reduce's blocking probe runs with
each of --rounds (alternately, so a slow spell of the shared machine meets both), and
each reading becomes the spec's wait line (`host_overhead_fit.blocking_wait`, the fit of
--spec) and the plan's predicted dp_comm (--plan, priced on --spec with that wait). The
spread (max - min over repeats, and relative to the median) says how stable each length
makes the term; the two lengths' medians should agree (the same quantity).

    .venv/bin/python bench/bench_blocking_spread.py --spec SPEC.json --plan PLAN.json
        [--nproc 2] [--repeats 3] [--rounds 7,21]

Read on 2026-11-26 13:59 UTC, 2 ranks, load 3.2 -> 2.9 (other sessions' timings on the
same 2 cores), gpt-ddp2 on a spec profiled at 13:55, 5 repeats: dp_comm 4.24-12.29 ms
(median 6.87, spread 117%) at 7 rounds (the profile's BLOCKING_PROBE_ROUNDS), 4.24-10.77
(7.46, 88%) at 21, 4.24-8.98 (6.54, 73%) at 41. Within a repeat the lengths move
together (repeat 3 read a 0 wait at all three; repeat 1 0.65-1.15 ms): the swing is the
machine's state at the moment of the probe (what the other processes run), not the
probe's sampling, so more rounds narrow it only a little; the median stays ~7 ms.

Informative: prints a table with the load (`os.getloadavg`) at start and end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from dist_utils import spawn  # noqa: E402
from planner.fmt import table  # noqa: E402


def _rank(rank: int, world_size: int, payload) -> list:
    import torch.distributed as dist

    from cost_models.collective_probes import blocking_seconds

    repeats, lengths = payload
    readings = []  # (repeat, rounds, [(bytes, s)])
    for repeat in range(repeats):
        order = lengths if repeat % 2 == 0 else tuple(reversed(lengths))
        for rounds in order:
            got = blocking_seconds(dist, rank, None, rounds=rounds, only=("all_reduce",))
            readings.append((repeat, rounds, got["all_reduce"]))
    return readings


def _dp_term_s(plan_path: str, spec, readings, nproc: int) -> tuple[float, float]:
    """(the wait at 0 bytes, the plan's predicted dp_comm) with this reading's wait."""
    from cost_models.host_overhead_fit import blocking_wait
    from ir.plan import load_plan
    from planner.trial.predict import plan_graph, predict

    fits = {(f.collective, f.measured_ranks): f for f in spec.calibration.collective_fits
            if f.scope == "intra_node"}
    waits = blocking_wait({nproc: {"all_reduce": readings}}, fits)
    others = tuple(w for w in spec.calibration.blocking_waits
                   if (w.collective, w.group_size) != ("all_reduce", nproc))
    priced = spec.with_calibration(blocking_waits=others + waits)
    doc = load_plan(plan_path)
    graph = plan_graph(doc, plan_path, None)
    return waits[0].seconds, predict(doc, graph, priced).time_breakdown["dp_comm"]


def main() -> int:
    from ir.cluster import ClusterSpec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", default="7,21")
    args = parser.parse_args()
    lengths = tuple(int(r) for r in args.rounds.split(","))
    spec = ClusterSpec.load(args.spec)
    load_start = os.getloadavg()[0]
    readings = spawn(_rank, args.nproc, (args.repeats, lengths), timeout_s=1800)[0]
    load_end = os.getloadavg()[0]
    rows, by_length = [], {}
    for repeat, rounds, reading in readings:
        wait_s, dp_s = _dp_term_s(args.plan, spec, reading, args.nproc)
        by_length.setdefault(rounds, []).append(dp_s)
        rows.append([repeat, rounds, *(f"{s * 1e3:.3f}" for _, s in reading),
                     f"{wait_s * 1e3:.3f}", f"{dp_s * 1e3:.2f}"])
    print(table(["repeat", "rounds", "32K call ms", "1M call ms", "wait ms", "dp_comm ms"],
                rows))
    for rounds, terms in sorted(by_length.items()):
        median = statistics.median(terms)
        print(f"rounds {rounds}: dp_comm {min(terms) * 1e3:.2f}-{max(terms) * 1e3:.2f} ms, "
              f"median {median * 1e3:.2f}, spread {(max(terms) - min(terms)) / median:.0%}")
    print(f"load {load_start:.2f} -> {load_end:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
