"""Kernel-level time model vs measured per-layer times, zoo models on one CPU thread.

For each zoo model at micro-batches 1, 4 and 16: trace it (meta, fp32), time every unique
layer forward and backward on the CPU (`cost_models.layer_profile.profile_graph`: the
median of repeats after warm-up, on ONE thread), and predict the same layer with the
compute model (`cost_models.compute.layer_compute`: the kernel sum of
`cost_models.kernel_time` plus the host's per-op dispatch, which on CPU processes adds)
on a spec measured here by `profile_device("cpu")`, whose GEMM table also measures
exactly the (m, n, k) the benched layers run (read off their kernel records). Columns: predicted and measured
milliseconds, the error (predicted / measured - 1), and the prediction's two parts:
kernels (device seconds of the kernel sum) and host (`host_dispatch.forward_host_seconds`: forward
ops and views with grad off, the grad_fns the forward records, module calls, fx nodes
that dispatch nothing and the ops' per-call excess at the kit's figures, and what the ops
pay in sequence among the layer's distinct ops: see bench/bench_host_ab.py;
`host_dispatch.backward_host_seconds`:
backward views, other ops, autograd nodes and the ops' per-call excess at the kit's figures).

Schedule (`interleaved_profile`): the rows are timed twice around the spec, in mirrored
order (pass 1: models in order; the spec; pass 2: models reversed), and each row's
measured time is the mean of its two passes: a row's two timings straddle the spec
symmetrically, so a drift of the machine's speed that is linear in time (a shared VM
slowing over minutes) moves the rows' mean and the spec alike instead of reading as model
error. What it does not cancel, a slow spell in one pass only, shows as the pass spread
(|pass 1 - pass 2| / mean) printed per model and kept per row. A slow spell over the
spec alone is what it cannot straddle: the host probes (the spec's figures the small
layers' prices rest on) run again after pass 2 on the same kernel tables, and the faster
of the two readings is kept whole (both headlines printed). The rows are timed on
`planner profile`'s wall clock; `--clock thread` times them on this thread's CPU time, the
probes' clock (`host_probes.probe_clock`): it did not steady them (below).

Read here (2026-11-26, 2 cores shared with 5 other sessions, load 12-41; counts over 15%
of 180 rows): mirrored schedule, wall clock 103 and 149 back to back (the spec's forward
host per op 2.5 then 6.6 us: the second spec ran in a slow spell, 380 s against 155,
while the rows moved 15%); thread clock 142 (load 30-41), 122 and 100; wall clock with
the second host reading 106 and 107 (load 15, 10). Pass spread (median per row) 9-28% in
every configuration, and 72-84 rows crossed 15% between two back-to-back runs (median
row error moved 18-48 points): at this load the table is noise; read it on a quiet host.
The faster-reading rule, priced on the same timings against the slower reading
(`--reprice --unkept`): 122 vs 117, 100 vs 112, 106 vs 116, 107 vs 110.

Target (issue 17): every layer within 15%; the bench exits 1 otherwise. Timings taken on
a loaded machine are noise: re-measure on a quiet one before reading the errors.

    .venv/bin/python bench/bench_kernel_model.py [--quick]

--quick: three models (gpt-tiny, llama-tiny, mlp-small), micro-batches 1 and 16, fewer
repeats, a quick device profile. Writes bench/results/kernel_model.json (--out), with the
whole spec and the raw timings: `--reprice RESULT_JSON` times nothing and prices those
timings with the current code (a pricing change's A/B on the same rows). `--record` also
keeps the raw timings in bench/kernel_model_runs/, and bench_kernel_model_pool.py prices
every kept run and reads each row's median error: on this VM one run is noise, ten are not.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import os
import platform
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.common import StepConfig  # noqa: E402
from ir.cluster import ClusterSpec  # noqa: E402
from cost_models.compute import layer_compute  # noqa: E402
from cost_models.host_dispatch import backward_host_seconds, forward_host_seconds  # noqa: E402
from cost_models.kernel_time import _token_scaled_gemm, layer_kernel_seconds  # noqa: E402
from cost_models.device_spec import spec_from_calibration  # noqa: E402
from cost_models.layer_profile import profile_graph, step_neighbours  # noqa: E402
from cost_models.profile_device import CPU_GEMM_MIN_FLOPS, profile_device  # noqa: E402
from ir.kernel_records import KernelKind  # noqa: E402
from ir.measure import layer_graph_from_trace  # noqa: E402
from ir.strategy import LayerStrategy, Precision  # noqa: E402
from ir.trace import trace  # noqa: E402
from planner.fmt import table  # noqa: E402
from planner.models import load_model  # noqa: E402

MODELS = ("gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny", "mlp-small", "cnn-small",
          "dlrm-small")
QUICK_MODELS = ("gpt-tiny", "llama-tiny", "mlp-small")
MICRO_BATCHES = (1, 4, 16)
QUICK_MICRO_BATCHES = (1, 16)
TARGET_ERROR = 0.15  # issue 17: per-layer time within 15%
WARMUP, REPEATS = 3, 9  # median of nine after three untimed runs
QUICK_WARMUP, QUICK_REPEATS = 2, 5
# The rows' clock: `planner profile`'s (wall) by default; "thread" is the probes'
# (`host_probes.probe_clock`, this thread's CPU time), which leaves other processes'
# turns on the core out (module docstring: it did not steady the rows here).
CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "kernel_model.json")
# Runs kept in the repository (`--record`: the raw timings and spec only, gzipped JSON),
# which bench_kernel_model_pool.py reads by default: one run here is noise, several are not
RUNS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_model_runs")
RAW_FIELDS = ("bench", "quick", "host", "spec_full", "clock", "schedule", "profiles")


def traced_graph(model: str, micro_batch: int):
    """(layer graph, measurer) of a zoo model at this micro-batch, fp32."""
    loaded = load_model(model, micro_batch, None, device="meta")
    traced = trace(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                   dtype=torch.float32)
    return layer_graph_from_trace(traced, loaded.inputs, loaded.target, name=loaded.name,
                                  dtype=torch.float32)


def result_layers(doc: dict, phase: str, graphs: dict):
    """(row, graph, layer) of each `phase` row of a written result (`doc`), each model
    traced once per micro-batch into `graphs`: how the A/B benches reprice the same rows."""
    for row in doc["rows"]:
        if row["phase"] != phase:
            continue
        key = (row["model"], row["micro_batch"])
        if key not in graphs:
            graphs[key] = traced_graph(*key)[0]
        graph = graphs[key]
        yield row, graph, next(l for l in graph.layers if l.name == row["layer"])


def gemm_shapes(graphs) -> list[tuple[int, int, int]]:
    """Every (m, n, k) the graphs' GEMM kernels run, as the time model reads them (the
    profile then measures exactly these, beside its grid)."""
    shapes = {}
    for graph in graphs:
        tokens = graph.micro_batch * (graph.seq_len or 1)
        for layer in graph.layers:
            for r in (layer.kernels.forward + layer.kernels.backward) if layer.kernels else ():
                if r.kind is not KernelKind.GEMM:
                    continue
                mnk = _token_scaled_gemm(r.shape, 1.0, tokens, 1.0)
                if 2 * math.prod(mnk) >= CPU_GEMM_MIN_FLOPS:
                    shapes[mnk] = None  # smaller ones time the dispatch (see the constant)
    return list(shapes)


def _mean_of_passes(first: list[dict], second: list[dict]) -> list[dict]:
    """`profile_graph` entries of two passes over one graph, each timing the mean of the
    two, the two kept (`passes_s`: forward and backward seconds of pass 1 and 2)."""
    by_hash = {m["structural_hash"]: m for m in second}
    merged = []
    for a in first:
        b = by_hash[a["structural_hash"]]
        merged.append({**a, **{key: (a[key] + b[key]) / 2 for key in (
            "forward_seconds", "backward_seconds", "node_span_seconds")},
            "node_span_spread": max(a["node_span_spread"], b["node_span_spread"]),
            "passes_s": {"fwd": (a["forward_seconds"], b["forward_seconds"]),
                         "bwd": (a["backward_seconds"], b["backward_seconds"])}})
    return merged


def clock_read_s(clock, reads: int = 1001) -> float:
    """Median seconds between two back-to-back reads of `clock`: what a window timed on it
    holds of the clock's own call (the thread clock is a system call here: 0.7 us of CPU a
    read, the wall clock's 0.13, 2026-11-26, load 16)."""
    gaps = []
    for _ in range(reads):
        t0 = clock()
        gaps.append(clock() - t0)
    return statistics.median(gaps)


