"""Paired A/B of one kit term on the SAME measured rows: one `bench/bench_kernel_model.py`
run (its models, micro-batches, profile and timings), each row priced with the kit's
calibration as measured (B) and with the term taken out (A: `without(calibration)`).
Prints the rows over 15% under A and B, the rows that crossed 15% or went past 25%, and
each row whose price moved by more than 1%; writes both prices per row. The A/B scripts
(`bench_gemm_layout_ab.py`, `bench_cold_kernel_ab.py`) name the term and call `run`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_kernel_model import (MICRO_BATCHES, MODELS, REPEATS,  # noqa: E402
                                      TARGET_ERROR, WARMUP, interleaved_profile, measure_model,
                                      traced_graph)
from ir.kernel_calibration import KernelCalibration  # noqa: E402

FAR_ERROR = 0.25  # a row may not go from within 15% to beyond this


def run(name: str, description: str, without: Callable[[KernelCalibration], KernelCalibration],
        argv: list[str]) -> int:
    """Price every row with and without the term `without` removes; `name` keys the JSON."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(
        __file__)), "results", f"{name}.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    graphs = {(model, mb): traced_graph(model, mb) for model in args.models.split(",")
              for mb in MICRO_BATCHES}
    # the rows timed in two mirrored passes around the spec, as the bench times them
    spec_b, profiles, _ = interleaved_profile(graphs, WARMUP, REPEATS)
    spec_a = dataclasses.replace(spec_b, kernel_calibration=without(spec_b.kernel_calibration))
    pairs = []
    for (model, mb), (graph, measurer) in graphs.items():
        profiled = profiles[(model, mb)]
        rows_a = measure_model(model, mb, graph, measurer, spec_a, WARMUP, REPEATS, profiled)
        rows_b = measure_model(model, mb, graph, measurer, spec_b, WARMUP, REPEATS, profiled)
        pairs.extend(zip(rows_a, rows_b))
    load = os.getloadavg()[0]
    over_a = sum(abs(a["error"]) > TARGET_ERROR for a, _ in pairs)
    over_b = sum(abs(b["error"]) > TARGET_ERROR for _, b in pairs)
    far = [(a, b) for a, b in pairs
           if abs(a["error"]) <= TARGET_ERROR and abs(b["error"]) > FAR_ERROR]
    print(f"{len(pairs)} rows; over {TARGET_ERROR:.0%}: A {over_a}, B {over_b}; within "
          f"{TARGET_ERROR:.0%} under A and past {FAR_ERROR:.0%} under B: {len(far)}; load "
          f"{load:.1f} ({time.perf_counter() - start:.0f} s)")
    for a, b in pairs:
        if abs(b["predicted_s"] / a["predicted_s"] - 1) > 0.01:
            crossed = ("  (now within)" if abs(a["error"]) > TARGET_ERROR >= abs(b["error"])
                       else "  (now over)" if abs(b["error"]) > TARGET_ERROR >= abs(a["error"])
                       else "")
            print(f"  {a['model']} {a['layer']} mb {a['micro_batch']} {a['phase']}: measured "
                  f"{a['measured_s'] * 1e6:.0f} us, A {a['error']:+.0%}, B {b['error']:+.0%}"
                  f"{crossed}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"bench": name, "load_average_1min": load,
                   "over_a": over_a, "over_b": over_b, "far": len(far),
                   "rows": [{**{k: a[k] for k in ("model", "layer", "micro_batch", "phase",
                                                 "measured_s")},
                             "predicted_a_s": a["predicted_s"], "error_a": a["error"],
                             "predicted_b_s": b["predicted_s"], "error_b": b["error"]}
                            for a, b in pairs]}, f, indent=1)
    print(f"wrote {args.out}")
    return 0
