"""What a memory op's cold code costs by the work between its runs (issue 17, the
cold-L2-code term `cost_models.cold_kernel`), two probes on one thread, thread clock.

--since: each kind's call (layer norm, gelu, add, sum) on operands of 1, 16 and 256 KiB,
run twice, then N MiB written (`fill_`) and its operands read back, then its first call
over its second: the excess by the bytes since its last run. Read 18:39 UTC (load 1.8-2.1,
15 rounds, median; us):

    kind         operand  0     0.25  1     2     4     16    64 MiB
    layer_norm   1K       1.4   4.1   7.8   15.1  45.2  39.5  49.3
    gelu         1K       2.0   3.1   7.4   20.8  47.3  61.8  68.8
    add          1K       0.6   1.9   2.5   5.1   13.7  15.9  20.5
    layer_norm   16K      1.8   4.0   6.7   16.9  37.1  39.1  48.9
    gelu         16K      1.1   4.0   8.7   26.2  51.4  53.5  65.9
    add          16K      0.6   0.7   3.0   7.4   14.6  15.4  24.6

Again at 18:46 (load 3.7): within 1-9 us of these, 256 KiB operands 6-28 us at 1-2 MiB
(their own data too). The excess is the op's code leaving this core's 2 MiB L2: little below 1 MiB since its
last run, most of it at 2 MiB, flat from 4 MiB (the kit's probe writes 2 x L2:
`COLD_EVICT_L2_MULTIPLE`), whatever the operand's size. So an op that the work just before
ran (a block's layer norm after the block before's, one block's bytes ago) pays the share
of the bytes since then, not of the pass's own: `ir.op_count.recent_code_bytes`,
`cold_kernel.recent_code_credit_seconds`.

--shared: after 4 MiB written, an op's first-call excess alone and right after another
cold op (tanh, sigmoid or add first). Read 18:40 UTC (load 2.4-3.0, 15 rounds; us):

    op          alone  after tanh  after sigmoid  after add
    layer_norm  33.6   22.4        20.9           25.7
    gelu        38.2   26.0        24.5           29.8
    add         17.2    9.0        10.1           -
    sum         22.0   10.8        10.2           14.4
    tanh        22.8    -           6.1           14.3
    sigmoid     20.6    5.8         -             14.0

One cold op re-warms 8-17 us of code the others share (dispatch, TensorIterator, the
Python binding): an op's point read alone holds it, which a pass pays once (the host's
cold entry, `host_dispatch.cold_entry_seconds`, prices it after the work between). So
charging every op its point at the bytes since its last run ("since" below) counts it
once per op: the work between is left to the entry, and the kernel term reads an op's
bytes since only where they are fewer than the pass's own.

Rules tried on the saved timings (`bench_kernel_model.py --reprice`, rows over 15% of 180
on km_s28 / km_s27 / km_base; the term as it stood: 53 / 56 / 38; 2026-11-26):
- each op at the bytes since its last run in the profile's loop (its own previous pass
  where the work before did not run it): 84 / 76 / 71 (the small layers after big windows
  go +50-100%: rel biases, norms, heads);
- the same less the shared part (8-15 us once per pass, netted against the entry's figure)
  and, for the ops the entry counts cold, less the entry's per-op figure: 60-79 / 70-81 /
  56-71;
- off: 57 / 66 / 57; only for the ops the work before ran: 57 / 58 / 37; only for the
  others: 53 / 64 / 51;
- each op's point less the shared part, at the pass's own bytes: 48-52 / 59-64 / 40-45
  (the blocks at micro-batch 4 and 16 go 5-8 points under: the term holds there what
  grows with their bytes, not their code);
- + (own bytes - L2) / the kit's bandwidth x 0.25-1: 44-68 / 57-70 / 31-42 (a fitted
  factor: not landed);
- LANDED: the fewer of the pass's own bytes and the bytes since the work just before ran
  the op: 49 / 57 / 37. Only prices fall (1-22 us): the blocks' passes at micro-batch 1
  and 4 (their ops ran in the block before, or for a backward in the block after's
  backward, under an L2 ago), bert's head, t5's encoder_norm backward.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_cold_code_between.py [--rounds 15]

Writes bench/results/cold_code_between.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "cold_code_between.json")
FILLS_MIB = (0, 0.25, 1, 2, 4, 16, 64)  # around this CPU's 2 MiB L2 and 32 MiB L3
OPERAND_BYTES = (2**10, 16 * 2**10, 256 * 2**10)
SHARED_FILL_MIB = 4  # the kit's probe: 2 x L2
WIDTH = 64  # layer norm rows


def calls(n: int) -> dict:
    """Per kind, a call on fresh fp32 operands of n elements, and the operands."""
    x, y, out, z = torch.rand(n), torch.rand(n), torch.empty(n), torch.rand(n)
    rows = x.view(-1, WIDTH) if n >= WIDTH else x.view(1, -1)
    return {"layer_norm": lambda: F.layer_norm(rows, (rows.shape[-1],)),
            "gelu": lambda: F.gelu(x), "add": lambda: torch.add(x, y, out=out),
            "sum": lambda: x.sum(), "tanh": lambda: torch.tanh(z),
            "sigmoid": lambda: torch.sigmoid(z)}, (x, y)


def first_over_second_ns(call, before, clock) -> int:
    """`call`'s first run after `before()` less its second run right after."""
    before()
    t0 = clock()
    call()
    t1 = clock()
    call()
    t2 = clock()
    return (t1 - t0) - (t2 - t1)