def interleaved_profile(graphs: dict, warmup: int, repeats: int, quick: bool = False,
                        log=print, clock=time.perf_counter):
    """(spec, {(model, micro_batch): profile entries}, schedule) with the rows timed in
    two mirrored passes around `profile_device("cpu")` (module docstring: why) on `clock`
    (a forward's reading less the clock's own read, `clock_read_s`, off the wall clock:
    the backward's span already takes its own cost out); the schedule lists each phase's
    start, end (seconds from the first) and load average."""
    start, schedule, passes = time.perf_counter(), [], {}
    read_s = clock_read_s(clock) if clock is not time.perf_counter else 0.0

    def phase(name: str, run):
        t0 = time.perf_counter() - start
        out = run()
        schedule.append({"phase": name, "start_s": t0, "end_s": time.perf_counter() - start,
                         "load_average_1min": os.getloadavg()[0]})
        log(f"  [{schedule[-1]['end_s']:5.0f} s] {name} (load {os.getloadavg()[0]:.1f})",
            file=sys.stderr)
        return out

    keys = list(graphs)
    for n, order in ((1, keys), (2, keys[::-1])):
        for key in order:
            graph, measurer = graphs[key]
            entries = phase(f"pass {n} {key[0]} mb {key[1]}", lambda: profile_graph(
                graph, measurer, "cpu", warmup=warmup, repeats=repeats, clock=clock))
            passes.setdefault(key, []).append([{**e, "forward_seconds": e[
                "forward_seconds"] - read_s} for e in entries])
        if n == 1:
            spec, cal = phase("spec", lambda: profile_device("cpu", quick=quick,
                                                             extra_gemm_shapes=gemm_shapes(
                graph for graph, _ in graphs.values())))
            torch.set_num_threads(1)
    # The host figures again, after pass 2 (the kernel tables kept): a slow spell over one
    # reading inflates all its figures together (2.6x here, at the same load as the rows:
    # bench_kernel_model x2, 2026-11-26), so the faster reading is kept whole, as the
    # kit keeps the faster of its two GEMM passes.
    again = phase("spec host again", lambda: spec_from_calibration(
        "cpu", cal, spec.name))
    torch.set_num_threads(1)
    schedule[-1]["host_op_s"] = [host_op_s(spec), host_op_s(again)]
    spec, other = sorted((spec, again), key=host_op_s)
    schedule[-1]["unkept_spec"] = other  # written whole (`raw_result`): --reprice --unkept
    return spec, {key: _mean_of_passes(*two) for key, two in passes.items()}, schedule


