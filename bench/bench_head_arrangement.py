"""A head's profiled backward (`layer_profile.time_layer`) with the pieces of its step
arrangement toggled, alternating in one process (6 rounds, each mode's median and
spread): "stock"; "no window fwd" (`StepNeighbours.before_forward` off: the forwards of
the layers before); "no after bwd" (`StepNeighbours.after_backward` off: the layers
before's forwards and backwards after the head's backward); "neither" (the head's
forward and backward back to back, warm).

Read here (2026-11-25 14:05 UTC, load 4.8, us): mlp-small head mb4 stock 37.1, no window
fwd 32.9, no after bwd 32.5, neither 28.2; cnn-small head mb4 87.6 / 79.8 / 81.3 / 50.4;
gpt-tiny head mb1 64.5 / 55.6 / 63.1 / 55.2; dlrm-small top_mlp mb4 166.6 / 158.4 /
162.4 / 152.9. A real step's span of the head agrees with the stock profile
(mlp-small mb4 33.1, cnn-small mb4 104.2, dlrm top_mlp mb4 165.8: bench_profile_step's
`real_step_backward_s`, same session), so the heads' under-prediction is the work a step
runs around a head evicting its backward's code (mlp-small's head: 5 cold backward ops,
priced 0 because `Layer.step_warm`), not the loss's node kinds: a Linear(64, 10) head's
backward with cross-entropy read 3.4-5.0 us over the same head with a sum loss, where
the kit's parts price the extra node and two ops at 3.5 (NodeSpan, 400 alternating
rounds, load 4.4-5.0); first in an engine call it read 0.7-2.9 us over after another
graph's nodes.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_head_arrangement.py \
        mlp-small:4:head cnn-small:4:head gpt-tiny:1:head dlrm-small:4:top_mlp
"""

from __future__ import annotations

import os
import resource
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models import layer_profile  # noqa: E402
from cost_models.autograd_engine import EngineSampler  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402

from bench.bench_kernel_model import REPEATS, WARMUP, traced_graph  # noqa: E402

ROUNDS = 6
MODES = ("stock", "no window fwd", "no after bwd", "neither")


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    torch.set_num_threads(1)
    clock = probe_clock("cpu")
    neighbours = layer_profile.StepNeighbours
    kept = (neighbours.before_forward, neighbours.after_backward)
    try:
        for case in sys.argv[1:]:
            model, mb, name = case.split(":")
            graph, measurer = traced_graph(model, int(mb))
            i = next(k for k, layer in enumerate(graph.layers) if layer.name == name)
            factory = real_factory("cpu")
            got = {mode: [] for mode in MODES}
            for r in range(ROUNDS):
                for mode in (MODES if r % 2 else MODES[::-1]):
                    neighbours.before_forward = (kept[0] if mode in ("stock", "no after bwd")
                                                 else (lambda self: None))
                    neighbours.after_backward = (kept[1] if mode in ("stock", "no window fwd")
                                                 else (lambda self: None))
                    state = measurer.layer_state(i, factory)
                    got[mode].append(layer_profile.time_layer(
                        measurer, i, state, factory, "cpu", warmup=WARMUP, repeats=REPEATS,
                        name=name, engine=EngineSampler("cpu", clock, nodes_only=True),
                        layers=graph.layers, clock=clock)[1])
            print(case + ": " + ", ".join(
                f"{mode} {statistics.median(v) * 1e6:.1f} ({(max(v) - min(v)) * 1e6:.1f})"
                for mode, v in got.items()) + f" us, load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        neighbours.before_forward, neighbours.after_backward = kept
    return 0


if __name__ == "__main__":
    sys.exit(main())
