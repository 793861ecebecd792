"""Where a profiled layer's backward span ends, against a real step's per-layer span, in
one process, alternating: "leaf" (the old span: the stand-in input a leaf, the span to
the marker, past the input's AccumulateGrad; the span's own-cost probe alike), "node"
(`autograd_engine.step_inputs`: the input read behind a node whose pre-hook ends the
span, as the layer before's node ends it in a step), "step" (`bench_profile_step.
real_step_backward_s`: the layer's first node to the next layer's, in one `backward()`
of the zoo model). One thread, the probe clock; ROUNDS rounds, the order rotating, each
mode's median over rounds and its spread (max - min).

Read here (2026-11-25 13:59-14:00 UTC, load 4.7-5.8, two runs, us, leaf / node / step):
t5-tiny encoder_norm mb1 43.1 / 44.1 / 44.7 and 43.8 / 45.7 / 46.2; mb4 69.5 / 70.1 /
72.2 and 65.7 / 67.3 / 68.5; dlrm-small tables.3 mb1 (no input gradient: the marker
ends both, but the old probe's intercept held a leaf's accumulation, 3.8 against 2.3 us
now, which it took out) 30.0 / 33.8 / 35.9 and 29.6 / 32.7 / 33.1; mlp-small blocks.1
mb4 23.2 / 22.7 / 20.7 and 22.3 / 21.8 / 20.3. The node span is the nearer to the step in
all eight. A layer with one input needing a gradient moves little (its accumulation,
~1.5 us, left both the span and the intercept); one with none gains it back.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_span_end.py \
        t5-tiny:1:encoder_norm t5-tiny:4:encoder_norm dlrm-small:1:tables.3 \
        mlp-small:4:blocks.1
"""

from __future__ import annotations

import os
import resource
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models import autograd_engine, layer_profile  # noqa: E402
from cost_models.autograd_engine import EngineSampler  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402

from bench.bench_kernel_model import REPEATS, WARMUP, traced_graph  # noqa: E402
from bench.bench_profile_step import real_step_backward_s  # noqa: E402

ROUNDS = 5
MODES = ("leaf", "node", "step")


def profiled_s(graph, measurer, i, name, clock, leaf: bool) -> float:
    kept = autograd_engine.step_inputs, layer_profile.step_inputs
    if leaf:  # the old span: inputs stay leaves, so no input node ends it
        autograd_engine.step_inputs = layer_profile.step_inputs = lambda values: values
    try:
        factory = real_factory("cpu")
        state = measurer.layer_state(i, factory)
        return layer_profile.time_layer(
            measurer, i, state, factory, "cpu", warmup=WARMUP, repeats=REPEATS, name=name,
            engine=EngineSampler("cpu", clock, nodes_only=True), layers=graph.layers,
            clock=clock)[1]
    finally:
        autograd_engine.step_inputs, layer_profile.step_inputs = kept


def main() -> int:
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    torch.set_num_threads(1)
    clock = probe_clock("cpu")
    for case in sys.argv[1:]:
        model, mb, name = case.split(":")
        graph, measurer = traced_graph(model, int(mb))
        i = next(k for k, layer in enumerate(graph.layers) if layer.name == name)
        names = [layer.name for layer in graph.layers]
        got = {mode: [] for mode in MODES}
        for r in range(ROUNDS):
            for mode in MODES[r % 3:] + MODES[:r % 3]:
                got[mode].append(real_step_backward_s(model, int(mb), names, clock)[name]
                                 if mode == "step" else
                                 profiled_s(graph, measurer, i, name, clock, mode == "leaf"))
        cells = [f"{mode} {statistics.median(v) * 1e6:.1f} "
                 f"({(max(v) - min(v)) * 1e6:.1f})" for mode, v in got.items()]
        print(f"{case}: " + ", ".join(cells) + f"  us, load {os.getloadavg()[0]:.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