def host_op_s(spec) -> float:
    """A host reading's headline: its forward plus backward seconds per op."""
    return spec.op_overhead_s + spec.backward_op_overhead_s


def measure_model(model: str, micro_batch: int, graph, measurer, spec, warmup: int,
                  repeats: int, profiled: list[dict] | None = None) -> list[dict]:
    """One row per unique layer: predicted and measured seconds, forward and backward
    (`profiled`: `profile_graph`'s entries already taken, for an A/B of two specs)."""
    if profiled is None:
        profiled = profile_graph(graph, measurer, "cpu", warmup=warmup, repeats=repeats)
    measured = {m["structural_hash"]: m for m in profiled}
    config = StepConfig(micro_batch=micro_batch, graph_micro_batch=graph.micro_batch,
                        graph_dtype=graph.dtype, precision=Precision.FP32,
                        seq_len=graph.seq_len, device_type="cpu")
    rows = []
    for i, first in enumerate(graph.layers):
        m = measured.pop(first.structural_hash, None)
        if m is None:  # a repeat of a layer already timed
            continue
        # The profile timed it where most of its kind stand (`layer_profile.step_neighbours`:
        # a stack's blocks after a block): each pass is compared with that position's layer,
        # whose cold ops (`Layer.cold_distinct_ops_fwd`) are the ones the timing paid.
        before, after = step_neighbours(measurer, i)
        at = {"fwd": graph.layers[i if before is None else before + 1],
              "bwd": graph.layers[i if after is None else after - 1]}
        predicted = {phase: layer_compute(layer, LayerStrategy(), spec, config)
                     for phase, layer in at.items()}
        kernels = layer_kernel_seconds(first.kernels, spec, config)
        for phase, pred_s, meas_s, kernel_s, ops, host_s in (
                ("fwd", predicted["fwd"].forward_s, m["forward_seconds"],
                 kernels.forward.total_s, first.ops_fwd,
                 forward_host_seconds(at["fwd"], spec)),
                ("bwd", predicted["bwd"].backward_s, m["backward_seconds"],
                 kernels.backward.total_s, first.ops_bwd,
                 backward_host_seconds(at["bwd"], spec))):
            layer = at[phase]
            rows.append({"model": model, "layer": layer.name, "kind": layer.kind,
                         "micro_batch": micro_batch, "phase": phase,
                         "predicted_s": pred_s, "measured_s": meas_s,
                         "error": pred_s / meas_s - 1.0 if meas_s > 0 else float("inf"),
                         # the two mirrored passes' timings (interleaved_profile), if any
                         "measured_passes_s": m.get("passes_s", {}).get(phase),
                         "kernel_s": kernel_s, "host_s": host_s, "ops": ops,
                         "python_nodes": layer.python_nodes_fwd if phase == "fwd" else 0,
                         "distinct_ops": layer.distinct_ops_fwd if phase == "fwd" else 0,
                         "cold_ops": layer.host_position[0 if phase == "fwd" else 1],
                         "autograd_nodes": (layer.autograd_nodes_fwd if phase == "fwd"
                                            else layer.autograd_nodes_bwd),
                         # the span's own cost the measured backward left out (layer_profile)
                         "node_span_s": m["node_span_seconds"] if phase == "bwd" else 0.0,
                         "node_span_spread": (m["node_span_spread"] if phase == "bwd"
                                              else 0.0)})
    return rows


