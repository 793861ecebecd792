"""Rank start-up: spawned interpreters against forks of the preloaded server (`ir.launch`).

A launch is timed from the call that starts N ranks until every rank has imported what a
`planner validate` rank imports before its first step (the executors and
`planner.trial.rank`), joined a gloo group and passed a barrier, and all have exited.
Three ways, each round in a fresh process so that nothing is warm that should not be:
  spawn             torch.multiprocessing "spawn": every rank a new interpreter that
                    imports torch and the project itself (what validate did before);
  forkserver-cold   `ir.launch.start_ranks` in a process whose server is not running yet:
                    the server's imports are in the time (`planner validate`, once per run);
  forkserver-warm   a second launch from that process (tests, bench_validate's cases,
                    profile-cluster's re-measure): forks only.

    .venv/bin/python bench/bench_launch.py [--ranks 2,4] [--rounds 3]

Prints a table (median seconds per launch over the rounds, ranks started per second) and
writes bench/results/launch.json. Target: forks of a warm server start ranks faster than
spawn at every rank count, and a cold server does at 4 ranks (it imports once what 4
spawned ranks import 4 times). At 2 ranks on 2 cores a cold server's one import and two
spawned ranks' parallel imports take about the same wall time on a quiet machine, so
that row has no target. Exit status 1 when a target is missed or a launch fails.

Recorded 2026-11-24 23:42-23:48 UTC (torch 2.13 CPU, 2 cores shared with 7 other jobs at
load 8-19: re-measure on a quiet machine), 3 rounds, median (min-max) seconds per launch:
    ranks  spawn               forkserver-cold   forkserver-warm
    2      15.5 (15.5-42.0)    7.5 (6.6-11.0)    0.16 (0.15-0.26)
    4      44.0 (32.4-77.1)    7.2 (6.4-8.5)     0.41 (0.27-0.74)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

METHODS = ("spawn", "forkserver-cold", "forkserver-warm")
# (method, ranks) pairs that must start ranks faster than spawn at the same rank count
TARGETS = {("forkserver-warm", 2), ("forkserver-warm", 4), ("forkserver-cold", 4)}
LAUNCH_TIMEOUT_S = 600  # one round's process, on a 2-core host at load ~20


def _rank(rank: int, world: int, port: int) -> None:
    """Ready for a first step: a validate rank's imports, a gloo group, a barrier."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import executors.apply  # noqa: F401 - what run_rank imports before its first step
    import planner.trial.rank  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=LAUNCH_TIMEOUT_S))
    dist.barrier()
    dist.destroy_process_group()


def _one_round(how: str, world: int) -> dict[str, float]:
    """In a fresh process: seconds of one launch by `how` ("spawn" or "forkserver": then
    a cold and a warm launch)."""
    import torch.multiprocessing as mp

    from ir.launch import free_port, start_ranks

    seconds = {}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as folder:
        for method in (("spawn",) if how == "spawn" else ("forkserver-cold", "forkserver-warm")):
            start = time.perf_counter()
            if method == "spawn":
                context = mp.start_processes(_rank, args=(world, free_port()), nprocs=world,
                                             join=False, start_method="spawn")
            else:
                context = start_ranks(_rank, world, (world, free_port()), folder)
            while not context.join(timeout=1.0):
                pass
            seconds[method] = time.perf_counter() - start
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4", help="rank counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="launches per way and count")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "launch.json"))
    parser.add_argument("--one", nargs=2, metavar=("HOW", "RANKS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # a round, in its own process
        print(json.dumps(_one_round(args.one[0], int(args.one[1]))))
        return 0
    counts = [int(n) for n in args.ranks.split(",")]
    runs: dict[tuple[str, int], list[float]] = {(m, n): [] for m in METHODS for n in counts}
    load_before = os.getloadavg()[0]
    for round_index in range(args.rounds):
        for world in counts:
            order = ("spawn", "forkserver") if round_index % 2 == 0 else ("forkserver", "spawn")
            for how in order:  # alternated: a busy spell of a shared host hits both
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", how,
                                       str(world)], capture_output=True, text=True, cwd=ROOT,
                                      timeout=LAUNCH_TIMEOUT_S)
                if done.returncode != 0:
                    print(f"{how} on {world} ranks failed:\n{done.stderr[-3000:]}",
                          file=sys.stderr)
                    return 1
                for method, seconds in json.loads(done.stdout.splitlines()[-1]).items():
                    runs[method, world].append(seconds)
                print(f"round {round_index + 1}/{args.rounds}, {world} ranks, {how}: "
                      f"{json.loads(done.stdout.splitlines()[-1])}", file=sys.stderr)
    rows, records, missed = [], [], []
    for world in counts:
        spawn_s = statistics.median(runs["spawn", world])
        for method in METHODS:
            seconds = statistics.median(runs[method, world])
            target = (method, world) in TARGETS
            ok = seconds < spawn_s if target else None
            if ok is False:
                missed.append(f"{method} on {world} ranks: {seconds:.2f} s, spawn {spawn_s:.2f} s")
            rows.append([world, method, f"{seconds:.2f}", f"{min(runs[method, world]):.2f}",
                         f"{max(runs[method, world]):.2f}", f"{world / seconds:.2f}",
                         f"{spawn_s / seconds:.1f}x",
                         {True: "faster", False: "MISSED", None: "-"}[ok]])
            records.append({"ranks": world, "method": method, "median_seconds": seconds,
                            "seconds": runs[method, world], "ranks_per_second": world / seconds,
                            "speedup_over_spawn": spawn_s / seconds, "target": target,
                            "met": ok})
    from planner.fmt import table

    print(table(["ranks", "method", "median s", "min s", "max s", "ranks/s", "vs spawn",
                 "target"], rows, right={0, 2, 3, 4, 5, 6}))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"rounds": args.rounds, "cpus": os.cpu_count(),
                   "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
                   "results": records}, fh, indent=1)
    print(f"wrote {args.out}")
    for line in missed:
        print(f"MISSED: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
