"""`planner validate plan.json --nproc N [--steps K] [--json] [--calibrate --out spec.json]`.

Runs the plan on N local ranks (gloo on CPU, NCCL on GPUs) and prints predicted vs
measured peak memory per rank and median iteration time, and whether the losses equal a
single-process run; for fp32 and bf16 plans also whether the first step's gradient norms,
layer by layer, equal one process run under the plan's own precision policy (`--json`:
`grad_norms_match_reference`, `grad_norm_rtol`, `grad_norm_worst_layer`,
`grad_norm_worst_relative_error`; see `planner.trial.grad_check`). Make CPU plans for
this machine with
`planner plan MODEL --cluster local --gpus-per-node N --out plan.json`.
"""

from __future__ import annotations

import json
import os
import sys

from ir.errors import PlannerError
from ir.plan import load_plan
from planner.fmt import table

# A machine-speed reading beyond this factor either way (against the spec's profile) is
# drift the size of the time target itself: say so when it points the error's way.
DRIFT_WARNING = 1.25


def register(sub) -> None:
    p = sub.add_parser("validate", help="run a plan here and compare it with its prediction",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--nproc", type=int, required=True, help="processes to run (the plan's world size)")
    p.add_argument("--model", default=None, metavar="MODEL",
                   help="rebuild the model from this MODEL instead of the spec the plan "
                        "records (a factory package.module:function must be given here)")
    p.add_argument("--steps", type=int, default=5, help="timed steps after warm-up (5)")
    p.add_argument("--cluster", default=None,
                   help="re-estimate on this preset or spec JSON instead of the plan's prediction")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--calibrate", action="store_true",
                   help="fit the cluster spec to the measured time (framework overhead on CPU "
                        "processes, matmul efficiency on GPUs)")
    p.add_argument("--out", default=None, help="where --calibrate writes the spec JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from planner.trial.calibrate import write_calibrated
    from planner.trial.run import validate_plan

    if args.calibrate and not args.out:
        raise PlannerError("--calibrate needs --out SPEC.json (where the calibrated spec goes)")
    if args.out and not args.calibrate:
        raise PlannerError("--out is where --calibrate writes: add --calibrate")
    if args.nproc < 1:
        raise PlannerError(f"--nproc must be >= 1, got {args.nproc}")
    if args.out and os.path.isdir(args.out):
        raise PlannerError(f"--out {args.out} is a folder: give a file name such as spec.json")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise PlannerError(f"--out {args.out}: folder {os.path.dirname(os.path.abspath(args.out))} "
                           "does not exist; create it first (checked before the run)")
    doc = load_plan(args.plan)
    progress = None if args.json else (lambda msg: print(f"... {msg}", file=sys.stderr, flush=True))
    result = validate_plan(args.plan, args.nproc, steps=args.steps, cluster=args.cluster,
                           progress=progress, model_spec=args.model)
    fitted = (write_calibrated(doc, result, args.out, args.cluster, args.model)
              if args.calibrate else None)
    if args.json:
        out = result.to_json()
        if fitted is not None:
            out["calibrated"] = {"out": args.out, "matmul_efficiency": fitted.matmul_efficiency,
                                 "op_overhead_s": fitted.op_overhead_s,
                                 "note": fitted.notes.rsplit("; ", 1)[-1]}
        print(json.dumps(out, indent=2))
        return 0
    print(f"{result.model}: {result.plan} on {result.nproc} {result.backend} ranks "
          f"(prediction: {result.prediction_source})")
    rows = [[r.rank, r.predicted_peak_bytes, r.measured_peak_bytes, f"{100 * r.error:+.1f}%"]
            for r in result.ranks]
    print(table(["rank", "predicted peak B", "measured peak B", "error"], rows,
                right={0, 1, 2, 3}))
    print(f"iteration: predicted {result.predicted_iteration_seconds:.4g} s, measured "
          f"{result.measured_iteration_seconds:.4g} s (median of {len(result.step_seconds)}), "
          f"error {100 * result.time_error:+.1f}%")
    print(f"loss matches the single-process fp32 reference (within {result.loss_rtol:g} "
          f"relative): {'yes' if result.loss_matches_reference else 'NO'}")
    grads = result.grad_check
    if grads is not None:
        print(f"first-step gradient norms match the reference under the plan's precision "
              f"policy (each layer within {grads.rtol:g} relative): "
              f"{'yes' if grads.matches else 'NO'} (furthest: {grads.worst_layer or '-'}, "
              f"{grads.worst_relative_error:.1e})")
    drift = drift_line(result.machine_slowdown, result.time_error, result.host_op_s)
    if drift:
        print(drift)
    if fitted is not None:
        print(f"wrote {args.out}: {fitted.notes.rsplit('; ', 1)[-1]}")
    return 0


def drift_line(slowdown: float | None, time_error: float,
               host_op_s: tuple[float, float] | None = None) -> str | None:
    """The machine-speed reading for people (the spec's per-op host figure and this
    machine's now), with advice when it explains the error."""
    if slowdown is None:
        return None
    slower, faster = slowdown > DRIFT_WARNING, slowdown < 1 / DRIFT_WARNING
    explains = (slower and time_error < 0) or (faster and time_error > 0)
    advice = ": part of the time error is the machine; re-profile (planner profile-cluster)" \
        if explains else ""
    both = (f" ({host_op_s[1] * 1e6:.2f} us an op here now, {host_op_s[0] * 1e6:.2f} in the "
            "spec)" if host_op_s else "")
    return f"before the run, ops took x{slowdown:.2f} the time this spec was profiled at{both}{advice}"
