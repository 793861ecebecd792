"""`planner profile-cluster --nproc N [--backend gloo|nccl] [--out spec.json]`: measure
collectives and matmuls here and write a cluster spec.

    planner profile-cluster --nproc 2 --out spec.json
    planner estimate gpt-tiny --cluster spec.json --dp 2
"""

from __future__ import annotations

import json
import sys

from cost_models.profile_cluster import DEFAULT_MAX_BYTES, DEFAULT_MIN_BYTES, profile_cluster
from ir.errors import PlannerError
from planner.arg_types import byte_size, check_out, count
from planner.fmt import human_bytes, table
from planner.train_loop_probe import with_train_loop

# Collectives move float32 elements: a smaller message has nothing to send.
MIN_MESSAGE_BYTES = 4


def register(sub) -> None:
    p = sub.add_parser("profile-cluster", help="measure collectives and matmuls, write a spec",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=count(2, 1024, 2), required=True,
                   help="processes to spawn (>= 2)")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--min-bytes", default=DEFAULT_MIN_BYTES, type=byte_size,
                   help="smallest message (1K)")
    p.add_argument("--max-bytes", default=DEFAULT_MAX_BYTES, type=byte_size,
                   help=f"largest message ({human_bytes(DEFAULT_MAX_BYTES)}; 256M for the "
                        "full sweep)")
    p.add_argument("--name", default="local-profiled", help="cluster name in the spec")
    p.add_argument("--out", default=None, help="write the spec JSON here")
    p.add_argument("--json", action="store_true", help="print the spec JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    check_out(args.out)
    if args.min_bytes < MIN_MESSAGE_BYTES or args.max_bytes < args.min_bytes:
        raise PlannerError(f"--min-bytes {args.min_bytes} and --max-bytes {args.max_bytes}: "
                           f"need {MIN_MESSAGE_BYTES} <= min <= max (e.g. --min-bytes 1K "
                           "--max-bytes 64M)")
    if not args.name.strip() or args.name != args.name.strip():
        raise PlannerError(f"--name {args.name!r}: give a non-empty name without surrounding "
                           "spaces")
    print(f"profiling {args.nproc} processes on {args.backend} ...", file=sys.stderr)
    spec, raw = profile_cluster(args.nproc, args.backend, max_bytes=args.max_bytes,
                                min_bytes=args.min_bytes, name=args.name)
    spec = with_train_loop(spec)  # the executor's own loop (planner.train_loop_probe)
    if args.out:
        spec.save(args.out)
    if args.json:
        print(spec.to_json())
        return 0
    rows = []
    tables = spec.calibration
    for fit in tables.collective_fits:
        if fit.scope != "intra_node":
            continue
        largest = raw[fit.collective, fit.measured_ranks][-1]
        rows.append([fit.collective, fit.measured_ranks, f"{fit.alpha_s * 1e6:.1f}",
                     f"{fit.bytes_per_s / 1e9:.3f}", human_bytes(largest[0]),
                     f"{largest[1] * 1e3:.2f}"])
    print(table(["collective", "group", "alpha us", "GB/s", "largest", "ms"], rows,
                right={1, 2, 3, 5}))
    flops = ", ".join(f"{d} {f / 1e9:.1f} GFLOP/s" for d, f in spec.peak_flops_by_dtype)
    print(f"matmul: {flops}; memory copy {spec.hbm_gbps:.1f} GB/s")
    if spec.host_bound:  # the framework-overhead figures CPU processes pay
        units = ", ".join(str(r) for r in tables.dp_overheads if r.group_size is not None)
        tp = ", ".join(str(r) for r in tables.tp_modules)
        optimizer = ", ".join(str(r) for r in tables.optimizer_steps)
        print(f"per op {spec.op_overhead_s * 1e6:.1f} us (+{spec.dtensor_op_overhead_s * 1e6:.1f} "
              f"us on DTensors); random draw {spec.random_element_s * 1e9:.1f} ns/element; "
              f"DP unit: {units}; TP module: {tp or 'not measured'}; "
              f"optimizer step: {optimizer or 'not measured'}")
        waits = ", ".join(str(r) for r in tables.blocking_waits)
        print(f"blocking-call wait between computing processes: {waits or 'not measured'}")
    if args.out:
        print(f"spec written to {args.out} (use: planner estimate MODEL --cluster {args.out})")
    return 0
