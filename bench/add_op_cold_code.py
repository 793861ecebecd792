"""Copies a `bench/bench_kernel_model.py` result whose spec was measured before the kit's
per-op-kind cold-code probe (`cost_models.op_cold_probe`), with the probe run here added
to its spec (both host readings), so that `--reprice` prices the SAME timings with the
term (B) where `--reprice` of the original prices them without it (A).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/add_op_cold_code.py \\
        /tmp/km_before.json /tmp/km_with_op_cold.json
    .venv/bin/python bench/bench_kernel_model.py --reprice /tmp/km_before.json --out A.json
    .venv/bin/python bench/bench_kernel_model.py --reprice /tmp/km_with_op_cold.json --out B.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.op_cold_probe import probe_op_cold_code  # noqa: E402


def main(source: str, target: str) -> int:
    torch.set_num_threads(1)  # as profile-device runs it
    with open(source) as f:
        doc = json.load(f)
    load = os.getloadavg()[0]
    rows = [{"kind": p.kind, "dtype": p.dtype, "seconds": p.seconds}
            for p in probe_op_cold_code("cpu")]
    specs = [doc["spec_full"]] + [p["unkept_spec"] for p in doc["schedule"] if "unkept_spec" in p]
    for spec in specs:
        spec["kernel_calibration"]["op_cold_code"] = rows
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
    args = parser.parse_args()
    sys.exit(main(args.source, args.target))
