"""A/B of the entry's traffic term: saved timings priced with and without the kit's
`ColdTrafficPoint`s (`cold_entry_probes.cold_entry_traffic_points`, probed here and put
into the result's spec; `host_dispatch.traffic_entry_seconds` reads them at
`Layer.after_bytes`), the rows that cross 15% either way.

Read (this session's machine, 2 shared cores; 2026-11-26): the probe, a fill of n bytes
between the block pair and a small layer's forward before the probe layers, gave +0-7 /
7-11 / 7-11 / 7-11 us per layer and 0.1-1.0 / 1.0-2.2 / 1.0-2.2 / 3.7 us per cold op at
1 / 4 / 16 / 64 MiB (two runs, load 1.5-3); with the fill just before the layers (no
layer before: the most it evicts) +16-20 / 32-35 / 35-36 / 40-53 us and 0.2-0.5 / 1.7-1.9
/ 1.8-1.9 / 6.1-7.3 per op. Repricing /work/notes/km_base.json (180 rows, 39 over 15%):
42 and 43 over with the first, 59 with the second, 41 with either's per-op slope dropped;
a fresh t5-tiny, dlrm-small, mlp-small run (96 rows, 40 over, load 2-3): 45 and 44.
Rows fixed: gpt-tiny embed b4 (-18 -> -7%), t5 decoder_rel_bias b16 (-19 -> -3%),
cnn-small head b16 (-27 -> -10%), stem b4; broken: llama-tiny embed b4/b16 (+13/+7 ->
+42/+34%), t5 rel biases b4/b16 (+3..+11 -> +18..+30%), encoder/decoder blocks.0 b1. The
bytes between do not order these layers' misses: llama-tiny's and gpt-tiny's embeds sit
after the same windows and miss opposite ways, and the relative biases' warm part is over
at micro-batch 1 (bench_small_pass_terms.py). So `planner profile-device` does not run
the probe; this bench is the A/B for a probe or a reading that does better.

    .venv/bin/python bench/bench_traffic_entry_ab.py --reprice RESULT_JSON [--points JSON]

Writes bench/results/traffic_entry_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.cold_entry_probes import cold_entry_traffic_points  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "traffic_entry_ab.json")
TARGET_ERROR = 0.15  # bench_kernel_model's


def reprice(result_path: str, out_path: str) -> dict:
    """bench_kernel_model's `--reprice` of a result file, its written rows (it exits 1
    on a row over its target: only a missing file is a failure here)."""
    subprocess.run([sys.executable, os.path.join(HERE, "bench_kernel_model.py"), "--reprice",
                    result_path, "--out", out_path], check=False, stdout=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    with open(out_path) as f:
        return json.load(f)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reprice", required=True, metavar="RESULT_JSON",
                        help="a bench_kernel_model result: its timings and spec")
    parser.add_argument("--points", default=None, metavar="JSON",
                        help="ColdTrafficPoint rows to use instead of probing")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    if args.points:
        with open(args.points) as f:
            points = json.load(f)
    else:
        points = [{"after_bytes": p.after_bytes, "entry_s": p.entry_s, "op_s": p.op_s}
                  for p in cold_entry_traffic_points("cpu")]
    with open(args.reprice) as f:
        doc = json.load(f)
    doc["spec_full"]["kernel_calibration"].pop("cold_entry_traffic_points", None)
    with tempfile.TemporaryDirectory() as tmp:
        plain, traffic = os.path.join(tmp, "plain.json"), os.path.join(tmp, "traffic.json")
        with open(plain, "w") as f:
            json.dump(doc, f)
        doc["spec_full"]["kernel_calibration"]["cold_entry_traffic_points"] = points
        with open(traffic, "w") as f:
            json.dump(doc, f)
        before = reprice(plain, os.path.join(tmp, "plain_out.json"))["rows"]
        after = reprice(traffic, os.path.join(tmp, "traffic_out.json"))["rows"]
    print("points: " + ", ".join(f"{p['after_bytes'] / 2**20:g} MiB {p['entry_s'] * 1e6:.1f} us "
                                 f"+ {p['op_s'] * 1e6:.2f}/op" for p in points))
    crossed = []
    for a, b in zip(before, after):
        over_a, over_b = abs(a["error"]) > TARGET_ERROR, abs(b["error"]) > TARGET_ERROR
        if over_a != over_b:
            crossed.append([a["model"], a["layer"], a["micro_batch"], a["phase"],
                            f"{a['error']:+.0%}", f"{b['error']:+.0%}",
                            "fixed" if over_a else "broken"])
    for row in crossed:
        print("  ".join(str(x) for x in row))
    over = [sum(abs(r["error"]) > TARGET_ERROR for r in rows) for rows in (before, after)]
    print(f"{len(before)} rows: {over[0]} over {TARGET_ERROR:.0%} without the points, "
          f"{over[1]} with them; load average {os.getloadavg()[0]:.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"bench": "traffic_entry_ab", "repriced_from": args.reprice,
                   "points": points, "over_target": over, "crossed": crossed,
                   "load_average_1min": os.getloadavg()[0]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
