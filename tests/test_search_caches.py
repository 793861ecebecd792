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
from planner.search import search
from planner.search_space import SearchOptions, outer_candidates
from tests.layer_graphs import layer_graph


@pytest.fixture(scope="module")
def gpt():
    return layer_graph("gpt3-350m", 1, None, torch.bfloat16)


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


def test_candidates_that_differ_only_in_schedule_get_their_own_rows(gpt):
    """1F1B and interleaved candidates of one pp and m share every input of a row but
    the schedule, which the walk's floor reads (`walk_floor.forward_after_backward`:
    1F1B's steady state holds earlier gradients): priced after the 1F1B one through the
    shared caches, the interleaved tables equal those priced alone (the keys once left
    the schedule out, and the interleaved candidate got 1F1B's floor)."""
    from cost_models.walk_floor import forward_after_backward
    from ir.strategy import Schedule

    cluster = get_cluster("a100-80g", nodes=2)
    options = SearchOptions(max_tp=8)
    cands = outer_candidates(gpt, cluster.world_size, 64, options)
    late = next(c for c in cands if c.schedule is Schedule.INTERLEAVED
                and c.num_microbatches > c.pp)
    early = next(c for c in cands if c.schedule is Schedule.ONE_F_ONE_B
                 and (c.pp, c.num_microbatches) == (late.pp, late.num_microbatches))
    assert forward_after_backward(early.schedule, early.pp, early.num_microbatches) != \
        forward_after_backward(late.schedule, late.pp, late.num_microbatches)
    cache: dict = {}
    first, _ = price_layers(gpt, cluster, early, options, 64, None, cache)
    shared, _ = price_layers(gpt, cluster, late, options, 64, None, cache)
    alone, _ = price_layers(gpt, cluster, late, options, 64, None, {})
    for t, u in zip(shared, alone):
        assert t.strategies == u.strategies
        np.testing.assert_array_equal(t.floor_state_bytes, u.floor_state_bytes)
    assert any((t.floor_state_bytes != u.floor_state_bytes).any() for t, u in zip(first, alone)
               if t.strategies == u.strategies)  # the check can tell the schedules apart


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


def test_memory_kernel_points_are_kept_per_calibration_kernel_and_dtype():
    """`kernel_loops.memory_gbps` keeps each calibration's sorted points: two calibrations
    that differ only in one point's bandwidth, and the kernels and dtypes of one, each
    get their own answer, the one a fresh filter and sort of the points gives."""
    import dataclasses
    import math

    from cost_models.kernel_loops import memory_gbps
    from ir.kernel_calibration import KernelCalibration, MemoryKernelPoint

    def fresh(cal, kernel, dtype, nbytes):  # the rule, without the kept points
        points = [p for p in cal.memory_kernels if p.kernel == kernel]
        points = sorted([p for p in points if p.dtype == dtype] or points,
                        key=lambda p: p.nbytes)
        if nbytes <= points[0].nbytes:
            return points[0].gbps
        for lo, hi in zip(points, points[1:]):
            if nbytes <= hi.nbytes:
                x = math.log(nbytes / lo.nbytes) / math.log(hi.nbytes / lo.nbytes)
                return lo.gbps + x * (hi.gbps - lo.gbps)
        return points[-1].gbps

    points = (MemoryKernelPoint("copy", "float32", 2**24, 20.0),
              MemoryKernelPoint("copy", "float32", 2**16, 5.0),
              MemoryKernelPoint("copy", "bfloat16", 2**20, 9.0),
              MemoryKernelPoint("add", "float32", 2**20, 7.0))
    a = KernelCalibration(measured_on="a", memory_kernels=points)
    b = dataclasses.replace(a, memory_kernels=points[:1] + (
        MemoryKernelPoint("copy", "float32", 2**16, 6.0),) + points[2:])
    for cal in (a, b, a):  # a again: from the kept points
        for kernel, dtype in (("copy", "float32"), ("copy", "bfloat16"), ("add", "float32"),
                              ("add", "bfloat16")):
            for nbytes in (2**10, 2**18, 2**22, 2**30):
                assert memory_gbps(cal, kernel, dtype, nbytes, 1.0) == \
                    fresh(cal, kernel, dtype, nbytes)
    assert memory_gbps(a, "copy", "float32", 2**18, 1.0) != \
        memory_gbps(b, "copy", "float32", 2**18, 1.0)  # the check can tell them apart
    assert memory_gbps(a, "copy", "float32", 2**30, 1.0) != \
        memory_gbps(a, "copy", "bfloat16", 2**30, 1.0)


