"""torch.distributed.pipelining's own host seconds per action (one forward or backward of
one stage on one micro-batch), beyond the stage's layers and its engine call: the
schedule's bookkeeping, the stage's input and output handling (pytree flattening, the
p2p op lists, `_make_grads`), on CPU processes a share of every pipelined step that no
layer's time holds (bench/bench_engine_calls.py: ~30 us an action here, 2026-11-25).

The probe runs a chain of PIPELINE_PROBE_LAYERS small blocks as two stages on this one
process (ScheduleInterleaved1F1B over a world-1 gloo group: no p2p leaves the process)
and as the plain loop over the same blocks (one `loss.backward()` per micro-batch), in
alternation on the probe clock, and takes

    per action = (pipelined - plain - m x engine start) / (4 m)

(two stages x m micro-batches x forward and backward; the pipelined step makes m more
engine calls, priced apart: `cost_models.step_host`). The p2p's own host work between
processes is not in it (the collective fits price a transfer). The figure holds the
second stage's input gradient: torch makes a non-first stage's input a leaf
(`PipelineStage.set_local_fwd_input`, `requires_grad_`) and `stage_backward` reads its
`.grad`, so each of that stage's m backwards ends in an AccumulateGrad, a quarter of one
per action (`PIPELINE_PROBE_INPUT_ACCUMULATIONS_PER_ACTION`), which `cost_models.step_host`
takes off and prices per stage instead (`input_accumulations`).

    seconds = pipeline_action_host_s("cpu")   # ~3e-05  # doctest: +SKIP
"""

from __future__ import annotations

import os
import statistics
import sys
from datetime import timedelta

from ir.errors import PlannerError

# Blocks (Linear + ReLU) of the probe chain, width and micro-batches: small, so the
# runtime's host work is not lost in the noise of the layers' own.
PIPELINE_PROBE_LAYERS = 4
PIPELINE_PROBE_STAGES = 2  # the chain's halves
# The input accumulations among the probe's actions: every stage's but the first's, once
# per backward, over a forward and a backward action per stage and micro-batch:
# (stages - 1) m / (2 stages m) = 1/4 (tests/test_step_host_input_grad.py counts torch's
# own order).
PIPELINE_PROBE_INPUT_ACCUMULATIONS_PER_ACTION = (PIPELINE_PROBE_STAGES - 1) / (
    2 * PIPELINE_PROBE_STAGES)
PIPELINE_PROBE_WIDTH = 32
PIPELINE_PROBE_MICROBATCHES = 8
# Alternating rounds, after PIPELINE_PROBE_WARMUP untimed: the median of each run. One
# round took ~3 ms here (one thread, 2026-11-25): ~0.5 s in all.
PIPELINE_PROBE_ROUNDS = 150
PIPELINE_PROBE_WARMUP = 5
# Whole probe runs tried before giving up: a busy spell can leave the pipelined step no
# slower than the plain loop and its engine calls (a reviewer's scenario: a load spike
# while the engine start was measured); a kit then records 0 (not priced) and says so.
PIPELINE_PROBE_ATTEMPTS = 3


def pipeline_action_host_s(device: str = "cpu") -> float:
    """Host seconds torch's pipelining runtime adds per stage action (module docstring),
    on the probe clock, one thread. Needs no process group of its own: it makes a world-1
    gloo group where none exists; a PlannerError inside one of several ranks. 0 (with a
    warning) where PIPELINE_PROBE_ATTEMPTS runs all read no extra: a busy host."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import autograd_call_s, probe_clock
    from ir.launch import free_port

    made = not dist.is_initialized()
    if not made and dist.get_world_size() != 1:
        raise PlannerError("the pipeline action probe runs on one process; call it outside "
                           "a multi-rank process group")
    m, width = PIPELINE_PROBE_MICROBATCHES, PIPELINE_PROBE_WIDTH
    engine_s = autograd_call_s(device)
    clock = probe_clock(device)
    if made:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=120))
    try:
        with _one_thread():
            blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()).to(device)
                      for _ in range(PIPELINE_PROBE_LAYERS)]
            half = PIPELINE_PROBE_LAYERS // PIPELINE_PROBE_STAGES
            halves = [nn.Sequential(*blocks[:half]), nn.Sequential(*blocks[half:])]

            def loss_fn(out, target):
                return ((out - target) ** 2).mean()

            stages = [PipelineStage(h, i, PIPELINE_PROBE_STAGES, torch.device(device))
                      for i, h in enumerate(halves)]
            schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
            x, target = torch.randn(m, width, device=device), torch.randn(m, width, device=device)

            def plain():
                for xi, ti in zip(x.chunk(m), target.chunk(m)):
                    loss_fn(halves[1](halves[0](xi)), ti).backward()

            runs = {"pipelined": lambda: schedule.step(x, target=target), "plain": plain}
            for _ in range(PIPELINE_PROBE_ATTEMPTS):
                seconds: dict[str, list[float]] = {name: [] for name in runs}
                for rep in range(PIPELINE_PROBE_WARMUP + PIPELINE_PROBE_ROUNDS):
                    for name in (list(runs) if rep % 2 else list(runs)[::-1]):
                        start = clock()
                        runs[name]()
                        if rep >= PIPELINE_PROBE_WARMUP:
                            seconds[name].append(clock() - start)
                    for block in blocks:
                        block.zero_grad(set_to_none=True)
                pipelined_s, plain_s = (statistics.median(seconds[n])
                                        for n in ("pipelined", "plain"))
                extra_s = pipelined_s - plain_s - m * engine_s
                if extra_s > 0:
                    return extra_s / (2 * PIPELINE_PROBE_STAGES * m)
    finally:
        if made:
            dist.destroy_process_group()
    # no clamped value: a busy spell, not a measurement; 0 = not priced
    print(f"warning: the pipeline action probe timed the pipelined step ({pipelined_s * 1e6:.0f} "
          f"us) no slower than the plain loop ({plain_s * 1e6:.0f} us) and its engine calls "
          f"{PIPELINE_PROBE_ATTEMPTS} times: the host is too busy; the spec records 0 (the "
          "pipelining runtime not priced): re-run on a quieter machine", file=sys.stderr)
    return 0.0
