"""What a step's first layer's forward pays for the work before it (issue 17: gpt-tiny's
embed forward priced 29% under, llama-tiny's 17-23% over, the same position).

A step's first layer runs its forward after a backward. `planner profile` times it after
its backward window's forwards and backwards (`layer_profile.backward_window`: gpt-tiny's
4 blocks, norm and head, 770 ATen ops at micro-batch 1; llama-tiny's one block, 276; the
window stops at the ops a step leaves warm), and the compute model prices the entry at
`Layer.after_ops` off the kit's after-backward `ColdEntryPoint`s (after the probe's Linear,
17 ops, and its one transformer block, 115: `host_dispatch.cold_entry_seconds`), flat
beyond the block. Three tables, each on the thread clock, min over ROUNDS interleaved
rounds of `time_layer`'s medians:

--decompose: gpt-tiny's embed forward at micro-batch 1/16, whole and less a part
(dropout in eval mode; positions made once instead of `arange`; the token embedding alone,
llama-tiny's layer), each in its profile place.
Default: the first layer's forward (gpt-tiny's token embedding alone; llama-tiny's embed)
after windows of 1, 2 and 4 of the model's blocks (`backward_window` set so), and
gpt-tiny's after its first block run 4 times (same code and parameters, 4x the work);
beside, the kit's probe (`cold_entry_probes.cold_entry_cost`, after a backward) after 1,
2 and 4 of its blocks.

Read here (2 cores shared, load 17-20, 2026-11-26 21:59-22:02 UTC; us, least round,
the median round in brackets; two --decompose runs):

    gpt embed mb 1    layer 120-125 (131-132)  no dropout 99 (99-109)
                      no arange 71-77 (78-86)  token only 41-60 (58-64)
    gpt embed mb 16   layer 302-350 (326-384)  no dropout 114-124 (139-150)
    first forward after blocks       1            2            4         4 x block 1
      gpt token embedding      36.3 (186 ops) 43.6 (372)  55.9 (744)   50.1 (744)
      llama embed              35.9 (276)     48.1 (552)  70.8 (1104)
      kit probe entry, no op   26.7 (115)     30.8 (229)  35.1 (457)
Ad hoc runs of the same (load 8-14, 21:45-21:58) read alike: token only after gpt's whole
window 67-73, after blocks 1/2/4 34-35 / 41-43 / 54-63 (4 x block 1: 46); llama 34 / 45
/ 71; the kit's entry 28.6 / 34.5 / 41.4 (medians of 3). llama's embed alone in a tight
loop 6.4 / 6.7 / 7.5 at micro-batch 1 / 4 / 16, in place 33.4 / 30.4 / 43.3 (load 14-21).

So: gpt-tiny's embed misses for its window, not its ops. The token embedding alone, a
llama-tiny layer, ran ~60-70 us after gpt's 770-op window and 34-36 after one block. The
parts it adds (arange, the position embedding, the add, dropout's empty_like, bernoulli_,
div_ and mul) are priced warm within ~2 us of their tight loops (arange 1.1-1.5 us a call
against add's 0.8; F.dropout at 2 Ki elements 16.2 us against ~17 priced: random draw 10
+ kernels 2 + per-op host 5); in place after that window they add 60-65 us at
micro-batch 1, ~40 over warm for 5 cold ops (~8 us each) where the model adds 5 x 3: the
cold ops' slope is read at the same one-block point (the kit's own slope after 4 of its
blocks read 4.3 us against 4.1 after one: its probe ops feel the work less). After the first block
the entry grows ~0.035-0.044 us per op of more work, alike for gpt's, llama's and the
kit's blocks (the same block run 4 times grows it too: the work, not only new code or
parameters). The kit has no point beyond one block, so gpt's window reads as one block's.
llama-tiny's over-price is not its window (one block, what the kit's point measures):
its entry in place (in place less tight loop, 24-27 us) sits ~7 us under the kit's
block point plus a cold op (29-31 + 3), and its warm part ~4 us under the priced one
(module call, forward node: 9-11 priced against 6.5 measured).

What-if (the judge, ten saved runs repriced, `/work/prompts/agg_rows.py`): each kit given
after-backward points after 2 and 4 probe blocks, its block point + the increments read
above (+5.9 us at 229 ops, +12.8 at 457): rows over 15% at the median 38 -> 38; gpt embed
fwd mb 1/4/16 -29/-10/-15% -> -20/-2/-12%, bert embed mb 1 -12 -> -5%; llama embed fwd
mb 1/4/16 -2/+23/+17% -> +16/+45/+34% (its window, 276 ops, now reads between the 2- and
4-block points). Not kept: it moves llama's rows out with gpt's in. The points belong in
the kit once llama's single-block entry and warm part price right.
Tried and reverted (0104086): a composite's output allocation (aten::empty /
empty_strided inside embedding_dense_backward) counted warm after any pass that ran a
kernel writing a fresh output (38 -> 37 over 15%). Its premise is false: under the CPU
profiler (torch 2.13, 2026-11-26) forward mm, mul, add, relu and gelu dispatch neither op
(structured kernels allocate their outputs directly); zeros, clone and index_select do,
and llama's block's aten::empty came from mm's clone of a stride-0 gradient. A right rule
needs each overload's own dispatched allocations, profiled on an instance of it, which
the trace's arbitrary overloads do not give cheaply.

Hypotheses tested and rejected here:
- dropout's per-call cost: bernoulli_ is 5.1-5.5 ns per element at 2 Ki to 256 Ki
  elements and ~0.9 us a call (the kit's `random_element_s` 4.9-5.7 ns): priced; the
  whole F.dropout at 2 Ki elements 16.2 us warm against ~17 priced.
- Python's garbage collector in the timed forward: gc off read the same (73 vs 75 us).
- the window's bytes: llama's window at micro-batch 16 writes 40 MiB against 2.9 at 1 and
  its embed's entry did not grow with it (24-27 us at 1 and 4).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_first_layer_window.py [--decompose]

Writes bench/results/first_layer_window{,_decompose}.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cost_models.cold_entry_probes as entry_probes  # noqa: E402
import cost_models.layer_profile as layer_profile  # noqa: E402
from bench.bench_kernel_model import traced_graph  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402
from planner.fmt import table  # noqa: E402

ROUNDS = 5  # interleaved rounds; each figure is the least round's `time_layer` median
WARMUP, REPEATS = 3, 9  # bench_kernel_model's
WINDOW_BLOCKS = (1, 2, 4)  # blocks of work between two first-layer forwards
KIT_BLOCK_KINDS = {1: "block", 2: "block2", 4: "block4"}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
CLOCK = time.thread_time  # the probes' clock (`host_probes.probe_clock` on CPU)


@contextlib.contextmanager
def window(layers: list[int]):
    """`planner profile`'s backward window (`layer_profile.backward_window`) set to
    `layers` for the first layer's timing."""
    saved = layer_profile.backward_window
    layer_profile.backward_window = lambda _layers, _after: list(layers)
    try:
        yield
    finally:
        layer_profile.backward_window = saved


