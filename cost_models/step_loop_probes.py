"""Host seconds a training step pays once, outside its layers and the optimizer's
per-tensor work (`cost_models.step_host.step_loop_s`); one thread, the probe clock.

  loss_sum_host_s         every step each rank starts one asynchronous all-reduce of its
                          scalar loss and waits on it after the optimizer step
                          (`executors.runtime.ProcessModel._start_loss_sum`,
                          `train_step`): `dist.all_reduce(scalar, async_op=True).wait()`
                          on a world-1 gloo group (made where none exists, as
                          `pipeline_probes`). The transfer between processes is not in it
                          (one float, overlapping the last backward).
  optimizer_entry_host_s  the optimizer step runs once a step, right after a backward:
                          its Python and its state start out of the caches, which the
                          per-tensor probe (`step_probes`, steps back to back) runs warm.
                          torch's AdamW over OPTIMIZER_ENTRY_TENSORS small tensors, step +
                          zero_grad, timed right after a step layer's forward and backward
                          (`cold_entry_probes.neighbour_block`) less right after itself.
  grad_accumulate_host_s  per parameter tensor, what a backward pays more when its .grad
                          exists (a step's micro-batches 2..m: AccumulateGrad adds into
                          it) than when it is None (the first: it steals the tensor, as
                          every backward figure of the kit and `planner profile` runs):
                          a chain of GRAD_ACCUMULATE_TENSORS small Linear weights' backward
                          both ways, interleaved, the medians' difference per tensor (the
                          adds' kernels, 1 KiB each, are ~0 of it; `step_host` prices the
                          bytes apart).

Read here (stephost, 2026-11-25 13:20-13:31 UTC, load 4-7): a real mlp-1rank step in one
process, thread CPU, spent 53-103 us in the loss's all-reduce call (this probe: 7.5 us
warm) and 0.37-0.41 ms in AdamW's step over 10 tensors that took 0.26-0.28 ms back to
back (cnn-small +0.31 ms, gpt-tiny +0.44); the entry probe read 118-126 us at 4 tensors,
159-178 us at 32 (~1.8 us a tensor more, not priced).

The accumulation probe read 0.2-1.5 us a tensor (gradaccum, 2026-11-25 14:28-14:36 UTC,
load 1.6-2.9; medians 0.45-1.1 over 5 calls), live 0.3-1.5 us (bench/bench_grad_accum.py).

    seconds = loss_sum_host_s("cpu")          # ~8e-06 here   # doctest: +SKIP
    seconds = optimizer_entry_host_s("cpu")   # ~1.2e-04 here # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import statistics
from datetime import timedelta

from ir.errors import PlannerError

LOSS_SUM_PROBE_CALLS = 200  # after LOSS_SUM_PROBE_WARMUP untimed; the median (~20 ms in all)
LOSS_SUM_PROBE_WARMUP = 10
# Optimizer entry: few tensors, so the entry is not lost in the per-tensor work; rounds
# alternate cold and warm (the medians' difference), ~0.1 s in all here.
OPTIMIZER_ENTRY_TENSORS = 4
OPTIMIZER_ENTRY_SHAPE = (16, 16)
OPTIMIZER_ENTRY_ROUNDS = 60  # after OPTIMIZER_ENTRY_WARMUP untimed
OPTIMIZER_ENTRY_WARMUP = 5
# Accumulation: many tensors so the per-tensor difference stands out of the backward's
# noise; 16x16 fp32 weights (1 KiB: the add's kernel ~0); ~0.1 s in all here.
GRAD_ACCUMULATE_TENSORS = 32
GRAD_ACCUMULATE_WIDTH = 16
GRAD_ACCUMULATE_ROUNDS = 100  # after GRAD_ACCUMULATE_WARMUP untimed
GRAD_ACCUMULATE_WARMUP = 5


def loss_sum_host_s(device: str = "cpu") -> float:
    """Median host seconds of one scalar all-reduce started asynchronously and waited on
    (module docstring), on the probe clock; a PlannerError inside a multi-rank group."""
    import torch
    import torch.distributed as dist

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    with one_process_group("the loss all-reduce probe"), _one_thread():
        value = torch.zeros((), device=device)
        clock = probe_clock(device)
        times = []
        for call in range(LOSS_SUM_PROBE_WARMUP + LOSS_SUM_PROBE_CALLS):
            start = clock()
            dist.all_reduce(value, async_op=True).wait()
            if call >= LOSS_SUM_PROBE_WARMUP:
                times.append(clock() - start)
        return statistics.median(times)


@contextlib.contextmanager
def one_process_group(probe: str):
    """A world-1 gloo group for `probe` (made and destroyed here when none exists); a
    PlannerError inside a multi-rank group."""
    import torch.distributed as dist

    from ir.launch import free_port

    made = not dist.is_initialized()
    if not made and dist.get_world_size() != 1:
        raise PlannerError(f"{probe} runs on one process; call it outside a multi-rank "
                           f"process group")
    if made:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=120))
    try:
        yield
    finally:
        if made:
            dist.destroy_process_group()


def optimizer_entry_host_s(device: str = "cpu") -> float:
    """Host seconds AdamW's step + zero_grad costs more right after a step layer's
    forward and backward than right after itself (module docstring), >= 0."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.cold_entry_probes import ENTRY_TOKENS, ENTRY_WIDTH, neighbour_block
    from cost_models.host_probes import probe_clock

    with _one_thread():
        block = neighbour_block().to(device)
        x = torch.randn(1, ENTRY_TOKENS, ENTRY_WIDTH, device=device)
        params = [torch.nn.Parameter(torch.randn(OPTIMIZER_ENTRY_SHAPE, device=device))
                  for _ in range(OPTIMIZER_ENTRY_TENSORS)]
        optimizer = torch.optim.AdamW(params)
        clock = probe_clock(device)
        times: dict[bool, list[float]] = {False: [], True: []}

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        def fill_grads() -> None:
            for p in params:
                p.grad = torch.ones_like(p)

        for rnd in range(OPTIMIZER_ENTRY_WARMUP + OPTIMIZER_ENTRY_ROUNDS):
            for cold in ((True, False) if rnd % 2 else (False, True)):
                fill_grads()
                if cold:  # a step's backward runs right before its optimizer
                    block(x).sum().backward()
                    block.zero_grad(set_to_none=True)
                else:
                    step()
                    fill_grads()
                start = clock()
                step()
                if rnd >= OPTIMIZER_ENTRY_WARMUP:
                    times[cold].append(clock() - start)
        return max(0.0, statistics.median(times[True]) - statistics.median(times[False]))


