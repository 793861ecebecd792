"""Timing the optimizer step's host work inside the process group `profile-cluster` spawned.

  optimizer_tensor_seconds  host CPU seconds per parameter tensor of one optimizer step +
                            zero_grad, for every optimizer a plan names, on plain tensors
                            and on row-sharded DTensors (FSDP2's layout).

The probe reads the calling thread's CPU time (`host_probes.probe_clock`), as the DP-unit
probe does (`dp_unit_probe._added_step_s`): on CPU processes sharing cores with each other
and with other load, the wall clock holds the time others held the core (at load 7-8 on 2
cores, 2026-11-25, it priced 43 ms per step where the thread's CPU was 7.4 ms), which
`compute.optimizer_step_seconds` adds back as the node's own processes' share of the cores
(`ClusterSpec.host_share`), as it does for every other host figure.
"""

from __future__ import annotations

import statistics

from ir.calibration_tables import OptimizerStepCost

from cost_models.host_probes import probe_clock

# Optimizer steps timed: OPTIMIZER_PROBE_TENSORS tensors small enough that the host's
# per-tensor work dominates (the bytes streamed are priced apart), sharded on DTensors
# by rows as FSDP2 shards them (the row count divides every group size up to 16).
OPTIMIZER_PROBE_TENSORS = 32
OPTIMIZER_PROBE_SHAPE = (16, 16)
OPTIMIZER_PROBE_STEPS = 12  # after OPTIMIZER_PROBE_WARMUP steps (state allocation); the median
OPTIMIZER_PROBE_WARMUP = 3


def optimizer_tensor_seconds(mesh) -> tuple[OptimizerStepCost, ...]:
    """Host CPU seconds per parameter tensor of one optimizer step + zero_grad, for every
    optimizer a plan names, on plain tensors and on row-sharded DTensors, all ranks
    stepping together (`optimizer_step_cpu_s`). The executor's optimizers run torch's
    per-tensor loop on DTensors."""
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    from ir.plan import OPTIMIZERS
    from cost_models.clusters import _one_thread

    out = []
    with _one_thread():
        for name, (cls, kwargs) in OPTIMIZERS.items():
            for on_dtensors in (False, True):
                params = []
                for _ in range(OPTIMIZER_PROBE_TENSORS):
                    t = torch.randn(OPTIMIZER_PROBE_SHAPE)
                    if on_dtensors:
                        t = distribute_tensor(t, mesh, [Shard(0)])
                    params.append(torch.nn.Parameter(t))
                seconds = optimizer_step_cpu_s(cls(params, **kwargs), params)
                out.append(OptimizerStepCost(name, on_dtensors,
                                             seconds / OPTIMIZER_PROBE_TENSORS))
    return tuple(out)


def optimizer_step_cpu_s(optimizer, params) -> float:
    """Median over OPTIMIZER_PROBE_STEPS steps (after OPTIMIZER_PROBE_WARMUP: state
    allocation) of the calling thread's CPU seconds in `optimizer.step()` +
    `zero_grad(set_to_none=True)`, every rank starting each step together (a barrier
    outside the clock). Time the thread did not run (other processes held the core) is
    left out."""
    import torch
    import torch.distributed as dist

    clock = probe_clock("cpu")
    times = []
    for step in range(OPTIMIZER_PROBE_WARMUP + OPTIMIZER_PROBE_STEPS):
        for p in params:
            p.grad = torch.ones_like(p)
        dist.barrier()
        start = clock()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= OPTIMIZER_PROBE_WARMUP:
            times.append(clock() - start)
    return statistics.median(times)
