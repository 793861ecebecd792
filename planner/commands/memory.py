"""`planner memory MODEL --cluster ... [strategy flags] [--json] [--chart FILE.png]`: the
dry-run memory report, per pipeline stage, without running anything.

    planner memory llama3-70b --cluster h100-80g --nodes 8 --tp 8 --pp 4 --zero 1 \\
        --checkpoint full --chart memory.png
"""

from __future__ import annotations

import json

from cost_models.advice import suggest_fixes
from cost_models.common import model_layer_configs
from cost_models.memory import plan_memory
from planner import report
from planner.arg_types import check_chart
from planner.commands.estimate import add_model_arguments, describe, load_inputs


def register(sub) -> None:
    p = sub.add_parser("memory", help="per-device memory of a strategy, stage by stage",
                       description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.add_argument("--chart", default=None, metavar="FILE.png",
                   help="draw a stacked bar per stage against device memory")
    p.set_defaults(func=run)


def run(args) -> int:
    check_chart(args.chart)
    graph, plan, cluster, _, model = load_inputs(args)
    memory = plan_memory(graph, plan, cluster,
                         model_layer_configs(graph, plan, cluster.device, model))
    if args.chart:
        report.memory_chart(memory, args.chart, f"{graph.model} on {cluster.name}: {plan}")
    if args.json:
        print(json.dumps(memory.to_json(), indent=2))
        return 0
    print(describe(graph, plan, cluster))
    print()
    print(report.memory_table(memory))
    fixes = () if memory.fits else suggest_fixes(graph, plan, cluster)
    print(report.memory_verdict(memory, fixes))
    if args.chart:
        print(f"chart written to {args.chart}")
    return 0
