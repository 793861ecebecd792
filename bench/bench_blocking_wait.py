"""What a blocking gloo all-reduce waits for when the ranks computed just before it (issue
17: a DP gradient all-reduce inside the backward took 3-7x its time in a burst).

Each of `--nproc` gloo ranks (one thread each) times one all-reduce per message size in
four ways, ROUNDS calls each, medians:
  burst            back to back after a barrier (what the profile sweep times);
  compute          after COMPUTE_S of matmuls (what the backward does);
  compute_evict    the same, then EVICT_BYTES written (cache-cold buffers);
  compute_barrier  the same compute, then a barrier, then the call (peers in step, gloo's
                   threads awake).
For each call: wall time, the process's CPU time (every thread), the calling thread's
CPU time, how late the last peer entered the call (time.time(), one host), and the run
queue delay of all the process's threads (/proc/self/task/*/schedstat, field 2: time
runnable but not running). The stated check: the extra wall time after compute is not
CPU work, i.e. process CPU time grows by less than CPU_SHARE_LIMIT of it.

    .venv/bin/python bench/bench_blocking_wait.py [--nproc 2] [--sizes 32768,1048576]

Prints a table, writes bench/results/blocking_wait.json, exits 1 when the check fails.
On a shared machine only the ratios between the modes mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dist_utils import spawn  # noqa: E402
from planner.fmt import table  # noqa: E402

ROUNDS = 25
COMPUTE_S = 3e-3  # about one layer's backward in the bench_dp_phases cases
EVICT_BYTES = 16 * 2**20  # larger than this host's last-level cache share
MATMUL = 64  # edge of the square matmul the compute repeats
MODES = ("burst", "compute", "compute_evict", "compute_barrier")
# The check: more than this share of the extra wall time as CPU work would mean the call
# does more work after compute (cache misses, copies), not that it waits.
CPU_SHARE_LIMIT = 0.25


def _run_queue_s() -> float:
    total_ns = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as fh:
                total_ns += int(fh.read().split()[1])
        except OSError:  # a thread that ended meanwhile
            pass
    return total_ns / 1e9


def _rank(rank: int, world: int, sizes: list[int]) -> dict:
    a = torch.randn(MATMUL, MATMUL)
    evict = torch.empty(EVICT_BYTES // 4)

    def compute(evicting: bool) -> None:
        end = time.perf_counter() + COMPUTE_S
        while time.perf_counter() < end:
            torch.mm(a, a)
        if evicting:
            evict.fill_(1.0)

    out = {}
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        for _ in range(2):
            dist.all_reduce(x)
        for mode in MODES:
            rows = {k: [] for k in ("wall_s", "cpu_s", "thread_s", "peer_late_s", "run_queue_s")}
            for _ in range(ROUNDS):
                dist.barrier()
                if mode != "burst":
                    compute(mode == "compute_evict")
                if mode == "compute_barrier":
                    dist.barrier()
                entry = torch.tensor([time.time()], dtype=torch.float64)
                queue0 = _run_queue_s()
                wall0, cpu0, thread0 = time.perf_counter(), time.process_time(), time.thread_time()
                dist.all_reduce(x)
                rows["wall_s"].append(time.perf_counter() - wall0)
                rows["cpu_s"].append(time.process_time() - cpu0)
                rows["thread_s"].append(time.thread_time() - thread0)
                rows["run_queue_s"].append(_run_queue_s() - queue0)
                entries = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
                dist.all_gather(entries, entry)
                rows["peer_late_s"].append(max(e.item() for e in entries) - entry.item())
            out[nbytes, mode] = {k: statistics.median(v) for k, v in rows.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--sizes", default="32768,1048576")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "blocking_wait.json"))
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = spawn(_rank, args.nproc, sizes, timeout_s=900)
    rows, failed, records = [], [], []
    for nbytes in sizes:
        for mode in MODES:  # mean over ranks of each rank's medians
            m = {k: statistics.fmean(r[nbytes, mode][k] for r in results)
                 for k in results[0][nbytes, mode]}
            records.append({"bytes": nbytes, "mode": mode, **m})
            rows.append([nbytes, mode, *(f"{1e3 * m[k]:.3f}" for k in
                                         ("wall_s", "cpu_s", "thread_s", "peer_late_s",
                                          "run_queue_s"))])
        burst, after = (next(r for r in records if r["bytes"] == nbytes and r["mode"] == mode)
                        for mode in ("burst", "compute"))
        extra_s = after["wall_s"] - burst["wall_s"]
        if extra_s > 0 and after["cpu_s"] - burst["cpu_s"] > CPU_SHARE_LIMIT * extra_s:
            failed.append(f"{nbytes} B: CPU time grew {1e3 * (after['cpu_s'] - burst['cpu_s']):.2f}"
                          f" ms of {1e3 * extra_s:.2f} ms extra wall")
    print(f"{args.nproc} gloo ranks, load {os.getloadavg()[0]:.1f}, medians of {ROUNDS} calls, "
          "mean over ranks (ms)")
    print(table(["bytes", "mode", "wall", "proc cpu", "thread cpu", "peer late", "run queue"],
                rows, right={0, 2, 3, 4, 5, 6}))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"bench": "blocking_wait", "torch": torch.__version__, "cpus": os.cpu_count(),
                   "nproc": args.nproc, "load": os.getloadavg()[0], "rows": records}, fh,
                  indent=2)
    print(f"wrote {args.out}" + (f"; check failed: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
