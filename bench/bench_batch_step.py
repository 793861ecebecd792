"""What a small layer runs, op by op, at micro-batch 1 against 4 (issue 17: rows whose
measured time steps up from b1 to b4 while the prediction stays flat).

Each layer is timed as `planner profile` times it (`layer_profile.time_layer`'s loop: the
step neighbours' work untimed before each pass, fresh inputs, the backward in ONE engine
call with the neighbours' roots), with a dispatch mode in the timed passes stamping each
ATen op (this thread's clock after the call before it returned, when it is entered, when
it returns). Per op name of the pass, summed over its calls: the median seconds inside
the op and in the Python/engine gap before it, at each micro-batch; beside them what the
kernel model charges its records (`kernel_time.kernel_call_seconds` plus the kit's
per-op host figure of its kind, view or not, and its per-call excess; the pass's
autograd-node, module-call and cold terms are not per op and are left out). The stamps
cost a few us per op (every op and gap reads high by about that; more for an op with
list arguments, which the mode converts: new_empty_strided ~9 us a call under it, 2.8 in
a tight loop): read the columns' DIFFERENCES between micro-batches, not their levels.
Ops that run at one micro-batch only show 0 at the other.

Read here (2026-11-26 16:45-16:50 UTC, one thread, thread clock, load 3-7; the spec of
/work/notes/km_s27.json), the step b1 -> b4 in us, op + gap:
  mlp-small head forward +3.7 (addmm +1.6, _log_softmax +0.9+0.9); backward +5.2 (the
    input-gradient mm, m = batch +1.3+0.3, the bias-gradient sum +0.4+0.7, ~0.2 each
    other op); the profile's own step there (time_layer, min of 6 rounds of 9): forward
    22.6 -> 30.4, backward 26.4 -> 33.5. The model charges each op the same at both.
  dlrm-small top_mlp forward +19 (the three addmms +4.9, +1.5, +1.0; BCE +2.6; stack
    +2.2; index +1.1); backward: at b4 four `new_empty_strided` + `copy_` pairs that b1
    runs as four `detach`es: AccumulateGrad's layout clones of the layer's input leaves,
    whose gradients (select views of the stack's (b, 5, 16) gradient) are not dense at
    b > 1. A whole dlrm-small step (meta-free, CPU, dispatch-mode count) runs none at b1
    or b4: its inputs are the bottom MLP's and the tables' outputs, not leaves; the
    records (`ir.graph_measurer`) and the profile both make them leaves, so both carry
    the clones; the host model priced their `new_empty_strided` as a view until
    `KernelRecord.host_view` (an allocation dispatches as an op, with its excess).
Warm tight loops (min of 5, thread clock) move far less than in sequence: addmm
(4,64,26) 4.68 us against (1,64,26) 4.18, mm 1.90 against 1.73 (MKL runs m = 1 as a
matrix-vector product); a bias-gradient sum 1.39 against 1.34; an allocation
`new_empty_strided` 3.04 against a `detach` 0.98 and an add 1.59.

    .venv/bin/python bench/bench_batch_step.py --spec RESULT_JSON \
        [--layers mlp-small:head,dlrm-small:top_mlp] [--batches 1,4] [--rounds 2]

RESULT_JSON: a bench_kernel_model.py result (its whole spec is read). Writes
bench/results/batch_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_kernel_model import traced_graph  # noqa: E402
from cost_models.common import StepConfig  # noqa: E402
from cost_models.kernel_time import kernel_call_seconds  # noqa: E402
from cost_models.layer_profile import StepNeighbours  # noqa: E402
from ir.cluster import ClusterSpec  # noqa: E402
from ir.graph_measurer import _clear_grads  # noqa: E402
from ir.stand_in import real_factory  # noqa: E402
from ir.strategy import Precision  # noqa: E402
from planner.fmt import table  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "batch_step.json")
DEFAULT_LAYERS = "mlp-small:head,mlp-small:blocks.0,dlrm-small:top_mlp,llama-tiny:norm"
WARMUP, REPEATS = 5, 25  # passes per round: the first untimed, as the profile's warm-up


class Stamps(TorchDispatchMode):
    """(op name, seconds in the gap before it, seconds inside it) per ATen call."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.rows, self.last = clock, [], None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = self.clock()
        out = func(*args, **(kwargs or {}))
        end = self.clock()
        self.rows.append((func._schema.name, start - (self.last or start), end - start))
        self.last = self.clock()
        return out


