"""gloo's reduce-scatter against the executor's in place one (`GlooReduceScatter`): time.

ZeRO-2/3 units on gloo reduce with `ir.gloo_collectives.GlooReduceScatter` (an
in-place all-reduce in FSDP2's copy-in buffer, then this rank's chunk copied out) instead
of gloo's `reduce_scatter_single`, which clones the input and all-reduces the clone
(issue 17: that clone outlived the call on some runs). The same all-reduce runs either
way, so the in-place one must cost nothing: each rank times both, alternating their
order, on buffers of a llama-tiny block (43,136 fp32) and of a larger unit (4 Mi fp32).

    .venv/bin/python bench/bench_gloo_reduce_scatter.py [--nproc 4] [--calls 60]

Prints the median per call (mean over ranks), writes bench/results/gloo_reduce_scatter.json
and exits 1 when the in-place median exceeds gloo's by more than SLOWER_LIMIT. On a loaded
shared machine single calls move by milliseconds: re-measure on a quiet one.
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

# fp32 elements: one llama-tiny decoder block (the unit of issue 17's case), and a larger
# unit whose copy, not the call's start-up, dominates
NUMELS = (43_136, 4 << 20)
SLOWER_LIMIT = 0.10  # "costs nothing": within the noise of a median on this machine
WARMUP_CALLS = 10  # dropped from each median (first connections, page faults)


def _rank(rank: int, world_size: int, calls: int) -> dict:
    from ir.gloo_collectives import GlooReduceScatter

    group, in_place = dist.group.WORLD, GlooReduceScatter()
    out = {}
    for numel in NUMELS:
        data = torch.randn(numel)
        output = torch.empty(numel // world_size)
        runs = {"gloo": lambda x: dist.reduce_scatter_single(output, x, group=group),
                "in place": lambda x: in_place(output, x, group)}
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for call in range(calls):
            for name in (list(runs) if call % 2 else list(runs)[::-1]):
                buffer = data.clone()  # FSDP2 hands each call a fresh copy-in buffer
                dist.barrier()
                start = time.perf_counter()
                runs[name](buffer)
                seconds[name].append(time.perf_counter() - start)
        out[numel] = {name: statistics.median(s[WARMUP_CALLS:]) for name, s in seconds.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "gloo_reduce_scatter.json"))
    args = parser.parse_args(argv)
    if args.calls <= WARMUP_CALLS:
        raise SystemExit(f"--calls must exceed the {WARMUP_CALLS} warm-up calls")
    results = spawn(_rank, args.nproc, args.calls, timeout_s=900)
    rows, records, failed = [], [], []
    for numel in NUMELS:
        m = {name: statistics.fmean(r[numel][name] for r in results) for name in results[0][numel]}
        ratio = m["in place"] / m["gloo"]
        records.append({"numel": numel, "gloo_s": m["gloo"], "in_place_s": m["in place"],
                        "ratio": ratio})
        rows.append([numel, f"{1e3 * m['gloo']:.3f}", f"{1e3 * m['in place']:.3f}",
                     f"{ratio:.2f}"])
        if ratio > 1 + SLOWER_LIMIT:
            failed.append(f"{numel} elements: in place {ratio:.2f}x gloo's time")
    print(f"{args.nproc} gloo ranks, load {os.getloadavg()[0]:.1f}, medians of "
          f"{args.calls - WARMUP_CALLS} calls, mean over ranks (ms)")
    print(table(["fp32 elements", "gloo", "in place", "ratio"], rows, right={0, 1, 2, 3}))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"bench": "gloo_reduce_scatter", "torch": torch.__version__,
                   "nproc": args.nproc, "load": os.getloadavg()[0], "rows": records}, fh,
                  indent=2)
    print(f"wrote {args.out}" + (f"; target missed: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