def since(rounds: int, clock) -> dict:
    """Median excess (seconds) per (kind, operand bytes, MiB written since its last run)."""
    fills = {mib: torch.empty(max(1, int(mib * 2**20) // 4)) for mib in FILLS_MIB}
    scratch = torch.empty(max(OPERAND_BYTES) // 4)
    subjects = {}
    for size in OPERAND_BYTES:
        made, operands = calls(size // 4)
        for kind in ("layer_norm", "gelu", "add", "sum"):
            subjects[(kind, size)] = (made[kind], operands)
    excess = {}
    for r in range(rounds):  # every subject and fill each round: a slow spell spoils few
        for (kind, size), (call, (x, y)) in subjects.items():
            for mib in FILLS_MIB:
                def before(fill=fills[mib], x=x, y=y, call=call):
                    call(), call()  # its code warm: its last run
                    fill.fill_(float(r))
                    scratch[:x.numel()].copy_(x), scratch[:y.numel()].copy_(y)
                excess.setdefault((kind, size, mib), []).append(
                    first_over_second_ns(call, before, clock))
    return {key: statistics.median(v) * 1e-9 for key, v in excess.items()}


def shared(rounds: int, clock) -> dict:
    """Median excess (seconds) per (op, the cold op run first or None) after the fill."""
    made, _ = calls(16 * 2**10 // 4)
    fill = torch.empty(SHARED_FILL_MIB * 2**20 // 4)
    excess = {}
    for r in range(rounds):
        for op, call in made.items():
            for first in (None, "tanh", "sigmoid", "add"):
                if first == op:
                    continue

                def before(first=first):
                    for other in made.values():
                        other()
                    fill.fill_(float(r))
                    if first is not None:
                        made[first]()
                excess.setdefault((op, first), []).append(
                    first_over_second_ns(call, before, clock))
    return {key: statistics.median(v) * 1e-9 for key, v in excess.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    clock = time.thread_time_ns  # this thread's CPU time: a switch away does not count
    load = os.getloadavg()[0]
    by_since = since(args.rounds, clock)
    by_first = shared(args.rounds, clock)
    print(f"excess over the second call (us) by MiB written since the last run "
          f"{FILLS_MIB}:")
    for kind, size in dict.fromkeys((k, s) for k, s, _ in by_since):
        print(f"  {kind:11s} {size // 1024:4d} KiB " + " ".join(
            f"{by_since[(kind, size, mib)] * 1e6:6.1f}" for mib in FILLS_MIB))
    print(f"after {SHARED_FILL_MIB} MiB written, alone and after another cold op (us):")
    for op in dict.fromkeys(op for op, _ in by_first):
        print(f"  {op:11s} " + "  ".join(f"{first or 'alone'} {s * 1e6:5.1f}"
                                          for (o, first), s in by_first.items() if o == op))
    print(f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"bench": "cold_code_between", "rounds": args.rounds,
                   "load_average_1min": [load, os.getloadavg()[0]],
                   "since_s": [[k, s, m, v] for (k, s, m), v in by_since.items()],
                   "shared_s": [[o, first, v] for (o, first), v in by_first.items()]},
                  f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
