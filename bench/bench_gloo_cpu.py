"""What gloo's own threads cost the host per collective call (issue 17): the CPU of a
rank's threads other than the caller's, per all-reduce, by message size and rank count.

Each rank runs CALLS blocking `all_reduce`s of a size between barriers and reads every
thread's CPU from `/proc/self/task/<tid>/schedstat` (field 1: time on the CPU) before and
after, with the thread's name (`/proc/self/task/<tid>/comm`): the calling thread's CPU,
gloo's threads' CPU and the wall time per call. Then the same all-reduces issued async
(as a replicate unit issues its gradient all-reduce) over SPIN_S of busy compute on the
calling thread, against the compute alone: the extra run-queue delay of the compute is
what gloo's threads took from it. Per-call gloo CPU is fitted as a + b x bytes (least
squares over the sizes) to compare with a step's gloo CPU (`bench_dp_phases`).

Read on 2026-11-25 at load 5-14 on 2 cores: gloo's threads (most of it `gloo_tcp_loop`)
took 0.13-0.33 ms per small all-reduce at 2 ranks and 0.4-2.3 ms at 4 (moving with the
call's wall time), ~0.3 ns per byte; an async 1-4 MiB all-reduce under 5 ms of compute
added 5-7 ms to the compute's run-queue delay at 2 ranks, a small one nothing.

    .venv/bin/python bench/bench_gloo_cpu.py [--ranks 2,4] [--calls 40]

CPU times move far less with load than wall times; the run-queue figure needs a quiet
machine to mean "this rank's own gloo threads". Prints a table, writes
bench/results/gloo_cpu.json; no target (a measurement), exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from bench.bench_kernel_sequence import line_fit  # noqa: E402
from planner.fmt import table  # noqa: E402

SIZES_BYTES = (4 << 10, 64 << 10, 1 << 20, 4 << 20)  # gpt-tiny's buckets span 4 KiB-4 MiB
SPIN_S = 5e-3  # compute the async all-reduce overlaps (a few layers' backward)


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds so far of each of this process's threads, by `name:tid`."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                cpu_ns = int(fh.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended
        out[f"{name}:{tid}"] = cpu_ns / 1e9
    return out


def _runqueue_s() -> float:
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as fh:
        return int(fh.read().split()[1]) / 1e9


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _rank(rank: int, world: int, port: int, calls: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    main = f":{threading.get_native_id()}"
    rows = []
    for nbytes in SIZES_BYTES:
        x = torch.ones(nbytes // 4)
        for _ in range(3):
            dist.all_reduce(x)
        dist.barrier()
        before, wall0 = _thread_cpu_s(), time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(x)
        wall = time.perf_counter() - wall0
        after = _thread_cpu_s()
        spent = {k: after[k] - before.get(k, 0.0) for k in after}
        caller = sum(s for k, s in spent.items() if k.endswith(main))
        others = {k.split(":")[0]: 0.0 for k in spent if not k.endswith(main)}
        for k, s in spent.items():
            if not k.endswith(main):
                others[k.split(":")[0]] += s
        # async over compute, against the compute alone, alternating
        alone, overlapped = [], []
        for _ in range(calls // 4):
            for with_call in (False, True):
                dist.barrier()
                q0 = _runqueue_s()
                work = dist.all_reduce(x, async_op=True) if with_call else None
                _spin(SPIN_S)
                (overlapped if with_call else alone).append(_runqueue_s() - q0)
                if work is not None:
                    work.wait()
        rows.append({"bytes": nbytes, "wall_s": wall / calls, "caller_cpu_s": caller / calls,
                     "gloo_cpu_s": sum(others.values()) / calls,
                     "by_thread_name": {k: s / calls for k, s in others.items()},
                     "spin_runqueue_alone_s": statistics.median(alone),
                     "spin_runqueue_overlapped_s": statistics.median(overlapped)})
    out[rank] = rows
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "gloo_cpu.json"))
    args = parser.parse_args(argv)
    results, rows = [], []
    for world in (int(n) for n in args.ranks.split(",")):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = mp.Manager().dict()
        mp.start_processes(_rank, args=(world, port, args.calls, out), nprocs=world,
                           start_method="spawn")
        ranks = [out[r] for r in range(world)]
        sizes = []
        for i, nbytes in enumerate(SIZES_BYTES):
            mean = lambda key: statistics.fmean(r[i][key] for r in ranks)  # noqa: E731
            sizes.append({key: mean(key) for key in ranks[0][i] if key != "by_thread_name"}
                         | {"bytes": nbytes, "by_thread_name": ranks[0][i]["by_thread_name"]})
            s = sizes[-1]
            rows.append([world, nbytes, f"{1e3 * s['wall_s']:.3f}",
                         f"{1e3 * s['caller_cpu_s']:.3f}", f"{1e3 * s['gloo_cpu_s']:.3f}",
                         f"{1e3 * s['spin_runqueue_alone_s']:.3f}",
                         f"{1e3 * s['spin_runqueue_overlapped_s']:.3f}"])
        per_call_s, per_byte_s = line_fit([s["bytes"] for s in sizes],
                                          [s["gloo_cpu_s"] for s in sizes])
        results.append({"ranks": world, "sizes": sizes, "gloo_cpu_per_call_s": per_call_s,
                        "gloo_cpu_per_byte_s": per_byte_s})
        rows.append([world, "fit", "", "", f"{1e6 * per_call_s:.1f} us + "
                     f"{1e12 * per_byte_s:.2f} ps/B", "", ""])
    print("per all-reduce call, mean over ranks: wall, caller's CPU, gloo threads' CPU; the "
          f"caller's run-queue delay over {1e3 * SPIN_S:.0f} ms of compute alone and with the "
          "call async under it")
    print(table(["ranks", "bytes", "wall ms", "caller CPU ms", "gloo CPU ms", "runq alone ms",
                 "runq overlapped ms"], rows, right={1, 2, 3, 4, 5, 6}))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"bench": "gloo_cpu", "torch": torch.__version__, "cpus": os.cpu_count(),
                   "load_avg": os.getloadavg(), "results": results}, fh, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
