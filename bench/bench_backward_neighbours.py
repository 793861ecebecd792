"""What a small layer's backward pays for what ran before it, by arrangement (issue 17:
the backward rows whose host share misses); one thread, the thread clock.

For each MODEL:MB:LAYER, the layer's backward as `planner profile` runs it
(`layer_profile.StepNeighbours`: the layers before's forwards, its forward, the layer
after's forward and backward, the engine's start warmed), timed as its own call ("call":
the engine's start in it) and from a pre-hook on its roots' nodes to a hook on its input
stand-ins' gradients ("nodes"; a layer with no floating input: to the call's end), with,
between the layer's forward and its timed backward:
  profile      the layer after's work (what the profile times)
  own copy     that, then the layer's own forward and backward (its ops all warm)
  probe block  `cold_entry_probes.neighbour_block`'s forward and backward instead (what
               `cold_backward_probes` prices every cold op after)
  window call  instead, every layer the cold count takes as warm
               (`ir.op_count.recent_window_layers` over their backward ops): their forwards
               in step order, then one backward call over them
  one call     their forwards, then their nodes and the layer's in ONE engine call, no
               Python between (a step's; "call" then holds the window's nodes too)
beside the layer's nodes in one backward call of a real step
(`bench_profile_step.real_step_backward_s`: stamp to the next layer's stamp; a layer at a
model's edge holds nodes there that the profile gives no layer: the loss's, a tied sum).
Arrangements alternate; medians of --runs after 3 rounds. profile - own copy is what the
layer pays for its place in the profile; the kit prices cold_distinct_ops_bwd x
cold_backward_op_host_s + cold_inner_ops_bwd x cold_backward_inner_op_host_s for it.

Read here (2026-11-25 ~10:00-10:10 UTC, load 5-10 on 2 shared cores, 2-3 runs; nodes,
us; the kit's figures that hour: 2.7-8.0 us a cold op, 1.6-3.5 an inner op, moving with
the load more than the profile's rows do):
  t5-tiny mb1 encoder_norm (cold 0+0): profile 64-66, own copy 47-53, probe block 71-73,
      window call 59-64, one call 48-49, real step 45-50. mb4: 97 / 68-72 / - / 88-97 /
      77 / 67-82. Its count (0) is a step's: in one call after the window its nodes run
      as warm as its own copy's. Timed in their own call they pay 10-17 us more, even
      after the window; after its own copy, not; after its own copy and then the window's
      call 55-60 (the window's call undoes the copy's warmth, its nodes right before the
      layer's in one call do not). Not the engine's start (the window's call without the
      sine that warms it: 52-56), nor page faults (0 minor faults in every timed call),
      nor glibc returning memory (MALLOC_TRIM_THRESHOLD_ / MMAP / TOP_PAD raised: same
      figures). The profile reads it 15-20 us above a step: its -15..-22% is the
      profile's, cause inside the call boundary open.
  dlrm-small mb1 tables.3 (1+18, after top_mlp): 39-46 / 22-26 / 55-58 / 33-42 / - /
      real 29-34: it pays 16-20 us after top_mlp, 29-33 after the probe's block (the
      kit's 2.69 + 18 x 1.60 = 31.5, the block's price): the +32%.
  gpt-tiny mb1 head (2+1, the last layer): 53-65 / 39-44 / 55-72; t5-tiny mb1 head
      (2+1): 69 / 51 / 75: 14-21 us for 2 cold ops + 1 inner (kit ~7): their cold ops
      (nll_loss's, log-softmax's backwards) cost more than the probe's unary ops.
  gpt-tiny mb4 norm (1+0, after head): 18-24 / 13-17 / 16-18 / 19-22; 4-7 us for its
      one cold op (native_layer_norm_backward; kit 2.7).
  llama-tiny mb4 embed (1+4, after blocks.0): 25-29 / 17-20 / 25-28: 8-11 us (kit 9.1):
      its miss (-21%) is not its cold price.
  mlp-small mb1 blocks.0 (0+0): 17-20 / 17-20 / 30-32 / 17-20 / 15: no price for its
      place; its +17..+19% is the warm one (see below).
  cnn-small mb1 stem (0+0): 44-48 / 41-43 / 69-70 / 52 / 44: 2-5 us for its place.
The warm per-node figure: the kit's Linear-LayerNorm-GELU-Linear chain (its formula
solved as bench_node_mix solves it) read 2.25-2.76 us a node, a Linear-ReLU chain's
1.89-2.16 (0.36-0.60 less: mlp-small's 5 nodes 1.8-3 us of its ~3.5 us miss); with the
weights' gradients stolen as the profile runs them, not accumulated: -0.08..+0.03 us a
node (no effect). Load 5-10.

Tried on these findings and dropped (bench_kernel_model's 90 backward rows, the same
timings priced both ways; 2026-11-25 10:10-10:30 UTC, load 3-6):
  - the probe's backward figure from each round's median run, not its mean (as
    `time_layer` reads a layer: the same runs gave 2.21-2.57 against 2.73-3.38 us a node
    at load 3): paired in one process 48 -> 52 rows over 15% (mlp-small's blocks +28 ->
    +23%, the heads and blocks further under): on this machine the load's inflation of
    the node figure was hiding the places' under-pricing.
  - the last layer's backward counted cold against no backward op (not its forward's
    ops): paired 48 -> 43 (gpt, llama, t5 heads within 15%), on two earlier runs' timings
    37 -> 35 and 29 -> 30; it puts dlrm's top_mlp over (+8 -> +19%, +15 -> +27%): its
    place costs 24-30 us here (profile - own copy) where 13-21 cold ops x 3.0 price
    39-63. A warm mm (a Linear's backward) or cross entropy run just before took 5-8 us
    each off gpt's and t5's heads (their mm, views and loss composites are all cold), none
    off top_mlp's: its cold ops are cheap ones, after small neighbours (as tables.3's).
  - the per-node figure less the probe chain's in-sequence share (the forward's rule
    over distinct backward ops): 37 -> 39; less 0.3-0.6 us a node (a GELU-free chain's)
    with the composites' excess scaled up to keep the chain's sum: 37 -> 36-41.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_backward_neighbours.py \\
        t5-tiny:1:encoder_norm dlrm-small:1:tables.3 mlp-small:1:blocks.0
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.autograd_engine import warm_engine_start  # noqa: E402
from cost_models.cold_entry_probes import ENTRY_TOKENS, ENTRY_WIDTH, neighbour_block  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from cost_models.layer_profile import StepNeighbours  # noqa: E402
from ir.graph_measurer import _clear_grads  # noqa: E402
from ir.op_count import recent_window_layers  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402

from bench.bench_kernel_model import traced_graph  # noqa: E402
from bench.bench_profile_step import real_step_backward_s  # noqa: E402

MODES = ("profile", "own copy", "probe block", "window call", "one call")
WARMUP_ROUNDS = 3


def _backward(roots: list[torch.Tensor]) -> None:
    if roots:
        torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])


def arrangements(model: str, micro_batch: int, name: str, runs: int, clock) -> dict:
    """{mode: (median call seconds, median nodes seconds)} and the layer's counts."""
    graph, measurer = traced_graph(model, micro_batch)
    factory = real_factory("cpu")
    i = [layer.name for layer in graph.layers].index(name)

    def runner(j):  # a fresh copy of layer j: its forward's roots, gradients cleared
        state = measurer.layer_state(j, factory)
        module = measurer.layer_module(j, state)

        def roots():
            _clear_grads(state)
            return measurer.module_roots(j, module(*measurer.fresh_inputs(j, state, factory)))
        return roots

    state = measurer.layer_state(i, factory)
    module = measurer.layer_module(i, state)
    own = runner(i)
    after = [graph.layers[j].measured.backward_overloads for j in range(i + 1, len(graph.layers))]
    window = [runner(j) for j in range(i + 1, i + 1 + recent_window_layers(after))]
    block = neighbour_block()
    neighbours = StepNeighbours(measurer, i, factory, graph.layers, "cpu")
    times = {mode: [] for mode in MODES}
    for rep in range(len(MODES) * (WARMUP_ROUNDS + runs)):
        mode = MODES[rep % len(MODES)]
        _clear_grads(state)
        neighbours.before_forward()
        inputs = measurer.fresh_inputs(i, state, factory)
        outs = measurer.module_roots(i, module(*inputs))
        if mode in ("profile", "own copy"):
            neighbours.before_backward()
        if mode == "own copy":
            _backward(own())
        elif mode == "probe block":
            _backward([block(torch.randn(1, ENTRY_TOKENS, ENTRY_WIDTH, requires_grad=True))])
        elif mode == "window call":  # forwards in step order, one engine call
            _backward([t for roots in window for t in roots()])
        if mode not in ("profile", "one call"):
            warm_engine_start("cpu")
        # one call: the window's forwards, then its nodes and the layer's in one engine call
        ahead = [t for roots in window for t in roots()] if mode == "one call" else []
        marks = {}
        for t in outs:
            t.grad_fn.register_prehook(lambda g: marks.setdefault("first", clock()) and None)
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.requires_grad:
                x.register_hook(lambda g: marks.__setitem__("last", clock()))
        start = clock()
        _backward(ahead + outs)
        end = clock()
        neighbours.after_backward()
        if rep >= WARMUP_ROUNDS * len(MODES):
            times[mode].append((end - start, marks.get("last", end) - marks.get("first", start)))
    layer = graph.layers[i]
    real = real_step_backward_s(model, micro_batch, [x.name for x in graph.layers], clock)
    return {"modes": {mode: (statistics.median(c for c, _ in t), statistics.median(n for _, n in t))
                      for mode, t in times.items()},
            "real_step_s": real.get(name), "cold": (layer.cold_distinct_ops_bwd,
                                                    layer.cold_inner_ops_bwd),
            "after": graph.layers[neighbours.after].name if neighbours.after is not None else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="+", metavar="MODEL:MB:LAYER")
    parser.add_argument("--runs", type=int, default=15, help="timed runs per arrangement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = probe_clock("cpu")
    for spec in args.layers:
        model, micro_batch, name = spec.split(":")
        r = arrangements(model, int(micro_batch), name, args.runs, clock)
        real = "-" if r["real_step_s"] is None else f"{r['real_step_s'] * 1e6:.1f}"
        print(f"{model} mb{micro_batch} {name} (after {r['after']}, cold {r['cold'][0]}+"
              f"{r['cold'][1]}), us call/nodes: "
              + "  ".join(f"{mode} {c * 1e6:.1f}/{n * 1e6:.1f}" for mode, (c, n) in r["modes"].items())
              + f"  real step nodes {real}; load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
