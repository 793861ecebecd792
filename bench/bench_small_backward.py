"""Where a small layer's backward goes when `planner profile` times it after its step
neighbour (issue 17): the autograd engine's start, paid cold, or the layer's own nodes.

`layer_profile.time_layer` times each layer's backward as its own
`torch.autograd.backward` call right after the layer after's forward and backward
(`StepNeighbours`), and takes out the engine's start as the intercept of probe graphs
timed in a tight loop after the runs (`autograd_engine.EngineSampler`): a WARM start. A
call made right after other code runs its start (Python's `torch.autograd.backward`, the
engine's graph task) cold. A step runs all its layers' nodes in one engine call and pays
one start per micro-batch and stage, so that cold excess is the profile's, not the step's.

Part 1 (`--calls`, the mechanism): a multiply's backward right after the backward of 28
distinct `bench.chained_calls` as its own call, and inside one call with them
(the multiply's node run after theirs: what a step does).

Part 2 (per layer, one thread, the thread clock): each unique layer's backward as the
profile times it (`raw`), and
  warm start  the intercept of the engine probe graphs in a tight loop (the profile's)
  cold start  the same graphs, each timed right after the layer's forward and the step
              neighbour's forward and backward, as the layer's own backward is
  absorbed    the layer's backward after the neighbour and then, untimed, one tiny
              backward of another op (`warm_engine_start`: a sine's; its start warms the
              engine's, none of the layer's nodes runs)
so raw - warm is what the profile reports, raw - cold and absorbed - warm what the
layer's nodes cost after the neighbour (the two should agree), and cold - warm the excess
the profile keeps. With `--predicted` (a bench/results/kernel_model.json), each row's
predicted seconds beside both readings. Microseconds; medians of REPEATS after WARMUP.
`--step MODEL:MB,...`: the whole model's backward (one call) beside the sum of its
layers' figures read either way, plus one warm start. `--probe`: part 5 below; `--sweep`: part 6
(JSON to bench/results/small_backward_sweep.json). `--all`:
every layer of bench_kernel_model's models and micro-batches, and how many backward passes
miss its target read either way. (The figures below were read before
`StepNeighbours.before_backward` warmed the start itself, which `planner profile` now
does: raw and absorbed read alike since; the "--kernel-model" what-if below was that
change, run ahead of it.) Target: none (a decomposition); exits 0. JSON to bench/results/small_backward.json.

Read here (one thread, thread clock, 2026-11-25 04:25-04:33 UTC, load 3-8: re-measure on
a quiet machine). --calls: the multiply's node as its own call after the chain's backward
26-29 us, warm 15-18 (11-12 us more), inside the chain's call -3..+1 us: the excess is the
call's, and one tiny backward of another op in between took it away (a sine's or an
exp's: 16.8 -> 3.2-3.8 us; 28 calls of 4 distinct ops before: 3.3). The cold start's
excess over the warm one (cold start - warm), us: 3-4 after dlrm's tables, 5-9 after a
head or the layer's own forward, 15-25 after a block at micro-batch 1, 40-160 at 16.
--all: 50 of 90 backward passes over 15% as the profile reads them (raw - warm), 40 with
the start warmed (absorbed - warm); what the warm start leaves: dlrm tables.3 -58% (its
`_embedding_bag_backward` runs ~20 distinct ATen ops inside, which the layer counter sees
as one cold op: top_mlp ran none), llama/gpt/bert embeddings -20..-44% at micro-batch 1
(`embedding_dense_backward`), t5's rel_bias -10..-46% (grows with the block before it),
last layers after their own forward (cnn head -37..-50%, bert head -23..-26%, top_mlp
-25..-38%), norms -15..-34%; mlp-small's blocks +16..+26%. --kernel-model (all seven
models) against bench_kernel_model run just before, backward passes over 15% of 90: 58 ->
51 (load 8-9), 62 -> 37 (load 6-7), 53 -> 31 (load 5-6); median |error| 19% -> 11% in the
last pair. --step (load 7): the whole backward against the layers' sum the profile's way
/ start warmed: gpt-tiny mb1 -0% / -2%, mb16 +0% / -1%, llama-tiny mb1 +22% / +8%,
bert-tiny mb4 +11% / -1%, dlrm-small mb1 +28% / +8%, mb16 +20% / +3%, cnn-small mb4 +6% /
-1%, mlp-small mb4 +15% / +10%; t5-tiny mb1 -19% / -23% (under either way).

Quiet re-read (load 0.3-0.6, 05:40 UTC): bench_kernel_model 29 of 90 backward passes over
15% (median 8%); --all raw 33, absorbed 31. cold_backward_chains per cold op, cold - warm:
6.8, 3.4-3.9, 3.5, 3.0, 2.5-2.8 us at 1, 2, 4, 5, 11 cold ops (a line: 4.7 us + 2.05 per
op); added per layer (Layer.cold_distinct_ops_bwd) to those rows: 30 over 15%; a flat 1.2
us per op: 23 (a fit to the bench, not a probe). Nested ATen ops the CPU profiler sees in
a backward where a dispatch mode sees 2-3: embedding 8, embedding bag 22, cross-entropy 4.
With those counted (Layer.cold_inner_ops_bwd), two bench_kernel_model runs: a flat 1.0 us
per cold op 29 -> 15 and 32 -> 24 over 15% (0.8 us: 16, 20); the probe's line 4.7 us +
2.05 per op 29 -> 44, 32 -> 50 (its slope alone 33, 36): the probe reads twice what fits.

Part 5 (`--probe`, 2026-11-25 07:17 UTC, load 6): the one-call probe read 7.4, 8.6, 17.7,
16.8, 33.0 us at 1, 2, 4, 5, 11 cold ops where its chains' own nodes in that same call
(gradient hooks) paid 0.6, 1.0, 11.0, 11.9, 23.8: a ~7 us intercept of its call
subtraction, and chained calls whose backward kernels are large (GELU's, softmax's);
`cold_backward_probes` (profile order, after a block; unary chains, an embedding bag, an
embedding) 2.6, 3.7, 10.4, 11.4, 22.3 us at 1, 2, 7, 10, 17 cold ops, 14.4 at 1 + 19
inner, 4.5 at 1 + 4: 1.30 us per cold op, 0.69 per inner op. Priced (profile-device's
figures, cold ops counted over the window of layers whose backward ran just before,
none where the step stays warm) against the same run's rows without them, backward
passes over 15% of 90: 34 -> 14 (load 3.6), 33 -> 18 (6.2), 38 -> 22, 35 -> 32 (7.2),
48 -> 46 (6.6); moved out in any run: cnn-small head mb1 (+15..+26%, 3 of 5 runs; 5 of
its 8 cold ops are views, which a view-only chain showed cost as much cold: 3.5 us at 1,
6 at 3), llama norm mb1/16, dlrm top_mlp mb4 (one run each). Re-measure quiet.

Part 6 (`--sweep`, 2026-11-25 08:11 UTC, load 6.0-6.6, three runs; re-measure quiet):
cold - warm of an embedding's backward (the composite instance; llama-tiny's 128 x 64
table over 32 tokens read within 0.5 us of it) after each neighbour, us: the probe's
block 4.1-4.4; its bytes alone (tokens 16 / 256) 3.9-4.2 / 4.4-4.8; its width (16 / 128
/ 192: kernel sizes and weight bytes) 3.9-4.1 / 4.3-4.4 / 4.8-5.4; its nodes and weights
(2 / 4 blocks) 4.5-4.6 / 5.2-5.7; its distinct backward ops alone (15 -> 21 / 26) 4.8-5.2
/ 5.8-6.0; ~0.4 ms of Python after its forward (no op) 5.6-6.0; llama-tiny's decoder
layer (22 ops, an HF forward) 6.4-6.9. The 4-op unary chain moves alike (8.1-9.2 ->
10.4-11.1 at width 192 / 4 blocks, 11.1-11.5 after the Python). No one variable: the
neighbour's time (0.6 us per ms of its forward and backward), its distinct ops (~0.15 us
each) and Python run in between each move it by 1-2 us. The profile's llama embed row
(absorbed - warm 14.4 us, warm ~7) matches the llama-layer neighbour's 6.4-6.9 us cold;
the probe's fit prices its 1 + 4 cold ops at 3.6. Not priced (a second variable the
layer IR does not hold: the Python the layer after runs).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_small_backward.py --sweep
    PYTHONPATH=$PWD .venv/bin/python bench/bench_small_backward.py --calls
    PYTHONPATH=$PWD .venv/bin/python bench/bench_small_backward.py --probe
    PYTHONPATH=$PWD .venv/bin/python bench/bench_small_backward.py --model dlrm-small --mb 1 \
        --layers tables,top_mlp --predicted bench/results/kernel_model.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.autograd_engine import ENGINE_PROBE_ELEMENTS, ENGINE_PROBE_OPS, warm_engine_start, \
    EngineSampler, fit_line  # noqa: E402
from cost_models.clusters import _one_thread  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from cost_models.layer_profile import StepNeighbours, step_neighbours  # noqa: E402
from ir.graph_measurer import _clear_grads  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402
from planner.fmt import table  # noqa: E402

from bench.bench_kernel_model import traced_graph  # noqa: E402
from bench.chained_calls import chained_calls  # noqa: E402

WARMUP, REPEATS = 3, 15  # median of fifteen after three untimed runs
CALL_RUNS = 40  # part 1's medians
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "small_backward.json")


def calls_split(clock) -> dict:
    """Part 1: median seconds of a multiply's backward right after the 28-call chain's
    backward as its own call (`after_call`) and alone right after itself (`warm_call`),
    of the chain's backward alone (`chain`) and with the multiply's node inside the same
    call, run after the chain's nodes (`one_call`)."""
    calls = chained_calls("cpu")
    x = torch.randn(2, 8, 8, requires_grad=True)

    def graph(with_mul: bool, with_chain: bool):
        z = x * 0.5 if with_mul else x.detach().requires_grad_()
        for call in calls if with_chain else ():
            z = call(z)
        return z, torch.ones_like(z)

    def timed(z, seed) -> float:
        start = clock()
        torch.autograd.backward(z, seed)
        seconds = clock() - start
        x.grad = None
        return seconds

    runs = {k: [] for k in ("one_call", "chain", "after_call", "warm_call")}
    for _ in range(CALL_RUNS):
        runs["one_call"].append(timed(*graph(True, True)))
        mul, chain = graph(True, False), graph(False, True)
        runs["chain"].append(timed(*chain))
        runs["after_call"].append(timed(*mul))
        runs["warm_call"].append(timed(*graph(True, False)))
    return {k: statistics.median(v) for k, v in runs.items()}


