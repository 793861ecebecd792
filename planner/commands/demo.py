"""`planner demo`: the main job on built-in defaults, for `make demo`."""

from __future__ import annotations

import time

from planner.commands.inspect import _grouped_rows
from planner.fmt import human_bytes, human_count, table
from planner.models import load_layer_graph

DEMO_MODEL = "gpt3-175b"


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the main job on built-in defaults",
                       description="Trace GPT-3 175B on the meta device and report its layers.")
    p.add_argument("--model", default=DEMO_MODEL, help=f"model to show ({DEMO_MODEL})")
    p.set_defaults(func=run)


def run(args) -> int:
    print(f"== 1. Trace and measure {args.model} on the meta device (no real memory)")
    start = time.perf_counter()
    graph = load_layer_graph(args.model)
    seconds = time.perf_counter() - start
    headers = ["layer", "kind", "count", "params", "fwd FLOPs", "bwd FLOPs", "saved", "output", "TP"]
    print(table(headers, _grouped_rows(graph), right={2, 3, 4, 5, 6, 7}))
    saved = sum(l.saved_activation_bytes for l in graph.layers)
    print(f"{graph.num_params:,} parameters ({human_count(graph.num_params)}) in "
          f"{len(graph.layers)} layers, {graph.unique_layers_measured} measured, traced with "
          f"{graph.trace_method} in {seconds:.1f} s; one micro-batch of {graph.seq_len} tokens "
          f"saves {human_bytes(saved)} for backward in {graph.dtype}")
    return 0
