"""A pipeline stage's input gradient (`cost_models.step_host.input_accumulations`,
`input_accumulation_s`): torch's pipelining makes every stage's input but the first's a
leaf and `stage_backward` reads its `.grad`, so each backward of a non-first stage ends in
one AccumulateGrad; the first stage's input (the model's) needs none."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models.common import layer_configs
from cost_models.compute import layer_compute
from cost_models.estimate import estimate
from cost_models.pipeline_probes import PIPELINE_PROBE_INPUT_ACCUMULATIONS_PER_ACTION
from cost_models.step_host import (input_accumulation_s, input_accumulations,
                                   pipeline_action_s, pipeline_actions, placed_compute)
from cost_models.synthetic import gpt_layer_graph
from cost_models.torch_schedule_order import torch_pipeline_order
from ir.kernel_calibration import KernelCalibration
from ir.plan import uniform_plan
from ir.strategy import Precision, Schedule
from planner.search_space import OuterCandidate
from planner.stage_host import StageHost
from tests.cpu_specs import two_cpu_processes


def _cpus(kit: KernelCalibration):
    """Four CPU processes on four cores (core share 1), the two-process spec's figures."""
    return dataclasses.replace(two_cpu_processes(kit), devices_per_node=4, host_cores=4)

# Round figures far above the float noise of the other terms: the pipelining runtime per
# action, the backward per autograd node and per view op (an accumulation's steal is one
# of each: its node and a detach)
ACTION_S, NODE_S, VIEW_S = 2e-3, 3e-4, 1e-4


@pytest.mark.parametrize("schedule, v", [(Schedule.GPIPE, 1), (Schedule.ONE_F_ONE_B, 1),
                                         (Schedule.INTERLEAVED, 2)])
@pytest.mark.parametrize("pp", [2, 4, 8])
def test_every_backward_of_a_stage_but_the_first_accumulates_its_input(schedule, v, pp):
    """Counted on torch's own pass order (`torch_pipeline_order`: the actions its runtime
    walks): per plan stage (chunk x pp + rank) its backward actions, stage 0 none. Of all
    actions (a forward and a backward per stage and micro-batch) that is (S - 1) / 2S,
    S = pp x v stages: 1/4 at pp 2, 3/8 at pp 4, 7/16 at pp 8 (v 1); interleaved's v 2,
    7/16 at pp 4. The pipeline probe's 2 stages hold 1/4 per action."""
    m = 2 * pp
    order = torch_pipeline_order(schedule, pp, m, v)
    torch_backwards: dict[int, int] = {}
    for rank, ops in order.items():
        for op in ops:
            if not op.forward and op.chunk * pp + rank > 0:
                stage = op.chunk * pp + rank
                torch_backwards[stage] = torch_backwards.get(stage, 0) + 1
    counts = input_accumulations(schedule, pp, m, v)
    assert counts == torch_backwards == {s: m for s in range(1, pp * v)}
    actions = sum(len(ops) for ops in order.values())
    assert actions == sum(pipeline_actions(schedule, pp, m, v).values())
    stages = pp * v
    assert sum(counts.values()) / actions == pytest.approx((stages - 1) / (2 * stages))
    assert PIPELINE_PROBE_INPUT_ACCUMULATIONS_PER_ACTION == 1 / 4  # its 2 stages


def test_the_plain_loop_accumulates_no_input():
    assert input_accumulations(Schedule.ONE_F_ONE_B, 1, 4, 1) == {}


def _kit(**extra) -> KernelCalibration:
    return KernelCalibration(measured_on="test", pipeline_action_host_s=ACTION_S,
                             backward_node_host_s=NODE_S, backward_view_host_op_s=VIEW_S,
                             **extra)


def test_a_stage_pays_its_input_accumulation_per_backward_and_the_first_none():
    """pp 4, GPipe, m 4: the kit's per-action figure holds the probe's quarter of an
    accumulation (n + w per accumulation: a node, a detach), taken off every action; each
    stage but the first adds one accumulation per backward. Per micro-batch, rank r pays
    2 (a - (n + w) / 4) + (r > 0) (n + w), all of the accumulation in its backward."""
    graph = gpt_layer_graph(layers=4, hidden=64, heads=4, vocab=128, seq=16)
    plan = uniform_plan(len(graph.layers), pp=4, micro_batch=1, global_batch=4,
                        schedule=Schedule.GPIPE, precision=Precision.FP32)
    cluster = _cpus(_kit())
    acc = (NODE_S + VIEW_S) * cluster.host_share
    assert input_accumulation_s(cluster) == pytest.approx(acc)
    assert pipeline_action_s(cluster) == pytest.approx(ACTION_S * cluster.host_share
                                                       - acc / 4)
    bare = _cpus(dataclasses.replace(_kit(), pipeline_action_host_s=0.0,
                                     backward_node_host_s=0.0, backward_view_host_op_s=0.0))
    with_runtime, without = estimate(graph, plan, cluster), estimate(graph, plan, bare)
    for r, (t, t0) in enumerate(zip(with_runtime.stage_times, without.stage_times)):
        expected = 2 * (ACTION_S * cluster.host_share - acc / 4) + (acc if r else 0.0)
        assert t.pipeline_action_s == pytest.approx(expected)
        assert (t.compute_backward_s - t0.compute_backward_s) - (
            t.compute_forward_s - t0.compute_forward_s) == pytest.approx(
                acc if r else 0.0, abs=1e-12)