def _probe_graph(leaf: torch.Tensor, ops: int):
    """`autograd_engine.EngineSampler`'s probe graph of `ops` multiplies and its seed."""
    y = leaf
    for _ in range(ops):
        y = y * 1.0001
    return y, torch.ones_like(y)


def time_backward(measurer, index: int, state: dict, factory, clock) -> dict:
    """Part 2 for layer `index`: median raw and absorbed backward seconds, and the warm
    and cold engine starts (intercepts), on `clock`."""
    module = measurer.layer_module(index, state)
    neighbours = StepNeighbours(measurer, index, factory)
    leaf = torch.randn(ENGINE_PROBE_ELEMENTS, requires_grad=True)
    raw, absorbed = [], []
    cold = {ops: [] for ops in ENGINE_PROBE_OPS}

    def step_forward():
        _clear_grads(state)
        neighbours.before_forward()
        outs = measurer.module_roots(index, module(*measurer.fresh_inputs(index, state,
                                                                          factory)))
        return outs, [torch.ones_like(t) for t in outs]

    for rep in range(WARMUP + REPEATS):
        for variant in ("raw", "absorbed"):
            outs, seeds = step_forward()
            neighbours._backward(neighbours.before_backward())
            if variant == "absorbed":
                warm_engine_start()
            start = clock()
            torch.autograd.backward(outs, seeds)
            seconds = clock() - start
            if rep >= WARMUP:
                (raw if variant == "raw" else absorbed).append(seconds)
        for ops in ENGINE_PROBE_OPS:  # the probe graphs where the layer's backward stands
            outs, seeds = step_forward()
            y, seed = _probe_graph(leaf, ops)
            neighbours._backward(neighbours.before_backward())
            start = clock()
            torch.autograd.backward(y, seed)
            seconds = clock() - start
            leaf.grad = None
            if rep >= WARMUP:
                cold[ops].append(seconds)
            del outs, seeds
    warm = EngineSampler("cpu", clock)  # the profile's: a tight loop after the runs
    for rep in range(WARMUP + REPEATS):
        for _ in range(4):
            warm.sample(keep=rep >= WARMUP)
    cold_start, _ = fit_line([float(ops) for ops in ENGINE_PROBE_OPS],
                             [statistics.median(cold[ops]) for ops in ENGINE_PROBE_OPS])
    return {"raw_s": statistics.median(raw), "absorbed_s": statistics.median(absorbed),
            "warm_start_s": warm.result().seconds, "cold_start_s": cold_start}


