"""One-process step split by term against the estimate's own terms (issue 17: cnn-1rank
predicted 38% under its measured step while mlp-1rank was +2%).

A one-rank plan (`planner plan --cluster spec.json`, e.g. bench_validate's `--work-dir`
plans) is built by the executor as `planner validate` builds it and stepped in this
process; the main thread's CPU (time.thread_time: it moves far less with load than wall
time) is split by hooks into each layer's forward (module hooks), the loss, the
backward call, the optimizer step, zero_grad and the rest of `train_step` (the loop).
Beside each, the estimate's figure for the same term (`estimate.stage_time`'s parts,
divided by the spec's core share as CPU time). Hooks cost a few microseconds each;
they land in the forward rows. The step's wall time and its wait for a core
(`planner.trial.sched`) show what load adds; the kit's optimizer probe, read every
PROBE_EVERY steps in the same process, against the spec's figure shows how far the
machine's speed moved since the spec was profiled (a term's CPU moves with it). A
checkpointed plan's backward is split further: the recompute's rerun forward (each
checkpointed layer's forward function called again inside the backward) against the
estimate's whole recompute (which also holds the per-call start and the unpack hooks).

Read on 2026-11-26 at load 10-16 on 2 cores (spec profiled at load ~10, 06:41): gpt-1rank
predicted 26.2 ms against 17.1-17.8 ms of CPU, a wall of 55 ms of which 36-38 ms waiting
for a core; cnn-1rank 7.0 against 4.5-8.8 ms of CPU (three moments), wall 4.6-24.6 ms;
the optimizer probe read 30-40 us per tensor where the spec holds 55.

Read again 10:33-10:36 on a spec profiled at 10:30 (bench_validate --work-dir, load 6-8,
run-queue delay under 0.2 ms, medians of 40-60 steps): step CPU against the estimate
gpt-1rank -7..+25%, cnn-1rank +13..+26%, mlp-1rank -10..+9%. By term: the forward sum
within 0..+29% (each model's first layer 16-54% under, the later ones 10-60% over), the
backward +8..+42% (gpt) and +47..+60% (cnn) over, the optimizer step + zero_grad + entry
within 10%, and the loop (rest of `train_step`) 0.25/0.31 ms for mlp/cnn as priced but
0.66-1.17 ms for gpt where 0.24 is priced: its walk over 68 parameter tensors
(`reduce_partial_grads`, 2.5 us each: 0.17 ms, priced since by `step_host.param_walk_s`),
the tied sync (0.06-0.08 ms) and the loss's and batch's ops run colder. At load 14 the
same cnn step read 5.9 ms of CPU against 2.6-2.9 at load 7: a step's CPU moves with the
load (cores shared with siblings), every term together, as the optimizer probe's ratio
shows; no term alone holds a uniform -27%.

    .venv/bin/python bench/bench_step_terms.py PLAN.json --spec SPEC.json [--steps 40]
        [--backward-hooks]

Prints a table; informative, not judged.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from one_rank import one_rank_payload, start_one_rank_group  # noqa: E402
from planner.fmt import table  # noqa: E402

WARMUP_STEPS = 5
PROBE_EVERY = 5  # steps between readings of the kit's optimizer probe
# the loop's parts timed apart (`measure`); the weighted loss holds the loss function
LOOP_PARTS = ("forward_backward", "loss function", "weighted loss", "local batch",
              "count target", "loss all-reduce start", "tied sync", "set_gradient_sync",
              "reduce_partial_grads", "split_microbatches")


def _runqueue_s() -> float:
    """Seconds the calling thread waited for a core so far (`planner.trial.sched`)."""
    from planner.trial.sched import thread_schedstat

    reading = thread_schedstat()
    if reading is None:
        sys.exit("bench_step_terms: this kernel gives no per-thread schedstat "
                 "(/proc/self/task/<tid>/schedstat): run it on Linux with schedstats on")
    return reading[1]


def _optimizer_probe(optimizer: str):
    """The kit's optimizer-step probe (`step_probes.optimizer_step_cpu_s` on
    OPTIMIZER_PROBE_TENSORS plain tensors), read now: seconds per tensor."""
    from cost_models.step_probes import (OPTIMIZER_PROBE_SHAPE, OPTIMIZER_PROBE_TENSORS,
                                         optimizer_step_cpu_s)
    from ir.plan import OPTIMIZERS

    cls, kwargs = OPTIMIZERS[optimizer]
    params = [torch.nn.Parameter(torch.randn(OPTIMIZER_PROBE_SHAPE))
              for _ in range(OPTIMIZER_PROBE_TENSORS)]
    opt = cls(params, **kwargs)
    return lambda: optimizer_step_cpu_s(opt, params) / OPTIMIZER_PROBE_TENSORS


def predicted_terms(doc, graph, spec) -> dict[str, float]:
    """The estimate's terms of rank 0's one stage, seconds per step (m micro-batches)."""
    from cost_models.common import model_layer_configs
    from cost_models.estimate import estimate
    from cost_models.step_host import placed_compute, placed_layers

    plan = doc.plan
    configs = model_layer_configs(graph, plan, spec.device, None)
    est = estimate(graph, plan, spec, configs=configs)
    st, m = est.stage_times[0], plan.num_microbatches
    layers = placed_layers(graph, plan, spec)
    out: dict[str, float] = {}
    fwd_layers = bwd_layers = opt_layers = recompute = 0.0
    for j, layer in enumerate(graph.layers):
        c = placed_compute(layers[j], plan.layer_strategies[j], spec, configs[j])
        out[f"fwd {layer.name or '<root>'}"] = m * c.forward_s
        fwd_layers += m * c.forward_s
        out[f"bwd {layer.name or '<root>'}"] = m * (c.backward_s + c.recompute_s)
        bwd_layers += m * (c.backward_s + c.recompute_s)
        recompute += m * c.recompute_s
        opt_layers += c.optimizer_s
    out["forward (layers)"] = fwd_layers
    out["backward (layers)"] = bwd_layers
    out["recompute (layers)"] = recompute
    out["backward (engine, accumulation)"] = m * st.compute_backward_s - bwd_layers
    out["optimizer (layers)"] = opt_layers
    out["loop + optimizer entry"] = st.loop_s
    out["step"] = est.iteration_seconds
    out["optimizer probe per tensor"] = spec.calibration.optimizer_seconds_per_tensor(
        plan.optimizer, False) or 0.0
    share = spec.host_share if spec.host_bound else 1.0
    return {k: v / share for k, v in out.items()}


def _time_recomputes(clock, add) -> None:
    """Time each checkpointed layer's recompute: its forward function's second call, made
    inside the backward by `torch.utils.checkpoint` (`executors.checkpointing.apply_ac`
    looks `checkpoint` up at call time, so wrapping it here reaches every layer). The
    reading holds the rerun ops, their autograd nodes and the recompute's pack hooks (the
    early stop's exception included), not the per-call start (`fork_rng`, the frame). Call
    with (None, None) to undo."""
    import executors.checkpointing as ac

    if clock is None:
        ac.checkpoint = getattr(ac.checkpoint, "plain", ac.checkpoint)
        return
    plain = ac.checkpoint

    def checkpoint(fn, *args, **kwargs):
        calls = [0]

        def counted(*a, **k):
            calls[0] += 1
            if calls[0] == 1:  # the forward
                return fn(*a, **k)
            start = clock()
            try:
                return fn(*a, **k)
            finally:
                add("recompute (rerun forward)", clock() - start)
        return plain(counted, *args, **kwargs)
    checkpoint.plain = plain
    ac.checkpoint = checkpoint


def measure(doc, plan_path: str, graph, steps: int,
            backward_hooks: bool = False) -> dict[str, float]:
    """Median CPU seconds per step of each term on the real executor."""
    from planner.trial.rank import _build

    start_one_rank_group()
    payload = one_rank_payload(doc, plan_path, graph, steps)
    pm = _build(payload, torch.device("cpu"), without_dropout=False)
    acc: dict[str, float] = {}
    probes: list[float] = []
    clock = time.thread_time

    def add(key: str, seconds: float) -> None:
        acc[key] = acc.get(key, 0.0) + seconds

    def timed(owner, attr: str, key: str):
        inner = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            start = clock()
            try:
                return inner(*args, **kwargs)
            finally:
                add(key, clock() - start)
        setattr(owner, attr, wrapper)

    modules = dict(pm.module.named_modules())
    starts: dict[str, float] = {}
    for layer in graph.layers:
        if layer.name not in modules or not layer.name:
            continue
        key = f"fwd {layer.name}"
        modules[layer.name].register_forward_pre_hook(
            lambda *_, k=key: starts.__setitem__(k, clock()))
        modules[layer.name].register_forward_hook(
            lambda *_, k=key: add(k, clock() - starts[k]))
        if backward_hooks:  # --backward-hooks: each layer's
            back = f"bwd {layer.name}"  # backward, gradient hooks' wrappers included
            modules[layer.name].register_full_backward_pre_hook(
                lambda *_, k=back: starts.__setitem__(k, clock()))
            modules[layer.name].register_full_backward_hook(
                lambda *_, k=back: add(k, clock() - starts[k]))
    plain_backward = torch.Tensor.backward
    timed(torch.Tensor, "backward", "backward call")
    _time_recomputes(clock, add)
    timed(pm.optimizer, "step", "optimizer step")
    timed(pm.optimizer, "zero_grad", "zero_grad")
    # the loop's own parts (`executors.runtime`): the loss function inside the weighted
    # loss, the batch's split and count, the loss's all-reduce start, the tied sync
    timed(pm, "loss_fn", "loss function")
    timed(pm, "_weighted_loss", "weighted loss")
    timed(pm, "local_batch", "local batch")
    timed(pm, "_count_global", "count target")
    timed(pm, "_start_loss_sum", "loss all-reduce start")
    timed(pm.tied, "sync", "tied sync")
    timed(pm, "_forward_backward", "forward_backward")
    import executors.runtime as runtime
    saved = {name: getattr(runtime, name) for name in ("set_gradient_sync",
                                                         "reduce_partial_grads",
                                                         "split_microbatches")}
    for name in saved:
        timed(runtime, name, name)
    root = pm.module
    root.register_forward_pre_hook(lambda *_: starts.__setitem__("forward (model)", clock()))
    root.register_forward_hook(lambda *_: add("forward (model)", clock() - starts["forward (model)"]))
    batches = payload.batches
    per_step: list[dict[str, float]] = []
    probe = _optimizer_probe(doc.plan.optimizer)
    try:
        for k in range(WARMUP_STEPS + steps):
            if k >= WARMUP_STEPS and k % PROBE_EVERY == 0:  # the kit's probe, interleaved
                probes.append(probe())
            acc.clear()
            start, wall, queued = clock(), time.perf_counter(), _runqueue_s()
            pm.train_step(*batches[k % len(batches)])
            acc["step"] = clock() - start
            acc["step wall"] = time.perf_counter() - wall
            acc["step run-queue delay"] = _runqueue_s() - queued
            if k >= WARMUP_STEPS:
                per_step.append(dict(acc))
    finally:
        torch.Tensor.backward = plain_backward
        _time_recomputes(None, None)
        for name, fn in saved.items():
            setattr(runtime, name, fn)
        dist.destroy_process_group()
    keys = per_step[0].keys()
    out = {k: statistics.median(s.get(k, 0.0) for s in per_step) for k in keys}
    out["optimizer probe per tensor"] = statistics.median(probes)
    out["loop (rest of train_step)"] = out["step"] - sum(
        out.get(k, 0.0) for k in ("forward (model)", "backward call", "optimizer step",
                                  "zero_grad"))
    return out


def main(argv: list[str] | None = None) -> int:
    from ir.cluster import ClusterSpec
    from ir.plan import load_plan
    from planner.trial.predict import plan_graph

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--backward-hooks", action="store_true",
                        help="time each layer's backward too (full backward hooks: their "
                             "wrappers add autograd nodes, so the step's figures move)")
    args = parser.parse_args(argv)
    doc = load_plan(args.plan)
    if doc.plan.world_size != 1:
        parser.error("one-rank plans only (bench_dp_phases splits data-parallel steps)")
    spec = ClusterSpec.load(args.spec)
    graph = plan_graph(doc, args.plan, None)
    pred = predicted_terms(doc, graph, spec)
    share = spec.host_share if spec.host_bound else 1.0
    meas = measure(doc, args.plan, graph, args.steps, args.backward_hooks)
    rows = []
    pairs = [(k, pred.get(k), meas.get(k)) for k in pred if k.startswith("fwd ")]
    if args.backward_hooks:  # a first layer fed by the data fires no backward hook
        pairs += [(k, pred.get(k), meas.get(k)) for k in pred if k.startswith("bwd ")]
    pairs += [("forward (layers / model)", pred["forward (layers)"], meas.get("forward (model)")),
              ("backward (layers + engine, accumulation)",
               pred["backward (layers)"] + pred["backward (engine, accumulation)"],
               meas.get("backward call")),
              ("  of which recompute (pred: whole; meas: rerun forward only)",
               pred["recompute (layers)"], meas.get("recompute (rerun forward)", 0.0)),
              ("  backward less recompute", pred["backward (layers)"]
               + pred["backward (engine, accumulation)"] - pred["recompute (layers)"],
               meas["backward call"] - meas.get("recompute (rerun forward)", 0.0)),
              ("optimizer step", pred["optimizer (layers)"], meas.get("optimizer step")),
              ("zero_grad", None, meas.get("zero_grad")),
              *((f"  loop: {k}", None, meas.get(k)) for k in LOOP_PARTS),
              ("loop + optimizer entry", pred["loop + optimizer entry"],
               meas.get("loop (rest of train_step)")),
              ("optimizer probe per tensor (spec / now)",
               pred["optimizer probe per tensor"] * share, meas["optimizer probe per tensor"]),
              ("step", pred["step"], meas["step"]),
              ("step wall", pred["step"], meas["step wall"]),
              ("step run-queue delay", None, meas["step run-queue delay"])]
    for name, p, m in pairs:
        rows.append([name, "" if p is None else f"{1e3 * p:.3f}",
                     "" if m is None else f"{1e3 * m:.3f}",
                     f"{100 * (p / m - 1):+.0f}%" if p is not None and m else ""])
    print(f"{args.plan}: CPU ms per step (thread_time, median of {args.steps}) against the "
          "estimate's terms / core share")
    print(table(["term", "pred ms", "meas CPU ms", "error"], rows, right={1, 2, 3}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
