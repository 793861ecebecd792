"""What the work between a layer's forwards costs its next forward (issue 17): the kit's
probe layer (`cold_entry_probes._entry_layer(0)`: a LayerNorm module, no cold op) timed
right after some work (cold) and right after itself (warm), one thread, thread clock,
ROUNDS interleaved rounds of RUNS runs; the median cold - warm per round, in us.

The work: the layer's own backward (always, as in a step), after the work named:
  own             nothing else
  small / conv / block / block16   one Linear's / a conv block's / the probe's transformer
                  block's / the same block at 16 tokens x 16 features' forward + backward
  write1M/2M/4M   that many bytes written (a fill: data only, no code)
each alone ("none": the layer's forward follows them, as a step's first layer follows a
backward) and then a block's forward ("+block": a layer before of other code, which runs
the same layer norm op) or a copy of the layer's own forward ("+same": a table after a
table). The after's ops and seconds are printed beside (its fwd+bwd, this clock).

Read here (Intel Xeon, 2 MiB L2 a core, 2026-11-25, load 3.7-12, the same runs as
one-off scripts before this one): own 1.4; small 3.2-4.5, conv (31 ops, 469 us) 14.9,
block (115 ops, 990 us) 26-31, block16 26: code and objects, not bytes; write1M 4.8, 2M
(this L2) 17, 4M 22; +block: 8-9 with nothing after, 9-10 small, 13.5 conv, 15-16 block;
+same: 0-1.5, 6.4 after a block. This script's one run beside the full test suite (load
7-13) read 2-4x those for the block rows: run it on a quiet host. The kit's figures
(`cold_entry_calibration`) are this probe's at two amounts of work.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_cold_entry_work.py
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

import torch
from torch import fx, nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.cold_entry_probes import (_entry_layer, neighbour_block,  # noqa: E402
                                           small_neighbour)
from ir.op_count import count_ops  # noqa: E402
from planner.fmt import table  # noqa: E402

ROUNDS, RUNS, WARMUP = 4, 16, 3  # medians of 13 runs per round after 3 untimed
MEMORY_CAP_BYTES = 6 << 30


class ConvBlock(nn.Module):
    """A residual conv block (cnn-small's kind): conv, batch norm, ReLU twice, an add."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels)
        self.c2, self.b2 = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


def tokens(n: int = 64, width: int = 64):
    return lambda: torch.randn(1, n, width, requires_grad=True)


def afters() -> dict:
    """name -> (work, its fwd+bwd ops or None)."""
    def layer_work(module, fresh):
        def run():
            out = module(fresh())
            out.backward(torch.ones_like(out))
        x, out = fresh(), []
        ops = count_ops(lambda: out.append(module(x)))
        seed = torch.ones_like(out[0])
        return run, ops + count_ops(lambda: out[0].backward(seed))

    work = {"own": (lambda: None, 0),
            "small": layer_work(small_neighbour(), tokens()),
            "conv": layer_work(fx.symbolic_trace(ConvBlock()),
                               lambda: torch.randn(1, 16, 16, 16, requires_grad=True)),
            "block": layer_work(neighbour_block(), tokens()),
            "block16": layer_work(neighbour_block(16), tokens(16, 16))}
    for mib in (1, 2, 4):
        buf = torch.empty((mib << 20) // 4)
        work[f"write{mib}M"] = ((lambda b=buf: b.fill_(1.0)), None)
    return work


def extra_us(layer, after, before) -> float:
    """Median cold - warm of `layer` after `after()`, its own backward, then `before()`."""
    fresh = tokens()
    out, cold, warm = layer(fresh()), [], []
    for i in range(WARMUP + RUNS):
        after()
        out.backward(torch.ones_like(out))
        before()
        x = fresh()
        start = time.thread_time()
        out = layer(x)
        cold.append(time.thread_time() - start)
        layer(fresh())
        x = fresh()
        start = time.thread_time()
        layer(x)
        warm.append(time.thread_time() - start)
    return (statistics.median(cold[WARMUP:]) - statistics.median(warm[WARMUP:])) * 1e6


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))
    torch.set_num_threads(1)
    torch.set_grad_enabled(True)
    layer, block, same = _entry_layer(0), neighbour_block(), _entry_layer(0)
    befores = {"none": lambda: None, "+block": lambda: block(tokens()()),
               "+same": lambda: same(tokens()())}
    work = afters()
    seconds = {}
    for name, (run, _) in work.items():
        start = time.thread_time()
        for _ in range(20):
            run()
        seconds[name] = (time.thread_time() - start) / 20 * 1e6
    reads = {}
    for _ in range(ROUNDS):
        for name, (run, _) in work.items():
            for bname, before in befores.items():
                reads.setdefault((name, bname), []).append(extra_us(layer, run, before))
    rows = [[name, "" if ops is None else ops, f"{seconds[name]:.0f}",
             *(f"{statistics.median(reads[(name, b)]):.1f}" for b in befores)]
            for name, (_, ops) in work.items()]
    print(table(["work after", "ops", "its us", *(f"extra us {b}" for b in befores)], rows))
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