def layer_rows(model: str, micro_batch: int, prefixes: tuple[str, ...] | None,
               predicted_path: str | None, clock) -> list[dict]:
    """Part 2's rows for the unique layers of `model` whose names start with `prefixes`
    (None: all), each named as bench_kernel_model names its backward row."""
    graph, measurer = traced_graph(model, micro_batch)
    factory = real_factory("cpu")
    predicted = predictions(predicted_path, model, micro_batch)
    rows, seen = [], set()
    for i, layer in enumerate(graph.layers):
        if layer.structural_hash in seen or (prefixes and not layer.name.startswith(prefixes)):
            continue
        seen.add(layer.structural_hash)
        _, after = step_neighbours(measurer, i)
        at = graph.layers[i if after is None else after - 1]  # as bench_kernel_model
        if not at.ops_bwd:
            continue
        t = time_backward(measurer, i, measurer.layer_state(i, factory), factory, clock)
        rows.append({"model": model, "micro_batch": micro_batch, "layer": at.name,
                     "after": None if after is None else graph.layers[after].name,
                     "predicted_s": predicted.get(at.name), **t})
    return rows


def run_all(predicted_path: str | None, clock) -> int:
    """Every model and micro-batch of bench_kernel_model: how many backward passes miss
    TARGET_ERROR as the profile reads them (raw - warm start) and with the start warmed
    (absorbed - warm start)."""
    from bench.bench_kernel_model import MICRO_BATCHES, MODELS, TARGET_ERROR

    rows = []
    with _one_thread():
        for model in MODELS:
            for micro_batch in MICRO_BATCHES:
                rows.extend(layer_rows(model, micro_batch, None, predicted_path, clock))
    scored = [r for r in rows if r["predicted_s"]]

    def error(r, key):
        return r["predicted_s"] / (r[key] - r["warm_start_s"]) - 1.0

    print(table(["model", "layer", "batch", "after", "predicted us", "raw-warm us",
                 "absorbed-warm us", "cold start - warm us", "err raw", "err absorbed"],
                [[r["model"], r["layer"], r["micro_batch"], r["after"] or "(own fwd)",
                  f"{r['predicted_s'] * 1e6:.1f}", f"{(r['raw_s'] - r['warm_start_s']) * 1e6:.1f}",
                  f"{(r['absorbed_s'] - r['warm_start_s']) * 1e6:.1f}",
                  f"{(r['cold_start_s'] - r['warm_start_s']) * 1e6:.1f}",
                  f"{error(r, 'raw_s'):+.0%}", f"{error(r, 'absorbed_s'):+.0%}"] for r in scored]))
    for key in ("raw_s", "absorbed_s"):
        errors = sorted(abs(error(r, key)) for r in scored)
        print(f"{key[:-2]}: {len(scored)} backward passes, median |error| "
              f"{errors[len(errors) // 2]:.0%}, {sum(e > TARGET_ERROR for e in errors)} over "
              f"{TARGET_ERROR:.0%}")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"bench": "small_backward", "load_average_1min": os.getloadavg()[0],
                   "rows": rows}, f, indent=2)
    return 0


