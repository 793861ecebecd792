"""What a small layer's forward entry feels of the work before it, real layers beside probes.

issue 17 (helper "entry"): the reverted `cold_entry_traffic_points` probe (in
/work/notes/small2_patches: a LayerNorm then k distinct unary ops, timed after a fill of
n bytes then a small Linear's forward, less the same without the fill) read +7-11 us a
layer, where t5-tiny's encoder_rel_bias read +42-210 us after a fill just before it
(bench/bench_traffic_cold.py). Guess tested: the penalty scales with the layer's code
footprint (its distinct ATen ops) and the data it touches. Three tables, each timed on
the thread clock, min over ROUNDS rounds of REPEATS-run medians, subjects interleaved:

Default: per subject (real layers at micro-batch 1, as `time_layer` runs their module;
unary chains of k cold ops; 6 Linear+ReLU modules) its forward over its tight loop, after
a fill of N MiB alone, and after the fill then the kit's small Linear forward (the kit's
placement); a line fitted through the 16 KiB chains (penalty vs the distinct ops the
Linear did not run) predicts the rest (in brackets). Read 17:14 UTC (load 2.7), us:

    subject           cold  fill 1/4/16/64      +small 1/4/16/64 (chain line)
    t5 enc_rel_bias     15  58/80/84/121        57/83/67/115 (47/65/76/132)
    t5 dec_rel_bias     16  68/84/86/150        63/80/83/115 (50/68/81/139)
    dlrm bottom_mlp      2  18/49/48/85         22/24/23/38 (11/22/18/44)
    dlrm top_mlp        13  83/117/123/206      81/97/91/120 (42/58/68/119)
    mlp blocks.0         2  14/30/44/66         15/16/20/36 (11/22/18/44)
    cnn head             4  22/63/64/140        28/40/38/70 (17/29/27/58)
    linear-relu x6       2  46/73/82/176        38/30/37/58 (11/22/18/44)
    chain line: 5.8 + 2.8 / 15.6 + 3.3 / 9.6 + 4.5 / 30.5 + 6.8 us per cold op

Placed alike, the chains feel the traffic as the real layers do, within ~15 us, by the
distinct ops the layer before did not run (ops, op bytes, 16 KiB vs 256 KiB inputs do not
order it; module calls add some: the Linear+ReLU chain and the MLPs sit 10-40 us over the
line). A fill right before the layer costs ~2x the same fill before a Linear: that
forward re-warms the dispatch path all ops share. The old probe's +7-11 was the increment
over its no-fill run (already after a block's forward and backward), not the whole.

--context: real layers at micro-batch 1/4/16, their entry (`time_layer`'s forward after
their real step neighbours less the tight loop) against a 12-cold-op chain's after a fill
of the layer's `Layer.after_bytes` then the small Linear (load 2.9; us):
encoder_rel_bias 49/92/104 vs 94/83/121, decoder 65/93/182 vs 96/112/228, cnn head
51/98/155 vs 80/126/119; dlrm top_mlp 77/75/51 vs 19-24 (its 0.1 MiB explains none of it).

--placement: the micro-batch-1 layer after what `time_layer` runs between two forwards at
micro-batch 1 and at 16, and at 1 plus `after_bytes(16)` written before the forward window
(the kit probe's place) or last (load 2.9; us over tight):

    layer (mb 1)       mb 1 window  mb 16 window  fill MiB  +fill before  +fill last
    t5 enc_rel_bias        +69          +93          27         +84          +106
    t5 dec_rel_bias        +91         +156          43        +140          +153
    cnn head               +54         +131          21         +76           +82
    dlrm bottom_mlp        +23          +31         0.3         +31           +28

The bytes explain 60-75% of the relative biases' growth (the same layer, only the
window's micro-batch changed), a third of cnn-small's head's: at micro-batch > 1 its
window's convolutions run oneDNN's kernels, more code (`op_cold_code.op_cold_kind`).
dlrm's differences (+-8 us) are this host's noise. Swapped (one-off, load 3.5): the
micro-batch-16 encoder_rel_bias read +84 / +103 after the 1 / 16 window, the 1 one +71 /
+102 (the window, not the layer); dlrm's bottom_mlp the other way, the 1 layer +25 / +25,
the 16 one +36 / +33: its own GEMMs at m 16 (3 Linear+ReLU after 4 MiB and 12 unary ops:
+32 us at m 1, +39-47 at m 2-64, the m-1 path less code).

--replay (the warm part, the other half of the cancelling pair): at micro-batch 1, each
layer's tight loop, the sum of its ATen calls' own tight loops, and the warm forward the
km_s27 kit charges (16:42 kit, timed 17:18, load 1.4; us): the per-op charges sit BELOW
the calls' own loops and the rest (module calls, autograd nodes, in-sequence, wrapped
numbers) far above the layer's Python beyond its calls (tight - calls):

    layer            ops  tight  calls' loops  model warm  model per-op  model rest
    t5 enc_rel_bias   23   69.6      60.2         80.0         44.7         35.3
    t5 dec_rel_bias   23   74.5      64.0         87.0         48.2         38.8
    dlrm bottom_mlp   12   36.8      24.0         45.9         18.1         27.8
    dlrm top_mlp      25   84.5      65.3         90.2         38.3         51.9
    mlp blocks.0       4   16.1      10.9         15.6          6.3          9.3
Reconciled (us, s27 kit): the per-op charges + fresh outputs + autograd nodes + wrapped
numbers come to the calls' loops (enc_rel_bias 61.4 vs 60.2, bottom_mlp 27.1 vs 24.0);
what is over is the rest: enc_rel_bias's in-sequence 9.3 + module call 2.9 + the kernels'
cold L2 code (`cold_kernel_seconds`, read at the pass's own bytes: 5.6 here, 13.9 of the
km_base kit's 37.3 kernel us) against 9.4 measured beyond its calls; bottom_mlp's 6
module calls x 2.92 + in-sequence 1.2 against 12.8 (a call ~2.1 here, 0.9-1.3 in a tight
loop of one module; the kit's is read in its chain's order).
What-ifs on the two baselines' timings (--reprice, rows over 15%, base 38 / s27 56):
kit module call x0.4 (a tight loop's) 52 / 57; + traffic points probed 17:16 (the
reverted term) 49 / 59, the points alone 39 / 62; no cold L2 code 57 / 66; that code read
at own + window bytes (`after_bytes`) 56 / 73. No single term: each fixes the small rows
it targets and breaks the blocks that lean on it.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_entry_footprint.py \\
        [--context t5-tiny:encoder_rel_bias,...] [--placement t5-tiny:encoder_rel_bias:27,...]
        [--replay t5-tiny:encoder_rel_bias,... --spec-from RESULT_JSON]

Writes bench/results/entry_footprint{,_context,_placement}.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
from torch import fx, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_kernel_model import traced_graph  # noqa: E402
from cost_models.cold_entry_probes import _entry_layer, small_neighbour  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from cost_models.layer_profile import StepNeighbours, time_layer  # noqa: E402
from ir.graph_measurer import _clear_grads  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402
from planner.fmt import table  # noqa: E402

REAL = ("t5-tiny:encoder_rel_bias", "t5-tiny:decoder_rel_bias", "dlrm-small:bottom_mlp",
        "dlrm-small:top_mlp", "mlp-small:blocks.0", "cnn-small:head")
FILL_MIB = (1, 4, 16, 64)  # from under this CPU's 2 MiB L2 to past the zoo's windows
ROUNDS, REPEATS = 5, 7
CONTEXT_BATCHES = (1, 4, 16)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "entry_footprint.json")


class Footprint(TorchDispatchMode):
    """ATen ops, distinct overloads and bytes (tensor arguments and results) of a call."""

    def __init__(self):
        super().__init__()
        self.ops, self.overloads, self.bytes = 0, set(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self.overloads.add(str(func))
        self.bytes += sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                          if isinstance(t, torch.Tensor))
        return out


def unary_chain(k: int, tokens: int, width: int = 64):
    """The kit's entry layer (`cold_entry_probes._entry_layer`: a LayerNorm, then the first
    k `_unary_ops`) on tokens x width."""
    return _entry_layer(k, width), lambda: torch.randn(1, tokens, width, requires_grad=True)


def module_chain(n: int, tokens: int = 64, width: int = 64):
    """n (Linear, ReLU) module pairs: few distinct ops, many module calls and parameters."""
    layer = fx.symbolic_trace(nn.Sequential(*[m for _ in range(n)
                                              for m in (nn.Linear(width, width), nn.ReLU())]))
    return layer, lambda: torch.randn(1, tokens, width, requires_grad=True)


class Subject:
    """A forward to time: `inputs()` draws them (untimed, after the work before, as
    `time_layer` draws a layer's), `call(inputs)` runs it and returns its roots."""

    def __init__(self, inputs, call):
        self.inputs, self.call = inputs, call


def real_subject(model: str, name: str, batch: int = 1):
    graph, measurer = traced_graph(model, batch)
    index = [layer.name for layer in graph.layers].index(name)
    factory = real_factory("cpu")
    state = measurer.layer_state(index, factory)
    module = measurer.layer_module(index, state)

    def inputs():
        _clear_grads(state)
        return measurer.fresh_inputs(index, state, factory)
    return Subject(inputs, lambda xs: measurer.module_roots(index, module(*xs))), module


def probe_subject(made):
    layer, fresh = made

    return Subject(lambda: (fresh(),), lambda xs: [layer(*xs)]), layer


def subjects() -> dict:
    out = {f"{m}:{n}": real_subject(m, n) for m, n in (r.split(":") for r in REAL)}
    for k in (2, 4, 8, 12):
        out[f"unary {k} 16KiB"] = probe_subject(unary_chain(k, 64))
    out["unary 12 256KiB"] = probe_subject(unary_chain(12, 1024))
    out["linear-relu x6"] = probe_subject(module_chain(6))
    return out


def footprint(subject, module) -> dict:
    mode, inputs = Footprint(), subject.inputs()
    with mode:
        outs = subject.call(inputs)
    del outs
    calls = sum(1 for _ in module.modules()) - 1
    nodes = len(module.graph.nodes) if hasattr(module, "graph") else 0
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    return {"ops": mode.ops, "distinct": len(mode.overloads), "op_bytes": mode.bytes,
            "modules": calls, "fx_nodes": nodes, "param_bytes": params}


def overloads(fn) -> frozenset[str]:
    mode = Footprint()
    with mode:
        fn()
    return frozenset(mode.overloads)


def line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) through (x, y) points."""
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


def timed(subject, before, clock) -> float:
    """Median seconds of REPEATS forwards, each after `before()` then its inputs drawn,
    its backward run after it (untimed)."""
    times = []
    for _ in range(REPEATS):
        before()
        inputs = subject.inputs()
        start = clock()
        outs = subject.call(inputs)
        times.append(clock() - start)
        outs = [t for t in outs if t.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return statistics.median(times)


def tight(subject, clock) -> float:
    """Median seconds of REPEATS forwards back to back on the same inputs, grad on (the
    warm figure: bench_small_pass_terms' tight loop)."""
    inputs, times = subject.inputs(), []
    for _ in range(REPEATS + 1):
        start = clock()
        outs = subject.call(inputs)
        times.append(clock() - start)
        del outs
    return statistics.median(times[1:])


def in_context(name: str, clock) -> list[dict]:
    """Real layer `name` (model:layer) at CONTEXT_BATCHES: its entry measured (its forward
    in `time_layer`'s loop, after its real step neighbours, less its tight loop) against
    a unary chain's of as many cold ops (at most 12) timed after a fill of the layer's
    `after_bytes` then the kit's small neighbour's forward (`cold_entry_probes
    .small_neighbour`: the probe's placement) or after the fill alone; ROUNDS rounds,
    least of each."""
    model, layer_name = name.split(":")
    factory, reals = real_factory("cpu"), {}
    for batch in CONTEXT_BATCHES:
        graph, measurer = traced_graph(model, batch)
        index = [layer.name for layer in graph.layers].index(layer_name)
        reals[batch] = (graph, measurer, index, real_subject(model, layer_name, batch)[0])
    layer = reals[CONTEXT_BATCHES[0]][0].layers[reals[CONTEXT_BATCHES[0]][2]]
    cold = min(12, max(1, layer.cold_distinct_ops_fwd))
    probe = probe_subject(unary_chain(cold, 64))[0]
    small, x = small_neighbour(), lambda: torch.randn(1, 64, 64)
    best = {}
    for _ in range(ROUNDS):
        for batch, (graph, measurer, index, subject) in reals.items():
            fill = torch.empty(max(graph.layers[index].after_bytes // 4, 1))
            state = measurer.layer_state(index, factory)
            runs = {"profile": lambda: time_layer(measurer, index, state, factory, "cpu",
                                                  warmup=1, repeats=REPEATS,
                                                  layers=graph.layers, clock=clock)[0],
                    "tight": lambda: tight(subject, clock),
                    "probe tight": lambda: tight(probe, clock),
                    "probe fill+small": lambda: timed(probe, lambda: (fill.fill_(1.0),
                                                                      small(x())), clock),
                    "probe fill": lambda: timed(probe, lambda: fill.fill_(1.0), clock)}
            for key, run in runs.items():
                best[batch, key] = min(best.get((batch, key), float("inf")), run())
    return [{"layer": name, "micro_batch": batch, "cold_distinct_ops_fwd":
             reals[batch][0].layers[reals[batch][2]].cold_distinct_ops_fwd,
             "after_bytes": reals[batch][0].layers[reals[batch][2]].after_bytes,
             "probe_cold_ops": cold,
             **{f"{key.replace(' ', '_').replace('+', '_')}_s": best[batch, key]
                for key in ("profile", "tight", "probe tight", "probe fill+small",
                            "probe fill")}} for batch in reals]


def placement(name: str, clock) -> dict:
    """Real layer `name` (model:layer:MiB) at micro-batch 1, its forward after what
    `time_layer` runs between two of its forwards (`StepNeighbours`: the backward
    window's forwards and backwards, then the forward window's forwards), taken at
    micro-batch 1 and at 16, and at 1 with MiB written by a `fill_` before the forward
    window (where the kit's traffic probe put it) or last, just before the layer: over
    its tight loop, the least of ROUNDS. Whether the bytes of the bigger work explain its
    entry's growth, or what else of it does (its kernels' code at bigger shapes)."""
    model, layer_name, mib = name.split(":")
    factory, fill = real_factory("cpu"), torch.empty(int(float(mib) * 2**20) // 4)
    windows = {}
    for batch in (1, 16):
        graph, measurer = traced_graph(model, batch)
        index = [layer.name for layer in graph.layers].index(layer_name)
        windows[batch] = StepNeighbours(measurer, index, factory, graph.layers, "cpu")

    def between(window, mid=False, last=False):
        roots = window.before_backward()
        if roots:
            torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])
        window.after_backward()
        if mid:
            fill.fill_(1.0)
        window.before_forward()
        if last:
            fill.fill_(1.0)
    runs = {"mb 1 window": lambda: between(windows[1]),
            "mb 16 window": lambda: between(windows[16]),
            "mb 1 + fill before": lambda: between(windows[1], mid=True),
            "mb 1 + fill last": lambda: between(windows[1], last=True)}
    subject, best = real_subject(model, layer_name, 1)[0], {}
    for _ in range(ROUNDS):
        best["tight"] = min(best.get("tight", float("inf")), tight(subject, clock))
        for key, run in runs.items():
            best[key] = min(best.get(key, float("inf")), timed(subject, run, clock))
    return {"layer": f"{model}:{layer_name}", "fill_mib": float(mib),
            **{key.replace(" ", "_").replace("+", "plus") + "_s": best[key] - best["tight"]
               for key in runs}, "tight_s": best["tight"]}


class Capture(TorchDispatchMode):
    """Each ATen call of a forward: (overload, args, kwargs), to replay alone."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def replay(name: str, spec, clock) -> dict:
    """Real layer `name` (model:layer) at micro-batch 1, warm: its tight loop, the sum of
    its ATen calls' tight loops (each overload called alone from Python on the captured
    arguments, grad on: kernel, dispatch, autograd node, wrapped numbers), and what the
    model charges its warm forward on `spec` (kernels + `forward_host_seconds` less the
    entry), of which its per-op charges (`bench_batch_step.charged`: kernel, per-op host
    figure, per-call excess) and the rest (module calls, nodes, in-sequence, numbers)."""
    from bench.bench_batch_step import charged
    from cost_models.common import StepConfig
    from cost_models.compute import layer_kernel_seconds
    from cost_models.host_dispatch import (cold_entry_seconds, forward_host_seconds,
                                           warm_step_entry_seconds)
    from ir.strategy import Precision

    model, layer_name = name.split(":")
    subject = real_subject(model, layer_name, 1)[0]
    inputs, capture = subject.inputs(), Capture()
    with capture:
        subject.call(inputs)
    ops_s = 0.0
    for func, args, kwargs in capture.calls:
        ops_s += min(tight(Subject(lambda: (), lambda _, f=func, a=args, k=kwargs: f(*a, **k)),
                           clock) for _ in range(ROUNDS))
    graph, _ = traced_graph(model, 1)
    layer = next(layer for layer in graph.layers if layer.name == layer_name)
    config = StepConfig(micro_batch=1, graph_micro_batch=graph.micro_batch,
                        graph_dtype=graph.dtype, precision=Precision.FP32,
                        seq_len=graph.seq_len, device_type="cpu")
    cal = spec.kernel_calibration
    entry_s = (warm_step_entry_seconds(layer, cal) if layer.step_warm
               else cold_entry_seconds(layer, cal))
    warm_s = (layer_kernel_seconds(layer.kernels, spec, config).forward.total_s
              + forward_host_seconds(layer, spec) - entry_s)
    return {"layer": name, "ops": len(capture.calls),
            "tight_s": min(tight(subject, clock) for _ in range(ROUNDS)),
            "ops_tight_s": ops_s, "model_warm_s": warm_s,
            "model_per_op_s": sum(charged(model, layer_name, 1, spec)["fwd"].values())}


def print_context(rows: list[dict]) -> None:
    us = lambda x: f"{x * 1e6:.0f}"  # noqa: E731
    print(table(["layer", "mb", "cold ops", "after MiB", "profile", "tight", "entry",
                 "probe k", "probe entry fill+small", "probe entry fill"],
                [[r["layer"], r["micro_batch"], r["cold_distinct_ops_fwd"],
                  f"{r['after_bytes'] / 2**20:.1f}", us(r["profile_s"]), us(r["tight_s"]),
                  us(r["profile_s"] - r["tight_s"]), r["probe_cold_ops"],
                  us(r["probe_fill_small_s"] - r["probe_tight_s"]),
                  us(r["probe_fill_s"] - r["probe_tight_s"])] for r in rows]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", default="", help="model:layer,... : entries in context")
    parser.add_argument("--placement", default="", help="model:layer:MiB,... : what of the "
                        "work between grows the entry")
    parser.add_argument("--replay", default="", help="model:layer,... : warm, op by op")
    parser.add_argument("--spec-from", default="", metavar="RESULT_JSON",
                        help="with --replay: a bench_kernel_model result whose kit prices")
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = probe_clock("cpu")
    if args.replay:
        from ir.cluster import ClusterSpec
        with open(args.spec_from) as f:
            spec = ClusterSpec.from_dict(json.load(f)["spec_full"], args.spec_from)
        rows = [replay(name, spec, clock) for name in args.replay.split(",")]
        us = lambda x: f"{x * 1e6:.1f}"  # noqa: E731
        print(table(["layer (mb 1)", "ops", "tight", "its ops' tight loops", "model warm",
                     "model per-op", "model rest"],
                    [[r["layer"], r["ops"], us(r["tight_s"]), us(r["ops_tight_s"]),
                      us(r["model_warm_s"]), us(r["model_per_op_s"]),
                      us(r["model_warm_s"] - r["model_per_op_s"])] for r in rows]))
        print(f"load average {os.getloadavg()[0]:.1f}; kit {spec.kernel_calibration.measured_on}")
        return 0
    if args.placement:
        rows = [placement(name, clock) for name in args.placement.split(",")]
        print(table(["layer (mb 1)", "tight us", "after: mb 1 window", "mb 16 window",
                     "fill MiB", "mb 1 + fill before window", "mb 1 + fill last"],
                    [[r["layer"], f"{r['tight_s'] * 1e6:.0f}",
                      *(f"+{r[k] * 1e6:.0f}" for k in ("mb_1_window_s", "mb_16_window_s")),
                      f"{r['fill_mib']:.0f}",
                      *(f"+{r[k] * 1e6:.0f}" for k in ("mb_1_plus_fill_before_s",
                                                       "mb_1_plus_fill_last_s"))]
                     for r in rows]))
        print(f"load average {os.getloadavg()[0]:.1f}")
        with open(RESULTS.replace(".json", "_placement.json"), "w") as f:
            json.dump({"bench": "entry_footprint_placement", "rows": rows,
                       "load_average_1min": os.getloadavg()[0]}, f, indent=2)
        return 0
    if args.context:
        rows = [r for name in args.context.split(",") for r in in_context(name, clock)]
        print_context(rows)
        print(f"load average {os.getloadavg()[0]:.1f}")
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS.replace(".json", "_context.json"), "w") as f:
            json.dump({"bench": "entry_footprint_context", "rows": rows,
                       "load_average_1min": os.getloadavg()[0]}, f, indent=2)
        return 0
    subs = subjects()
    small, x = small_neighbour(), torch.randn(1, 64, 64)
    small_ops = overloads(lambda: small(x))
    fills = {mib: torch.empty(mib * 2**20 // 4) for mib in FILL_MIB}
    befores = {("fill", mib): (lambda b=fills[mib]: b.fill_(1.0)) for mib in FILL_MIB}
    befores.update({("fill+small", mib): (lambda b=fills[mib]: (b.fill_(1.0), small(x)))
                    for mib in FILL_MIB})
    best = {}
    for subject, _ in subs.values():  # warm-up: allocator, autograd
        timed(subject, lambda: None, clock)
    for r in range(ROUNDS):  # subjects and placements interleaved, the order turned a round
        for s, (subject, _) in subs.items():
            best[s, "tight"] = min(best.get((s, "tight"), float("inf")), tight(subject, clock))
            keys = list(befores)
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                best[s, key] = min(best.get((s, key), float("inf")),
                                   timed(subject, befores[key], clock))
    rows = []
    for s, (subject, module) in subs.items():
        row = {"subject": s, **footprint(subject, module), "tight_s": best[s, "tight"]}
        inputs = subject.inputs()
        row["cold_after_small"] = len(overloads(lambda: subject.call(inputs)) - small_ops)
        for where, mib in befores:
            row[f"{where.replace('+', '_')}_{mib}_s"] = best[s, (where, mib)] - best[s, "tight"]
        rows.append(row)
    fits = {mib: line([(r["cold_after_small"], r[f"fill_small_{mib}_s"]) for r in rows
                       if r["subject"].startswith("unary") and "16KiB" in r["subject"]])
            for mib in FILL_MIB}
    us = lambda x: f"{x * 1e6:.0f}"  # noqa: E731
    print(table(["subject", "ops", "distinct", "cold vs small", "op KiB", "modules", "tight us",
                 *(f"fill {mib}" for mib in FILL_MIB),
                 *(f"+small {mib} (chain fit)" for mib in FILL_MIB)],
                [[r["subject"], r["ops"], r["distinct"], r["cold_after_small"],
                  f"{r['op_bytes'] / 1024:.0f}", r["modules"], us(r["tight_s"]),
                  *(us(r[f"fill_{mib}_s"]) for mib in FILL_MIB),
                  *(f"{us(r[f'fill_small_{mib}_s'])} ({us(fits[mib][0] + fits[mib][1] * r['cold_after_small'])})"
                    for mib in FILL_MIB)] for r in rows]))
    print("chain fit per MiB, us: " + ", ".join(
        f"{mib}: {a * 1e6:.1f} + {b * 1e6:.2f}/cold op" for mib, (a, b) in fits.items()))
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"bench": "entry_footprint", "load_average_1min": load, "rows": rows,
                   "chain_fit_s": {mib: list(ab) for mib, ab in fits.items()}}, f, indent=2)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
