"""What checkpointing adds to a one-rank step, term by term, against the estimate's terms.

Three one-rank plans of one model, NONE, FULL and SELECTIVE (bench_validate's gpt-1rank,
gpt-1rank-full and gpt-1rank-sel in its `--work-dir`), are built by the executor as
`planner validate` builds them (`planner.trial.rank._build`) in ONE process and stepped
interleaved (each plan takes each place in turn), so a slow spell of the shared host hits
all three; the main thread's CPU (time.thread_time) is split into the model's forward,
the backward call and, inside it, the recompute's rerun forward (each checkpointed
layer's forward called again, `bench_step_terms._time_recomputes`). Each mode's extra
over NONE, measured, against:

  forward extra       the machinery's forward (`checkpoint_probes.checkpoint_extra_seconds`,
                      summed over the layers at the plan's micro-batch) priced with a probe
                      taken in this process right after the steps (`checkpoint_host_seconds`:
                      the same moment), and with the spec's figures
  backward extra      the estimate's recompute (`layer_compute`'s recompute_s on the spec)
                      and, drift-free, the measured plain forward x the ops rerun / ops
                      (FULL; what the estimate charges the rerun, at this moment's speed)
                      + the machinery's recompute priced with the fresh probe
  rerun forward       measured, beside NONE's forward (information)

Read on 2026-11-26 (gpt-tiny, micro-batch 8, six runs at load 6-18): FULL's forward extra
swung 0.05-1.6 ms against ~0.8-1.1 priced (a checkpointed forward keeps no activations,
which saves the plain forward some of what the machinery costs), its backward extra
+2..+8% / -9..-11% of the drift-free price; SELECTIVE's forward extra -22..-29% of the
price from the tiny chains' SAC figures, -18..+10% read at the block's tensor size
(`selective_forward_op_figures`); its SAC recompute (SELECTIVE's backward less FULL's)
1.6-1.9 ms at load 6-8, about the 1.65 its figures give with the kept GEMMs at their
measured ~1.1 ms, 2.3-5.1 ms at load 12-18. Informative, not judged.

    .venv/bin/python bench/bench_recompute_terms.py [--work-dir DIR] [--steps 30]

Without --work-dir it profiles a spec and plans the three cases as bench_validate does
(`profile_specs`, `plan_case`: a minute or two), in a temporary folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench_step_terms import _time_recomputes  # noqa: E402
from one_rank import one_rank_payload, start_one_rank_group  # noqa: E402
from planner.fmt import table  # noqa: E402

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

CASES = ("gpt-1rank", "gpt-1rank-full", "gpt-1rank-sel")  # NONE, FULL, SELECTIVE
WARMUP_STEPS = 5


def build(path: str):
    """The plan's (ProcessModel, batches, doc, graph), built as a validate rank builds it."""
    from ir.plan import load_plan
    from planner.trial.predict import plan_graph
    from planner.trial.rank import _build

    doc = load_plan(path)
    graph = plan_graph(doc, path, None)
    payload = one_rank_payload(doc, path, graph, steps=1)
    return _build(payload, torch.device("cpu"), without_dropout=False), payload.batches, doc, graph


def measure(built: dict, steps: int) -> dict:
    """Median thread seconds per step of forward, backward and rerun forward, per case."""
    clock = time.thread_time
    acc: dict[str, float] = {}

    def add(key: str, seconds: float) -> None:
        acc[key] = acc.get(key, 0.0) + seconds

    _time_recomputes(clock, add)
    for pm, *_ in built.values():
        pm.module.register_forward_pre_hook(lambda *_: acc.__setitem__("_start", clock()))
        pm.module.register_forward_hook(lambda *_: add("forward", clock() - acc["_start"]))
    plain_backward = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        start = clock()
        try:
            return plain_backward(self, *args, **kwargs)
        finally:
            add("backward", clock() - start)
    torch.Tensor.backward = backward
    readings = {case: [] for case in built}
    names = list(built)
    try:
        for k in range(WARMUP_STEPS + steps):
            for case in names[k % 3:] + names[:k % 3]:
                pm, batches, *_ = built[case]
                acc.clear()
                pm.train_step(*batches[k % len(batches)])
                if k >= WARMUP_STEPS:
                    readings[case].append(dict(acc))
    finally:
        torch.Tensor.backward = plain_backward
        _time_recomputes(None, None)
    return {case: {key: statistics.median(r.get(key, 0.0) for r in rs)
                   for key in ("forward", "backward", "recompute (rerun forward)")}
            for case, rs in readings.items()}


