"""How long and how much memory `planner inspect` takes on the biggest presets.

Each model runs in a fresh process (so peak RSS is that model's alone), traced and
measured on the meta device. Target (issue 2): under 60 s and 3 GiB peak RSS.

    .venv/bin/python bench/bench_inspect.py [--models gpt3-175b llama3-405b ...]

Prints a table and writes bench/results/inspect.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

DEFAULT_MODELS = ["gpt3-175b", "llama3-70b", "llama3-405b", "t5-large", "bert-large", "dlrm-large"]
TARGET_SECONDS = 60.0
TARGET_RSS_GIB = 3.0


def child(model: str) -> None:
    from planner.models import load_layer_graph

    start = time.perf_counter()
    graph = load_layer_graph(model)
    seconds = time.perf_counter() - start
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
    print(json.dumps({"model": model, "seconds": seconds, "peak_rss_gib": rss_gib,
                      "num_params": graph.num_params, "layers": len(graph.layers),
                      "unique_layers_measured": graph.unique_layers_measured,
                      "trace_method": graph.trace_method}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    rows = []
    for model in args.models:
        out = subprocess.run([sys.executable, __file__, "--child", model], capture_output=True,
                             text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'model':<14} {'params':>16} {'layers':>7} {'measured':>9} {'trace':>6} "
          f"{'seconds':>8} {'peak RSS GiB':>13}  ok")
    ok_all = True
    for r in rows:
        ok = r["seconds"] < TARGET_SECONDS and r["peak_rss_gib"] < TARGET_RSS_GIB
        ok_all &= ok
        print(f"{r['model']:<14} {r['num_params']:>16,} {r['layers']:>7} "
              f"{r['unique_layers_measured']:>9} {r['trace_method']:>6} {r['seconds']:>8.2f} "
              f"{r['peak_rss_gib']:>13.2f}  {'yes' if ok else 'NO'}")
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/inspect.json", "w") as f:
        json.dump({"target_seconds": TARGET_SECONDS, "target_rss_gib": TARGET_RSS_GIB,
                   "rows": rows}, f, indent=2)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
