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

With --forms it times instead the forms a TP all-reduce can take (issue 17), each after
FORMS_COMPUTE_S of matmuls, as the profile's probe does (loop with the call less loop
without, median of FORMS_ROUNDS pairs): `dist.all_reduce` (what DP and the plain wait
probe issue), funcol `all_reduce` + `wait_tensor`, and DTensor's Partial -> Replicate
redistribution (what TP issues); wall and calling-thread CPU per call, and the forms'
ratios to the plain call. Check: DTensor's form costs the calling thread more CPU than
the plain call (what `collective_probes.dtensor_extra_seconds` leaves to the TP
module probe is not negative). Writes bench/results/blocking_wait_forms.json.

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
FORMS = ("dist", "funcol", "dtensor")
FORMS_COMPUTE_S = 0.5e-3  # a TP block's compute between collectives on the tiny models
FORMS_CALLS = 16  # calls per timed loop
FORMS_ROUNDS = 7  # pairs of loops, the median kept


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


def _forms_rank(rank: int, world: int, sizes: list[int]) -> dict:
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    mesh = init_device_mesh("cpu", (world,))
    group = mesh.get_group()
    a = torch.randn(MATMUL, MATMUL)

    def loop(reps: int, op) -> tuple[float, float]:
        dist.barrier()
        wall0, thread0 = time.perf_counter(), time.thread_time()
        for _ in range(FORMS_CALLS):
            for _ in range(reps):
                torch.mm(a, a)
            if op is not None:
                op()
        return ((time.perf_counter() - wall0) / FORMS_CALLS,
                (time.thread_time() - thread0) / FORMS_CALLS)

    per_rep = torch.tensor([loop(200, None)[0] / 200])  # every rank busy at once
    dist.all_reduce(per_rep)
    reps = max(1, round(FORMS_COMPUTE_S / (per_rep.item() / world)))
    out = {}
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        partial = DTensor.from_local(x, mesh, [Partial()], run_check=False)
        ops = {"dist": lambda: dist.all_reduce(x, group=group),
               "funcol": lambda: funcol.wait_tensor(funcol.all_reduce(x, "sum", group)),
               "dtensor": lambda: partial.redistribute(mesh, [Replicate()]).to_local()}
        for form, op in ops.items():
            for _ in range(2):
                op()
            pairs = [(loop(reps, None), loop(reps, op)) for _ in range(FORMS_ROUNDS)]
            out[nbytes, form] = {k: statistics.median(call[i] - alone[i] for alone, call in pairs)
                                 for i, k in enumerate(("wall_s", "thread_s"))}
    return out


def forms(args, sizes: list[int]) -> int:
    results = spawn(_forms_rank, args.nproc, sizes, timeout_s=900)
    rows, records, failed = [], [], []
    for nbytes in sizes:
        m = {form: {k: statistics.fmean(r[nbytes, form][k] for r in results)
                    for k in ("wall_s", "thread_s")} for form in FORMS}
        for form in FORMS:
            ratio = m[form]["wall_s"] / m["dist"]["wall_s"] if m["dist"]["wall_s"] > 0 else 0.0
            records.append({"bytes": nbytes, "form": form, **m[form], "wall_over_dist": ratio})
            rows.append([nbytes, form, f"{1e3 * m[form]['wall_s']:.3f}",
                         f"{1e3 * m[form]['thread_s']:.3f}", f"{ratio:.2f}"])
        if m["dtensor"]["thread_s"] <= m["dist"]["thread_s"]:
            failed.append(f"{nbytes} B: DTensor's form took no more calling-thread CPU")
    print(f"{args.nproc} gloo ranks, load {os.getloadavg()[0]:.1f}, {FORMS_COMPUTE_S * 1e3} ms "
          f"compute, median of {FORMS_ROUNDS} loop pairs, mean over ranks (ms per call)")
    print(table(["bytes", "form", "wall", "thread cpu", "wall / dist"], rows,
                right={0, 2, 3, 4}))
    out = args.out.replace("blocking_wait.json", "blocking_wait_forms.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"bench": "blocking_wait_forms", "torch": torch.__version__,
                   "nproc": args.nproc, "load": os.getloadavg()[0], "rows": records}, fh,
                  indent=2)
    print(f"wrote {out}" + (f"; check failed: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--sizes", default="32768,1048576")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "blocking_wait.json"))
    parser.add_argument("--forms", action="store_true",
                        help="time a TP all-reduce's forms (plain, funcol, DTensor) instead")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.forms:
        return forms(args, sizes)
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