@pytest.mark.parametrize("pp, schedule, v", [
    (2, Schedule.GPIPE, 1), (4, Schedule.GPIPE, 1), (2, Schedule.ONE_F_ONE_B, 1),
    (4, Schedule.ONE_F_ONE_B, 1), (2, Schedule.INTERLEAVED, 2)])
def test_a_stage_adds_in_the_search_what_it_adds_in_the_estimate(pp, schedule, v):
    """pp 2 and 4 on CPU (interleaved: pp 2 x v 2), the runtime's actions and the inputs'
    accumulations priced: per rank the estimate's per-micro-batch compute + optimizer
    share equals the search's layers' own compute + h(a, b, r) over the rank's stages
    (`planner.stage_host`), to the float."""
    graph = gpt_layer_graph(layers=6, hidden=64, heads=4, vocab=128, seq=16)
    n, m = len(graph.layers), 4
    plan = uniform_plan(n, pp=pp, micro_batch=1, global_batch=m, schedule=schedule,
                        precision=Precision.FP32, virtual_stages=v)
    cluster = _cpus(_kit(autograd_call_host_s=1e-3))
    configs = layer_configs(graph, plan, "cpu")
    est = estimate(graph, plan, cluster, configs=configs)
    cand = OuterCandidate(pp=pp, num_microbatches=m, schedule=schedule, virtual_stages=v)
    host = StageHost(graph, cluster, cand, lambda j, s, placed: placed_compute(
        placed, s, cluster, configs[j]).total_s, lambda j, name: 0.0)
    if v > 1:
        host.with_pieces([(s.first_layer, s.last_layer) for s in plan.stages])
    from_search = [0.0] * pp
    for i, stage in enumerate(plan.stages):
        a, b, r = stage.first_layer, stage.last_layer, i % pp
        own = [layer_compute(graph.layers[j], plan.layer_strategies[j], cluster, configs[j])
               for j in range(a, b + 1)]
        placed = sum(host.delta_s(j, plan.layer_strategies[j], p)
                     for j, (_, p) in host.edges(a, b, r).items())
        from_search[r] += (sum(c.total_s + c.optimizer_s / m for c in own)
                           + host.stage_s(a, b, r) + placed)
    assert len(est.stage_times) == pp  # one per rank
    for r, t in enumerate(est.stage_times):
        assert t.pipeline_action_s > 0
        from_estimate = t.compute_forward_s + t.compute_backward_s + t.optimizer_s / m
        assert from_search[r] == pytest.approx(from_estimate, rel=1e-12)


def test_torch_runs_one_input_accumulation_per_backward_of_every_stage_but_the_first():
    """An oracle apart from the rule the pricing states: torch's own pipelining runs 4
    stages (ScheduleInterleaved1F1B, all on this process over a world-1 gloo group, as
    the pipeline probe does) for m micro-batches; a hook after each AccumulateGrad on a
    stage's input (`register_post_accumulate_grad_hook`) counts those that run, per
    stage. They are `input_accumulations` of any 4-stage plan: pp 4 GPipe, pp 2 x v 2."""
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

    from ir.launch import free_port

    stages_n, m, width = 4, 4, 8
    ran: dict[int, int] = {}

    def count(stage: int):
        def hook(module, args):
            x = args[0]
            if x.is_leaf and x.requires_grad:
                x.register_post_accumulate_grad_hook(
                    lambda _: ran.__setitem__(stage, ran.get(stage, 0) + 1))
        return hook

    made = not dist.is_initialized()
    if made:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        assert dist.get_world_size() == 1
        blocks = [nn.Linear(width, width) for _ in range(stages_n)]
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(count(i))
        stages = [PipelineStage(b, i, stages_n, torch.device("cpu"))
                  for i, b in enumerate(blocks)]
        schedule = ScheduleInterleaved1F1B(
            stages, n_microbatches=m, loss_fn=lambda out, target: ((out - target) ** 2).mean())
        schedule.step(torch.randn(m, width), target=torch.randn(m, width))
    finally:
        if made:
            dist.destroy_process_group()
    assert ran == {s: m for s in range(1, stages_n)}
    assert ran == input_accumulations(Schedule.GPIPE, 4, m, 1)
    assert ran == input_accumulations(Schedule.INTERLEAVED, 2, m, 2)
