"""What `planner profile` reads for each layer's backward as a step runs around it
(new: `layer_profile.backward_window`, the layers whose backward a step runs just before,
as the cold backward ops are counted, ahead of the timed backward; after the last
layer's backward, the layers before it, `StepNeighbours.after_backward`) against the
layer after alone and nothing after (old); one thread, the thread clock, the compute
model's prediction beside both and each layer's backward timed inside whole steps
(`bench_host_ab.step_timings`, each backward call after a warmed engine start).

For each model and micro-batch: `bench_kernel_model.measure_model` twice per mode,
alternating old, new, old, new (each layer's figure the lower of its mode's two), on one
quick device profile. Prints the backward rows the change touches (`--all-rows`: every
one) and, over all backward rows, how many miss bench_kernel_model's 15% against either
profile and against the step. No target (an A/B record); exits 0. JSON to
bench/results/backward_window.json. Readings are in `layer_profile`'s docstrings and
the commit messages (load 4-9: re-measure quiet).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_backward_window.py --models t5-tiny,gpt-tiny \
        --batches 1,4,16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_host_ab import step_timings  # noqa: E402
from bench.bench_kernel_model import (MODELS, TARGET_ERROR, WARMUP, REPEATS, gemm_shapes,  # noqa: E402
                                      measure_model, traced_graph)
from cost_models import layer_profile  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from cost_models.profile_device import profile_device  # noqa: E402
from planner.fmt import table  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "backward_window.json")


def _after_alone(layers, after):
    """The old profile's window: the layer after alone."""
    return [] if after is None else [after]


def paired_rows(model: str, micro_batch: int, spec) -> list[dict]:
    """Backward rows of `measure_model`, measured with the old window and the new."""
    graph, measurer = traced_graph(model, micro_batch)
    window, after_last = layer_profile.backward_window, layer_profile.StepNeighbours.after_backward
    best: dict[str, dict[str, dict]] = {"old": {}, "new": {}}
    try:
        for mode in ("old", "new", "old", "new"):
            layer_profile.backward_window = _after_alone if mode == "old" else window
            layer_profile.StepNeighbours.after_backward = (
                (lambda self: None) if mode == "old" else after_last)
            for r in measure_model(model, micro_batch, graph, measurer, spec, WARMUP, REPEATS):
                kept = best[mode].get(r["layer"])
                if r["phase"] == "bwd" and (kept is None or r["measured_s"] < kept["measured_s"]):
                    best[mode][r["layer"]] = r
    finally:
        layer_profile.backward_window = window
        layer_profile.StepNeighbours.after_backward = after_last
    in_step = {layer.name: bwd for layer, (_, bwd) in zip(graph.layers, step_timings(
        measurer, len(graph.layers), WARMUP, REPEATS, warm_start=True))}
    changed = set()  # the rows' layers (measure_model's: the one before the layer after)
    for i in range(len(graph.layers)):
        after = layer_profile.step_neighbours(measurer, i)[1]
        if after is None:  # the last layer: the layers before run after its backward
            changed.add(graph.layers[i].name)
        elif len(window(graph.layers, after)) > 1:
            changed.add(graph.layers[after - 1].name)
    return [{"model": model, "micro_batch": micro_batch, "layer": name,
             "window_changed": name in changed,
             "predicted_s": new["predicted_s"], "measured_old_s": best["old"][name]["measured_s"],
             "measured_new_s": new["measured_s"], "step_s": in_step[name],
             "error_old": new["predicted_s"] / best["old"][name]["measured_s"] - 1.0,
             "error_new": new["predicted_s"] / new["measured_s"] - 1.0,
             "error_step": new["predicted_s"] / in_step[name] - 1.0}
            for name, new in best["new"].items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated presets")
    parser.add_argument("--batches", default="1,4,16", help="comma-separated micro-batches")
    parser.add_argument("--all-rows", action="store_true", help="every backward row")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # The layer timer reads the probes' clock (thread CPU time), as bench_host_ab's steps
    layer_profile.time = types.SimpleNamespace(perf_counter=probe_clock("cpu"))
    cases = [(m, int(b)) for m in args.models.split(",") for b in args.batches.split(",")]
    spec, _ = profile_device("cpu", quick=True, extra_gemm_shapes=gemm_shapes(
        traced_graph(m, b)[0] for m, b in cases))
    torch.set_num_threads(1)
    rows = [r for m, b in cases for r in paired_rows(m, b, spec)]
    print(table(["model", "mb", "layer", "predicted us", "old us", "new us", "step us",
                 "old err", "new err", "step err"],
                [[r["model"], r["micro_batch"], r["layer"], f"{r['predicted_s'] * 1e6:.1f}",
                  f"{r['measured_old_s'] * 1e6:.1f}", f"{r['measured_new_s'] * 1e6:.1f}",
                  f"{r['step_s'] * 1e6:.1f}",
                  f"{r['error_old']:+.0%}", f"{r['error_new']:+.0%}",
                  f"{r['error_step']:+.0%}"]
                 for r in rows if r["window_changed"] or args.all_rows]))
    old = sum(abs(r["error_old"]) > TARGET_ERROR for r in rows)
    new = sum(abs(r["error_new"]) > TARGET_ERROR for r in rows)
    step = sum(abs(r["error_step"]) > TARGET_ERROR for r in rows)
    load = os.getloadavg()[0]
    print(f"\nbackward passes over {TARGET_ERROR:.0%} of {len(rows)}: {old} with the layer "
          f"after alone, {new} with the backward window; against the step: {step} "
          f"(load {load:.1f})")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"load_average_1min": load, "rows": rows}, f, indent=1)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
