"""A/B of a backward's cold-op price (issue 17): the kit's block figures alone (A: per cold
op and per cold inner op, both probed after a transformer block's forward and backward)
against the figures read off `ColdBackwardPoint`s at the layer's window's work (B:
`host_dispatch.backward_host_seconds` at `Layer.backward_after_ops`), on the SAME measured
rows: each `bench/bench_kernel_model.py` result given is repriced both ways (its measured
seconds, its prediction less the cold term it was priced with: its spec's points where it
has them, else its block figures), so the pair differs in the
rule alone. Both rules' figures come from one `cold_backward_calibration` run in this
process per result (--probes of them, medians), taken after that result's rows.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_cold_backward_ab.py RESULT.json [...]

Prints, per backward row, measured us and both errors (the median over the results given)
and the count over 15% under each rule. Exits 0 (a comparison, not a target).

Read here (four bench_kernel_model runs of mlp-small, dlrm-small, t5-tiny, gpt-tiny, load
2.4-6.6, 2026-11-25 11:38-11:45 UTC; probes 0.42-0.52 / 0.23-0.26 us after a Linear's 17
ops, 3.07-3.15 / 1.53-1.73 after a block's 115): A 30 of 60 backward rows over 15%, B 29.
Closer: dlrm tables.3 mb1/4/16 +68/+48/+41 -> +41/+27/+22 (its window, top_mlp's 88-92
ops, reads it mid-line; it pays ~1/3 of the block's figures), gpt-tiny norm +16/+13/+7 ->
+1/+1/+1 (after the head's 23 ops); further under, within 15%: dlrm top_mlp (the last
layer, after the window before's 70-74 ops) +5/+1/-3 -> -4/-8/-11. Others unchanged (no
cold op, a warm step, or a window beyond the block's ops).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.cold_backward_probes import cold_backward_calibration  # noqa: E402
from ir.kernel_points import ColdBackwardPoint  # noqa: E402
from planner.fmt import table  # noqa: E402

from bench.bench_kernel_model import TARGET_ERROR, result_layers  # noqa: E402


def cold_s(layer, op_s: float, inner_op_s: float) -> float:
    """The cold term `backward_host_seconds` adds at these figures."""
    return 0.0 if layer.step_warm else (layer.cold_distinct_ops_bwd * op_s
                                        + layer.cold_inner_ops_bwd * inner_op_s)


def median_calibration(probes: int) -> dict:
    """`cold_backward_calibration` run `probes` times, each figure's median."""
    runs = [cold_backward_calibration("cpu") for _ in range(probes)]
    at = [r["cold_backward_points"] for r in runs]
    points = tuple(ColdBackwardPoint(p.after_ops, statistics.median(r[i].op_s for r in at),
                                     statistics.median(r[i].inner_op_s for r in at))
                   for i, p in enumerate(at[0]))
    return dict(op_s=statistics.median(r["cold_backward_op_host_s"] for r in runs),
                inner_op_s=statistics.median(r["cold_backward_inner_op_host_s"] for r in runs),
                points=points)


def repriced(path: str, graphs: dict, probes: int) -> dict:
    """(model, layer, micro-batch) -> (measured s, predicted s under A, under B)."""
    from cost_models.host_dispatch import read_points

    with open(path) as f:
        doc = json.load(f)
    spec, cal = doc["spec"], median_calibration(probes)
    print(f"{path}: block {cal['op_s'] * 1e6:.2f} / {cal['inner_op_s'] * 1e6:.2f} us; points "
          + ", ".join(f"{p.after_ops} ops {p.op_s * 1e6:.2f} / {p.inner_op_s * 1e6:.2f}"
                      for p in cal["points"]), flush=True)
    out = {}
    for row, _, layer in result_layers(doc, "bwd", graphs):
        own_points = sorted((ColdBackwardPoint(**p) for p in spec.get("cold_backward_points", ())),
                            key=lambda p: p.after_ops)
        own = cold_s(layer, *(read_points(own_points, layer.backward_after_ops, "op_s",
                                          "inner_op_s") if own_points else
                              (spec["cold_backward_op_host_s"],
                               spec["cold_backward_inner_op_host_s"])))
        base = row["predicted_s"] - own
        points = sorted(cal["points"], key=lambda p: p.after_ops)
        b = read_points(points, layer.backward_after_ops, "op_s", "inner_op_s")
        out[(row["model"], row["layer"], row["micro_batch"])] = (
            row["measured_s"], base + cold_s(layer, cal["op_s"], cal["inner_op_s"]),
            base + cold_s(layer, *b), layer.backward_after_ops,
            layer.cold_distinct_ops_bwd, layer.cold_inner_ops_bwd)
    return out


def main(argv: list[str]) -> int:
    probes = 3
    if argv and argv[0].startswith("--probes="):
        probes, argv = int(argv[0].split("=")[1]), argv[1:]
    graphs = {}
    runs = [repriced(path, graphs, probes) for path in argv]
    rows, over = [], {"A": 0, "B": 0}
    for key in runs[0]:
        per = [run[key] for run in runs if key in run]
        err_a = statistics.median(p[1] / p[0] - 1 for p in per)
        err_b = statistics.median(p[2] / p[0] - 1 for p in per)
        over["A"] += abs(err_a) > TARGET_ERROR
        over["B"] += abs(err_b) > TARGET_ERROR
        rows.append([*key, per[0][3], f"{per[0][4]}+{per[0][5]}",
                     f"{statistics.median(p[0] for p in per) * 1e6:.1f}",
                     f"{err_a:+.0%}", f"{err_b:+.0%}"])
    print(table(["model", "layer", "batch", "window ops", "cold", "measured us", "error A",
                 "error B"], rows))
    print(f"\n{len(rows)} backward rows over {len(runs)} result(s): over "
          f"{TARGET_ERROR:.0%} A (block figures alone) {over['A']}, B (by window's work) "
          f"{over['B']}; load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