def composite_cold(clock, others: int) -> list[tuple[str, float, float]]:
    """Part 3: (name, cold - warm seconds, warm seconds) of ops whose backward the layer
    counter sees as one op but which run several inside ATen, each node run inside ONE
    engine call after the nodes of the last `others` `chained_calls` (their parts built
    first run last), against a second copy of it run after the first: cold excess = (one
    copy + others) - others - ((two copies + others) - (one copy + others))."""
    import torch.nn.functional as F

    calls = chained_calls("cpu")[-others:]
    table_w = torch.randn(64, 8, requires_grad=True)
    ids, bag_ids, offsets = (torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (64,)),
                             torch.arange(0, 64, 4))
    x = torch.randn(2, 8, 8, requires_grad=True)
    targets = torch.randint(0, 8, (16,))
    ops = {"embedding_dense_backward": lambda: F.embedding(ids, table_w),
           "_embedding_bag_backward": lambda: F.embedding_bag(bag_ids, table_w, offsets,
                                                              mode="sum"),
           "nll_loss + log_softmax backward": lambda: F.cross_entropy(x.view(16, 8), targets),
           "tanh_backward (one plain op)": lambda: torch.tanh(x)}

    def call_s(op, copies: int) -> float:
        parts = [op().sum() for _ in range(copies)]
        y = torch.randn(2, 8, 8, requires_grad=True)
        for call in calls:
            y = call(y)
        root = y.sum()
        for part in parts:
            root = root + part
        start = clock()
        root.backward()
        seconds = clock() - start
        table_w.grad = x.grad = None
        return seconds

    rows = []
    for name, op in ops.items():
        runs = {copies: [] for copies in (0, 1, 2)}
        for _ in range(CALL_RUNS):
            for copies in runs:
                runs[copies].append(call_s(op, copies))
        t0, t1, t2 = (statistics.median(runs[c]) for c in (0, 1, 2))
        rows.append((name, (t1 - t0) - (t2 - t1), t2 - t1))
    return rows


