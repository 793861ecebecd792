"""The search's caches (issue 19's speed work) give the answers the uncached code gives.

Each cache is checked against a fresh computation that does not go through it: the
collective cache against `comm._collective_s`, the memory walk's per-kind layer figures
against `plan_memory` without a cache, the shared layer tables against tables priced
without sharing rows, and the reworked walk against peaks the tests elsewhere pin
(tests/test_cost_memory.py); tests/test_search_pinned.py pins whole searches.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cost_models import comm
from cost_models.clusters import get_cluster
from cost_models.memory import _layer_kinds, plan_memory
from planner.layer_tables import price_layers
from planner.models import load_layer_graph
from planner.search import search
from planner.search_space import SearchOptions, outer_candidates


@pytest.fixture(scope="module")
def gpt():
    return load_layer_graph("gpt3-350m", 1, None, torch.bfloat16)


def test_collective_cache_keeps_each_cluster_apart():
    """Same question, two clusters: each gets its own uncached answer."""
    a100, h100 = get_cluster("a100-80g", nodes=2), get_cluster("h100-80g", nodes=2)
    for collective in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        for n, stride in ((8, 1), (16, 1), (2, 8)):
            nbytes = 3 * 2**20
            for cluster in (a100, h100, a100):  # a100 again: now from the cache
                assert comm.collective_s(collective, nbytes, n, cluster, stride) == \
                    comm._collective_s(collective, nbytes, n, cluster, stride)
    assert comm.collective_s("all_reduce", 2**30, 16, a100) != \
        comm.collective_s("all_reduce", 2**30, 16, h100)  # the check can tell them apart


def test_identical_blocks_share_a_layer_kind_and_the_ends_do_not(gpt):
    kinds = _layer_kinds(gpt, {})
    blocks = [k for l, k in zip(gpt.layers, kinds) if l.name.startswith("blocks.")]
    assert len(blocks) == 24 and len(set(blocks)) == 1
    assert len(set(kinds)) == len(kinds) - 23  # embedding, blocks, norm/head apart


def test_a_search_plan_walks_the_same_with_and_without_the_caches(gpt):
    cluster = get_cluster("a100-80g", nodes=2)
    result = search(gpt, cluster, 64)
    cache: dict = {}
    for cand in result.candidates[:4]:
        cached = plan_memory(gpt, cand.plan, cluster, rank_cache=cache)
        assert cached == plan_memory(gpt, cand.plan, cluster)
        assert cand.estimate.memory == cached


def test_identical_layers_share_one_table_priced_as_alone(gpt):
    """One table per identical layer, equal to what pricing without any shared rows gives."""
    cluster = get_cluster("a100-80g", nodes=2)
    options = SearchOptions(max_tp=8)
    shared_rows: dict = {}
    for cand in outer_candidates(gpt, cluster.world_size, 64, options)[:6]:
        tables, layouts = price_layers(gpt, cluster, cand, options, 64, None,
                                       {"rows": shared_rows})
        alone, alone_layouts = price_layers(gpt, cluster, cand, options, 64, None, {})
        assert layouts == alone_layouts
        blocks = [t for l, t in zip(gpt.layers, tables) if l.name.startswith("blocks.")]
        assert all(t is blocks[0] for t in blocks)
        for t, u in zip(tables, alone):
            assert t.strategies == u.strategies
            for field in ("time_s", "state_bytes", "kept_bytes", "transient_bytes", "layout"):
                np.testing.assert_array_equal(getattr(t, field), getattr(u, field))
    assert shared_rows  # the rows were kept for the next search


def test_blocks_that_pay_cold_ops_get_their_own_table_where_a_kit_prices_them(gpt):
    """gpt3-350m's first block runs 15 forward ops the embedding did not (its last block
    13 backward ops the norm's did not): where a kit prices cold ops they price apart,
    each table's time that of its own layer (no block borrows another's cold ops); where
    none does (the A100 preset) all 24 blocks still share one table."""
    import dataclasses

    from cost_models.common import StepConfig
    from cost_models.compute import layer_compute
    from ir.kernel_calibration import KernelCalibration

    blocks = [i for i, l in enumerate(gpt.layers) if l.name.startswith("blocks.")]
    first, middle, last = blocks[0], blocks[1], blocks[-1]
    assert gpt.layers[first].cold_distinct_ops_fwd == 15
    assert gpt.layers[middle].host_position == (0, 0)
    plain = get_cluster("a100-80g", nodes=2)
    cal = dataclasses.replace(plain.kernel_calibration or KernelCalibration(measured_on="t"),
                              forward_host_op_s=1e-6, cold_op_host_s=2e-6,
                              cold_backward_op_host_s=1e-6)
    cold = dataclasses.replace(plain, kernel_calibration=cal)
    options = SearchOptions(max_tp=8)
    cand = outer_candidates(gpt, plain.world_size, 64, options)[0]
    tables, _ = price_layers(gpt, plain, cand, options, 64, None, {})
    assert all(tables[i] is tables[first] for i in blocks)
    tables, _ = price_layers(gpt, cold, cand, options, 64, None, {})
    assert tables[first] is not tables[middle] and tables[last] is not tables[middle]
    assert all(tables[i] is tables[middle] for i in blocks[1:-1])
    forward_only = dataclasses.replace(cold, kernel_calibration=dataclasses.replace(
        cal, cold_backward_op_host_s=0.0))  # what profile-device writes: the last block shares
    tables, _ = price_layers(gpt, forward_only, cand, options, 64, None, {})
    assert tables[first] is not tables[middle]
    assert all(tables[i] is tables[middle] for i in blocks[1:])
    s = tables[first].strategies[0]
    assert s in tables[middle].strategies
    # on CPU processes, where host time adds (on a GPU it hides under the kernels)
    local = get_cluster("local")
    cpu = dataclasses.replace(local, kernel_calibration=dataclasses.replace(
        local.kernel_calibration or KernelCalibration(measured_on="t"), forward_host_op_s=1e-6,
        cold_op_host_s=2e-6, cold_backward_op_host_s=1e-6))
    config = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype=gpt.dtype,
                        device_type="cpu")
    extra_s = (layer_compute(gpt.layers[first], s, cpu, config).forward_s
               - layer_compute(gpt.layers[middle], s, cpu, config).forward_s)
    assert extra_s == pytest.approx(15 * 2e-6 * cpu.host_share, rel=1e-6)