def grad_accumulate_host_s(device: str = "cpu") -> float:
    """Host seconds per parameter tensor a backward pays more with its gradients existing
    than None (module docstring), >= 0."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    with _one_thread():
        weights = [torch.nn.Parameter(torch.randn(GRAD_ACCUMULATE_WIDTH, GRAD_ACCUMULATE_WIDTH,
                                                  device=device) / GRAD_ACCUMULATE_WIDTH)
                   for _ in range(GRAD_ACCUMULATE_TENSORS)]
        x = torch.randn(1, GRAD_ACCUMULATE_WIDTH, device=device)
        clock = probe_clock(device)
        times: dict[bool, list[float]] = {False: [], True: []}
        for rnd in range(GRAD_ACCUMULATE_WARMUP + GRAD_ACCUMULATE_ROUNDS):
            for accumulate in ((True, False) if rnd % 2 else (False, True)):
                y = x
                for w in weights:
                    y = torch.nn.functional.linear(y, w)
                loss = y.sum()
                for w in weights:  # accumulate: a gradient to add into; else none
                    w.grad = torch.zeros_like(w) if accumulate else None
                start = clock()
                loss.backward()
                if rnd >= GRAD_ACCUMULATE_WARMUP:
                    times[accumulate].append(clock() - start)
        extra_s = statistics.median(times[True]) - statistics.median(times[False])
        return max(0.0, extra_s / GRAD_ACCUMULATE_TENSORS)


def step_loop_fields(device: str = "cpu") -> dict[str, float]:
    """The figures as `KernelCalibration` fields (profile-device and profile-cluster;
    `train_loop_host_s` runs the executor, so `planner.train_loop_probe` adds it)."""
    return {"loss_sum_host_s": loss_sum_host_s(device),
            "optimizer_entry_host_s": optimizer_entry_host_s(device),
            "grad_accumulate_host_s": grad_accumulate_host_s(device)}
