"""`planner profile-device --device cuda|cpu --out spec.json [--quick] [--json]`: time
GEMMs, memory-bound kernels, SDPA backends and kernel launches on this device and write a
cluster spec carrying the tables.

    planner profile-device --device cpu --out spec.json
    planner estimate gpt-tiny --cluster spec.json
"""

from __future__ import annotations

import sys

from planner.arg_types import check_out
from planner.fmt import table

# Rows of the printed summary: GEMM shapes a person checks first.
SKINNY_ROWS = 4


def register(sub) -> None:
    p = sub.add_parser("profile-device", help="time this device's kernels, write a spec",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--device", required=True, choices=["cuda", "cpu"], help="where to measure")
    p.add_argument("--out", default=None, help="write the spec JSON here")
    p.add_argument("--name", default=None, help="cluster name in the spec (DEVICE-profiled)")
    p.add_argument("--quick", action="store_true",
                   help="a small grid (a smoke run; the CPU grid is always small)")
    p.add_argument("--json", action="store_true", help="print the spec JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from cost_models.fresh_output import KIND as FRESH_OUTPUT_KIND
    from cost_models.profile_device import check_device, profile_device
    from planner.train_loop_probe import with_train_loop

    check_out(args.out)
    check_device(args.device)
    progress = None if args.json else (lambda msg: print(f"... {msg}", file=sys.stderr,
                                                         flush=True))
    spec, cal = profile_device(args.device, quick=args.quick, name=args.name, progress=progress)
    if args.device == "cpu":  # the executor's own loop (CPU kits; planner.train_loop_probe)
        spec = with_train_loop(spec)
    if args.out:
        spec.save(args.out)
    if args.json:
        print(spec.to_json())
        return 0
    rows = []
    for dtype in sorted({p.dtype for p in cal.gemm}):
        best = cal.best_gemm(dtype)
        skinny = sorted((p for p in cal.gemm if p.dtype == dtype), key=lambda p: p.m)
        rows.append([dtype, f"{best.m}x{best.n}x{best.k}", f"{best.flop_per_s / 1e12:.2f}",
                     ", ".join(f"{p.m}x{p.n}x{p.k} {p.flop_per_s / 1e12:.2f}"
                               for p in skinny[:SKINNY_ROWS])])
    print(table(["dtype", "best m x n x k", "TFLOP/s", "smallest m (TFLOP/s)"], rows,
                right={2}))
    largest = {}  # each kernel at its largest size
    for p in cal.memory_kernels:
        if p.kernel not in largest or p.nbytes > largest[p.kernel].nbytes:
            largest[p.kernel] = p
    largest.pop(FRESH_OUTPUT_KIND, None)  # an extra per byte written, not a bandwidth
    memory = ", ".join(f"{p.kernel} {p.gbps:.0f} ({p.nbytes / 2**20:.0f} MiB)"
                       for p in largest.values())
    print(f"memory-bound kernels, largest size (GB/s, bytes read + written): {memory}")
    fresh = [p for p in cal.memory_kernels if p.kernel == FRESH_OUTPUT_KIND]
    if fresh:  # points store bytes over the extra seconds: 1024 / GB/s = ns per KiB
        print("writing outputs into blocks out of cache, extra ns per KiB: " + ", ".join(
            f"{1024 / p.gbps:.0f} at {p.nbytes // 2**10} KiB" for p in fresh)
            + f" (pool {cal.fresh_output_pool_bytes / 2**20:.0f} MiB)")
    sdpa = [[p.backend, f"{p.batch}x{p.heads}x{p.seq_len}x{p.head_dim}", p.dtype,
             f"{p.forward_s * 1e3:.3f}", f"{p.backward_s * 1e3:.3f}"] for p in cal.sdpa]
    print(table(["sdpa backend", "b x heads x s x d", "dtype", "fwd ms", "bwd ms"], sdpa,
                right={3, 4}))
    print(f"launch: host {cal.launch_host_s * 1e6:.2f} us per eager op, device "
          f"{cal.launch_device_s * 1e6:.2f} us per kernel (graph replay; 0: not measured)")
    print(f"spec: peak {', '.join(f'{d} {f / 1e12:.2f}' for d, f in spec.peak_flops_by_dtype)}"
          f" TFLOP/s, matmul_efficiency {spec.matmul_efficiency:.3f}, memory {spec.hbm_gbps:.0f}"
          f" GB/s, op overhead {spec.op_overhead_s * 1e6:.2f} us")
    if args.out:
        print(f"spec written to {args.out} (use: planner estimate MODEL --cluster {args.out})")
    return 0
