"""Why a layer's backward nodes cost more in their own engine call than inside a step's
one call, and `planner profile`'s backward before / after it times them inside one call
(issue 17: t5-tiny's encoder_norm read -15..-22% against the profile); one thread, the
thread clock.

  (default)  for each MODEL:MB:LAYER, `layer_profile.time_layer` at --old (the harness
             that timed the layer in its own call, after the layer after's backward and a
             warm engine start, less the fitted start) and now (`NodeSpan`: its nodes in
             one call after those of the layers whose backwards a step runs before it),
             alternated ROUNDS times in one process, beside the layer's nodes in one
             backward call of a real step (`bench_profile_step.real_step_backward_s`; none
             for the layer whose backward runs last; the one run first also holds the
             loss's nodes and a tied weight's sum: gpt-tiny's, t5-tiny's head).
  --nodes    a pre-hook stamp on each of the layer's nodes (and a hook on each leaf), by
             arrangement, after the old harness's neighbours ("own call"); after the
             count's window in its own call, the layer's call right after with no Python
             but the wrapper between ("window call"); the window's nodes then the layer's
             in one call ("one call"). Offsets from its first node, medians.
  --tail     the engine's end (a leaf's gradient hook to the call's return) by graph size.

Read here (2026-11-25 11:29 UTC, load 2.3), us, default (old / new / real step):
  t5-tiny encoder_norm mb1 58-64 / 41-43 / 44, mb4 87-94 / 65-71 / 72; dlrm-small
  tables.3 mb1 35-36 / 30-33 / 30; gpt-tiny head mb1 58-66 / 56-60 / 73 (real holds the
  loss and the tied sum); mlp-small blocks.1 mb1 20-24 / 17-20 / 19, mb4 27-30 / 21-22 /
  20. At load 10 (10:52) the same order: t5 mb1 62-85 / 46-53 / 55, dlrm 37-63 / 32-52
  / 43, mlp-small mb1 23-36 / 20-24 / 23.
  --nodes t5-tiny:1:encoder_norm, the leaf's accumulation after its 6 nodes at: own call
    82-86, window call 70-72, one call 53-60. Its rsqrt's, mean's and pow's backwards
    cost ~5 us more each in their own call; not the Python between the calls
    (`torch.autograd.grad`, `Tensor.backward` and the engine's `run_backward` called
    directly read the same, 76-86), but the call boundary: the engine's end and start
    between the window's nodes and the layer's. The engine's start fit cannot hold it:
    it is the layer's nodes that run slower, and the probe's own slower nodes go into
    its slope, not its intercept.
  --tail: 4.1 us for 1-10 nodes, 7-19 at 100, 53-80 at 400 (~0.2 us a node; perf: the
    GraphTask's disposal and glibc's malloc_consolidate), the same without Python's GC:
    after a window of layers the layer's call's end read 20 us where its own call's read
    5-11, which is why `NodeSpan` ends at a marker node, not at the call's return.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_backward_call.py \\
        t5-tiny:1:encoder_norm dlrm-small:1:tables.3 gpt-tiny:1:head mlp-small:1:blocks.0
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models import layer_profile  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from ir.graph_measurer import _clear_grads  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402

from bench.bench_kernel_model import traced_graph  # noqa: E402
from bench.bench_profile_step import real_step_backward_s  # noqa: E402

OLD_REV = "0da6ca4"  # main before this harness: the layer's backward in its own call
ROUNDS = 4
MEMORY_CAP_BYTES = 6 << 30


def old_harness(rev: str, clock) -> types.ModuleType:
    """`cost_models/layer_profile.py` at `rev`, its clock `clock`."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = subprocess.run(["git", "-C", root, "show", f"{rev}:cost_models/layer_profile.py"],
                          check=True, capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(), "old_layer_profile.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location("old_layer_profile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.time = types.SimpleNamespace(perf_counter=clock)
    return module


