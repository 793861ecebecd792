"""Where a small layer's time after its step neighbours goes (issue 17): code, data, or the
backward's own work.

For each unique layer of a zoo model, one thread, the thread clock
(`time.thread_time`: the run queue of a loaded machine is left out), each pass timed as

  step      after its step neighbours, as `planner profile` times it
            (`layer_profile.StepNeighbours`: the layer before's forward ahead of the
            forward; the layer after's forward and backward ahead of the backward)
  data      the same, then the layer's parameters and inputs read once (a sum each,
            untimed) just before the timed pass: its data back in cache, its code not
  code      the same as step, then the layer's pass run once, untimed, on other inputs
            of the same shapes just before the timed one (forward: a forward; backward:
            a forward and backward): its code warm, the timed inputs' data not
  repeat    right after its own previous run (no neighbours): code and data warm
  evict     the same as step, then EVICT_BYTES written once just before the timed pass
            (twice this CPU's 32 MiB L3): what a step of a model bigger than the caches
            leaves of the layer's code, objects and data

so step - data is what the neighbour's eviction of the layer's data costs, data -
repeat what its code (and the data the touch does not reach: saved activations, grad
buffers) costs, and code - repeat what is left once the code is warm. Columns in
microseconds (the thread clock: the backward includes autograd's engine start, ~9 us
here, which the profile subtracts), the smaller of two alternations' medians, and each
variant's median minor page faults per timed pass; JSON to bench/results/small_layers.json.
Target: none (a decomposition); exits 0.

Read here (one thread, 2026-11-25 02:50 UTC, load 3-4; re-measure on a quiet machine):
the whole gap is code, not data. Re-reading the parameters and inputs (step - data)
moved -4..+6 us (noise: their bytes, 32-40 KiB tables and 8-128 KiB inputs, stay in L2
past a neighbour); running the pass once on other inputs (code - repeat) closed it to
-5..+10 us. data - repeat, us, llama-tiny mb1 / mb16: embed fwd 10 / 23-32, bwd 20 /
29-36; norm fwd 7 / 7, bwd 15 / 19-22; head fwd 4-5 / 6, bwd 6-7 / 11-12; gpt-tiny mb1 /
mb16: embed fwd 21 / 55, bwd 18 / 38; norm fwd 5 / 7, bwd 9 / 14; head fwd 2 / 6, bwd 3
/ 10; mlp-small's blocks and head: within +-3 (nothing cold: the whole model's ops fit
in cache). No page fault in any timed pass. The embedding's backward gradient table is
not the gap: llama-tiny's is 32 KiB, its zero fill ~1 us at the model's copy rate plus
its `fresh_output` write-allocate, and a warm-code run closes the 20 us.

--probes (removed with its probe, `sequence_probes.cold_chains`, once the kit's forward
cold figures came from `cold_entry_probes`, which has an after-backward mode): the old
cold-op probe (chains run after the pool's other FORWARD calls, not after a backward)
beside the same chains run after a backward (what a step's first layer follows). Here
(load 3.3): after forward 2.0-2.3 us at 0 cold ops, 5.4, 7-9, 15, 25-28, 23-28 at 1, 2, 7, 13, 26 (median 2.04-2.13 per cold
op); after a backward 0.3, 0.9-1.0, 1.3-1.5, 5.0-5.2, 14.3-14.5, 40-42 us at 0, 1, 3, 7,
13, 23 (median 0.82-0.97): no dearer at 1-7 cold ops (that backward, of 14 calls,
evicts less than the pool's ~40 forward calls), dearer at 23 (1.8 us per op); the
embedding's 10 us at 1 cold op is no after-backward price. The heads' over-prediction was the count: 6-7 cold ops against the norm alone,
2-3 against the ops that ran within a cache's worth (`ir.op_count.recent_forward_ops`).

Read again (2026-11-25 04:47 UTC, load 4.5, the step variant after `StepNeighbours`'
window: a head after the norm AND the block), forward, step / repeat / evict us: gpt-tiny
mb1 embed 50 / 33 / 149, norm 12 / 8 / 39, head 31 / 23 / 96; llama-tiny embed 16 / 7 /
72, norm 22 / 16 / 68, head 41 / 25 / 161; t5-tiny encoder_rel_bias 85 / 55 / 234,
decoder_rel_bias 109 / 59 / 263, encoder_norm 37 / 34 / 105. The cold cost is the layer's
own code, objects and data re-fetched, and it grows with what ran since the layer last
did: t5's decoder_rel_bias (output 16 KiB at every micro-batch) reads 93 us at mb1 after
its neighbours, 104 after 4 MiB more written, 185 after 32 MiB (230 at mb16, whose
neighbours touch more); a run of another instance of the same layer just before (its
code warm, its objects not) closes 100 of mb16's 120 us. So a step of a model bigger than
the last-level cache pays the evict column (3-4x the profile's figure for these layers),
which neither `planner profile` nor the kit's `cold_entry_probes` (one block's work
between: ~3.5 us per layer + ~2 per cold op) reproduce: next to price.

dlrm-small's tables (2026-11-25 08:08 UTC, load 5.7-6.2; `--model dlrm-small --layers
tables`), forward step / code us at micro-batch 1 and 4: tables.0 (after bottom_mlp) 18.0
/ 12.1 and 20.4 / 13.7, tables.1-3 (after a table) 11.7-12.3 / 11.1-11.2 and 13.6-14.1 /
13.1-13.2: a cold start of 5.9-6.7 us after the MLP, 0.4-1.1 after another table (the
kit prices 4.0 entry + 1.6 a cold op: 10.4-12.1 and 4.0).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_small_layers.py --model llama-tiny --mb 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.clusters import _one_thread  # noqa: E402
from cost_models.layer_profile import StepNeighbours  # noqa: E402
from ir.graph_measurer import _clear_grads  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402
from planner.fmt import table  # noqa: E402

from bench.bench_kernel_model import traced_graph  # noqa: E402

WARMUP, REPEATS = 3, 15  # median of fifteen after three untimed runs
# The `evict` variant's sweep: twice the last-level cache here (AMD EPYC, 32 MiB L3 shared
# by the machine's cores: lscpu), so the layer's lines are out of every cache level.
EVICT_BYTES = 64 << 20
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "small_layers.json")


def _touch(tensors) -> None:
    """Read every tensor once (a sum: its lines into cache, nothing kept)."""
    with torch.no_grad():
        for t in tensors:
            if t.is_floating_point():
                t.sum()
            else:
                t.max()


def _minor_faults() -> int:
    """This thread's minor page faults so far (a fresh page's first touch: a zero fill)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def time_variant(measurer, index: int, state: dict, factory, variant: str,
                 repeats: int = REPEATS, layers: list | None = None) -> tuple[float, float]:
    """Median (forward, backward) thread seconds of layer `index` under `variant`, then
    the median minor page faults of each (`layers`: the graph's, for `StepNeighbours`'
    window of layers before, as `planner profile` passes them)."""
    module = measurer.layer_module(index, state)
    neighbours = StepNeighbours(measurer, index, factory, layers)
    if variant == "repeat":
        neighbours.befores, neighbours.after = [], None
    params = [t for t in state.values() if isinstance(t, torch.Tensor)]
    sweep = torch.empty(EVICT_BYTES // 4) if variant == "evict" else None
    fwd, bwd, faults = [], [], []
    for rep in range(WARMUP + repeats):
        _clear_grads(state)
        inputs = measurer.fresh_inputs(index, state, factory)
        neighbours.before_forward()
        if variant == "data":
            _touch(params + [t for t in inputs if isinstance(t, torch.Tensor)])
        if variant == "code":
            module(*measurer.fresh_inputs(index, state, factory))
        if sweep is not None:
            sweep.fill_(1.0)
        flt = _minor_faults()
        start = time.thread_time()
        returned = module(*inputs)
        mid = time.thread_time()
        flt_mid = _minor_faults()
        outs = measurer.module_roots(index, returned)
        seeds = [torch.ones_like(t) for t in outs]
        neighbours._backward(neighbours.before_backward())  # its own call (old harness)
        if variant == "data":
            _touch(params + seeds + [t for t in inputs if isinstance(t, torch.Tensor)])
        if variant == "code":
            other = measurer.module_roots(index, module(*measurer.fresh_inputs(
                index, state, factory)))
            if other:
                torch.autograd.backward(other, [torch.ones_like(t) for t in other])
            _clear_grads(state)
        if sweep is not None:
            sweep.fill_(1.0)
        flt_back = _minor_faults()
        back = time.thread_time()
        if outs:
            torch.autograd.backward(outs, seeds)
        end = time.thread_time()
        if rep >= WARMUP:
            fwd.append(mid - start)
            bwd.append(end - back)
            faults.append((flt_mid - flt, _minor_faults() - flt_back))
        del inputs, returned, outs, seeds
    return (statistics.median(fwd), statistics.median(bwd),
            statistics.median(f for f, _ in faults), statistics.median(b for _, b in faults))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--mb", type=int, default=1)
    parser.add_argument("--layers", default="embed,norm,head",
                        help="comma-separated name prefixes (default: the small layers)")
    args = parser.parse_args(argv)
    graph, measurer = traced_graph(args.model, args.mb)
    factory = real_factory("cpu")
    wanted = tuple(args.layers.split(","))
    rows, seen = [], set()
    with _one_thread():
        for i, layer in enumerate(graph.layers):
            if layer.structural_hash in seen or not layer.name.startswith(wanted):
                continue
            seen.add(layer.structural_hash)
            state = measurer.layer_state(i, factory)
            # one alternation of the five, twice: a slow spell hits them alike
            times = {v: [] for v in ("step", "data", "code", "repeat", "evict")}
            for _ in range(2):
                for v in times:
                    times[v].append(time_variant(measurer, i, state, factory, v,
                                                 layers=graph.layers))
            med = {v: tuple(min(t[p] for t in ts) for p in range(4)) for v, ts in times.items()}
            for p, phase in enumerate(("fwd", "bwd")):
                rows.append({"model": args.model, "micro_batch": args.mb, "layer": layer.name,
                             "phase": phase, "param_bytes": layer.param_bytes,
                             "input_bytes": layer.input_bytes,
                             **{f"{v}_s": med[v][p] for v in med},
                             **{f"{v}_faults": med[v][p + 2] for v in med}})
    print(table(["layer", "phase", "step us", "data us", "code us", "repeat us", "evict us",
                 "step-data", "data-repeat", "code-repeat", "faults step/repeat"],
                [[r["layer"], r["phase"], f"{r['step_s'] * 1e6:.1f}",
                  f"{r['data_s'] * 1e6:.1f}", f"{r['code_s'] * 1e6:.1f}",
                  f"{r['repeat_s'] * 1e6:.1f}", f"{r['evict_s'] * 1e6:.1f}",
                  f"{(r['step_s'] - r['data_s']) * 1e6:.1f}",
                  f"{(r['data_s'] - r['repeat_s']) * 1e6:.1f}",
                  f"{(r['code_s'] - r['repeat_s']) * 1e6:.1f}",
                  f"{r['step_faults']:.0f}/{r['repeat_faults']:.0f}"] for r in rows]))
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"bench": "small_layers", "load_average_1min": os.getloadavg()[0],
                   "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
