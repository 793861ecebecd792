"""One rank of a trial run: memory, then time, then the losses (see `planner.trial`).

`run_rank` runs inside an initialised process group on a spawned rank
(`planner.trial.spawn`); `measure_one_process` takes the same memory reading of a
one-device plan in this process (the memory tests and `bench/bench_memory.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time

import torch
import torch.distributed as dist

from cost_models.memory_tracker import LiveTensorTracker
from ir.errors import PlannerError
from ir.plan import plan_from_dict
from planner.trial.grad_check import grad_norms
from planner.trial.records import RankMeasurement, RankPayload
from planner.trial.reference import (LEARNING_RATE, SEED, optimizer_kwargs,
                                     trial_max_grad_norm, zero_dropout)
from planner.trial.sched import ThreadSchedstat

MEMORY_STEPS = 2  # measured under the tracker, after one warm-up step
TIME_WARMUP_STEPS = 2  # untimed steps after leaving the tracker (DTensor caches fill)


def _build(payload: RankPayload, device: torch.device, without_dropout: bool):
    from executors import apply, meta_init
    from planner.models import example_batch, load_model, planned_on_meta

    doc = plan_from_dict(json.loads(payload.plan_json), payload.plan_path)
    if planned_on_meta(doc):  # built as priced: on meta, each rank materializing its shards
        inputs, _ = example_batch(payload.model, 1, payload.seq_len, seed=SEED)
        with meta_init():  # the same seed as a CPU build: the same weights
            loaded = load_model(payload.model, micro_batch=1, seq_len=payload.seq_len,
                                device="meta", seed=SEED)
        loaded = dataclasses.replace(loaded, inputs=inputs)  # the inputs a CPU build has
    else:
        loaded = load_model(payload.model, micro_batch=1, seq_len=payload.seq_len,
                            device="cpu", seed=SEED)
    if without_dropout:
        zero_dropout(loaded.module)
    return apply(loaded.module, doc.plan, payload.graph, loss_fn=loaded.loss_fn,
                 device=device, optimizer_kwargs=optimizer_kwargs(doc.plan.optimizer),
                 example_inputs=loaded.inputs, sparse_optimizer=sparse_spec(doc.plan),
                 max_grad_norm=trial_max_grad_norm(doc.plan))


def sparse_spec(plan):
    """The tables' row-sparse optimizer of a trial: the plan's kind at the trial's learning
    rate (the reference steps its tables the same way); None without sharded tables."""
    if plan.embeddings is None:
        return None
    from executors.sparse_optimizer import SparseOptimizerSpec
    return SparseOptimizerSpec(plan.embeddings.sparse_optimizer, LEARNING_RATE)


def run_rank(payload: RankPayload) -> RankMeasurement:
    """Memory, time and losses of this rank (runs inside an initialised process group)."""
    from executors import default_device

    device = default_device()
    batches = payload.batches
    warm, measured, timed = 1, payload.memory_steps, payload.steps
    losses: list[float] = []
    step_s: list[float] = []
    cuda = device.type == "cuda"

    def step(pm, k):
        inputs, target = batches[k % len(batches)]
        return pm.train_step(inputs, target)

    grads: dict[str, float] = {}
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        pm = _build(payload, device, without_dropout=False)
    tracker = LiveTensorTracker(record=bool(payload.memory_detail)) if not cuda else None
    context = tracker if tracker is not None else contextlib.nullcontext()
    with context:
        if not cuda:
            pm = _build(payload, device, without_dropout=False)
        if payload.grad_check and not payload.check_steps:  # before the peak is reset
            record_first_grads(pm, grads)
        k = 0
        for _ in range(warm):
            losses.append(step(pm, k)); k += 1
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            tracker.reset_peak()
        for _ in range(measured):
            losses.append(step(pm, k)); k += 1
    peak = torch.cuda.max_memory_allocated(device) if cuda else tracker.peak_bytes
    detail = [str(s) for s in tracker.live_at_peak(payload.memory_detail)] \
        if tracker is not None and payload.memory_detail else []
    del tracker
    for _ in range(TIME_WARMUP_STEPS):
        losses.append(step(pm, k)); k += 1
    # sharded tables: the timed steps' seconds per phase too (executors.phase_clock)
    from executors.phase_clock import PhaseClock
    clock = PhaseClock(pm) if getattr(pm, "tables", None) is not None else None
    cpu_s: list[float] = []  # per timed step, the main thread's CPU (`sched`)
    queued_s: list[float] = []  # per timed step, waiting for a core (`sched`)
    schedstat = ThreadSchedstat()  # opened once: each read then costs ~1.7 us, not ~19
    with clock if clock is not None else contextlib.nullcontext():
        for _ in range(timed):
            dist.barrier()
            start = time.perf_counter()
            before = schedstat.read()  # read inside the wall clock's span: a wait counts once
            losses.append(step(pm, k)); k += 1
            if cuda:
                torch.cuda.synchronize(device)
            after = schedstat.read()
            step_s.append(time.perf_counter() - start)
            if before is not None and after is not None:
                cpu_s.append(after[0] - before[0])
                queued_s.append(after[1] - before[1])
            if clock is not None:
                clock.step_done()
    schedstat.close()
    phases = clock.per_step(timed) if clock is not None else {}
    if clock is not None:  # the ranks' arrival skew at the dense collectives
        from executors.phase_clock import arrival_wait
        logs: list = [None] * dist.get_world_size()
        dist.all_gather_object(logs, clock.call_log)
        phases.update(arrival_wait(logs, dist.get_rank(), timed))
    check_losses: list[float] = []
    if payload.check_steps:  # the model has dropout: a dropout-free run for the losses
        del pm
        pm = _build(payload, device, without_dropout=True)
        if payload.grad_check:
            record_first_grads(pm, grads)
        check_losses = [step(pm, j) for j in range(payload.check_steps)]
    return RankMeasurement(peak_bytes=int(peak), losses=tuple(losses),
                           step_seconds=tuple(step_s),
                           check_losses=tuple(check_losses or losses),
                           peak_tensors=tuple(detail), phase_seconds=phases,
                           grad_norms=grads,
                           step_runqueue_seconds=tuple(queued_s) if len(queued_s) == timed
                           else (),
                           step_cpu_seconds=tuple(cpu_s) if len(cpu_s) == timed else ())


def record_first_grads(pm, out: dict[str, float]) -> None:
    """Fill `out` with the gradient norms (`grad_check.grad_norms`) the first optimizer
    step of `pm` is given (after backward, the tied copies summed, clipped), then unwrap.
    A ZeRO-1 step reads its 16-bit gradients times its `grad_multiplier` (the clip's
    coefficient, fp16's unscale): those norms are taken times it, as the reference's
    after `clip_grad_norm_`."""
    from executors.optimizer import multiplied_params

    step = pm.optimizer.step
    multiplied = multiplied_params(pm.optimizer)

    def first_step(*args, **kwargs):
        out.update(grad_norms([m for _, m in pm.stage_modules], multiplied=multiplied,
                              multiplier=kwargs.get("grad_multiplier", 1.0)))
        pm.optimizer.step = step
        return step(*args, **kwargs)

    pm.optimizer.step = first_step


def measure_one_process(spec: str, plan, graph, *, steps: int = 1 + MEMORY_STEPS,
                        seed: int = SEED) -> LiveTensorTracker:
    """Peak live tensor bytes of a one-device `plan` run by the executor in this process
    (a one-rank gloo group is made when none exists): the model is built and applied
    inside the tracker, the first step allocates the optimizer states, the peak is taken
    over the steps after it. `peak_by_phase` tells forward, backward and optimizer
    apart (module hooks mark the model's forward; the optimizer step is wrapped)."""
    from executors import apply, init_distributed
    from planner.models import load_model

    if plan.world_size != 1:
        raise PlannerError(f"measure_one_process runs one device; the plan needs "
                           f"{plan.world_size}: use validate_plan")
    owned = not dist.is_initialized()
    if owned:
        init_distributed("gloo")
    try:
        with LiveTensorTracker() as mem:
            loaded = load_model(spec, micro_batch=plan.global_batch, seq_len=graph.seq_len,
                                device="cpu", seed=seed)
            pm = apply(loaded.module, plan, graph, loss_fn=loaded.loss_fn,
                       device=torch.device("cpu"), example_inputs=loaded.inputs,
                       max_grad_norm=trial_max_grad_norm(plan))
            pm.module.register_forward_pre_hook(lambda *_: mem.set_phase("forward"))
            pm.module.register_forward_hook(lambda *_: mem.set_phase("backward"))
            step = pm.optimizer.step

            def optimizer_step(*args, **kwargs):
                mem.set_phase("optimizer")
                return step(*args, **kwargs)

            pm.optimizer.step = optimizer_step
            for k in range(steps):
                if k == 1:
                    mem.reset_peak()
                pm.train_step(loaded.inputs, loaded.target)
            mem.set_phase(None)
        return mem
    finally:
        if owned:
            dist.destroy_process_group()
