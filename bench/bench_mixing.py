"""Where per-layer mixing beats one strategy for all layers, and by how much.

For zoo models x clusters x memory budgets: the searched plan against the best uniform
plan (every layer one strategy; all of TP, PP, DP, ZeRO, SP and checkpointing searched)
and the classic baselines (DDP, ZeRO-3/FSDP, Megatron TPxPPxDP). The searched plan must
never be slower than any uniform plan that fits; the script exits 1 if it is.

    .venv/bin/python bench/bench_mixing.py

Prints a table and writes bench/results/mixing.json.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from cost_models.clusters import get_cluster
from planner.models import load_layer_graph
from planner.search import search
from planner.search_space import SearchOptions

GiB = 2**30
CASES = [  # model, cluster, nodes, global batch, budgets in GiB (None: the device's)
    ("gpt3-1.3b", "a100-40g", 1, 64, (None, 16)),
    ("gpt3-6.7b", "a100-80g", 1, 128, (None, 40)),
    ("gpt3-13b", "a100-80g", 2, 256, (None, 40)),
    ("llama3-8b", "h100-80g", 1, 64, (None, 40)),
    ("bert-large", "a100-40g", 1, 256, (None, 8)),
    ("t5-large", "a100-40g", 1, 128, (None, 12)),
]


def main() -> int:
    rows, ok = [], True
    for model, cluster_name, nodes, batch, budgets in CASES:
        graph = load_layer_graph(model, 1, None, torch.bfloat16)
        cluster = get_cluster(cluster_name, nodes=nodes)
        for budget in budgets:
            budget_bytes = int(budget * GiB) if budget else None
            start = time.perf_counter()
            mixed = search(graph, cluster, batch, SearchOptions(memory_budget_bytes=budget_bytes))
            uniform = search(graph, cluster, batch,
                             SearchOptions(memory_budget_bytes=budget_bytes, uniform=True))
            seconds = time.perf_counter() - start
            best_uniform = uniform.best
            for b in mixed.baselines:
                if b.candidate and (best_uniform is None or b.candidate.estimate.iteration_seconds
                                    < best_uniform.estimate.iteration_seconds):
                    best_uniform = b.candidate
            m = mixed.best.estimate.iteration_seconds if mixed.best else None
            u = best_uniform.estimate.iteration_seconds if best_uniform else None
            gain = (u / m - 1) if (m and u) else None
            if m is not None and u is not None and m > u * (1 + 1e-9):
                ok = False
            rows.append({"model": model, "cluster": f"{nodes}x{cluster.devices_per_node} "
                         f"{cluster_name}", "global_batch": batch,
                         "budget_gib": budget or cluster.device_memory_bytes / GiB,
                         "mixed_seconds": m, "uniform_seconds": u, "speedup": gain,
                         "mixed_plan": str(mixed.best.plan) if mixed.best else None,
                         "uniform_plan": str(best_uniform.plan) if best_uniform else None,
                         "search_seconds": seconds})
    print(f"{'model':<11} {'cluster':<16} {'budget':>7} {'per-layer s':>11} {'uniform s':>10} "
          f"{'gain':>7}  per-layer plan  |  best uniform plan")
    for r in rows:
        fmt = lambda x: f"{x:.4g}" if x is not None else "none"  # noqa: E731
        gain = f"{100 * r['speedup']:+.1f}%" if r["speedup"] is not None else (
            "fits" if r["mixed_seconds"] and not r["uniform_seconds"] else "-")
        print(f"{r['model']:<11} {r['cluster']:<16} {r['budget_gib']:>5.0f}Gi "
              f"{fmt(r['mixed_seconds']):>11} {fmt(r['uniform_seconds']):>10} {gain:>7}  "
              f"{r['mixed_plan']}  |  {r['uniform_plan']}")
    wins = [r for r in rows if r["speedup"] and r["speedup"] > 1e-6]
    print(f"\nper-layer mixing faster in {len(wins)} of {len(rows)} cases"
          + (f", by up to {100 * max(r['speedup'] for r in wins):.1f}%" if wins else "")
          + ("" if ok else "; a searched plan was SLOWER than a uniform one"))
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/mixing.json", "w") as f:
        json.dump(rows, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