def stamped_passes(model: str, layer_name: str, micro_batch: int, clock) -> dict:
    """Per pass ("fwd", "bwd"), per op name: (median gap s, median op s) summed over its
    calls, over REPEATS passes run as `layer_profile.time_layer` runs them."""
    graph, measurer = traced_graph(model, micro_batch)
    index = next(i for i, layer in enumerate(graph.layers) if layer.name == layer_name)
    factory = real_factory("cpu")
    state = measurer.layer_state(index, factory)
    module = measurer.layer_module(index, state)
    neighbours = StepNeighbours(measurer, index, factory, graph.layers, "cpu")
    passes = {"fwd": [], "bwd": []}
    for rep in range(WARMUP + REPEATS):
        _clear_grads(state)
        neighbours.before_forward()
        inputs = measurer.fresh_inputs(index, state, factory)
        forward = Stamps(clock)
        with forward:
            returned = module(*inputs)
        roots = neighbours.before_backward() + measurer.module_roots(index, returned)
        seeds = [torch.ones_like(t) for t in roots]
        backward = Stamps(clock)
        with backward:
            torch.autograd.backward(roots, seeds)
        neighbours.after_backward()
        if rep >= WARMUP:
            passes["fwd"].append(forward.rows)
            passes["bwd"].append(backward.rows)
    out = {}
    for phase, runs in passes.items():
        sums = {}
        for rows in runs:
            per_run = {}
            for name, gap_s, op_s in rows:
                gap, op = per_run.get(name, (0.0, 0.0))
                per_run[name] = (gap + gap_s, op + op_s)
            for name, pair in per_run.items():
                sums.setdefault(name, []).append(pair)
        out[phase] = {name: (statistics.median(p[0] for p in pairs),
                             statistics.median(p[1] for p in pairs))
                      for name, pairs in sums.items()}
    return out


def charged(model: str, layer_name: str, micro_batch: int, spec: ClusterSpec) -> dict:
    """Per pass, per op name: seconds the kernel model charges its records per op (the
    kernel, the kit's per-op host figure of its kind, its per-call excess)."""
    graph, _ = traced_graph(model, micro_batch)
    layer = next(layer for layer in graph.layers if layer.name == layer_name)
    config = StepConfig(micro_batch=micro_batch, graph_micro_batch=graph.micro_batch,
                        graph_dtype=graph.dtype, precision=Precision.FP32,
                        seq_len=graph.seq_len, device_type="cpu")
    cal = spec.kernel_calibration
    out = {}
    for phase, records, backward in (("fwd", layer.kernels.forward, False),
                                     ("bwd", layer.kernels.backward, True)):
        view_s = cal.backward_view_host_op_s if backward else cal.view_host_op_s
        op_s = cal.backward_nonview_host_op_s if backward else cal.forward_host_op_s
        per_op = out.setdefault(phase, {})
        for r in records:
            host_s = view_s if r.host_view else op_s + cal.host_excess_s(
                r.excess_key)
            seconds = r.count * (kernel_call_seconds(r, spec, config, 1.0, backward) + host_s)
            per_op[r.op] = per_op.get(r.op, 0.0) + seconds
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, metavar="RESULT_JSON",
                        help="a bench_kernel_model.py result: its whole spec is read")
    parser.add_argument("--layers", default=DEFAULT_LAYERS, help="MODEL:LAYER,...")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds over every layer and micro-batch, interleaved; the "
                             "per-op figure is the least over rounds")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the profile's rows
    with open(args.spec) as f:
        spec = ClusterSpec.from_dict(json.load(f)["spec_full"], args.spec)
    layers = [tuple(item.split(":", 1)) for item in args.layers.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    measured = {}
    for _ in range(args.rounds):  # interleaved: a slow spell hits every micro-batch
        for model, name in layers:
            for mb in batches:
                for phase, ops in stamped_passes(model, name, mb, time.thread_time).items():
                    for op, (gap_s, op_s) in ops.items():
                        key = (model, name, phase, op, mb)
                        old = measured.get(key, (float("inf"), float("inf")))
                        measured[key] = (min(old[0], gap_s), min(old[1], op_s))
    rows = []
    for model, name in layers:
        prices = {mb: charged(model, name, mb, spec) for mb in batches}
        for phase in ("fwd", "bwd"):
            ops = dict.fromkeys(key[3] for key in measured
                                if key[:3] == (model, name, phase))
            ops.update(dict.fromkeys(op for mb in batches for op in prices[mb][phase]))
            for op in ops:
                row = {"model": model, "layer": name, "phase": phase, "op": op}
                for mb in batches:
                    gap_s, op_s = measured.get((model, name, phase, op, mb), (0.0, 0.0))
                    row[f"b{mb}"] = {"gap_s": gap_s, "op_s": op_s,
                                     "charged_s": prices[mb][phase].get(op, 0.0)}
                rows.append(row)
    us = lambda s: f"{s * 1e6:.1f}"  # noqa: E731
    headers = ["model", "layer", "pass", "op"] + [
        f"b{mb} {col}" for mb in batches for col in ("op us", "gap us", "charged us")]
    print(table(headers, [[r["model"], r["layer"], r["phase"], r["op"].split("::")[-1]]
                          + [us(r[f"b{mb}"][col]) for mb in batches
                             for col in ("op_s", "gap_s", "charged_s")] for r in rows]))
    load = os.getloadavg()[0]
    print(f"\nStamped (each op and gap reads high by the mode's cost): compare columns across "
          f"micro-batches. Load average {load:.1f}.")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump({"bench": "batch_step", "spec": args.spec, "load_average_1min": load,
                   "batches": batches, "rows": rows}, f, indent=2)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