def step_vs_layers(model: str, micro_batch: int, clock) -> dict:
    """Part 4: the whole model's backward (one engine call after its forward and loss,
    every `.grad` None first, as a step's first micro-batch; median of REPEATS) beside the
    sum over its layers (each unique layer's part-2 figure times the layers of its
    structure) plus one warm start, read the profile's way (raw - warm) and with the start
    warmed (absorbed - warm)."""
    import collections

    from planner.models import load_model

    loaded = load_model(model, micro_batch, None, device="cpu")
    module = loaded.module.float()

    def backward_s() -> float:
        for p in module.parameters():
            p.grad = None
        loss = loaded.loss_fn(module(**loaded.inputs), loaded.target)
        start = clock()
        loss.backward()
        return clock() - start

    for _ in range(WARMUP):
        backward_s()
    whole_s = statistics.median(backward_s() for _ in range(REPEATS))
    graph, _ = traced_graph(model, micro_batch)
    per_structure = collections.Counter(layer.structural_hash for layer in graph.layers)
    structure = {layer.name: layer.structural_hash for layer in graph.layers}
    rows = layer_rows(model, micro_batch, None, None, clock)
    start_s = statistics.median(r["warm_start_s"] for r in rows)
    sums = {key: start_s + sum(per_structure[structure[r["layer"]]]
                               * (r[key] - r["warm_start_s"]) for r in rows)
            for key in ("raw_s", "absorbed_s")}
    return {"model": model, "micro_batch": micro_batch, "whole_s": whole_s,
            "profile_sum_s": sums["raw_s"], "warmed_sum_s": sums["absorbed_s"]}


def predictions(path: str | None, model: str, micro_batch: int) -> dict:
    """(layer name) -> predicted backward seconds from a bench_kernel_model JSON."""
    if not path:
        return {}
    with open(path) as f:
        rows = json.load(f)["rows"]
    return {r["layer"]: r["predicted_s"] for r in rows if r["model"] == model
            and r["micro_batch"] == micro_batch and r["phase"] == "bwd"}


# Part 5's chains: the first PROBE_CHAIN_CALLS `chained_calls`, after the nodes of the
# last PROBE_OTHERS (half of them: a small layer's worth), as the deleted one-call probe
# (`sequence_probes.cold_backward_chains`) built them.
PROBE_CHAIN_CALLS = (1, 2, 4, 8, 14)
PROBE_OTHERS = 14