class Part(nn.Module):
    """gpt-tiny's embed (its traced module `layer`) less a part: "no_dropout" (the dropout
    in eval mode), "no_arange" (that and positions made once), "token_only"."""

    def __init__(self, layer: nn.Module, variant: str):
        super().__init__()
        self.layer, self.variant, self.positions = layer, variant, None
        self.token, self.position = [m for m in layer.modules() if isinstance(m, nn.Embedding)]
        for m in layer.modules():
            if isinstance(m, nn.Dropout) and variant != "layer":
                m.train(False)

    def forward(self, ids):
        if self.variant in ("layer", "no_dropout"):
            return self.layer(ids)
        if self.variant == "token_only":
            return (self.token(ids),)
        if self.positions is None:
            self.positions = torch.arange(ids.shape[1], device=ids.device)
        return (self.token(ids) + self.position(self.positions),)


def first_forward_s(graph, measurer, state, factory, variant: str = "layer") -> float:
    """Median forward seconds of layer 0 in its profile place (`time_layer`), as `variant`."""
    made = measurer.layer_module
    measurer.layer_module = lambda i, s: (Part(made(i, s), variant) if i == 0 and
                                          variant != "layer" else made(i, s))
    try:
        return layer_profile.time_layer(measurer, 0, state, factory, "cpu", warmup=WARMUP,
                                        repeats=REPEATS, layers=graph.layers, clock=CLOCK)[0]
    finally:
        measurer.layer_module = made


