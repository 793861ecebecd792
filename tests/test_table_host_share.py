"""Issue 18, `planner validate` of sharded DLRM plans on time: CPU processes sharing cores
stretch the tables' busy time as they stretch the dense layers' compute, and the phase
clock splits a collective's seconds into waiting for the last rank and the call after it."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models.clusters import get_cluster
from cost_models.embedding import NO_DENSE, EmbeddingConfig, evaluate, host_busy_s
from executors.phase_clock import arrival_wait
from ir.embedding_tables import EmbeddingTable, TablePlacement, TableSharding
from planner.table_problem import PlacementProblem, lower_bound

US = 1e-6


def cpu_spec(processes: int, cores: int):
    """A CPU node of `processes` ranks on `cores` cores (datasheet figures otherwise)."""
    spec = get_cluster("a100-80g", nodes=1, gpus_per_node=processes)
    return dataclasses.replace(spec, device="cpu", host_cores=cores, op_overhead_s=5 * US,
                               hbm_gbps=20.0, intra_node_latency_s=100 * US)


TABLES = [EmbeddingTable(f"t{i}", 10_000, 32, "float32", "sum", 4, None) for i in range(4)]
PLACED = [TablePlacement(t.name, TableSharding.TABLE_WISE, (i,)) for i, t in enumerate(TABLES)]
CONFIG = EmbeddingConfig(global_batch=64)


def test_four_processes_on_two_cores_take_twice_the_busy_time_and_the_same_exchange():
    one_core_each = evaluate(TABLES, PLACED, cpu_spec(4, 4), CONFIG, NO_DENSE)
    shared = evaluate(TABLES, PLACED, cpu_spec(4, 2), CONFIG, NO_DENSE)
    for alone, paired in zip(one_core_each.per_rank, shared.per_rank):
        assert alone.lookup_s > 0 and alone.update_s > 0
        assert paired.lookup_s == pytest.approx(2 * alone.lookup_s)
        assert paired.update_s == pytest.approx(2 * alone.update_s)
        assert paired.comm_s == pytest.approx(alone.comm_s)  # measured with all ranks running


def test_gpus_are_not_stretched():
    gpu = get_cluster("a100-80g", nodes=1, gpus_per_node=4)
    assert not gpu.host_bound
    assert host_busy_s(1e-3, gpu) == 1e-3
    assert host_busy_s(1e-3, cpu_spec(4, 2)) == pytest.approx(2e-3)
    assert host_busy_s(1e-3, cpu_spec(2, 4)) == pytest.approx(1e-3)  # an idle core: no turns


def test_lower_bound_stays_below_the_stretched_step():
    spec = cpu_spec(4, 2)
    problem = PlacementProblem(TABLES, spec, CONFIG, NO_DENSE)
    cost = evaluate(TABLES, PLACED, spec, CONFIG, NO_DENSE)
    assert lower_bound(problem) <= cost.step_s + 1e-12
    # and it moved with the stretch: above the bound of the same tables on 4 cores
    roomy = PlacementProblem(TABLES, cpu_spec(4, 4), CONFIG, NO_DENSE)
    assert lower_bound(problem) > lower_bound(roomy)


def test_arrival_wait_splits_each_call_at_the_last_arrival():
    # two ranks, two steps of one all-to-all and one all-reduce each
    rank0 = [("a2a_forward", 0.0, 5.0), ("dense_comm", 6.0, 9.0),
             ("a2a_forward", 10.0, 12.0), ("dense_comm", 13.0, 20.0)]
    rank1 = [("a2a_forward", 3.0, 5.0), ("dense_comm", 8.0, 9.0),
             ("a2a_forward", 10.5, 12.0), ("dense_comm", 12.0, 20.0)]
    out = arrival_wait([rank0, rank1], 0, steps=2)
    assert out["a2a_forward_wait_s"] == pytest.approx((3.0 + 0.5) / 2)
    assert out["a2a_forward_after_arrival_s"] == pytest.approx((2.0 + 1.5) / 2)
    assert out["dense_comm_wait_s"] == pytest.approx((2.0 + 0.0) / 2)
    assert out["dense_comm_after_arrival_s"] == pytest.approx((1.0 + 7.0) / 2)
    late = arrival_wait([rank0, rank1], 1, steps=2)
    assert late["a2a_forward_wait_s"] == 0.0 and late["dense_comm_wait_s"] == pytest.approx(0.5)


def test_arrival_wait_refuses_logs_of_different_calls():
    assert arrival_wait([[("dense_comm", 0.0, 1.0)], [("a2a_forward", 0.0, 1.0)]], 0, 1) == {}