def probe_split(clock) -> list[dict]:
    """Part 5 (`--probe`): why the one-call probe (`sequence_probes.cold_backward_chains`,
    since deleted) read ~2x. Per chain of PROBE_CHAIN_CALLS `chained_calls`: its nodes
    inside one call with the others' nodes, timed by gradient hooks (from its output's
    gradient to its input's), after the others' nodes and after a copy's (the one-call
    probe's own figures were call differences: their readings are in the docstring);
    then `cold_backward_probes`' chains (the profile's order, after a block) and their
    fit."""
    from cost_models.cold_backward_probes import _ops_of, cold_backward_cost, \
        cold_backward_layers

    calls = chained_calls("cpu")
    others = calls[-PROBE_OTHERS:]

    def built(chain):
        leaf = torch.randn(2, 8, 8, requires_grad=True)
        z = leaf
        for call in chain:
            z = call(z)
        return z, leaf

    def nodes_s(chain, before) -> float:
        (z, leaf), (o, _) = built(chain), built(before)
        marks = {}
        z.register_hook(lambda g: marks.__setitem__("start", clock()))
        leaf.register_hook(lambda g: marks.__setitem__("end", clock()))
        (z.sum() + o.sum()).backward()
        return marks["end"] - marks["start"]

    others_ran = _ops_of(lambda: built(others)[0], "cpu").backward_overloads
    rows = []
    for k in PROBE_CHAIN_CALLS:
        chain = calls[:k]
        cold, warm = [], []
        for _ in range(CALL_RUNS):
            cold.append(nodes_s(chain, others))
            warm.append(nodes_s(chain, chain))
        ran = _ops_of(lambda: built(chain)[0], "cpu").backward_overloads
        rows.append({"chain": f"{k} chained calls", "cold_ops": len(ran - others_ran),
                     "nodes_in_call_s": statistics.median(cold) - statistics.median(warm)})
    chains = cold_backward_layers("cpu")
    for c in chains:
        rows.append({"chain": "profile order", "cold_ops": c.cold_ops,
                     "cold_inner_ops": c.cold_inner_ops, "profile_order_s": c.extra_s})
    cost = cold_backward_cost(chains)
    rows.append({"chain": "fit", "op_s": cost.op_s, "inner_op_s": cost.inner_op_s,
                 "residual_s": cost.residual_s})
    return rows


# Part 6's neighbours: (name, block width, blocks, tokens, extra distinct ops after the
# last block). The probe's own is "block"; each other changes one thing: its kernels'
# sizes and bytes (width), its nodes and bytes, not its op set (blocks), its bytes only
# (tokens), its distinct ops only (extra ops none of the targets runs).
SWEEP_NEIGHBOURS = (("block", 64, 1, 64, 0), ("width 16", 16, 1, 64, 0),
                    ("width 128", 128, 1, 64, 0), ("width 192", 192, 1, 64, 0),
                    ("2 blocks", 64, 2, 64, 0),
                    ("4 blocks", 64, 4, 64, 0), ("tokens 16", 64, 1, 16, 0),
                    ("tokens 256", 64, 1, 256, 0), ("+6 ops", 64, 1, 64, 6),
                    ("+12 ops", 64, 1, 64, 12))
SWEEP_RUNS = 41  # medians; the neighbours alternate inside each run
# "block + Python": ~0.4-0.5 ms of interpreter work here, about an HF layer's forward
SWEEP_PYTHON_ITEMS = 1000


def _extra_ops() -> list:
    """Differentiable unary calls, one distinct ATen overload each, that neither the
    block nor `_unary_ops` nor an embedding's backward runs."""
    import torch.nn.functional as F

    return [torch.log1p, torch.expm1, torch.atan, torch.sinh, torch.cosh, torch.asinh,
            F.softplus, F.leaky_relu, F.hardtanh, F.logsigmoid, torch.asin, torch.acos]


def _llama_layer():
    """A run of llama-tiny's first decoder layer (and final norm: a one-layer
    `LlamaModel` at its zoo config) on its micro-batch-1 input embeddings: the neighbour
    the profile times the llama embedding's backward after."""
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
                         intermediate_size=160, vocab_size=128, num_hidden_layers=1,
                         max_position_embeddings=32)
    model = LlamaModel(config).float()

    def run():
        x = torch.randn(1, 32, 64, requires_grad=True)
        return model(inputs_embeds=x).last_hidden_state
    return run


