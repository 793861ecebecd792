"""What a small layer's forward pays after the step moved N MiB: its ops' code refetched.

issue 17 (helper kernelprice): on a CPU whose caches past L2 are slow to reach, cnn-small's
head (mean, addmm, log-softmax, NLL: ~1-3 us of kernels) was measured by `planner
profile` at 2-3x its own-only time, more at larger micro-batches, while every one of its
kernels re-run alone matched its price (bench_kernel_alone.py). What grows with the
micro-batch is the traffic of the layers before it (its `StepNeighbours`), which evicts
the ops' code and host data: the head's forward after writing N MiB of memory reads like
it does after its neighbours of that traffic. Per row: the forward (its GraphModule, as
`layer_profile.time_layer` runs it, then its backward) right after its own step (hot),
after its step neighbours' forwards (whose recorded kernel bytes are shown), and after
`fill_` of FILL_MIB MiB; medians of REPEATS on the thread clock.

Read (Intel Xeon, 2 MiB L2, 480 MiB L3 per lscpu; one thread, load 4.6, 2026-11-25),
cnn-small head forward, us:
    mb  neighbours' MiB  hot  neighbours  fill 1  fill 4  fill 16  fill 64
     1        0.6         28      52        40      84      204      248
     4        2.2         29     100        52      84      153      260
    16        8.8         59     154        76      98      160      284
and a tiny mean, addmm, log-softmax after N MiB written (one thread, load 5.5): 20 us for
the three at 0-0.5 MiB, 39 at 2, 70 at 4, 220 at 16, 317 at 64. The cold-entry probe
(`cost_models.cold_entry_probes`) prices a cold op after one small block (~16 KiB
activations): the least of this. Not a kernel price: no record is under-priced here.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_traffic_cold.py [--rows cnn-small:16:head]

Writes bench/results/traffic_cold.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_kernel_model import traced_graph  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from cost_models.layer_profile import StepNeighbours  # noqa: E402
from ir.graph_measurer import _clear_grads  # noqa: E402
from ir.kernel_records import KernelKind  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402
from planner.fmt import table  # noqa: E402

ROWS = ("cnn-small:1:head", "cnn-small:4:head", "cnn-small:16:head", "gpt-tiny:16:head")
FILL_MIB = (1, 4, 16, 64)  # past the 2 MiB L2, up to twice the old machine's 32 MiB L3
REPEATS, WARMUP = 15, 2
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "traffic_cold.json")


def forward_seconds(measurer, index, module, state, factory, before, clock) -> float:
    """Median forward seconds of layer `index`, each run after `before()` (untimed), its
    inputs drawn after it (as `time_layer` draws them), its backward run after."""
    times = []
    for rep in range(WARMUP + REPEATS):
        _clear_grads(state)
        before()
        inputs = measurer.fresh_inputs(index, state, factory)
        start = clock()
        returned = module(*inputs)
        times.append(clock() - start)
        outs = measurer.module_roots(index, returned)
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
    return statistics.median(times[WARMUP:])


def measure_row(model: str, micro_batch: int, name: str, clock) -> dict:
    graph, measurer = traced_graph(model, micro_batch)
    index = [layer.name for layer in graph.layers].index(name)
    factory = real_factory("cpu")
    state = measurer.layer_state(index, factory)
    module = measurer.layer_module(index, state)
    neighbours = StepNeighbours(measurer, index, factory, graph.layers, "cpu")
    moved = sum(r.count * r.bytes_per_call for j in neighbours.befores
                for r in graph.layers[j].kernels.forward if r.kind is not KernelKind.VIEW)
    row = {"model": model, "micro_batch": micro_batch, "layer": name,
           "neighbours_bytes": moved,
           "hot_s": forward_seconds(measurer, index, module, state, factory, lambda: None, clock),
           "neighbours_s": forward_seconds(measurer, index, module, state, factory,
                                           neighbours.before_forward, clock)}
    for mib in FILL_MIB:
        block = torch.empty(mib * 2**20 // 4)
        row[f"fill_{mib}_s"] = forward_seconds(measurer, index, module, state, factory,
                                               lambda: block.fill_(1.0), clock)
        del block
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="model:micro_batch:layer,...")
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = probe_clock("cpu")
    rows = [measure_row(m, int(b), name, clock)
            for m, b, name in (row.rsplit(":", 2) for row in args.rows.split(","))]
    us = lambda s: f"{s * 1e6:.0f}"  # noqa: E731
    print(table(["model", "mb", "layer", "neighbours MiB", "hot us", "after neighbours",
                 *(f"after {mib} MiB" for mib in FILL_MIB)],
                [[r["model"], r["micro_batch"], r["layer"], f"{r['neighbours_bytes'] / 2**20:.1f}",
                  us(r["hot_s"]), us(r["neighbours_s"]),
                  *(us(r[f"fill_{mib}_s"]) for mib in FILL_MIB)] for r in rows]))
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"bench": "traffic_cold", "load_average_1min": load, "rows": rows}, f, indent=2)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
