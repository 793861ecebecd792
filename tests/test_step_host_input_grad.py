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


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_a_stage_adds_in_the_search_what_it_adds_in_the_estimate(schedule, pp):
    """pp 2 and 4 on CPU, the runtime's actions and the inputs' accumulations priced: per
    rank the estimate's per-micro-batch compute + optimizer share equals the search's
    layers' own compute + h(a, b, r) (`planner.stage_host`), to the float."""
    graph = gpt_layer_graph(layers=6, hidden=64, heads=4, vocab=128, seq=16)
    n, m = len(graph.layers), 4
    plan = uniform_plan(n, pp=pp, micro_batch=1, global_batch=m, schedule=schedule,
                        precision=Precision.FP32)
    cluster = _cpus(_kit(autograd_call_host_s=1e-3))
    configs = layer_configs(graph, plan, "cpu")
    est = estimate(graph, plan, cluster, configs=configs)
    cand = OuterCandidate(pp=pp, num_microbatches=m, schedule=schedule, virtual_stages=1)
    host = StageHost(graph, cluster, cand, lambda j, s, placed: placed_compute(
        placed, s, cluster, configs[j]).total_s, lambda j, name: 0.0)
    for r, stage in enumerate(plan.stages):
        a, b = stage.first_layer, stage.last_layer
        own = [layer_compute(graph.layers[j], plan.layer_strategies[j], cluster, configs[j])
               for j in range(a, b + 1)]
        t = est.stage_times[r]
        assert t.pipeline_action_s > 0
        placed = sum(host.delta_s(j, plan.layer_strategies[j], p)
                     for j, (_, p) in host.edges(a, b, r).items())
        from_estimate = t.compute_forward_s + t.compute_backward_s + t.optimizer_s / m
        from_search = (sum(c.total_s + c.optimizer_s / m for c in own)
                       + host.stage_s(a, b, r) + placed)
        assert from_search == pytest.approx(from_estimate, rel=1e-12)