def paired(model: str, micro_batch: int, name: str, old, clock) -> dict:
    """{"old": [s], "new": [s], "real": s or None}: the layer's backward by each harness,
    alternated ROUNDS times, each on a fresh state after the instrumented run."""
    graph, measurer = traced_graph(model, micro_batch)
    i = [layer.name for layer in graph.layers].index(name)
    factory = real_factory("cpu")
    times = {"old": [], "new": []}
    for r in range(ROUNDS):
        for tag in ("old", "new") if r % 2 == 0 else ("new", "old"):
            state = measurer.layer_state(i, factory)
            col, row = measurer.tp_modules(i, graph.layers[i].tp_candidates)
            measurer.measure_layer(i, col, row, factory=factory, state=state)
            if tag == "old":
                engine = old.EngineSampler("cpu", clock)
                _, backward_s = old.time_layer(measurer, i, state, factory, "cpu", warmup=2,
                                               repeats=5, layers=graph.layers, engine=engine)
            else:
                engine = layer_profile.EngineSampler("cpu", clock, nodes_only=True)
                _, backward_s = layer_profile.time_layer(
                    measurer, i, state, factory, "cpu", warmup=2, repeats=5,
                    layers=graph.layers, engine=engine, clock=clock)
            times[tag].append(backward_s)
    real = real_step_backward_s(model, micro_batch, [x.name for x in graph.layers], clock)
    return {**times, "real": real.get(name)}


def node_stamps(model: str, micro_batch: int, name: str, old, clock, runs: int) -> dict:
    """{arrangement: [(node name, median us after the layer's first node)]}."""
    graph, measurer = traced_graph(model, micro_batch)
    i = [layer.name for layer in graph.layers].index(name)
    factory = real_factory("cpu")
    state, module = measurer.layer_state(i, factory), None
    module = measurer.layer_module(i, state)
    neighbours = old.StepNeighbours(measurer, i, factory, graph.layers, "cpu")
    window = layer_profile.StepNeighbours(measurer, i, factory, graph.layers, "cpu")
    modes = ("own call", "window call", "one call")
    stamps = {mode: [] for mode in modes}
    for rep in range(len(modes) * (3 + runs)):
        mode = modes[rep % len(modes)]
        _clear_grads(state)
        neighbours.before_forward()
        outs = measurer.module_roots(i, module(*measurer.fresh_inputs(i, state, factory)))
        ahead = []
        if mode == "own call":
            neighbours.before_backward()
        else:
            ahead = window.before_backward()
        marks, handles, seen, stack = [], [], set(), [t.grad_fn for t in outs]
        while stack:  # the layer's nodes
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            stack.extend(f for f, _ in node.next_functions)
            if hasattr(node, "variable"):  # a leaf's accumulation (it outlives the run)
                handles.append(node.register_hook(
                    lambda gi, go: marks.append(("leaf", clock())) and None))
            else:
                handles.append(node.register_prehook(
                    lambda g, n=node.name(): marks.append((n, clock())) and None))
        ahead_seeds = [torch.ones_like(t) for t in ahead]
        seeds = [torch.ones_like(t) for t in outs]
        if mode == "window call":
            torch.autograd.backward(ahead, ahead_seeds)
            torch.autograd.backward(outs, seeds)
        else:
            torch.autograd.backward(ahead + outs, ahead_seeds + seeds)
        for handle in handles:
            handle.remove()
        neighbours.after_backward()
        if rep >= 3 * len(modes):
            stamps[mode].append([(n, t - marks[0][1]) for n, t in marks])
    return {mode: [(rows[0][k][0], statistics.median(r[k][1] for r in rows) * 1e6)
                   for k in range(len(rows[0]))] for mode, rows in stamps.items()}


def engine_tail_us(clock, nodes: int, runs: int = 50) -> float:
    """Median us from a leaf's gradient hook to the return of a backward over a chain of
    `nodes` multiplies on it."""
    tails = []
    for rep in range(runs + 10):
        leaf = torch.ones(4, requires_grad=True)
        y = leaf
        for _ in range(nodes):
            y = y * 1.0001
        mark = []
        leaf.register_hook(lambda g: mark.append(clock()))
        torch.autograd.backward(y, torch.ones(4))
        end = clock()
        if rep >= 10:
            tails.append(end - mark[0])
    return statistics.median(tails) * 1e6


