"""`planner show plan.json [--chart FILE.png]`: a plan file as tables (and a picture)."""

from __future__ import annotations

from ir.plan import load_plan
from planner.arg_types import check_chart
from planner.fmt import escape_controls
from planner.table_report import plan_tables_text
from planner.plan_report import (check_predicted, predicted_lines, stage_memory_table,
                                  strategy_table, summary_line)


def register(sub) -> None:
    p = sub.add_parser("show", help="print a plan file as tables",
                       description="Print a plan file: per-layer strategies, stages, "
                                   "predicted time and memory.")
    p.add_argument("plan", metavar="PLAN.json")
    p.add_argument("--chart", default=None, metavar="FILE.png",
                   help="draw layers x strategy (TP degree, ZeRO stage, checkpointing, stages)")
    p.set_defaults(func=run)


def run(args) -> int:
    check_chart(args.chart)
    doc = load_plan(args.plan)
    check_predicted(doc.predicted, args.plan)
    lines = [summary_line(doc), "", strategy_table(doc), "", predicted_lines(doc.predicted)]
    if doc.predicted:
        lines.append(stage_memory_table(doc.predicted))
    if doc.plan.embeddings is not None:  # the sharded tables and their per-rank cost
        lines += ["", plan_tables_text(doc.plan.embeddings, doc.plan.world_size,
                                       (doc.predicted or {}).get("embedding"))]
    # Names come from the file: escape what could drive the terminal.
    print(escape_controls("\n".join(lines)))
    if args.chart:
        from planner.plan_chart import draw

        draw(doc, args.chart)
        print(f"\nwrote {escape_controls(args.chart)}")
    return 0