def priced(doc, graph, mode, cal, spec) -> tuple[float, float, float]:
    """(machinery forward, machinery recompute, the estimate's recompute) seconds a step."""
    from cost_models.checkpoint_probes import checkpoint_extra_seconds
    from cost_models.common import model_layer_configs
    from cost_models.compute import layer_compute

    m = doc.plan.num_microbatches
    configs = model_layer_configs(graph, doc.plan, spec.device, None)
    hooks = [checkpoint_extra_seconds.uncached(layer, mode, cal, configs[j])
             for j, layer in enumerate(graph.layers)]
    recompute = sum(layer_compute(layer, doc.plan.layer_strategies[j], spec, configs[j]).recompute_s
                    for j, layer in enumerate(graph.layers))
    return m * sum(h[0] for h in hooks), m * sum(h[1] for h in hooks), m * recompute


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default=None,
                        help="bench_validate's --work-dir (its spec2.json and the three plans)")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.work_dir is None:  # profile and plan as bench_validate does, then remove
            args.work_dir = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="recompute_terms_"))
            _profile_and_plan(args.work_dir)
        return _run(args)


def _profile_and_plan(work_dir: str) -> None:
    from bench_validate import plan_case, profile_specs

    spec_path = profile_specs({1}, work_dir)[1]
    for case in CASES:
        plan_case(case, work_dir, spec_path)


def _error(priced_s: float | None, measured_s: float) -> float | None:
    """priced / measured - 1; None where nothing is priced or the extra read 0."""
    return None if priced_s is None or measured_s == 0 else priced_s / measured_s - 1


def _run(args) -> int:
    from cost_models.checkpoint_probes import checkpoint_host_seconds, rerun_ops
    from ir.cluster import ClusterSpec
    from ir.kernel_calibration import KernelCalibration
    from ir.strategy import Checkpoint

    start_one_rank_group()
    try:
        built = {case: build(os.path.join(args.work_dir, f"{case}.json")) for case in CASES}
        meas = measure(built, args.steps)
        fresh = KernelCalibration(measured_on="this run",
                                  **checkpoint_host_seconds("cpu").calibration_fields())
    finally:
        dist.destroy_process_group()
    spec = ClusterSpec.load(os.path.join(args.work_dir, "spec2.json"))
    plain = meas[CASES[0]]
    rows, records = [], []
    for case, mode in zip(CASES[1:], (Checkpoint.FULL, Checkpoint.SELECTIVE)):
        _, _, doc, graph = built[case]
        fwd_fresh, rec_fresh, _ = priced(doc, graph, mode, fresh, spec)
        fwd_spec, _, recompute_spec = priced(doc, graph, mode, spec.kernel_calibration, spec)
        rerun_share = (sum(rerun_ops(layer) for layer in graph.layers)
                       / sum(layer.ops_fwd for layer in graph.layers))
        m_fwd = meas[case]["forward"] - plain["forward"]
        m_bwd = meas[case]["backward"] - plain["backward"]
        drift_free = plain["forward"] * rerun_share + rec_fresh
        for term, m, p_fresh, p_spec in (
                ("forward extra", m_fwd, fwd_fresh, fwd_spec),
                ("backward extra", m_bwd, drift_free if mode is Checkpoint.FULL else None,
                 recompute_spec),
                ("rerun forward (NONE's forward)", meas[case]["recompute (rerun forward)"],
                 plain["forward"], None)):
            cells = [case, term, f"{m * 1e3:.3f}"]
            for p_s in (p_fresh, p_spec):
                err = _error(p_s, m)
                cells.append("" if p_s is None else f"{p_s * 1e3:.3f}" + (
                    "" if err is None else f" ({err:+.0%})"))
            rows.append(cells)
            records.append({"plan": case, "term": term, "measured_s": m,
                            "priced_probe_now_s": p_fresh, "priced_spec_s": p_spec})
    print(f"CPU ms per step (thread_time, median of {args.steps}, plans interleaved; load "
          f"{os.getloadavg()[0]:.1f}): each mode's extra over NONE against the estimate's")
    print(table(["plan", "term", "meas ms", "priced, probe now", "priced, spec"], rows,
                right={2, 3, 4}))
    print("probe now (us): " + ", ".join(
        f"{f} {getattr(fresh, f) * 1e6:.2f}" for f in (
            "checkpoint_call_forward_s", "checkpoint_op_forward_s", "checkpoint_saved_forward_s",
            "selective_forward_op_s", "selective_forward_kept_op_s",
            "selective_forward_op_sized_s", "selective_recompute_op_s")))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    out = os.path.join(RESULTS_DIR, "recompute_terms.json")
    with open(out, "w") as f:
        json.dump({"load": os.getloadavg()[0], "steps": args.steps, "rows": records}, f,
                  indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
