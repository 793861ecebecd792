"""How much of a kernel's cold-code cost (`cost_models.cold_kernel`) a given amount of
traffic between two of its calls brings back: the probe's first-call-over-second
difference after writing 0 to 4 MiB, per kind, one thread, thread clock.

`cold_kernel_seconds` charges each distinct op's point x min(1, the pass's bytes / L2),
an assumption this measures: the share it implies against the share measured (each
kind's extra at a size over its extra at COLD_EVICT_L2_MULTIPLE x L2).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_cold_curve.py \\
        [--kinds batch_norm,add,sum,softmax,conv,conv_backward] [--rounds 21]

Read here (2026-11-25, L2 2 MiB, 21 rounds, two runs at load 5.5 and 8.3), share of
the 4 MiB figure after writing 64K-512K / 1 MiB / 2 MiB: batch_norm (49-59 us at 4 MiB)
1% / 6-29% / 32-72%, add (14-16 us) 1% / 5-6% / 18-23%, sum (26-27 us) 0-1% / 4-8% /
13-19%, softmax (14-27 us) 6-14% / 12-20% / 84-97%, conv (cnn-small's block at batch 4,
90-134 us) 2-14% / 32-37% / 53-55%, its backward (98 us) 3-13% / 40% / 78%. Nothing
below half the L2, little at the L2, all at twice it, where the linear share charges
12% at 256 KiB, 50% at 1 MiB and all at 2 MiB. The pass's own bytes are not what
evicts: an op's code leaves the L2 by the traffic since its last call (the layers the
step ran in between included). On its own bytes, this curve priced the quiet session-
start rows 49 -> 71 and 53 -> 74 over 15% (the loaded kit's deltas applied to them):
the linear share stands in for the neighbours' traffic too; not changed.
Convolutions pay the most (85 / 80 us forward / backward at 4 MiB in the kit's probe,
load 5.7): charged like the memory kinds (once per distinct op, linear share), three
paired A/Bs of cnn-small's 18 rows (load 6-9) read 12 -> 10, 17 -> 16 and 7 -> 13 over
15%: micro-batch 4/16 forwards and backwards came within, micro-batch 1 rows and the
stem's weight-only backward at 16 went over; dropped (it needs the traffic since the
last call, as above).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.cold_kernel import COLD_EVICT_L2_MULTIPLE, COLD_PROBE_BYTES  # noqa: E402
from cost_models.fresh_output import last_level_cache_bytes  # noqa: E402
from cost_models.memory_probes import _memory_kernel  # noqa: E402

EVICT_BYTES = (16 * 2**10, 64 * 2**10, 256 * 2**10, 512 * 2**10, 2**20, 2 * 2**20, 4 * 2**20)
# The "conv" kinds' convolution (batch, channels in = out, spatial, kernel): cnn-small's
# block at micro-batch 4, on ATen's oneDNN path (batch > 1).
CONV_SHAPE = (4, 16, 16, 3)


def conv_calls() -> dict:
    """kind -> (call, what reads its operands back): a convolution forward, and its
    backward computing the input's and the weight's gradients."""
    aten = torch.ops.aten
    batch, channels, spatial, kernel = CONV_SHAPE
    x, grad = (torch.randn(batch, channels, spatial, spatial) for _ in range(2))
    w = torch.randn(channels, channels, kernel, kernel)
    conv_args = ([1, 1], [kernel // 2] * 2, [1, 1], False, [0, 0], 1)  # stride, padding, ...
    operands = (lambda: (x.sum(), w.sum(), grad.sum()))
    return {"conv": (lambda: aten.convolution(x, w, None, *conv_args), operands),
            "conv_backward": (lambda: aten.convolution_backward(
                grad, x, w, None, *conv_args, [True, True, False]), operands)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="batch_norm,add,sum,softmax,conv,conv_backward")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = COLD_PROBE_BYTES // 4
    x, y, out, scratch = (torch.rand(n) * 2 - 1 for _ in range(4))
    operands = (lambda: (scratch.copy_(x), scratch.copy_(y), scratch.copy_(out)))
    convs = conv_calls()
    calls = {k: convs[k] if k in convs else (_memory_kernel(k, x, y, out)[0], operands)
             for k in args.kinds.split(",")}
    l2_bytes = last_level_cache_bytes(level=2)
    sizes = sorted({*EVICT_BYTES, COLD_EVICT_L2_MULTIPLE * l2_bytes})
    evict = {s: torch.empty(s // 4) for s in sizes}
    extra = {(k, s): [] for k in calls for s in sizes}
    clock = time.thread_time_ns
    for r in range(args.rounds):  # kinds and sizes interleaved: a slow spell hits all
        for kind, (call, read_operands) in calls.items():
            for s in sizes:
                call()  # warm first: what ran before (another kind, 4 MiB) does not count
                evict[s].fill_(float(r))
                read_operands()
                t0 = clock()
                call()
                t1 = clock()
                call()
                t2 = clock()
                extra[(kind, s)].append(((t1 - t0) - (t2 - t1)) * 1e-3)  # us
    full = COLD_EVICT_L2_MULTIPLE * l2_bytes
    print(f"L2 {l2_bytes >> 10} KiB; extra us (measured share of the {full >> 20} MiB "
          f"point; linear share) after writing:")
    for kind in calls:
        whole = statistics.median(extra[(kind, full)])
        cells = [f"{s >> 10}K {statistics.median(extra[(kind, s)]):5.1f} "
                 f"({statistics.median(extra[(kind, s)]) / whole if whole > 0 else 0:.0%}; "
                 f"{min(1.0, s / l2_bytes):.0%})" for s in sizes]
        print(f"  {kind:12s} " + "  ".join(cells))
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