def decompose() -> list[dict]:
    """gpt-tiny's embed forward, whole and less each part, at micro-batch 1 and 16."""
    factory, runs = real_factory("cpu"), {}
    graphs = {mb: traced_graph("gpt-tiny", mb) for mb in (1, 16)}
    states = {mb: m.layer_state(0, factory) for mb, (_, m) in graphs.items()}
    for _ in range(ROUNDS):
        for mb, (graph, measurer) in graphs.items():
            for variant in ("layer", "no_dropout", "no_arange", "token_only"):
                runs.setdefault((mb, variant), []).append(
                    first_forward_s(graph, measurer, states[mb], factory, variant))
    return [{"micro_batch": mb, "variant": v, "forward_us": min(s) * 1e6,
             "median_us": statistics.median(s) * 1e6} for (mb, v), s in runs.items()]


def stacked_blocks(count: int):
    """`count` of the kit's probe blocks in sequence (a window of `count` layers)."""
    return lambda: nn.Sequential(*[entry_probes.neighbour_block() for _ in range(count)])


def windows() -> list[dict]:
    """The first layer's forward after windows of WINDOW_BLOCKS blocks, gpt-tiny's (its
    token embedding alone) and llama-tiny's, and the kit probe's entry after as many of
    its blocks (added to its NEIGHBOURS for the run)."""
    factory, runs = real_factory("cpu"), {}
    subjects = {"gpt-tiny": "token_only", "llama-tiny": "layer"}
    graphs = {model: traced_graph(model, 1) for model in subjects}
    states = {model: m.layer_state(0, factory) for model, (_, m) in graphs.items()}
    cases = [(model, tuple(range(1, n + 1))) for model in subjects for n in WINDOW_BLOCKS]
    cases.append(("gpt-tiny", (1, 1, 1, 1)))  # the same block's work 4 times
    for n, kind in KIT_BLOCK_KINDS.items():
        entry_probes.NEIGHBOURS.setdefault(kind, stacked_blocks(n))
    try:
        for _ in range(ROUNDS):
            for model, layers in cases:
                graph, measurer = graphs[model]
                with window(list(layers)):
                    runs.setdefault((model, layers), []).append(first_forward_s(
                        graph, measurer, states[model], factory, subjects[model]))
            for n, kind in KIT_BLOCK_KINDS.items():
                cost = entry_probes.cold_entry_cost(entry_probes.cold_entry_chains(
                    "cpu", after_backward=True, after=kind))
                runs.setdefault(("kit", (n,)), []).append(cost.entry_s)
        kit_ops = {n: sum(entry_probes.neighbour_ops(kind)) for n, kind in
                   KIT_BLOCK_KINDS.items()}
    finally:
        for kind in KIT_BLOCK_KINDS.values():
            if kind != "block":
                entry_probes.NEIGHBOURS.pop(kind, None)
    rows = []
    for (model, layers), seconds in runs.items():
        ops = (kit_ops[layers[0]] if model == "kit" else
               sum(graphs[model][0].layers[j].ops_fwd + graphs[model][0].layers[j].ops_bwd
                   for j in layers))
        rows.append({"subject": model, "window": list(layers), "window_ops": ops,
                     "forward_us": min(seconds) * 1e6,
                     "median_us": statistics.median(seconds) * 1e6})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decompose", action="store_true", help="gpt-tiny's embed by part")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = decompose() if args.decompose else windows()
    keys = list(rows[0])
    print(table(keys, [[f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in keys]
                       for r in rows]))
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}")
    os.makedirs(RESULTS, exist_ok=True)
    name = "first_layer_window" + ("_decompose" if args.decompose else "")
    with open(os.path.join(RESULTS, name + ".json"), "w") as f:
        json.dump({"rows": rows, "load_average_1min": load}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