def pass_spread(rows: list[dict]) -> dict:
    """How far the two passes of the rows disagree: per row |pass 1 - pass 2| / mean, its
    median and worst, and the rows over target when each pass alone is the measurement
    (a count that moves between them is timing noise, not model error)."""
    by_model, over = {}, [0, 0]
    for r in rows:
        a, b = r["measured_passes_s"]
        by_model.setdefault(r["model"], []).append(abs(a - b) / ((a + b) / 2))
        for n, measured_s in enumerate((a, b)):
            over[n] += abs(r["predicted_s"] / measured_s - 1.0) > TARGET_ERROR
    spreads = sorted(x for v in by_model.values() for x in v)
    median = spreads[len(spreads) // 2]
    text = (f"Pass spread |pass 1 - pass 2| / mean: median {median:.1%}, worst "
            f"{spreads[-1]:.0%} (by model, median: " + ", ".join(
                f"{m} {sorted(v)[len(v) // 2]:.1%}" for m, v in by_model.items())
            + f"); over {TARGET_ERROR:.0%} on pass 1 alone {over[0]}, pass 2 alone {over[1]}.")
    return {"median": median, "max": spreads[-1], "over_target_pass1": over[0],
            "over_target_pass2": over[1], "text": text}


def raw_result(quick: bool, spec, profiled: dict, schedule: list[dict], clock: str) -> dict:
    """What `--reprice` reads back: the whole spec, the raw timings and their schedule."""
    return {"bench": "kernel_model", "quick": quick, "host": platform.node(),
            "spec_full": spec.to_dict(), "clock": clock,
            "schedule": [{k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in p.items()}
                         for p in schedule],
            "profiles": [[list(key), entries] for key, entries in profiled.items()]}


@dataclasses.dataclass(frozen=True)
class SavedResult:
    """A written result read back for pricing: its spec, raw timings and schedule, and
    each (model, micro_batch)'s traced (graph, measurer)."""
    quick: bool
    clock: str
    schedule: list
    spec: ClusterSpec
    profiled: dict
    graphs: dict


def load_result(path: str, unkept: bool = False, traced: dict | None = None) -> SavedResult:
    """Read a written result (`unkept`: its slower host reading as the spec); `traced`
    caches the graphs across results (one trace per key)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        doc = json.load(f)
    schedule = doc["schedule"]
    spec = ClusterSpec.from_dict(next(p["unkept_spec"] for p in schedule if "unkept_spec" in p)
                                 if unkept else doc["spec_full"], path)
    profiled = {tuple(key): entries for key, entries in doc["profiles"]}
    traced = {} if traced is None else traced
    for key in profiled:
        if key not in traced:
            traced[key] = traced_graph(*key)
    return SavedResult(doc["quick"], doc.get("clock", "wall"), schedule, spec, profiled,
                       {key: traced[key] for key in profiled})


def price_rows(graphs: dict, spec, profiled: dict, warmup: int, repeats: int) -> list[dict]:
    """Every model's rows (`measure_model`) priced on `spec` against its timings."""
    rows = []
    for (model, micro_batch), (graph, measurer) in graphs.items():
        rows.extend(measure_model(model, micro_batch, graph, measurer, spec, warmup, repeats,
                                  profiled[(model, micro_batch)]))
    return rows


def record_run(doc: dict, measured_on: str) -> str:
    """Keep a run's raw timings and spec under RUNS_DIR, named by when the spec was
    measured (`measured_on`'s date and time; -2, -3 ... where one is kept already: never
    overwritten); returns the path."""
    when = re.search(r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d)", measured_on)
    stamp = "".join(when.groups()) if when else time.strftime("%Y%m%d%H%M", time.gmtime())
    name = f"{'quick-' if doc['quick'] else ''}{stamp}"
    path, copy = os.path.join(RUNS_DIR, f"{name}.json.gz"), 1
    while os.path.exists(path):
        copy += 1
        path = os.path.join(RUNS_DIR, f"{name}-{copy}.json.gz")
    os.makedirs(RUNS_DIR, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({k: doc[k] for k in RAW_FIELDS}, f, separators=(",", ":"))
    return path


def write_result(path: str, doc: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 models, 2 micro-batches")
    parser.add_argument("--models", default=None, help="comma-separated zoo presets")
    parser.add_argument("--reprice", default=None, metavar="RESULT_JSON",
                        help="time nothing: price a written result's timings and spec with "
                             "this code (an A/B of a pricing change on the same timings)")
    parser.add_argument("--unkept", action="store_true",
                        help="with --reprice: price with the slower host reading instead")
    parser.add_argument("--out", default=RESULTS)
    parser.add_argument("--record", action="store_true",
                        help="also keep the run's timings in bench/kernel_model_runs/ "
                             "(what bench_kernel_model_pool.py reads)")
    parser.add_argument("--clock", choices=CLOCKS, default="wall",
                        help="the rows' clock (module docstring)")
    args = parser.parse_args()
    if args.record and args.reprice:
        parser.error("--record keeps a timed run; --reprice times nothing: pass one")
    torch.set_num_threads(1)  # as the planner's local processes run
    warmup, repeats = (QUICK_WARMUP, QUICK_REPEATS) if args.quick else (WARMUP, REPEATS)
    start = time.perf_counter()
    if args.reprice:
        saved = load_result(args.reprice, args.unkept)
        args.quick, args.clock, schedule = saved.quick, saved.clock, saved.schedule
        spec, profiled, graphs = saved.spec, saved.profiled, saved.graphs
    else:
        models = (args.models.split(",") if args.models else QUICK_MODELS if args.quick
                  else MODELS)
        batches = QUICK_MICRO_BATCHES if args.quick else MICRO_BATCHES
        graphs = {(model, mb): traced_graph(model, mb) for model in models for mb in batches}
        spec, profiled, schedule = interleaved_profile(graphs, warmup, repeats, args.quick,
                                                       clock=CLOCKS[args.clock])
        raw = raw_result(args.quick, spec, profiled, schedule, args.clock)
        write_result(args.out, raw)  # kept if pricing fails
        if args.record:
            print(f"recorded {record_run(raw, spec.kernel_calibration.measured_on)}")
    rows = price_rows(graphs, spec, profiled, warmup, repeats)
    print(table(["model", "layer", "batch", "pass", "predicted ms", "measured ms", "error",
                 "kernels ms", "host ms"],
                [[r["model"], r["layer"], r["micro_batch"], r["phase"],
                  f"{r['predicted_s'] * 1e3:.3f}", f"{r['measured_s'] * 1e3:.3f}",
                  f"{r['error']:+.0%}", f"{r['kernel_s'] * 1e3:.3f}", f"{r['host_s'] * 1e3:.3f}"]
                 for r in rows]))
    errors = sorted(abs(r["error"]) for r in rows)
    missed = [r for r in rows if abs(r["error"]) > TARGET_ERROR]
    spread = pass_spread(rows)
    print(spread["text"])
    readings = next((p["host_op_s"] for p in schedule if "host_op_s" in p), None)
    if readings:
        print(f"Host readings (forward + backward per op): {readings[0] * 1e6:.2f} us with the "
              f"spec, {readings[1] * 1e6:.2f} after pass 2; kept {host_op_s(spec) * 1e6:.2f}.")
    load = os.getloadavg()[0]
    print(f"\n{len(rows)} layer passes; median |error| {errors[len(errors) // 2]:.0%}, worst "
          f"{errors[-1]:.0%}; {len(missed)} over {TARGET_ERROR:.0%}. Spec: op_overhead "
          f"{spec.op_overhead_s * 1e6:.2f} us/op forward, {spec.backward_host_op_s * 1e6:.2f} "
          f"backward, {spec.hbm_gbps:.1f} GB/s, "
          f"{spec.peak_flops('float32') / 1e9:.1f} GFLOP/s fp32. Load average {load:.1f} "
          f"({time.perf_counter() - start:.0f} s).")
    write_result(args.out, {**raw_result(args.quick, spec, profiled, schedule, args.clock),
                   "repriced_from": args.reprice,
                   "load_average_1min": load, "target_error": TARGET_ERROR,
                   "spec": {"op_overhead_s": spec.op_overhead_s,
                            "backward_op_overhead_s": spec.backward_op_overhead_s,
                            "forward_host_op_s": spec.kernel_calibration.forward_host_op_s,
                            "module_call_host_s": spec.kernel_calibration.module_call_host_s,
                            "view_host_op_s": spec.kernel_calibration.view_host_op_s,
                            **{field: getattr(spec.kernel_calibration, field) for field in (
                                "backward_view_host_op_s", "backward_nonview_host_op_s",
                                "backward_node_host_s", "forward_node_host_s",
                                "python_node_host_s", "in_sequence_op_host_s",
                                "in_sequence_knee_distinct_ops", "cold_entry_host_s",
                                "cold_entry_after_backward_host_s", "cold_op_host_s",
                                "cold_entry_same_code_host_s", "cold_backward_op_host_s",
                                "cold_backward_inner_op_host_s",
                                "scalar_operand_float_host_s", "scalar_operand_int_host_s")},
                            "cold_entry_points": [dataclasses.asdict(p) for p in
                                                  spec.kernel_calibration.cold_entry_points],
                            "cold_backward_points": [dataclasses.asdict(p) for p in
                                                     spec.kernel_calibration.cold_backward_points],
                            "host_op_excess_s": {p.op: p.seconds for p in
                                                 spec.kernel_calibration.host_op_excess},
                            "notes": spec.notes, "hbm_gbps": spec.hbm_gbps,
                            "peak_flops_float32": spec.peak_flops("float32"),
                            "random_element_s": spec.random_element_s,
                            "measured_on": spec.kernel_calibration.measured_on},
                   "median_abs_error": errors[len(errors) // 2], "max_abs_error": errors[-1],
                   "over_target": len(missed),
                   "pass_spread": {k: v for k, v in spread.items() if k != "text"},
                   "rows": rows})
    starts = sorted(r["node_span_s"] for r in rows if r["node_span_s"] > 0)
    if starts:
        print(f"Node span's own cost left out of each measured backward (fit in each "
              f"layer's loop): median {starts[len(starts) // 2] * 1e6:.2f} us, range "
              f"{starts[0] * 1e6:.2f}-{starts[-1] * 1e6:.2f}; widest spread (thirds of a loop) "
              f"{max(r['node_span_spread'] for r in rows):.0%}.")
    print(f"Spec notes: {spec.notes}")
    print(f"wrote {args.out}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
