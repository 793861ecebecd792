"""A/B of the GEMM layout tables (issue 17) on the SAME measured rows: one
`bench/bench_kernel_model.py` run (its models, micro-batches, profile and timings), each
row priced without (A: the plain `mm` table for every GEMM record) and with (B) the kit's
`gemm_linear`, `gemm_linear_nobias` and `gemm_weight_grad` tables
(`cost_models.gemm_layouts`).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_gemm_layout_ab.py \\
        [--models gpt-tiny,bert-tiny] [--out PATH]

Prints the rows over 15% under A and B, the rows that crossed 15% or went past 25%, and
each row whose price moved by more than 1%; writes both prices per row (`--out`).
Read here (2026-11-25, 5 runs of all 180 rows, the shared host at load 6-23, never
quiet): rows over 15% A -> B 67 -> 67, 82 -> 81, 154 -> 154 (that run's kit was measured
at load ~16: every row over-priced), 100 -> 98, 113 -> 111; no row went from within 15%
to past 25%. B prices gpt-tiny's and bert-tiny's block forwards 2.5-5% higher, their
backwards 1-2.8%, t5-tiny's (bias-less Linears) 0.5-1.8%; where a row's measurement was
not wrecked by the load (|A error| < 50%) the median |error| went 6.0 -> 6.1%,
11.1 -> 8.1%, 11.9 -> 9.7% and 5.5 -> 5.8% (the load-16 run: 30.8 -> 33.7%).
"""

from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.kernel_ab import run  # noqa: E402
from ir.kernel_calibration import GEMM_LAYOUT_TABLES  # noqa: E402

if __name__ == "__main__":
    # A: the plain mm table for every GEMM record
    sys.exit(run("gemm_layout_ab", __doc__.splitlines()[0], lambda cal: dataclasses.replace(
        cal, **dict.fromkeys(GEMM_LAYOUT_TABLES.values(), ())), sys.argv[1:]))
