"""Host seconds of the training loop's loss all-reduce: every step each rank starts one
asynchronous all-reduce of its scalar loss and waits on it after the optimizer step
(`executors.runtime.ProcessModel._start_loss_sum`, `train_step`). On CPU processes the
call and the wait run on the main thread, outside every layer and the optimizer
(stephost, 2026-11-25, mlp-1rank in one process: 53-103 us a step of 1.07 ms, thread CPU,
load 4-7).

The probe times `dist.all_reduce(scalar, async_op=True)` + `wait()` on a world-1 gloo
group (made where none exists, as `pipeline_probes`), one thread, on the probe clock.
The transfer between processes is not in it (the collective fits price transfers; the
loop's all-reduce is one float and overlaps the last backward).

    seconds = loss_sum_host_s("cpu")   # ~5e-05 here  # doctest: +SKIP
"""

from __future__ import annotations

import os
import statistics
from datetime import timedelta

from ir.errors import PlannerError

LOSS_SUM_PROBE_CALLS = 200  # after LOSS_SUM_PROBE_WARMUP untimed; the median (~20 ms in all)
LOSS_SUM_PROBE_WARMUP = 10


def loss_sum_host_s(device: str = "cpu") -> float:
    """Median host seconds of one scalar all-reduce started asynchronously and waited on
    (module docstring), on the probe clock; a PlannerError inside a multi-rank group."""
    import torch
    import torch.distributed as dist

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock
    from ir.launch import free_port

    made = not dist.is_initialized()
    if not made and dist.get_world_size() != 1:
        raise PlannerError("the loss all-reduce probe runs on one process; call it outside "
                           "a multi-rank process group")
    if made:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=120))
    try:
        with _one_thread():
            value = torch.zeros((), device=device)
            clock = probe_clock(device)
            times = []
            for call in range(LOSS_SUM_PROBE_WARMUP + LOSS_SUM_PROBE_CALLS):
                start = clock()
                dist.all_reduce(value, async_op=True).wait()
                if call >= LOSS_SUM_PROBE_WARMUP:
                    times.append(clock() - start)
            return statistics.median(times)
    finally:
        if made:
            dist.destroy_process_group()
