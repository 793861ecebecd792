"""What an autograd node costs the backward's host by the mix of nodes (issue 17): the kit's
per-node figure is solved from one chain (`host_probes.host_op_seconds_by_pass`: Linear,
LayerNorm, GELU, Linear blocks); mlp-small's Linear+ReLU blocks ran 1.18-1.24 us a node
against its 1.35-1.38 (bench_kernel_model, load 1-2).

Chains of HOST_OP_CHAIN_BLOCKS blocks of each kind (NODE_MIX_BLOCKS), 2 x 8 fp32, one
thread, the probe clock. Each run: a forward, then, untimed, another forward and backward
of the same chain (the layer after's, as the probe and `StepNeighbours` run it), then the
timed backward; the chains alternate within each round. Per chain, as the kit's formula
solves it: per node = (backward - the engine's start - views x the C++ view figure - other
ops x the C++ op figure - its ops' excess) / its nodes (`ir.op_count.autograd_nodes`,
accumulations included); the counts as `host_probes` takes them. Also a least-squares
line of each chain's remainder over (nodes, saved tensors the forward packed): whether
the nodes' saved tensors, not their kind, carry the difference. Columns in microseconds;
JSON to bench/results/node_mix.json. Target: none (a decomposition); exits 0.

Read here (one thread, 2026-11-25 ~07:55 UTC, load 8.8-9.4 on 2 shared cores: re-measure
on a quiet machine), per node us, two runs: probe 1.51 / 1.62, lin relu lin relu 1.37 /
1.44, lin lin 1.41 / 1.44, lin gelu lin 1.61 / 1.59, lin ln lin 1.35 / 1.40 (round
spreads 10-16%). The kit's probe chain against mlp-small's kind: 0.07-0.18 us a node
apart, within the spread; Linear nodes alone read as mlp-small's, GELU ones ~+1 us each
(its backward's excess, priced per call from a grad-off tight loop, under-counts it in a
chain), LayerNorm ones below. The saved-tensor line fits no better than nodes alone (its
slope -0.08 / +0.14 us). So no per-node-kind figure from this: what differs by kind is
the composites' excess in a chain, which moves only the layers that run them. The kit's
own per-node figure read 1.61-1.82 inside profile-device (load 5-7) and 1.70-2.17
standalone (load 8), above this copy of its chain: the load, not the loop (the kit's
extra variants between runs, timed here apart, moved its backward 2-5 us of 390).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_node_mix.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.clusters import OP_OVERHEAD_WIDTH, _one_thread  # noqa: E402
from cost_models.host_excess import (internal_dispatch_seconds,  # noqa: E402
                                     plain_dispatch_seconds, records_excess_seconds)
from cost_models.host_probes import (HOST_OP_CHAIN_BLOCKS, HOST_OP_ROUNDS,  # noqa: E402
                                     HOST_OP_RUNS_PER_ROUND, HOST_OP_WARMUP_RUNS,
                                     autograd_call_s, probe_clock)
from ir.kernel_recorder import KernelRecorder  # noqa: E402
from ir.kernel_records import KernelKind  # noqa: E402
from ir.op_count import OpCounter, autograd_nodes  # noqa: E402
from planner.fmt import table  # noqa: E402

W = OP_OVERHEAD_WIDTH
# Block kinds: the kit's probe block (`clusters._overhead_block`) and mlp-small's, with
# each of the probe's two extra kinds apart.
NODE_MIX_BLOCKS = {
    "probe (lin ln gelu lin)": lambda: [nn.Linear(W, W), nn.LayerNorm(W), nn.GELU(),
                                        nn.Linear(W, W)],
    "lin relu lin relu": lambda: [nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W), nn.ReLU()],
    "lin lin": lambda: [nn.Linear(W, W), nn.Linear(W, W)],
    "lin gelu lin": lambda: [nn.Linear(W, W), nn.GELU(), nn.Linear(W, W)],
    "lin ln lin": lambda: [nn.Linear(W, W), nn.LayerNorm(W), nn.Linear(W, W)],
}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "node_mix.json")


def chain_counts(chain: nn.Module, x: torch.Tensor, excess: dict) -> dict:
    """Backward views, other ops, excess seconds and nodes with the weights' gradients
    accumulated (as in the timed runs), and the tensors the forward saves."""
    chain(x).sum().backward()  # gradients exist
    saved = [0]

    def pack(t):
        saved[0] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chain(x).sum()  # hooks change what backward dispatches: counted on another run
    loss = chain(x).sum()
    nodes = autograd_nodes([loss], lambda t: True)
    recorder = KernelRecorder(set())
    with OpCounter(recorder):
        loss.backward()
    records = recorder.records()
    views = sum(r.count for r in records if r.kind is KernelKind.VIEW)
    return dict(views=views, others=sum(r.count for r in records) - views, nodes=nodes,
                saved=saved[0], excess_s=records_excess_seconds(records,
                                                                lambda op: excess.get(op, 0.0)))


def main() -> int:
    start_s = time.perf_counter()
    torch.set_num_threads(1)
    internal, plain = internal_dispatch_seconds("cpu"), plain_dispatch_seconds("cpu")
    engine_s = autograd_call_s("cpu")
    clock = probe_clock("cpu")
    with _one_thread():
        x = torch.randn(2, W)
        chains = {name: nn.Sequential(*[m for _ in range(HOST_OP_CHAIN_BLOCKS) for m in make()])
                  for name, make in NODE_MIX_BLOCKS.items()}
        counts = {name: chain_counts(chain, x, plain.excess_s) for name, chain in chains.items()}
        for chain in chains.values():
            for _ in range(HOST_OP_WARMUP_RUNS):
                chain(x).sum().backward()
        rounds = {name: [] for name in chains}
        for _ in range(HOST_OP_ROUNDS):
            for name, chain in chains.items():
                total = 0.0
                for _ in range(HOST_OP_RUNS_PER_ROUND):
                    loss = chain(x).sum()
                    chain(x).sum().backward()  # the layer after's, untimed
                    begin = clock()
                    loss.backward()
                    total += clock() - begin
                rounds[name].append(total / HOST_OP_RUNS_PER_ROUND)
    rows = []
    for name, c in counts.items():
        backward_s = statistics.median(rounds[name]) - engine_s
        rest_s = (backward_s - c["views"] * internal.view_s - c["others"] * internal.op_s
                  - c["excess_s"])
        rows.append({"chain": name, **c, "backward_s": backward_s, "rest_s": rest_s,
                     "per_node_s": rest_s / c["nodes"],
                     "spread": (max(rounds[name]) - min(rounds[name]))
                     / statistics.median(rounds[name])})
    # rest = a x nodes + b x saved, least squares over the chains
    a11 = sum(r["nodes"] ** 2 for r in rows)
    a12 = sum(r["nodes"] * r["saved"] for r in rows)
    a22 = sum(r["saved"] ** 2 for r in rows)
    b1 = sum(r["nodes"] * r["rest_s"] for r in rows)
    b2 = sum(r["saved"] * r["rest_s"] for r in rows)
    det = a11 * a22 - a12 * a12
    per_node_s, per_saved_s = (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
    for r in rows:
        r["fit_s"] = per_node_s * r["nodes"] + per_saved_s * r["saved"]
    print(table(["chain", "nodes", "saved", "views", "ops", "excess us", "backward us",
                 "per node us", "node+saved fit", "spread"],
                [[r["chain"], str(r["nodes"]), str(r["saved"]), str(r["views"]),
                  str(r["others"]), f"{r['excess_s'] * 1e6:.1f}",
                  f"{r['backward_s'] * 1e6:.1f}", f"{r['per_node_s'] * 1e6:.3f}",
                  f"{(r['fit_s'] - r['rest_s']) / r['rest_s']:+.0%}", f"{r['spread']:.0%}"]
                 for r in rows]))
    load = os.getloadavg()[0]
    print(f"C++ view {internal.view_s * 1e6:.3f} us, op {internal.op_s * 1e6:.3f} us, engine "
          f"{engine_s * 1e6:.1f} us; fit: {per_node_s * 1e6:.3f} us a node + "
          f"{per_saved_s * 1e6:.3f} us a saved tensor. Load average {load:.1f} "
          f"({time.perf_counter() - start_s:.0f} s).")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"bench": "node_mix", "load_average_1min": load,
                   "internal_view_s": internal.view_s, "internal_op_s": internal.op_s,
                   "engine_s": engine_s, "fit_per_node_s": per_node_s,
                   "fit_per_saved_s": per_saved_s, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
