"""A GPU step between host syncs costs max(its host seconds, its device seconds), not the
sum of each layer's max (`estimate.gpu_runs_s`, `step_host.one_host_window`).

On the H100 (2026-11-25, bench/gpu_measured/h100_steps_2026-11-25.json) llama3.2-1b mb1
ran a step in 137 ms that the per-layer max priced at 186 ms: the host queues a whole
step's kernels ahead of the device (its only syncs are the batch's copies in and the
loss's `.item()` out), so a device-heavy pass runs under the host's next ones."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from cost_models.clusters import get_cluster
from cost_models.common import layer_configs
from cost_models.compute import layer_compute
from cost_models.dp_copies import dp_copy_step_seconds
from cost_models.estimate import estimate, gpu_runs_s
from cost_models.grad_accumulation import accumulation_step_seconds
from cost_models.step_host import one_host_window
from ir.cluster import ClusterSpec
from ir.embedding_tables import (EmbeddingPlan, EmbeddingTable, PlacedTable, TablePlacement,
                                 TableSharding)
from ir.plan import uniform_plan
from ir.strategy import Precision
from tests.cpu_specs import one_cpu_process

US = 1e-6


@functools.lru_cache(maxsize=None)
def _graph():
    from planner.models import load_layer_graph

    return load_layer_graph("llama-tiny", micro_batch=1, dtype=torch.float32)


def _h100(op_s: float, backward_op_s: float | None = None) -> ClusterSpec:
    """The h100-80g preset, one GPU, `op_s` a dispatched op (`backward_op_s` in backward,
    default the same)."""
    spec = get_cluster("h100-80g")
    return dataclasses.replace(spec, devices_per_node=1, op_overhead_s=op_s,
                               backward_op_overhead_s=op_s if backward_op_s is None
                               else backward_op_s)


def _sums(graph, plan, cluster) -> tuple[float, float, float, float]:
    """(device, host, per-layer max, gradient accumulation) seconds of the step, summed
    layer by layer; the accumulation adds after the composition, as the search adds it."""
    m, device_s, host_s, per_layer_s = plan.num_microbatches, 0.0, 0.0, 0.0
    accumulation_s = 0.0
    for layer, s, config in zip(graph.layers, plan.layer_strategies,
                                layer_configs(graph, plan, cluster.device)):
        c = layer_compute(layer, s, cluster, config)
        copies_s = dp_copy_step_seconds(layer, s, cluster, config)
        device_s += (m * (c.forward_device_s + c.backward_device_s) + c.optimizer_device_s
                     + copies_s)
        accumulation_s += accumulation_step_seconds(layer, s, cluster, config, m)
        host_s += m * (c.forward_host_s + c.backward_host_s) + c.optimizer_host_s
        per_layer_s += m * (c.forward_s + c.backward_s + c.recompute_s) + c.optimizer_s \
            + copies_s
    return device_s, host_s, per_layer_s, accumulation_s


@pytest.mark.parametrize("op_us, backward_op_us", [(0.0, 0.0), (1.0, 0.0), (3.0, 3.0),
                                                   (100.0, 100.0)])
def test_a_plain_gpu_step_costs_the_max_of_its_host_and_device_sums(op_us, backward_op_us):
    graph = _graph()
    plan = uniform_plan(len(graph.layers), micro_batch=1, global_batch=2)  # 2 micro-batches
    cluster = _h100(op_us * US, backward_op_us * US)
    device_s, host_s, per_layer_s, accumulation_s = _sums(graph, plan, cluster)
    est = estimate(graph, plan, cluster)
    assert est.time.tp_comm == est.time.pp_comm == est.time.bubble == 0.0
    assert accumulation_s > 0  # the second micro-batch adds into the first's gradients
    assert est.iteration_seconds == pytest.approx(max(device_s, host_s) + accumulation_s,
                                                  rel=1e-9)
    assert est.time.total == pytest.approx(est.iteration_seconds, rel=1e-12)
    if op_us and not backward_op_us:  # host-heavy forwards, device-heavy backwards: each
        # layer's max (the old rule) over-prices what the queue overlaps
        assert host_s < device_s < 0.8 * per_layer_s


def test_each_pass_is_its_own_run_where_the_host_syncs_inside_the_step():
    graph = _graph()
    plain = uniform_plan(len(graph.layers), micro_batch=1, global_batch=2)
    gpu, cpu = _h100(10 * US), one_cpu_process(None)
    assert one_host_window(plain, gpu)
    assert not one_host_window(plain, cpu)  # CPU processes: host and device add up
    fp16 = dataclasses.replace(plain, precision=Precision.FP16_MIXED)  # the overflow .item()
    assert not one_host_window(fp16, gpu)
    assert not one_host_window(uniform_plan(len(graph.layers), pp=2, micro_batch=1,
                                            global_batch=2), gpu)
    table = EmbeddingTable("tables.0", 10, 8, "float32", "sum", 3)
    placed = PlacedTable(table, TablePlacement("tables.0", TableSharding.REPLICATED, (0,)))
    tables = dataclasses.replace(plain, embeddings=EmbeddingPlan((placed,)))
    assert not one_host_window(tables, gpu)  # the exchange's .tolist() in forward
    # apart: each pass and the step at its own max; one run: the shared max, split in
    # proportion (forward host-heavy, backward device-heavy)
    parts = (1.0, 3.0, 4.0, 1.0, 0.5, 0.25)
    assert gpu_runs_s(parts, 0.5, 2, False, gpu) == (3.0, 4.0, 0.5, 0.5)
    runs = gpu_runs_s(parts, 0.5, 2, True, gpu)
    assert sum(runs[:2]) * 2 + runs[2] + runs[3] == pytest.approx(max(2 * 5 + 1, 2 * 4 + 0.25))
    assert runs[0] / runs[1] == pytest.approx(3.0 / 4.0)


def test_cpu_processes_compose_no_parts():
    graph = _graph()
    plan = uniform_plan(len(graph.layers), micro_batch=1, global_batch=2)
    cluster = one_cpu_process(None)
    config = dataclasses.replace(layer_configs(graph, plan, cluster.device)[1],
                                 precision=Precision.FP32)
    c = layer_compute(graph.layers[1], plan.layer_strategies[1], cluster, config)
    assert c.forward_s > 0
    assert (c.forward_device_s, c.forward_host_s, c.backward_device_s, c.backward_host_s,
            c.optimizer_device_s, c.optimizer_host_s) == (0.0,) * 6