def test_a_rows_step_config_is_kept_by_micro_batch_and_pipelining(gpt):
    """`layer_tables.row_config` keeps the configs it built: each (micro-batch, pipelined)
    gets its own, equal to one built without the kept ones."""
    from planner.layer_tables import row_config

    cluster = get_cluster("a100-80g", nodes=2)
    options = SearchOptions(max_tp=8)
    layer = gpt.layers[1]
    s = price_layers(gpt, cluster, outer_candidates(gpt, cluster.world_size, 64, options)[0],
                     options, 64, None, {})[0][1].strategies[0]
    configs: dict = {}
    seen = {}
    for micro_batch, pipelined in ((1, False), (2, False), (1, True), (2, True), (1, False)):
        kept = row_config(gpt, layer, s, cluster, options, micro_batch, None, pipelined,
                          configs)
        assert kept == row_config(gpt, layer, s, cluster, options, micro_batch, None,
                                  pipelined)
        assert (kept.micro_batch, kept.pipelined) == (micro_batch, pipelined)
        seen[(micro_batch, pipelined)] = kept
    assert len(set(seen.values())) == 4


def test_undominated_drops_what_the_pairwise_rule_drops():
    """`layer_tables._undominated` (all pairs at once) against the rule written as loops:
    j drops i when of i's layout, no worse everywhere, and better on one of the first
    four figures or listed first."""
    from dataclasses import dataclass

    from planner.layer_tables import ROW_FIGURES, _undominated

    @dataclass(frozen=True)
    class S:
        tp: int
        sequence_parallel: bool

    def rule(strategies, rows):
        keep = []
        for i, si in enumerate(strategies):
            ci = rows[i].tolist()
            if not any(j != i and (sj.tp, sj.sequence_parallel) == (si.tp, si.sequence_parallel)
                       and all(a <= b for a, b in zip(rows[j].tolist(), ci))
                       and (j < i or any(a < b for a, b in zip(rows[j][:4].tolist(), ci[:4])))
                       for j, sj in enumerate(strategies)):
                keep.append(i)
        return keep

    rng = np.random.default_rng(0)
    dropped = 0
    for _ in range(300):
        n = int(rng.integers(0, 24))
        strategies = [S(int(rng.choice([1, 2, 4])), bool(rng.integers(2))) for _ in range(n)]
        rows = rng.integers(0, 3, size=(n, ROW_FIGURES)).astype(float)
        rows[rng.random((n, ROW_FIGURES)) < 0.05] = np.inf
        keep = _undominated(strategies, rows)
        assert keep == rule(strategies, rows)
        dropped += n - len(keep)
    assert dropped  # the rule dropped some


@pytest.mark.parametrize("layout", [[0, 2, 0, 1, 0, 2, 0], [1] * 7])
def test_the_inner_step_is_the_recurrence(layout):
    """`stage_program._extend` against the inner recurrence written out: C[i][c][u] = min
    over s of layout c of min_c' (C[i-1][c'][u - mem(s)] + x(c', c)) + t(s); layout groups
    of unequal sizes (4, 1, 2) or one group (a plain min), and layouts no strategy takes."""
    from planner.layer_tables import LayerTable
    from planner.stage_program import _extend, _step

    rng = np.random.default_rng(0)
    layout = np.array(layout)
    k = len(layout)

    def figures(scale):
        return rng.integers(1, 8, size=k).astype(float) * scale

    table = LayerTable(list(range(k)), rng.random(k) + 0.1, figures(1.0), figures(0.5),
                       np.array([0.0, 1.0, 3.0, 0.0, 1.0, 2.0, 9.0]), layout,
                       *(figures(1.0) for _ in range(5)))
    n, units = 4, 24
    x = rng.random((n, n))
    x[rng.random((n, n)) < 0.2] = np.inf
    np.fill_diagonal(x, 0.0)  # staying in a layout costs nothing
    step = _step(table, 2.0, 1.0, 3.0, units, {})  # strategy 6 over the cap
    parent = _extend(None, table, None, step, n, units)
    child = _extend(parent, table, x, step, n, units)
    mem = step.mem
    for node, entry in ((parent, np.zeros((n, units + 1))),
                        (child, (parent.value[:, None, :] + x[:, :, None]).min(axis=0))):
        want = np.full((n, units + 1), np.inf)
        for s in range(k):
            c = layout[s]
            for u in range(units + 1):
                if mem[s] <= u:
                    want[c, u] = min(want[c, u], entry[c, u - mem[s]] + table.time_s[s])
        np.testing.assert_array_equal(node.value, want)
    assert np.isfinite(child.value).any() and np.isinf(child.value).any()
