"""Each recorded kernel's predicted seconds vs the same ATen op timed alone, on one CPU thread.

`bench_kernel_model.py` compares whole layers (kernels + host dispatch + what running in
sequence adds); this bench isolates the kernel model (`cost_models.kernel_time`): it runs
a zoo layer once on the CPU under a dispatch mode below autograd that re-runs every op
that launches work (views and allocations left out) with its real arguments, timing it
on the thread's CPU clock (`cost_models.host_probes.probe_clock`: the load of other
processes does not count) as the median of REPEATS calls, less the median of one
trivial `torch.ops` call (the Python-to-ATen dispatch the host model prices, not the
kernel). Per op name: predicted seconds (the layer's kernel records at this micro-batch,
on a spec `profile_device("cpu")` measures here) against the summed alone-seconds.

Target: each layer pass's kernel sum within 15% of the measured sum (exit 1 otherwise).
Notes: in-place ops are timed on a fresh clone (the clone's time and one trivial call
subtracted: batch norm's `num_batches_tracked += 1` and llama's in-place add_ on its
(16, 32, 1) norm statistics came out at their dispatch, ~2.5 us a call, against no kernel
priced); the parameters' `.grad` is cleared before the timed step (as `planner profile`
runs each repeat: a step's first micro-batch steals its gradients, no `add_`); ops that only draw
random numbers are priced by `compute.random_draw_seconds`, outside the kernel sum, and
are shown but not summed; the backward's seeds (`ones_like`: the harness's, ~3 us at
micro-batch 16) count in neither pass.
An op of a few microseconds is mostly dispatch: less the trivial call it can come out
near zero or below, so passes whose kernels sum to tens of microseconds (micro-batch 1,
t5's bias forward) say little; read the larger ones.

    .venv/bin/python bench/bench_kernel_alone.py [--rows dlrm-small:4:tables.0,...]

Writes bench/results/kernel_alone.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_kernel_model import gemm_shapes, traced_graph  # noqa: E402
from cost_models.common import StepConfig  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402
from cost_models.kernel_time import DRAW_ONLY_OPS, kernel_call_seconds  # noqa: E402
from cost_models.profile_device import profile_device  # noqa: E402
from ir.graph_measurer import _clear_grads  # noqa: E402
from ir.kernel_recorder import NO_KERNEL_OPS  # noqa: E402
from ir.kernel_records import KernelKind  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402
from ir.strategy import Precision  # noqa: E402
from planner.fmt import table  # noqa: E402

# issue 17's rows: dlrm tables, llama's block, cnn's stem, t5's relative bias
ROWS = ("dlrm-small:1:tables.0", "dlrm-small:16:tables.0", "llama-tiny:1:blocks.0",
        "llama-tiny:4:blocks.0", "llama-tiny:16:blocks.0", "cnn-small:4:stem",
        "cnn-small:16:stem", "t5-tiny:4:encoder_rel_bias", "t5-tiny:4:decoder_rel_bias")
TARGET_ERROR = 0.15  # issue 17's per-layer bound, here on the kernel part alone
REPEATS = 15  # median of fifteen calls after two untimed
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "kernel_alone.json")


def median_call_s(call, clock) -> float:
    call(), call()
    times = []
    for _ in range(REPEATS):
        start = clock()
        call()
        times.append(clock() - start)
    return statistics.median(times)


class AloneTimer(TorchDispatchMode):
    """Runs each op, then times it alone (see the module docstring); rows of
    (phase, op name, seconds less one trivial call)."""

    def __init__(self, clock, trivial_s: float):
        super().__init__()
        self.clock, self.trivial_s = clock, trivial_s
        self.phase, self.rows = "fwd", []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.is_view or name in NO_KERNEL_OPS:
            return out
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name.endswith("_") and first is not None:  # in place: on a clone, less the clone
            # and, like every op, less one trivial call (the op's own dispatch)
            seconds = median_call_s(lambda: func(first.clone(), *args[1:], **kwargs),
                                    self.clock) - median_call_s(first.clone, self.clock) \
                - self.trivial_s
        else:
            seconds = median_call_s(lambda: func(*args, **kwargs), self.clock) - self.trivial_s
        self.rows.append((self.phase, name, seconds))
        return out


def measure_row(model: str, micro_batch: int, layer_name: str, graph, measurer, spec,
                clock, trivial_s: float) -> list[dict]:
    index = [layer.name for layer in graph.layers].index(layer_name)
    layer = graph.layers[index]
    config = StepConfig(micro_batch=micro_batch, graph_micro_batch=graph.micro_batch,
                        graph_dtype=graph.dtype, precision=Precision.FP32,
                        seq_len=graph.seq_len, device_type="cpu")
    factory = real_factory("cpu")
    state = measurer.layer_state(index, factory)
    module = measurer.layer_module(index, state)

    def step(inputs, timer=None):
        outs = measurer.module_roots(index, module(*inputs))
        if timer is not None:
            timer.phase = "seed"  # the harness's backward seeds: neither pass, not summed
        seeds = [torch.ones_like(t) for t in outs]
        if timer is not None:
            timer.phase = "bwd"
        torch.autograd.backward(outs, seeds)

    step(measurer.fresh_inputs(index, state, factory))  # warm-up
    _clear_grads(state)  # a step's first micro-batch, as `planner profile` times it
    inputs = measurer.fresh_inputs(index, state, factory)  # drawn outside the timer
    timer = AloneTimer(clock, trivial_s)
    with timer:
        step(inputs, timer)
    rows = []
    for phase, records in (("fwd", layer.kernels.forward), ("bwd", layer.kernels.backward)):
        predicted, measured = collections.Counter(), collections.Counter()
        for r in records:
            if r.kind is not KernelKind.VIEW:
                predicted[r.op.split("::")[-1]] += r.count * kernel_call_seconds(
                    r, spec, config, 1.0, phase == "bwd")
        for row_phase, name, seconds in timer.rows:
            if row_phase == phase:
                measured[name] += seconds
        summed = [n for n in set(predicted) | set(measured) if n not in DRAW_ONLY_OPS]
        pred_s, meas_s = sum(predicted[n] for n in summed), sum(measured[n] for n in summed)
        rows.append({"model": model, "layer": layer_name, "micro_batch": micro_batch,
                     "phase": phase, "predicted_s": pred_s, "measured_alone_s": meas_s,
                     "error": pred_s / meas_s - 1.0 if meas_s > 0 else float("inf"),
                     "ops": {n: {"predicted_s": predicted[n], "measured_alone_s": measured[n]}
                             for n in sorted(set(predicted) | set(measured))}})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="model:micro_batch:layer,...")
    args = parser.parse_args()
    torch.set_num_threads(1)
    wanted = [(m, int(b), name) for m, b, name in (row.split(":") for row in args.rows.split(","))]
    graphs = {(m, b): traced_graph(m, b) for m, b, _ in wanted}
    spec, _ = profile_device("cpu", extra_gemm_shapes=gemm_shapes(g for g, _ in graphs.values()))
    torch.set_num_threads(1)
    clock = probe_clock("cpu")
    one = torch.ones(1)
    trivial_s = median_call_s(lambda: torch.ops.aten.add.Tensor(one, one), clock)
    rows = []
    for model, micro_batch, layer_name in wanted:
        graph, measurer = graphs[(model, micro_batch)]
        rows.extend(measure_row(model, micro_batch, layer_name, graph, measurer, spec, clock,
                                trivial_s))
    print(table(["model", "layer", "batch", "pass", "kernels ms", "alone ms", "error",
                 "largest gaps (op: predicted/alone us)"],
                [[r["model"], r["layer"], r["micro_batch"], r["phase"],
                  f"{r['predicted_s'] * 1e3:.3f}", f"{r['measured_alone_s'] * 1e3:.3f}",
                  f"{r['error']:+.0%}", ", ".join(
                      f"{n}: {o['predicted_s'] * 1e6:.0f}/{o['measured_alone_s'] * 1e6:.0f}"
                      for n, o in sorted(r["ops"].items(), key=lambda item: -abs(
                          item[1]["predicted_s"] - item[1]["measured_alone_s"]))[:3])]
                 for r in rows]))
    missed = [r for r in rows if abs(r["error"]) > TARGET_ERROR]
    load = os.getloadavg()[0]
    print(f"\n{len(rows)} layer passes, {len(missed)} over {TARGET_ERROR:.0%}; one trivial "
          f"call {trivial_s * 1e6:.2f} us (subtracted per op); load average {load:.1f}.")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"bench": "kernel_alone", "load_average_1min": load,
                   "trivial_call_s": trivial_s, "target_error": TARGET_ERROR, "rows": rows},
                  f, indent=2)
    print(f"wrote {RESULTS}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
