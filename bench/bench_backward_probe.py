"""A/B of the kit's per-pass host probe (`cost_models.host_probes.host_op_seconds_by_pass`)
against a git revision's, on bench_kernel_model's rows (issue 17: small layers' backward
over-predicted).

One `profile_device("cpu")` spec; then ROUNDS rounds, each: the old revision's probe and
this tree's (alternating which runs first), a spec from each (the probe's figures put into
the one spec: per-op totals and `HostOpCost.calibration_fields`), and one timing of every
unique layer (`layer_profile.profile_graph`), each row predicted with both specs
(`bench_kernel_model.measure_model`). So the two kits are judged on the same timings,
their probes run in the same minute. Prints per round the median |error| and the count
over 15% of each kit per pass, then per backward row the medians over rounds; JSON to
bench/results/backward_probe.json. Target: none (an A/B); exits 0.

Read here against ae10b3f (its probe timed the chain after a neighbour that was the chain
itself: shared parameters, shared accumulation nodes; this tree's has its own), one
thread, 4 rounds, 2026-11-25 13:31-13:37 UTC, load 3.8-6.2 (re-measure quiet): per-node
figure 3.09 / 2.70 / 2.93 / 3.20 -> 1.90 / 1.90 / 2.05 / 2.19 us; backward rows over 15%
(of 90) 56 / 49 / 59 / 52 -> 32 / 35 / 46 / 46, median |error| 18.9 / 16.2 / 19.9 /
19.1% -> 10.8 / 11.4 / 15.8 / 15.3%; forward rows 33 / 44 / 46 / 59 -> 33 / 45 / 46 / 53
(the forward figures alike: 6 alternations, forward per-op 2.35 vs 2.34 us median, load
7-14). Rows under-predicted before (heads, dlrm's top MLP, cnn-small) read lower still.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_backward_probe.py \\
        [--old ae10b3f] [--rounds 4] [--models mlp-small,dlrm-small] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_kernel_model import (MICRO_BATCHES, MODELS, QUICK_MICRO_BATCHES,  # noqa: E402
                                QUICK_REPEATS, QUICK_WARMUP, REPEATS, TARGET_ERROR, WARMUP,
                                gemm_shapes, measure_model, traced_graph)
from cost_models import host_probes  # noqa: E402
from cost_models.layer_profile import profile_graph  # noqa: E402
from cost_models.profile_device import profile_device  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results", "backward_probe.json")


def probe_at(revision: str):
    """`cost_models/host_probes.py` as it was at `revision`, loaded as its own module."""
    source = subprocess.run(["git", "-C", ROOT, "show", f"{revision}:cost_models/host_probes.py"],
                            check=True, capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"host_probes_{revision}", f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    os.unlink(f.name)
    return module


def with_probe(spec, cost):
    """`spec` with the per-pass probe's figures (`cost`, a HostOpCost) in it."""
    return dataclasses.replace(spec, op_overhead_s=cost.forward_s,
                               backward_op_overhead_s=cost.backward_s,
                               kernel_calibration=dataclasses.replace(
                                   spec.kernel_calibration, **cost.calibration_fields()))


def summary(rows: list[dict], phase: str) -> tuple[float, int]:
    errors = sorted(abs(r["error"]) for r in rows if r["phase"] == phase)
    return errors[len(errors) // 2], sum(e > TARGET_ERROR for e in errors)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="ae10b3f", help="git revision of the old probe")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--models", default=None, help="comma-separated zoo presets")
    parser.add_argument("--quick", action="store_true", help="quick spec, fewer repeats")
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = args.models.split(",") if args.models else MODELS
    batches = QUICK_MICRO_BATCHES if args.quick else MICRO_BATCHES
    warmup, repeats = (QUICK_WARMUP, QUICK_REPEATS) if args.quick else (WARMUP, REPEATS)
    graphs = {(m, mb): traced_graph(m, mb) for m in models for mb in batches}
    spec, _ = profile_device("cpu", quick=args.quick, extra_gemm_shapes=gemm_shapes(
        g for g, _ in graphs.values()))
    torch.set_num_threads(1)
    probes = {"old": probe_at(args.old), "new": host_probes}
    rounds = []
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        costs = {kit: probes[kit].host_op_seconds_by_pass("cpu") for kit in order}
        specs = {kit: with_probe(spec, cost) for kit, cost in costs.items()}
        rows = {kit: [] for kit in specs}
        for (model, mb), (graph, measurer) in graphs.items():
            profiled = profile_graph(graph, measurer, "cpu", warmup=warmup, repeats=repeats)
            for kit, kit_spec in specs.items():
                rows[kit].extend(measure_model(model, mb, graph, measurer, kit_spec, warmup,
                                               repeats, profiled=profiled))
        load = os.getloadavg()[0]
        line = " ".join(f"{kit} node {costs[kit].backward_node_s * 1e6:.2f} us: "
                        + ", ".join(f"{phase} {summary(rows[kit], phase)[0]:.1%} "
                                    f"{summary(rows[kit], phase)[1]} over"
                                    for phase in ("fwd", "bwd")) + ";" for kit in ("old", "new"))
        print(f"round {r}: {line} load {load:.1f}", flush=True)
        for kit in ("old", "new"):  # the forward's figures: the change leaves them be
            fields = costs[kit].calibration_fields()
            print(f"  {kit} forward figures (us): " + ", ".join(
                f"{name} {fields[name] * 1e6:.2f}" for name in (
                    "forward_host_op_s", "view_host_op_s", "forward_node_host_s",
                    "module_call_host_s")), flush=True)
        rounds.append({"load": load, "node_s": {k: c.backward_node_s for k, c in costs.items()},
                       "rows": rows})
    print("\nbackward rows, medians over rounds (us): measured, old, new predicted")
    for i, row in enumerate(rounds[0]["rows"]["old"]):
        if row["phase"] != "bwd":
            continue
        meas = statistics.median(rd["rows"]["old"][i]["measured_s"] for rd in rounds)
        old, new = (statistics.median(rd["rows"][kit][i]["predicted_s"] for rd in rounds)
                    for kit in ("old", "new"))
        print(f"{row['model']:10s} {row['layer']:18s} {row['micro_batch']:3d} {meas * 1e6:8.1f} "
              f"{old * 1e6:8.1f} {old / meas - 1:+6.0%} {new * 1e6:8.1f} {new / meas - 1:+6.0%}")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"bench": "backward_probe", "old": args.old, "rounds": rounds}, f, indent=1)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