def neighbour_sweep(clock) -> list[dict]:
    """Part 6 (`--sweep`): what sets a cold target's price: an embedding's backward
    (`embedding_dense_backward`, a composite) and a chain of 4 `_unary_ops`, each timed as
    `cold_backward_probes` times them (`backward_after`) after each SWEEP_NEIGHBOURS
    neighbour and after a copy of itself; cold - warm per neighbour, beside the
    neighbour's distinct backward overloads, its forward's seconds and its own
    backward's seconds (after itself)."""
    from cost_models.cold_backward_probes import _ops_of, backward_after
    from cost_models.cold_entry_probes import _unary_ops, neighbour_block
    from ir.composite_ops import COMPOSITE_BACKWARDS

    def neighbour_of(width, blocks, tokens, extra):
        stack = [neighbour_block(width) for _ in range(blocks)]
        ops = _extra_ops()[:extra]

        def run():
            z = torch.randn(1, tokens, width, requires_grad=True)
            for block in stack:
                z = block(z)
            for op in ops:
                z = op(z)
            return z
        return run

    def chain():
        z = torch.randn(2, 8, 8, requires_grad=True)
        for call in _unary_ops()[:4]:
            z = call(z)
        return z

    table_weight = torch.randn(128, 64, requires_grad=True)  # llama-tiny's vocab x hidden

    def llama_embedding():
        return torch.nn.functional.embedding(torch.randint(0, 128, (1, 32)), table_weight)

    targets = {"embedding": COMPOSITE_BACKWARDS["aten.embedding_dense_backward.default"],
               "llama-tiny embedding": llama_embedding, "4 unary ops": chain}
    neighbours = {name: neighbour_of(*spec) for name, *spec in SWEEP_NEIGHBOURS}
    neighbours["llama-tiny layer"] = _llama_layer()
    block = neighbours["block"]

    def block_then_python():  # the block's forward, then Python code that runs no op
        out = block()
        sorted({str(i): [i] * 3 for i in range(SWEEP_PYTHON_ITEMS)}.items())
        return out
    neighbours["block + Python"] = block_then_python
    own_s = {name: statistics.median(backward_after(before, before, clock, "cpu")
                                     for _ in range(SWEEP_RUNS // 4))
             for name, before in neighbours.items()}

    def forward_s(before) -> float:
        start = clock()
        before()
        return clock() - start
    own_forward_s = {name: statistics.median(forward_s(before) for _ in range(SWEEP_RUNS // 4))
                     for name, before in neighbours.items()}
    ops = {name: len(_ops_of(before, "cpu").backward_overloads)
           for name, before in neighbours.items()}
    rows = []
    for target, build in targets.items():
        runs = {name: [] for name in (*neighbours, "warm")}
        for _ in range(SWEEP_RUNS):
            for name, before in neighbours.items():
                runs[name].append(backward_after(build, before, clock, "cpu"))
            runs["warm"].append(backward_after(build, build, clock, "cpu"))
        warm_s = statistics.median(runs["warm"])
        rows += [{"target": target, "neighbour": name, "warm_s": warm_s,
                  "neighbour_backward_s": own_s[name], "neighbour_ops": ops[name],
                  "neighbour_forward_s": own_forward_s[name],
                  "extra_s": statistics.median(runs[name]) - warm_s} for name in neighbours]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--mb", type=int, default=1)
    parser.add_argument("--layers", default="embed,norm,head",
                        help="comma-separated name prefixes (default: the small layers)")
    parser.add_argument("--calls", action="store_true", help="part 1 only")
    parser.add_argument("--predicted", default=None,
                        help="a bench_kernel_model JSON whose predictions to set beside")
    parser.add_argument("--all", action="store_true",
                        help="every layer of bench_kernel_model's models and micro-batches")
    parser.add_argument("--composites", action="store_true",
                        help="part 3: composite backward ops' cold excess inside one call")
    parser.add_argument("--step", default=None, metavar="MODEL:MB,...",
                        help="part 4: whole-model backward vs the sum of its layers")
    parser.add_argument("--probe", action="store_true",
                        help="part 5: chains' nodes in one call, the profile-order probe")
    parser.add_argument("--sweep", action="store_true",
                        help="part 6: a cold target's price after neighbours of each size")
    args = parser.parse_args(argv)
    if args.sweep:
        with _one_thread(), torch.random.fork_rng():
            rows = neighbour_sweep(probe_clock("cpu"))
        print(table(["target", "neighbour", "its backward ops", "its forward us",
                     "its backward us", "cold - warm us", "warm us"],
                    [[r["target"], r["neighbour"], r["neighbour_ops"],
                      f"{r['neighbour_forward_s'] * 1e6:.0f}",
                      f"{r['neighbour_backward_s'] * 1e6:.0f}",
                      f"{r['extra_s'] * 1e6:.2f}", f"{r['warm_s'] * 1e6:.1f}"] for r in rows]))
        print(f"load {os.getloadavg()[0]:.1f}")
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS.replace(".json", "_sweep.json"), "w") as f:
            json.dump({"bench": "small_backward", "part": "sweep",
                       "load_average_1min": os.getloadavg()[0], "rows": rows}, f, indent=2)
        return 0
    if args.probe:
        with _one_thread():
            rows = probe_split(probe_clock("cpu"))

        def us(r, key):
            return f"{r[key] * 1e6:.2f}" if key in r else "-"

        print(table(["chain", "cold ops", "inner ops", "nodes in one call us",
                     "profile order us"],
                    [[r["chain"], r.get("cold_ops", "-"), r.get("cold_inner_ops", "-"),
                      us(r, "nodes_in_call_s"), us(r, "profile_order_s")]
                     for r in rows[:-1]]))
        fit = rows[-1]
        print(f"fit: {fit['op_s'] * 1e6:.2f} us per cold op, {fit['inner_op_s'] * 1e6:.2f} "
              f"per cold inner op (rms {fit['residual_s'] * 1e6:.2f}); load "
              f"{os.getloadavg()[0]:.1f}")
        with open(RESULTS, "w") as f:
            json.dump({"bench": "small_backward", "part": "probe",
                       "load_average_1min": os.getloadavg()[0], "rows": rows}, f, indent=2)
        return 0
    if args.step:
        with _one_thread():
            rows = [step_vs_layers(item.split(":")[0], int(item.split(":")[1]),
                                   probe_clock("cpu")) for item in args.step.split(",")]
        def against_whole(r, key):
            return f"{r[key] * 1e6:.0f} ({r[key] / r['whole_s'] - 1:+.0%})"

        print(table(["model", "batch", "whole backward us", "sum, profile's way us",
                     "sum, start warmed us"],
                    [[r["model"], r["micro_batch"], f"{r['whole_s'] * 1e6:.0f}",
                      against_whole(r, "profile_sum_s"), against_whole(r, "warmed_sum_s")]
                     for r in rows]))
        return 0
    if args.composites:
        with _one_thread():
            for others in (14, 28):
                print(table([f"op (after {others} others' nodes)", "cold - warm us",
                             "warm us"],
                            [[n, f"{c * 1e6:.1f}", f"{w * 1e6:.1f}"]
                             for n, c, w in composite_cold(probe_clock("cpu"), others)]))
        return 0
    if args.all:
        return run_all(args.predicted, probe_clock("cpu"))
    clock = probe_clock("cpu")
    doc = {"bench": "small_backward", "load_average_1min": os.getloadavg()[0]}
    with _one_thread():
        if args.calls:
            split = calls_split(clock)
            print(table(["chain+mul one call", "chain alone", "mul after it (own call)",
                         "mul warm (own call)", "mul inside the call", "mul's own call extra"],
                        [[f"{split[k] * 1e6:.1f}" for k in ("one_call", "chain", "after_call",
                                                            "warm_call")]
                         + [f"{(split['one_call'] - split['chain']) * 1e6:.1f}",
                            f"{(split['after_call'] - split['warm_call']) * 1e6:.1f}"]]))
            doc["calls"] = split
        else:
            rows = layer_rows(args.model, args.mb, tuple(args.layers.split(",")),
                              args.predicted, clock)
            doc["rows"] = rows

            def us(s):
                return "-" if s is None else f"{s * 1e6:.1f}"

            def err(r, s):
                return "-" if r["predicted_s"] is None else f"{r['predicted_s'] / s - 1:+.0%}"

            print(table(["layer", "after", "raw", "warm start", "cold start", "raw-warm",
                         "raw-cold", "absorbed-warm", "predicted", "err vs raw-warm",
                         "err vs raw-cold", "err vs absorbed-warm"],
                        [[r["layer"], r["after"] or "(own fwd)", us(r["raw_s"]),
                          us(r["warm_start_s"]), us(r["cold_start_s"]),
                          us(r["raw_s"] - r["warm_start_s"]), us(r["raw_s"] - r["cold_start_s"]),
                          us(r["absorbed_s"] - r["warm_start_s"]), us(r["predicted_s"]),
                          err(r, r["raw_s"] - r["warm_start_s"]),
                          err(r, r["raw_s"] - r["cold_start_s"]),
                          err(r, r["absorbed_s"] - r["warm_start_s"])] for r in rows]))
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
