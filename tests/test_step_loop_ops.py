"""The training loop's own work the estimate prices once a step (`step_host.step_loop_s`):
its op counts are the executor's, counted here under a dispatch mode, so a change to
`executors.runtime.train_step` that adds or drops ops fails until the counts follow."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from cost_models.clusters import get_cluster
from cost_models.estimate import estimate
from cost_models.step_host import LOSS_OPS_PER_MICROBATCH, STEP_LOOP_OPS, step_loop_s
from executors import apply, init_distributed
from ir.kernel_calibration import KernelCalibration
from ir.plan import uniform_plan
from ir.strategy import Precision
from planner.models import load_layer_graph, load_model

GLOBAL_BATCH = 8


class _LoopOps(TorchDispatchMode):
    """Counts the ops dispatched while `muted` is 0 (outside the model, loss, backward and
    optimizer)."""

    def __init__(self):
        super().__init__()
        self.muted, self.ops = 0, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.muted:
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _mute(counter: _LoopOps, obj, name: str) -> None:
    call = getattr(obj, name)

    def muted(*args, **kwargs):
        counter.muted += 1
        try:
            return call(*args, **kwargs)
        finally:
            counter.muted -= 1
    setattr(obj, name, muted)


def _loop_ops(micro_batch: int) -> collections.Counter:
    """Ops of one mlp-small `train_step` on one rank outside its model, loss function,
    backward and optimizer, at GLOBAL_BATCH / micro_batch micro-batches."""
    graph = load_layer_graph("mlp-small", micro_batch=micro_batch, dtype=torch.float32)
    plan = uniform_plan(len(graph.layers), micro_batch=micro_batch,
                        global_batch=GLOBAL_BATCH, precision=Precision.FP32)
    loaded = load_model("mlp-small", micro_batch=GLOBAL_BATCH, device="cpu", seed=0)
    pm = apply(loaded.module, plan, graph, loss_fn=loaded.loss_fn, device=torch.device("cpu"),
               example_inputs=loaded.inputs)
    counter = _LoopOps()
    pm.module.register_forward_pre_hook(lambda *_: setattr(counter, "muted", counter.muted + 1))
    pm.module.register_forward_hook(lambda *_: setattr(counter, "muted", counter.muted - 1))
    for obj, name in ((pm, "loss_fn"), (pm.optimizer, "step"), (pm.optimizer, "zero_grad")):
        _mute(counter, obj, name)
    backward = torch.Tensor.backward
    try:
        _mute(counter, torch.Tensor, "backward")
        pm.train_step(loaded.inputs, loaded.target)  # the optimizer's state, DTensor caches
        with counter:
            pm.train_step(loaded.inputs, loaded.target)
    finally:
        torch.Tensor.backward = backward
    return counter.ops


@pytest.fixture(scope="module")
def one_rank():
    owned = not dist.is_initialized()
    if owned:
        init_distributed("gloo")
    yield
    if owned:
        dist.destroy_process_group()


@pytest.mark.parametrize("micro_batch", [GLOBAL_BATCH, GLOBAL_BATCH // 4])
def test_loop_op_counts_are_the_executors(one_rank, micro_batch):
    ops = _loop_ops(micro_batch)
    assert ops.pop("c10d.allreduce_.default") == 1  # the loss's, priced apart
    m = GLOBAL_BATCH // micro_batch
    assert sum(ops.values()) == STEP_LOOP_OPS + LOSS_OPS_PER_MICROBATCH * m, dict(ops)


def _kit_cluster(loss_sum_host_s: float, optimizer_entry_host_s: float = 0.0):
    cluster = get_cluster("local")
    cal = cluster.kernel_calibration or KernelCalibration(measured_on="test")
    return dataclasses.replace(cluster, kernel_calibration=dataclasses.replace(
        cal, loss_sum_host_s=loss_sum_host_s, optimizer_entry_host_s=optimizer_entry_host_s))


def test_loop_is_priced_once_a_step_where_the_kit_measured_it():
    unmeasured, measured = _kit_cluster(0.0), _kit_cluster(50e-6, 100e-6)
    if not measured.host_bound:
        pytest.fail("the local spec should be a CPU one")
    assert step_loop_s(unmeasured, 4, True, "adamw") == 0.0
    assert step_loop_s(measured, 1, False, "sgd") > 50e-6 * measured.host_share
    # the entry measured on AdamW prices Adam and AdamW plans only
    assert step_loop_s(measured, 1, False, "adamw") == pytest.approx(
        step_loop_s(measured, 1, False, "sgd") + 100e-6 * measured.host_share)
    assert step_loop_s(measured, 4, True, "adam") > step_loop_s(measured, 1, True, "adam") \
        > step_loop_s(measured, 1, False, "adam")
    graph = load_layer_graph("mlp-small", micro_batch=2, dtype=torch.float32)
    plan = uniform_plan(len(graph.layers), micro_batch=2, global_batch=GLOBAL_BATCH,
                        precision=Precision.FP32)
    before, after = estimate(graph, plan, unmeasured), estimate(graph, plan, measured)
    assert after.stage_times[0].loop_s == pytest.approx(
        step_loop_s(measured, 4, True, plan.optimizer))
    assert after.iteration_seconds == pytest.approx(
        before.iteration_seconds + after.stage_times[0].loop_s)
