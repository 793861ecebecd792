"""Search speed: how long `planner plan`'s search takes, and how it grows.

Each case runs in a fresh process (peak RSS is that case's alone). The layer IR is
built first and not timed; "search s" covers the dynamic programs, the pricing of the
best candidates with the full cost model, and the three uniform baselines.

Targets (issue 19, on this 2-core machine, quiet): gpt3-175b on 128 x 8 a100-80g, global
batch 1536, and llama3-70b on 8 x 8 h100-80g, global batch 512, each under 2 s.

    .venv/bin/python bench/bench_search.py [--quick]

--quick runs the headline cases and the two largest growth cases (192 layers, 4096
devices). Prints a table (search wall and CPU seconds: on a shared machine CPU seconds
say more; the 1-minute load average is printed) and writes bench/results/search.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HEADLINE = [
    ("gpt3-175b", "a100-80g", 128, 1536, 2.0),
    ("llama3-70b", "h100-80g", 8, 512, 2.0),
]
# Growth with depth (GPT-3 13B widths, 64 x 8 A100) and with devices (GPT-3 13B).
LAYERS = [24, 48, 96, 192]
NODES = [1, 8, 64, 512]


def child(model: str, cluster: str, nodes: int, batch: int) -> None:
    import torch

    from cost_models.clusters import get_cluster
    from planner.models import load_layer_graph
    from planner.search import search

    graph = load_layer_graph(model, 1, None, torch.bfloat16)
    spec = get_cluster(cluster, nodes=nodes)
    start, cpu_start = time.perf_counter(), time.process_time()
    result = search(graph, spec, batch)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    best = result.best
    print(json.dumps({
        "model": model, "cluster": cluster, "devices": spec.world_size, "global_batch": batch,
        "layers": len(graph.layers), "search_seconds": seconds, "search_cpu_seconds": cpu_seconds,
        "load_average_1min": os.getloadavg()[0],
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "outer_searched": result.stats.outer_searched,
        "outer_candidates": result.stats.outer_candidates,
        "plan": str(best.plan) if best else None,
        "mfu": best.estimate.mfu if best else None,
        "iteration_seconds": best.estimate.iteration_seconds if best else None}))


def run_case(model, cluster, nodes, batch) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", model, cluster, str(nodes),
                          str(batch)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="headline cases only")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        model, cluster, nodes, batch = args.child
        child(model, cluster, int(nodes), int(batch))
        return 0
    rows = []
    for model, cluster, nodes, batch, target in HEADLINE:
        rows.append({**run_case(model, cluster, nodes, batch), "target_seconds": target,
                     "case": "headline"})
    for layers in LAYERS[-1:] if args.quick else LAYERS:
        spec = f"gpt:layers={layers},hidden=5120,heads=40,vocab=51200,seq=2048"
        rows.append({**run_case(spec, "a100-80g", 64, 1024), "case": "layers"})
    for nodes in NODES[-1:] if args.quick else NODES:
        rows.append({**run_case("gpt3-13b", "a100-80g", nodes, max(512, 8 * nodes)),
                     "case": "devices"})
    print(f"{'case':<9} {'model':<46} {'devices':>7} {'layers':>6} {'searched':>9} "
          f"{'search s':>9} {'cpu s':>6} {'load':>5} {'RSS GiB':>8} {'MFU':>6}  plan")
    ok = True
    for r in rows:
        target = r.get("target_seconds")
        flag = "" if target is None else (" (ok)" if r["search_seconds"] <= target else
                                          f" (target {target:.0f} s)")
        ok &= target is None or r["search_seconds"] <= target
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(f"{r['case']:<9} {r['model']:<46} {r['devices']:>7} {r['layers']:>6} "
              f"{r['outer_searched']:>4}/{r['outer_candidates']:<4} "
              f"{r['search_seconds']:>9.2f} {r['search_cpu_seconds']:>6.2f} "
              f"{r['load_average_1min']:>5.1f} {r['peak_rss_gib']:>8.2f} {mfu:>6}  "
              f"{r['plan']}{flag}")
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/search.json", "w") as f:
        json.dump(rows, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
