"""A/B of the last layer's backward window (issue 17: heads' backward under-predicted) on
the SAME measured rows: each `bench/bench_kernel_model.py` result given (`RULE:path`, the
rule it ran under) is repriced (its measured seconds, its prediction less the cold
backward term it was priced with) under A, the last layer's cold backward ops read at the
layers before's forward and backward ops (`Layer.after_ops`, the rule before), and B, at
those + their forwards again (`ir.op_count.step_between`: all `StepNeighbours` runs
between two of its backwards but its own forward), both at the result's own
`cold_backward_points`; W: B with the cold ops priced in a warm step too (`Layer
.step_warm`, where `backward_host_seconds` prices none).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_head_cold_ab.py A:RESULT.json B:RESULT.json ...

Prints per backward row that differs the measured us and each rule's error (medians over
the results), and the rows over 15% under each. Exits 0 (a comparison).

Read here (six bench_kernel_model runs, two under A and four under B, one thread,
2026-11-25 14:27-14:36 UTC, load 1.9-6.4): cnn-small head mb 1/4/16 -21/-32/-35% ->
-12/-25/-30%, dlrm-small top_mlp -23/-20/-20% -> -17/-14/-14% (each row better in each
of the six results), no other row moved; backward rows over 15% (of 90) A 48, B 45.
W (mlp-small's head, a warm step) -8/-41/-33% -> +50/-6/+8%: dropped, its miss grows with
the micro-batch (data, not code) and mb 1 goes from within 15% to +50%.
Live, bench_head_arrangement.py (load 1.7): the head's cold term (stock less "neither")
cnn-small mb 1 30 us, mb 4 45, where A priced 22-24 and B 29-31 (these kits); the
befores' forwards again ("no window fwd") 5.1 / 8.6 us, B less A 6-8. dlrm-small top_mlp
mb 4 29 us live where A priced 37-39 and B 48-53: its row improves by offsetting its warm
part's miss (live "neither" 163 us, priced 116-140), not by a truer cold term.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.host_dispatch import read_points  # noqa: E402
from ir.kernel_points import ColdBackwardPoint  # noqa: E402

from bench.bench_kernel_model import TARGET_ERROR, result_layers  # noqa: E402

RULES = ("A", "B", "W")


def cold_s(layer, points, after_ops: int, priced_warm: bool = False) -> float:
    """The cold term `backward_host_seconds` adds, read at `after_ops`."""
    if layer.step_warm and not priced_warm:
        return 0.0
    op_s, inner_op_s = read_points(points, after_ops, "op_s", "inner_op_s")
    return layer.cold_distinct_ops_bwd * op_s + layer.cold_inner_ops_bwd * inner_op_s


def windows(graph, layer) -> dict:
    """Each rule's window ops for `layer` (this tree's `backward_after_ops` is B's)."""
    last = layer.index == len(graph.layers) - 1
    return {"A": layer.after_ops if last else layer.backward_after_ops,
            "B": layer.backward_after_ops, "W": layer.backward_after_ops}


def repriced(arg: str, graphs: dict) -> dict:
    """(model, layer, micro-batch) -> (measured s, predicted s per rule, windows)."""
    ran, path = arg.split(":", 1)
    with open(path) as f:
        doc = json.load(f)
    points = sorted((ColdBackwardPoint(**p) for p in doc["spec"]["cold_backward_points"]),
                    key=lambda p: p.after_ops)
    out = {}
    for row, graph, layer in result_layers(doc, "bwd", graphs):
        ops = windows(graph, layer)
        base = row["predicted_s"] - cold_s(layer, points, ops[ran])
        out[(row["model"], row["layer"], row["micro_batch"])] = (
            row["measured_s"], *(base + cold_s(layer, points, ops[r], r == "W") for r in RULES),
            ops["A"], ops["B"])
    return out


def main(argv: list[str]) -> int:
    graphs = {}
    runs = [repriced(arg, graphs) for arg in argv]
    over = dict.fromkeys(RULES, 0)
    for key in runs[0]:
        per = [run[key] for run in runs if key in run]
        errs = [statistics.median(p[1 + i] / p[0] - 1 for p in per) for i in range(len(RULES))]
        for rule, err in zip(RULES, errs):
            over[rule] += abs(err) > TARGET_ERROR
        if len({round(e, 4) for e in errs}) > 1:
            print(f"{key[0]:10s} {key[1]:10s} {key[2]:3d} window {per[0][-2]}->{per[0][-1]} "
                  f"measured {statistics.median(p[0] for p in per) * 1e6:6.1f} us "
                  + " ".join(f"{r} {e:+4.0%}" for r, e in zip(RULES, errs))
                  + "  (A/B per result: " + " ".join(f"{p[1] / p[0] - 1:+.0%}/{p[2] / p[0] - 1:+.0%}"
                                                      for p in per) + ")")
    print(f"backward rows over {TARGET_ERROR:.0%} ({len(runs)} results): "
          + ", ".join(f"{r} {n}" for r, n in over.items()) + f"; load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