def kernel_model_ab(models: list[str], batches: list[int], old, rounds: int = 2) -> dict:
    """{(model, mb, layer): {"old": [error], "new": [error]}}: bench_kernel_model's backward
    rows (prediction / profile - 1) with the profile by each harness, alternated `rounds`
    times per graph in one process, one device spec for both."""
    from bench.bench_kernel_model import QUICK_REPEATS, QUICK_WARMUP, gemm_shapes, \
        measure_model
    from cost_models.autograd_engine import EngineSampler
    from cost_models.profile_device import profile_device

    graphs = {(m, mb): traced_graph(m, mb) for m in models for mb in batches}
    spec, _ = profile_device("cpu", extra_gemm_shapes=gemm_shapes(g for g, _ in graphs.values()))
    torch.set_num_threads(1)
    new_harness = (layer_profile.time_layer, layer_profile.EngineSampler)
    old_harness_ = (old.time_layer, lambda device, clock, nodes_only=False: EngineSampler(
        device, clock))
    errors: dict = {}
    for (model, mb), (graph, measurer) in graphs.items():
        for r in range(rounds):
            for tag in ("old", "new") if r % 2 == 0 else ("new", "old"):
                layer_profile.time_layer, layer_profile.EngineSampler = (
                    old_harness_ if tag == "old" else new_harness)
                try:
                    rows = measure_model(model, mb, graph, measurer, spec, QUICK_WARMUP,
                                         QUICK_REPEATS)
                finally:
                    layer_profile.time_layer, layer_profile.EngineSampler = new_harness
                for row in rows:
                    if row["phase"] == "bwd":
                        errors.setdefault((model, mb, row["layer"]), {"old": [], "new": []})[
                            tag].append(row["error"])
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", metavar="MODEL:MB:LAYER")
    parser.add_argument("--old", default=OLD_REV, help="git revision of the old harness")
    parser.add_argument("--nodes", action="store_true", help="per-node stamps by arrangement")
    parser.add_argument("--tail", action="store_true", help="the engine's end by graph size")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--kernel-model", default=None, metavar="MODELS",
                        help="comma-separated zoo presets: bench_kernel_model's backward "
                             "rows by each harness (--batches)")
    parser.add_argument("--batches", default="1,4")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))
    torch.set_num_threads(1)
    clock = probe_clock("cpu")
    old = old_harness(args.old, clock)
    if args.kernel_model:
        errors = kernel_model_ab(args.kernel_model.split(","),
                                 [int(b) for b in args.batches.split(",")], old)
        over = {tag: 0 for tag in ("old", "new")}
        for (model, mb, layer), e in errors.items():
            for tag in over:
                over[tag] += abs(statistics.median(e[tag])) > 0.15
            print(f"{model} mb{mb} {layer} bwd error: old "
                  + "/".join(f"{x:+.0%}" for x in e["old"]) + "  new "
                  + "/".join(f"{x:+.0%}" for x in e["new"]))
        print(f"{len(errors)} backward rows; over 15% (median of rounds): old {over['old']}, "
              f"new {over['new']}; load {os.getloadavg()[0]:.1f}")
    if args.tail:
        print("engine's end, us: " + "  ".join(
            f"{n} nodes {engine_tail_us(clock, n):.1f}" for n in (1, 10, 100, 400)))
    for spec in args.layers:
        model, micro_batch, name = spec.split(":")
        if args.nodes:
            for mode, row in node_stamps(model, int(micro_batch), name, old, clock,
                                         args.runs).items():
                print(f"{spec} {mode:11s} " + " ".join(f"{n[:12]}@{t:.1f}" for n, t in row))
        else:
            r = paired(model, int(micro_batch), name, old, clock)
            real = "-" if r["real"] is None else f"{r['real'] * 1e6:.1f}"
            print(f"{spec} backward us: old " + "/".join(f"{s * 1e6:.1f}" for s in r["old"])
                  + "  new " + "/".join(f"{s * 1e6:.1f}" for s in r["new"])
                  + f"  real step {real}")
        print(f"  load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
