"""A/B of two forward host terms (issue 17) on the SAME measured rows: each
`bench/bench_kernel_model.py` result given is repriced without (A) and with (B) a warm
step's entry (`host_dispatch.warm_step_entry_seconds`: mlp-small's first block and head)
and F.embedding_bag's Python per forward `_embedding_bag` call (the kit's
`aten::_embedding_bag` host excess, `item_probes.probe_embedding_bag_python_s`: dlrm's
tables). A result whose spec carries the excess was priced with both (B); an older one
with neither (A), its excess then `--bag-us`. Backward rows read neither term.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_small_forward_ab.py [--bag-us US] RESULT.json...

Prints per result the forward rows over 15% under A and B, and each repriced row.
Read here (2026-11-25): the lead's two quiet runs (load 0.6-0.8) at --bag-us 2.88 (the
probe's median of five at load 5-9): 45 -> 36 and 47 -> 36 of 90 forward rows over 15%;
two runs of this branch (mlp-small, dlrm-small, load 4.3-4.6): 17 -> 8, 19 -> 10 of 27.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.host_dispatch import warm_step_entry_seconds  # noqa: E402

from bench.bench_cold_entry_ab import both_rules  # noqa: E402
from bench.bench_kernel_model import TARGET_ERROR, result_layers  # noqa: E402

BAG_OP = "aten::_embedding_bag"


def repriced(path: str, bag_us: float, graphs: dict) -> list[tuple]:
    """(model, layer, micro-batch, measured s, predicted s under A, under B) per forward row."""
    with open(path) as f:
        doc = json.load(f)
    _, cal = both_rules(doc["spec"])
    own = doc["spec"].get("host_op_excess_s", {}).get(BAG_OP)
    out = []
    for row, _, layer in result_layers(doc, "fwd", graphs):
        calls = sum(r.count for r in layer.kernels.forward if r.op == BAG_OP)
        terms_s = calls * (own if own is not None else bag_us * 1e-6)
        if layer.step_warm:
            terms_s += warm_step_entry_seconds(layer, cal)
        a_s = row["predicted_s"] - (terms_s if own is not None else 0.0)
        out.append((row["model"], row["layer"], row["micro_batch"], row["measured_s"], a_s,
                    a_s + terms_s))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bag-us", type=float, default=0.0,
                        help="F.embedding_bag's Python (us) for results without the figure")
    parser.add_argument("results", nargs="+")
    args = parser.parse_args(argv)
    graphs = {}
    for path in args.results:
        rows = repriced(path, args.bag_us, graphs)
        over_a = sum(abs(a / m - 1) > TARGET_ERROR for *_, m, a, _ in rows)
        over_b = sum(abs(b / m - 1) > TARGET_ERROR for *_, m, _, b in rows)
        print(f"{path}: {len(rows)} forward rows, over {TARGET_ERROR:.0%} A {over_a}, B {over_b}")
        for model, layer, batch, m, a, b in rows:
            if a != b:
                print(f"  {model} {layer} mb {batch}: measured {m * 1e6:.1f} us, "
                      f"A {a / m - 1:+.0%}, B {b / m - 1:+.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
