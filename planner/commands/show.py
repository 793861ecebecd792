"""`planner show plan.json [--chart FILE.png]`: a plan file as tables (and a picture)."""

from __future__ import annotations

from ir.plan import load_plan
from planner.plan_report import predicted_lines, stage_memory_table, strategy_table, summary_line


def register(sub) -> None:
    p = sub.add_parser("show", help="print a plan file as tables",
                       description="Print a plan file: per-layer strategies, stages, "
                                   "predicted time and memory.")
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--chart", default=None, metavar="FILE.png",
                   help="draw layers x strategy (TP degree, ZeRO stage, checkpointing, stages)")
    p.set_defaults(func=run)


def run(args) -> int:
    doc = load_plan(args.plan)
    print(summary_line(doc))
    print()
    print(strategy_table(doc))
    print()
    print(predicted_lines(doc.predicted))
    if doc.predicted:
        print(stage_memory_table(doc.predicted))
    if args.chart:
        from planner.plan_chart import draw

        draw(doc, args.chart)
        print(f"\nwrote {args.chart}")
    return 0
