"""Copies a `bench/bench_kernel_model.py` result whose spec was measured before the kit's
per-op-kind cold-code probe (`cost_models.op_cold_probe`), with the probe run here added
to its spec (both host readings), so that `--reprice` prices the SAME timings with the
term (B) where `--reprice` of the original prices them without it (A).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/add_op_cold_code.py \\
        /tmp/km_before.json /tmp/km_with_op_cold.json
    .venv/bin/python bench/bench_kernel_model.py --reprice /tmp/km_before.json --out A.json
    .venv/bin/python bench/bench_kernel_model.py --reprice /tmp/km_with_op_cold.json --out B.json

`--kinds conv_onednn,conv_onednn_backward` (or `--kinds gemv`): a spec that has the table gains only these
kinds (a probe added since), each at the spec's own reference + its excess over the
reference measured here, so the kinds it had keep their figures and the A/B shows only
the new kinds' term.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.op_cold_probe import REFERENCE_KIND, probe_op_cold_code  # noqa: E402


def only_kinds(table: list[dict], probed: list[dict], kinds: list[str]) -> list[dict]:
    """`table` with `kinds` set from `probed`, moved by the reference's difference (each
    kind's excess over the reference as probed here)."""
    def reference(rows: list[dict]) -> float:
        return next(r["seconds"] for r in rows if r["kind"] == REFERENCE_KIND)

    shift = reference(table) - reference(probed)
    return [r for r in table if r["kind"] not in kinds] + [
        {**r, "seconds": max(0.0, r["seconds"] + shift)} for r in probed if r["kind"] in kinds]


def main(source: str, target: str, kinds: list[str]) -> int:
    torch.set_num_threads(1)  # as profile-device runs it
    with open(source) as f:
        doc = json.load(f)
    load = os.getloadavg()[0]
    rows = [{"kind": p.kind, "dtype": p.dtype, "seconds": p.seconds}
            for p in probe_op_cold_code("cpu")]
    specs = [doc["spec_full"]] + [p["unkept_spec"] for p in doc["schedule"] if "unkept_spec" in p]
    for spec in specs:
        cal = spec["kernel_calibration"]
        cal["op_cold_code"] = only_kinds(cal["op_cold_code"], rows, kinds) if kinds else rows
    with open(target, "w") as f:
        json.dump(doc, f)
    print(f"load {load:.1f}; us: " + ", ".join(f"{r['kind']} {r['seconds'] * 1e6:.1f}"
                                               for r in rows))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a bench_kernel_model.py --out result")
    parser.add_argument("target", help="where to write the copy with the probe's table")
    parser.add_argument("--kinds", default="", help="comma-separated kinds to add alone "
                        "(module docstring)")
    args = parser.parse_args()
    sys.exit(main(args.source, args.target, [k for k in args.kinds.split(",") if k]))
