"""`planner demo`: the main job on built-in defaults, for `make demo`.

  1. trace and measure GPT-3 175B on the meta device;
  2. search its plan on 128 nodes x 8 A100-80GB for a global batch of 1536, beside the
     uniform baselines;
  3. the dry-run time and memory report of the chosen plan.
"""

from __future__ import annotations

import time

import torch

from cost_models.clusters import get_cluster
from planner import report
from planner.arg_types import n_devices, n_samples
from planner.commands.inspect import _grouped_rows
from planner.commands.plan import baseline_table
from planner.fmt import human_bytes, human_count, table
from planner.models import load_layer_graph
from planner.plan_report import plan_document, strategy_table, summary_line
from planner.search import search
from planner.search_space import SearchOptions

DEMO_MODEL = "gpt3-175b"
DEMO_CLUSTER, DEMO_NODES, DEMO_GLOBAL_BATCH = "a100-80g", 128, 1536  # Narayanan et al. 2021


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the main job on built-in defaults",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=DEMO_MODEL, help=f"model ({DEMO_MODEL})")
    p.add_argument("--cluster", default=DEMO_CLUSTER, help=f"cluster preset ({DEMO_CLUSTER})")
    p.add_argument("--nodes", type=n_devices, default=DEMO_NODES, help=f"nodes ({DEMO_NODES})")
    p.add_argument("--global-batch", type=n_samples, default=DEMO_GLOBAL_BATCH)
    p.set_defaults(func=run)


def run(args) -> int:
    print(f"== 1. Trace and measure {args.model} on the meta device (no real memory)")
    start = time.perf_counter()
    graph = load_layer_graph(args.model, 1, None, torch.bfloat16)
    seconds = time.perf_counter() - start
    headers = ["layer", "kind", "count", "params", "fwd FLOPs", "bwd FLOPs", "saved", "output", "TP"]
    print(table(headers, _grouped_rows(graph), right={2, 3, 4, 5, 6, 7}))
    saved = sum(l.saved_activation_bytes for l in graph.layers)
    print(f"{graph.num_params:,} parameters ({human_count(graph.num_params)}) in "
          f"{len(graph.layers)} layers, {graph.unique_layers_measured} measured, traced with "
          f"{graph.trace_method} in {seconds:.1f} s; one sample of {graph.seq_len} tokens "
          f"saves {human_bytes(saved)} for backward in {graph.dtype}")

    cluster = get_cluster(args.cluster, nodes=args.nodes)
    print(f"\n== 2. Search per-layer TP/SP/DP/ZeRO/PP/checkpointing on {cluster.num_nodes} x "
          f"{cluster.devices_per_node} {cluster.device}, global batch {args.global_batch}")
    result = search(graph, cluster, args.global_batch, SearchOptions())
    if result.best is None:
        print("no plan fits")
        return 1
    doc = plan_document(graph, cluster, result.best, result.stats)
    print(summary_line(doc))
    print(strategy_table(doc, graph))
    print()
    print(baseline_table(result.best, result.baselines, cluster))
    print(f"searched {result.stats.outer_searched} of {result.stats.outer_candidates} "
          f"pipeline configurations in {result.stats.search_seconds:.1f} s")

    est = result.best.estimate
    print("\n== 3. Dry-run report of the chosen plan (planner estimate --plan)")
    print(report.time_table(est))
    print(report.throughput_lines(est))
    print(report.memory_table(est.memory))
    print(report.memory_verdict(est.memory))
    return 0
