"""Embedding-table placement: cost formulas pinned by hand, the exact search against a
brute-force enumeration written here, the memory wall, imbalance, and the greedy baseline."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random

import pytest
import torch

from cost_models.clusters import get_cluster
from cost_models.embedding import (HBM_ACHIEVED_FRACTION, ID_BYTES, NO_DENSE, DenseCost,
                                   EmbeddingConfig, PlacementCost, RankTime, ZERO, cost_of_loads,
                                   evaluate,
                                   lookup_shares, placement_loads, unique_rows)
from ir.embedding_tables import EmbeddingTable, TablePlacement, TableSharding
from planner.models import load_model
from planner.table_inventory import find_tables, hot_row_fraction, measured_shard_shares
from planner.table_greedy import greedy
from planner.table_placement import HEURISTIC_TIME_LIMIT_S, exact, plan_tables
from planner.table_problem import PlacementProblem, lower_bound

def cluster(nodes: int, per_node: int, **changes):
    """A datasheet A100 node resized; link and memory fields overridable."""
    spec = get_cluster("a100-80g", nodes=nodes, gpus_per_node=per_node)
    return dataclasses.replace(spec, **changes)


def table(name, rows, dim=64, ids=1, hot=None):
    return EmbeddingTable(name, rows, dim, "float32", "sum", ids, hot)


# ---- cost formulas, by hand ---------------------------------------------------------------

HAND = cluster(1, 2, hbm_gbps=1000.0, intra_node_gbps=100.0, intra_node_latency_s=5e-6,
               runtime_overhead_bytes=0)


def test_table_wise_terms_by_hand():
    t = table("t", rows=1000, dim=64, ids=2)
    config = EmbeddingConfig(global_batch=8)
    common, owned = placement_loads(t, TablePlacement("t", TableSharding.TABLE_WISE, (0,)), HAND, config)
    (rank, owner), = owned
    assert rank == 0
    hbm = 1000e9 * HBM_ACHIEVED_FRACTION
    ids, bags = 8 * 2, 8  # the owner serves all 16 ids of the global batch, 8 pooled bags
    # roofline: gather 16 rows of 64 fp32 + write 8 pooled rows
    assert owner.lookup_s == pytest.approx((16 + 8) * 64 * 4 / hbm)
    touched = 1000 * (1 - (1 - 1 / 1000) ** 16)  # occupancy: distinct rows of 16 draws
    state = 4  # row-wise Adagrad: one fp32 per row
    assert owner.update_s == pytest.approx(((8 + 16) * 64 * 4 + touched * (2 * 64 * 4 + 2 * state)) / hbm)
    assert owner.memory_bytes == 1000 * (64 * 4 + 4)
    # ids travel as (id, bag) int64 pairs; every rank also sends and gets a (count, bags)
    # int64 header per table from each of the 2 ranks
    pair, header = 2 * ID_BYTES, 2 * 2 * ID_BYTES
    assert owner.ids_recv_bytes == ids * pair and owner.out_send_bytes == bags * 64 * 4
    # every rank sends its 4 samples' 8 ids and gets 4 pooled rows back
    assert common.ids_send_bytes == 4 * 2 * pair + header and common.ids_recv_bytes == header
    assert common.out_recv_bytes == 4 * 64 * 4
    cost = evaluate([t], [TablePlacement("t", TableSharding.TABLE_WISE, (0,))], HAND, config, NO_DENSE)
    # pairwise-exchange all-to-all on one node: S (G-1)/n / B, S the larger of sent and
    # received, in three phases (ids, pooled forward, gradients backward); (n-1) alpha for
    # each of the executor's 4 calls (header, ids, pooled, gradients)
    bw = lambda nbytes: nbytes * 1 / 2 / 100e9  # noqa: E731
    calls = 4 * 1 * 5e-6
    rank0 = calls + bw(max(160, 288)) + 2 * bw(max(2048, 1024))
    rank1 = calls + bw(160) + 2 * bw(1024)
    assert cost.per_rank[0].comm_s == pytest.approx(rank0)
    assert cost.per_rank[1].comm_s == pytest.approx(rank1)
    assert cost.per_rank[1].lookup_s == 0 and cost.step_s == pytest.approx(cost.per_rank[0].total_s)


def test_tables_share_one_fused_exchange_per_dtype():
    """Sharded tables of one dtype share the executor's 4 calls per step (not 4 each);
    a table of another dtype is exchanged apart: 4 more."""
    a, b = table("a", rows=1000, dim=64, ids=2), table("b", rows=1000, dim=64, ids=2)
    half = dataclasses.replace(table("c", rows=1000, dim=64, ids=2), dtype="bfloat16")
    config = EmbeddingConfig(global_batch=8)
    one = evaluate([a], [TablePlacement("a", TableSharding.TABLE_WISE, (1,))], HAND, config,
                   NO_DENSE)
    two = evaluate([a, b], [TablePlacement("a", TableSharding.TABLE_WISE, (1,)),
                            TablePlacement("b", TableSharding.TABLE_WISE, (1,))],
                   HAND, config, NO_DENSE)
    mixed = evaluate([a, half], [TablePlacement("a", TableSharding.TABLE_WISE, (1,)),
                                 TablePlacement("c", TableSharding.TABLE_WISE, (1,))],
                     HAND, config, NO_DENSE)
    bw = lambda nbytes: nbytes * 1 / 2 / 100e9  # noqa: E731
    call_s = 5e-6  # (n-1) alpha, n = 2
    # rank 0 holds nothing: per table its header, its pairs out, its pooled rows back
    assert one.per_rank[0].comm_s == pytest.approx(4 * call_s + bw(160) + 2 * bw(1024))
    assert two.per_rank[0].comm_s == pytest.approx(4 * call_s + bw(320) + 2 * bw(2048))
    assert mixed.per_rank[0].comm_s == pytest.approx(8 * call_s + bw(320) + 2 * bw(1536))


def test_column_wise_adagrad_row_sums_are_one_more_call():
    """Row-wise Adagrad on column-wise tables: one more all-to-all a step for all of them
    (executors/sparse_optimizer.py `_column_totals`), each shard sending its touched
    rows' sums of squares to the table's k shards; SGD has none."""
    a, b = table("a", rows=1000, dim=64, ids=2), table("b", rows=1000, dim=64, ids=2)
    both = [TablePlacement("a", TableSharding.COLUMN_WISE, (0, 1)),
            TablePlacement("b", TableSharding.COLUMN_WISE, (0, 1))]
    adagrad = evaluate([a, b], both, HAND, EmbeddingConfig(global_batch=8), NO_DENSE)
    sgd = evaluate([a, b], both, HAND, EmbeddingConfig(global_batch=8, optimizer="sgd"), NO_DENSE)
    touched = 1000 * (1 - (1 - 1 / 1000) ** 16)  # distinct rows of 16 ids, per table
    sums_bytes = 2 * touched * 4 * 2  # 2 tables x rows x fp32 x 2 shards
    bw = lambda nbytes: nbytes * 1 / 2 / 100e9  # noqa: E731
    assert adagrad.per_rank[0].comm_s - sgd.per_rank[0].comm_s == pytest.approx(5e-6 + bw(sums_bytes))


def test_all_to_all_is_priced_from_the_profiled_fit():
    """`planner profile-cluster` fits all_to_all like every collective (CollectiveFit);
    a spec carrying the fit prices the table all-to-alls with its alpha and bandwidth,
    the fit for the node's group size first; without one, the spec's link figures."""
    from ir.cluster import CollectiveFit

    t = table("t", rows=1000, dim=64, ids=2)
    config = EmbeddingConfig(global_batch=8)
    p = [TablePlacement("t", TableSharding.TABLE_WISE, (0,))]
    alpha, bandwidth = 40e-6, 2e9  # a slow measured link: far from the spec's 5 us, 100 GB/s
    fits = (CollectiveFit("all_to_all", "intra_node", alpha, bandwidth, 2),
            CollectiveFit("all_to_all", "intra_node", 1.0, 1.0, 4),  # another group size
            CollectiveFit("all_reduce", "intra_node", 1.0, 1.0, 2))  # another collective
    fitted = evaluate([t], p, HAND.with_calibration(collective_fits=fits), config, NO_DENSE)
    bw = lambda nbytes: nbytes * 1 / 2 / bandwidth  # noqa: E731
    calls = 4 * 1 * alpha  # the executor's 4 calls, (n-1) alpha each
    assert fitted.per_rank[0].comm_s == pytest.approx(calls + bw(288) + 2 * bw(2048))
    assert fitted.per_rank[1].comm_s == pytest.approx(calls + bw(160) + 2 * bw(1024))
    plain = evaluate([t], p, HAND, config, NO_DENSE)
    assert plain.per_rank[0].comm_s < fitted.per_rank[0].comm_s / 5


def test_replicated_table_is_all_gathered_sparse_and_adam_state_by_hand():
    """A replicated table runs what executors/hybrid_step.py `all_gather_sparse` does: its
    coalesced sparse gradient (the local batch's distinct rows, int64 ids + fp32 rows)
    all-gathered in 3 calls (count, ids, rows), never a dense gradient all-reduce; every
    rank then steps the global batch's distinct rows."""
    t = table("t", rows=1000, dim=64, ids=2)
    config = EmbeddingConfig(global_batch=8, optimizer="adam")
    p = TablePlacement("t", TableSharding.REPLICATED, (0, 1))
    common, owned = placement_loads(t, p, HAND, config)
    assert owned == [] and not common.sharded
    # weight + Adam's two fp32 moments per element + the all-gathered sparse gradient:
    # the global batch's 8 x 2 looked-up rows of 64 fp32 with their int64 ids
    assert common.memory_bytes == 1000 * 64 * (4 + 8) + 8 * 2 * (64 * 4 + 8)
    cost = evaluate([t], [p], HAND, config, NO_DENSE)
    local = 1000 * (1 - (1 - 1 / 1000) ** 8)  # distinct rows of a rank's 4 x 2 ids
    ring = lambda result_bytes: 1 * 5e-6 + 1 / 2 * result_bytes / 100e9  # noqa: E731
    gathers = ring(2 * 8) + ring(2 * local * 8) + ring(2 * local * 64 * 4)
    assert cost.per_rank[0].comm_s == pytest.approx(gathers)
    assert cost.per_rank[1].comm_s == pytest.approx(gathers)
    hbm = 1000e9 * HBM_ACHIEVED_FRACTION
    touched = 1000 * (1 - (1 - 1 / 1000) ** 16)  # the global batch's distinct rows
    # local gathers (8 ids + 4 bags), the backward reads them again, the coalesce reads
    # both ranks' gathered rows, then Adam reads/writes weight and 2 moments per row
    assert cost.per_rank[0].lookup_s == pytest.approx((8 + 4) * 64 * 4 / hbm)
    assert cost.per_rank[0].update_s == pytest.approx(
        ((4 + 8) * 64 * 4 + 2 * local * 64 * 4 + touched * (2 * 64 * 4 + 2 * 8 * 64)) / hbm)


def test_unique_rows_occupancy_and_hot_rows():
    assert unique_rows(1, 10) == pytest.approx(1.0)
    assert unique_rows(10**9, 10) == pytest.approx(10.0)
    assert unique_rows(100, 1000) == pytest.approx(1000 * (1 - 0.999**100))
    # hot lookups revisit the same rows: fewer distinct rows
    assert unique_rows(10_000, 10**6, hot_fraction=0.9) < unique_rows(10_000, 10**6)


def test_range_shards_concentrate_hot_rows_hash_spreads_them():
    t = table("hot", rows=10_000, hot=0.5)
    served, rows = lookup_shares(t, TableSharding.ROW_RANGE, 4)
    assert rows == [0.25] * 4
    assert served[0] == pytest.approx(0.5 + 0.5 * (2500 - 100) / 9900)
    assert sum(served) == pytest.approx(1.0)
    hashed, hashed_rows = lookup_shares(t, TableSharding.ROW_HASH, 4)
    assert hashed == hashed_rows and max(hashed) < 0.4 and sum(hashed) == pytest.approx(1.0)


def test_imbalance_is_max_over_mean():
    cost = PlacementCost([RankTime(1.0, 0.0, 0.0), RankTime(2.0, 0.5, 0.5)], [0, 0], 1.0, 0.0)
    assert cost.imbalance == pytest.approx(3.0 / 2.0 - 1)
    assert cost.step_s == pytest.approx(3.0)


# ---- the exact search against brute force -------------------------------------------------


def brute_force(problem: PlacementProblem) -> float:
    """Every option of every table on every set of distinct ranks, priced by the cost
    model: the best step among the placements that fit."""
    per_table = []
    for opts in problem.options:
        choices = []
        for o in opts:
            if o.fixed_ranks is not None:
                choices.append((o, o.fixed_ranks))
            else:
                choices += [(o, ranks) for ranks in itertools.combinations(range(problem.n), len(o.pieces))]
        per_table.append(choices)
    best = math.inf
    for combo in itertools.product(*per_table):
        loads = [ZERO] * problem.n
        for o, ranks in combo:
            loads = [x + o.common for x in loads]
            for r, piece in zip(ranks, o.pieces):
                loads[r] = loads[r] + piece
        cost = cost_of_loads(loads, problem.cluster, problem.dense)
        if cost.fits:
            best = min(best, cost.step_s)
    return best


def random_tables(rng: random.Random, count: int) -> list[EmbeddingTable]:
    return [table(f"t{i}", rows=rng.choice([50, 5_000, 200_000, 3_000_000]),
                  dim=rng.choice([64, 128]), ids=rng.choice([1, 2, 8]),
                  hot=rng.choice([None, 0.3])) for i in range(count)]


# (tables, nodes, ranks per node, seed): 2-4 ranks, one case across two nodes (table-row-wise)
CASES = [(3, 1, 2, 0), (4, 1, 2, 1), (5, 1, 2, 2), (6, 1, 2, 8), (3, 1, 4, 3), (4, 1, 3, 4),
         (3, 2, 2, 5)]


@pytest.mark.parametrize("count,nodes,per_node,seed", CASES)
def test_exact_matches_brute_force(count, nodes, per_node, seed):
    rng = random.Random(seed)
    spec = cluster(nodes, per_node)
    dense = DenseCost(step_s=1e-4, state_bytes=1e9)
    problem = PlacementProblem(random_tables(rng, count), spec, EmbeddingConfig(global_batch=4096), dense)
    sol = exact(problem)
    expected = brute_force(problem)
    assert sol.cost.step_s == pytest.approx(expected, rel=1e-12)
    assert lower_bound(problem) <= expected * (1 + 1e-12)


def test_memory_wall_binds_and_is_respected():
    tables = [table(f"t{i}", rows=2_000_000, dim=128, ids=4) for i in range(4)]
    one_table = tables[0].rows * (128 * 4 + 4)
    # room for 1.5 tables a rank: two table-wise tables cannot share a rank, so the fourth
    # table must be split
    spec = cluster(1, 3, device_memory_bytes=int(1.5 * one_table) + 2**20, runtime_overhead_bytes=2**20)
    config = EmbeddingConfig(global_batch=3 * 1024)
    problem = PlacementProblem(tables, spec, config, NO_DENSE)
    sol = exact(problem)
    assert sol.cost.fits and max(sol.cost.memory_bytes) <= problem.capacity
    assert sol.cost.step_s == pytest.approx(brute_force(problem), rel=1e-12)
    # without the wall no plan is dearer (with fused exchanges the best split plan is as
    # cheap as any: the wall no longer costs time here)
    roomy = PlacementProblem(tables, cluster(1, 3), config, NO_DENSE)
    free = exact(roomy)
    assert free.cost.step_s <= sol.cost.step_s * (1 + 1e-12)
    assert free.cost.step_s == pytest.approx(brute_force(roomy), rel=1e-12)


# ---- the greedy baseline -------------------------------------------------------------------


def test_greedy_is_torchrec_lpt_on_table_wise():
    # big tables (replication's all-reduce is dear) whose cost grows with ids per sample:
    # each is table-wise; placed by descending perf on the least-loaded rank
    tables = [table(f"t{i}", rows=4_000_000, dim=128, ids=ids) for i, ids in enumerate([16, 12, 9, 8, 5])]
    problem = PlacementProblem(tables, cluster(1, 3), EmbeddingConfig(global_batch=3 * 4096), NO_DENSE)
    sol = greedy(problem)
    assert [o.sharding for o in sol.choice] == [TableSharding.TABLE_WISE] * 5
    f = [problem.f(o.pieces[0]) for o in sol.choice]
    assert f == sorted(f, reverse=True)
    # LPT by hand: 16->r0, 12->r1, 9->r2, 8->r2 (9 < 12 < 16), 5->r1 (12 < 16 < 17)
    assert sol.ranks == [(0,), (1,), (2,), (2,), (1,)]


def test_greedy_skips_ranks_without_room():
    tables = [table(f"t{i}", rows=2_000_000, dim=128, ids=ids) for i, ids in enumerate([16, 12, 1])]
    one_table = 2_000_000 * (128 * 4 + 4)
    spec = cluster(1, 2, device_memory_bytes=int(1.5 * one_table) + 2**20, runtime_overhead_bytes=2**20)
    problem = PlacementProblem(tables, spec, EmbeddingConfig(global_batch=2 * 4096), NO_DENSE)
    sol = greedy(problem)
    # t0 -> r0, t1 -> r1; neither rank has room for the whole third table, so (TorchRec's
    # proposer) it falls back to its next-best option, whose halves fit
    assert sol.ranks[0] == (0,) and sol.ranks[1] == (1,)
    assert sol.choice[2].sharding is not TableSharding.TABLE_WISE and len(sol.ranks[2]) == 2
    assert sol.cost.fits


def test_heuristic_beats_or_ties_greedy_within_its_bound():
    rng = random.Random(7)
    tables = random_tables(rng, 14)
    spec = cluster(2, 4)
    dense = DenseCost(step_s=2e-4, state_bytes=1e9)
    plan = plan_tables(tables, spec, EmbeddingConfig(global_batch=8 * 2048), dense)
    assert plan.method == "heuristic" and plan.cost.fits
    assert plan.cost.step_s <= plan.greedy_cost.step_s * (1 + 1e-12)
    assert plan.lower_bound_s <= plan.cost.step_s
    assert {p.table for p in plan.placements} == {t.name for t in tables}


# ---- the inventory -------------------------------------------------------------------------


def test_find_tables_reads_bags_and_sequences():
    loaded = load_model("dlrm-small", micro_batch=3, device="meta")
    found = find_tables(loaded.module, loaded.inputs)
    assert [(t.name, t.rows, t.dim, t.pooling, t.ids_per_sample) for t in found] == \
        [(f"tables.{i}", 100, 16, "sum", 2) for i in range(4)]
    gpt = load_model("gpt-tiny", micro_batch=2, device="meta")
    tokens = [t for t in find_tables(gpt.module, gpt.inputs) if t.rows == 128]
    assert tokens and tokens[0].pooling is None and tokens[0].ids_per_sample == 32


def test_criteo_preset_has_the_mlperf_tables():
    loaded = load_model("dlrm-criteo-tb", micro_batch=2, device="meta")
    found = find_tables(loaded.module, loaded.inputs)
    assert len(found) == 26 and sum(t.rows for t in found) == 204_184_588
    assert max(t.rows for t in found) == 40_000_000 and {t.dim for t in found} == {128}


# The planning bar, Criteo-Terabyte's 26 tables on 2 x 8 A100 in under 5 s of
# wall time, is bench/bench_table_placement.py's PLAN_TARGET_S: a wall clock on a shared
# machine is a benchmark's figure (1.4-2.2 s here at load 8), not a test's. The test
# keeps a loose bound that catches a heuristic ignoring its own time limit.
HEURISTIC_LIMIT_MARGIN = 4  # x HEURISTIC_TIME_LIMIT_S: 1.4-2.2 s read at load 8 for 1.5 s
CRITEO_IMBALANCE_TARGET = 0.10


def test_criteo_tb_on_2x8_a100_plans_fast_balanced_and_no_worse_than_greedy(capsys):
    from planner.cli import main

    assert main(["plan-tables", "dlrm-criteo-tb", "--cluster", "a100-80g", "--nodes", "2",
                 "--global-batch", "65536", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["world_size"] == 16
    assert len(report["placements"]) == 26  # every table placed
    ours, greedy = report["predicted"], report["greedy"]["predicted"]
    assert ours["fits"] and max(r["memory_bytes"] for r in ours["ranks"]) <= ours["capacity_bytes"]
    assert ours["imbalance"] <= CRITEO_IMBALANCE_TARGET, ours["imbalance"]
    assert ours["step_s"] <= greedy["step_s"] * (1 + 1e-12)
    assert report["plan_s"] < HEURISTIC_LIMIT_MARGIN * HEURISTIC_TIME_LIMIT_S, report["plan_s"]
    # the table for people prints both plans' steps, side by side
    assert main(["plan-tables", "dlrm-criteo-tb", "--cluster", "a100-80g", "--nodes", "2",
                 "--global-batch", "65536"]) == 0
    text = capsys.readouterr().out
    assert "plan (" in text and "TorchRec-style greedy  step" in text and "speed-up over greedy" in text


def test_measured_profile():
    ids = torch.tensor([0] * 90 + list(range(1, 11)))
    assert hot_row_fraction(ids, 100) == pytest.approx(0.9)
    t = table("m", rows=10)
    assert measured_shard_shares(t, torch.tensor([0, 1, 2, 7]), TableSharding.ROW_RANGE, 2) == [0.75, 0.25]
    shares = measured_shard_shares(t, torch.arange(10), TableSharding.ROW_HASH, 2)
    assert sum(shares) == pytest.approx(1.0)


# ---- the command ---------------------------------------------------------------------------


def test_plan_tables_command_writes_json(tmp_path, capsys):
    from planner.cli import main

    out = tmp_path / "tables.json"
    rc = main(["plan-tables", "dlrm-small", "--cluster", "a100-80g", "--gpus-per-node", "2",
               "--global-batch", "64", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "TorchRec-style greedy" in text and "lower bound" in text
    import json

    doc = json.loads(out.read_text())  # a whole plan file, the placement printed above
    assert doc["schema"] == "planner.plan/v1" and doc["search"]["tables"]["method"] == "exact"
    placed = doc["embedding_tables"]["tables"]
    assert [p["table"] for p in placed] == [f"tables.{i}" for i in range(4)]
    for p in placed:
        assert p["table"] in text and p["sharding"] in text
    tables = doc["search"]["tables"]
    assert tables["step_s"] <= tables["greedy_step_s"] * (1 + 1e-12)
    from ir.plan import load_plan
    plan = load_plan(out).plan
    assert plan.world_size == 2 and [t.placement.sharding.value for t in plan.embeddings.tables] \
        == [p["sharding"] for p in placed]
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary behind
    rc = main(["plan-tables", "dlrm-small", "--cluster", "a100-80g", "--gpus-per-node", "2",
               "--global-batch", "64", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["schema"] == "planner.table_plan/v1" and report["method"] == "exact"
    assert report["predicted"]["step_s"] <= report["greedy"]["predicted"]["step_s"] * (1 + 1e-12)
    assert main(["plan-tables", "dlrm-small", "--cluster", "a100-80g", "--global-batch", "9"]) == 2


def test_hot_rows_make_range_sharding_slower_than_hash():
    hot = table("hot", rows=4_000_000, dim=128, ids=8, hot=0.6)
    spec = cluster(1, 4)
    config = EmbeddingConfig(global_batch=4 * 4096)

    def slowest(sharding):
        cost = evaluate([hot], [TablePlacement("hot", sharding, (0, 1, 2, 3))], spec, config, NO_DENSE)
        return cost.max_embedding_s, cost.imbalance

    (range_s, range_imbalance), (hash_s, hash_imbalance) = (slowest(TableSharding.ROW_RANGE),
                                                            slowest(TableSharding.ROW_HASH))
    assert range_s > hash_s and range_imbalance > 2 * hash_imbalance
    # without a hot-row profile the even key ranges balance at least as well as the ring
    cold = dataclasses.replace(hot, hot_row_fraction=None)
    even = evaluate([cold], [TablePlacement("hot", TableSharding.ROW_RANGE, (0, 1, 2, 3))], spec,
                    config, NO_DENSE)
    assert even.imbalance < range_imbalance


def test_plan_tables_measures_hot_rows_from_an_id_sample(tmp_path):
    from planner.commands.plan_tables import profile_tables

    loaded = load_model("dlrm-small", micro_batch=2, device="meta")
    tables = find_tables(loaded.module, loaded.inputs)
    path = tmp_path / "ids.pt"
    torch.save({"tables.1": torch.tensor([5] * 9 + [6])}, path)
    profiled = profile_tables(tables, str(path))
    assert profiled[1].hot_row_fraction == pytest.approx(0.9)
    assert profiled[0].hot_row_fraction is None
    torch.save({"tables.9": torch.tensor([1])}, path)
    from ir.errors import PlannerError
    with pytest.raises(PlannerError, match="no table named tables.9"):
        profile_tables(tables, str(path))


def test_auto_falls_back_to_the_heuristic_when_exact_runs_out_of_time(monkeypatch):
    import planner.table_placement as tp

    tables = random_tables(random.Random(3), 5)
    spec = cluster(1, 2)
    config = EmbeddingConfig(global_batch=2048)
    assert plan_tables(tables, spec, config, NO_DENSE).method == "exact"
    monkeypatch.setattr(tp, "EXACT_TIME_LIMIT_S", 0.0)
    plan = plan_tables(tables, spec, config, NO_DENSE)
    assert plan.method == "heuristic" and plan.cost.fits


def test_host_op_counts_match_the_executor():
    """The cost model's host ops (EXECUTOR_HOST_OPS_*) are what the executor runs: counted
    here with a TorchDispatchMode on a one-rank group, a model of 1 and of 3 table-wise
    tables with `table_inputs` (one fused exchange), a lookup, its backward and a row-wise
    Adagrad step; per table = the difference / 2, per exchange = the rest."""
    import torch.distributed as dist
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode

    from cost_models.embedding import (EXECUTOR_HOST_OPS_BACKWARD_PER_EXCHANGE,
                                       EXECUTOR_HOST_OPS_FORWARD,
                                       EXECUTOR_HOST_OPS_FORWARD_PER_EXCHANGE,
                                       EXECUTOR_HOST_OPS_UPDATE)
    from executors.sharded_embedding import apply_table_placements
    from executors.sparse_optimizer import SparseOptimizerSpec, SparseRowOptimizer

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    class Tables(nn.Module):
        def __init__(self, count):
            super().__init__()
            self.tables = nn.ModuleList(nn.EmbeddingBag(1000, 32, mode="sum")
                                        for _ in range(count))

        def table_inputs(self, ids):
            return {f"tables.{i}": ids[:, i] for i in range(len(self.tables))}

        def forward(self, ids):  # (bags, tables, ids per bag)
            return [t(ids[:, i]) for i, t in enumerate(self.tables)]

    def counts(count):
        model = Tables(count)
        tables = apply_table_placements(model, [TablePlacement(f"tables.{i}", TableSharding.TABLE_WISE, (0,))
                                                for i in range(count)])
        opt = SparseRowOptimizer(tables, SparseOptimizerSpec("rowwise_adagrad", 0.01))
        ids = torch.randint(0, 1000, (16, count, 4))
        for _ in range(2):  # the first is a warm-up
            forward, update = Count(), Count()
            with forward:
                outs = model(ids)
            loss = sum(out.sum() for out in outs)
            with update:
                loss.backward()
                opt.step()
                opt.zero_grad()
        return forward.ops, update.ops

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        (f1, u1), (f3, u3) = counts(1), counts(3)
    finally:
        if owned:
            dist.destroy_process_group()
    # the model's own ops are not the tables': per table 2 id slices forward (forward's,
    # table_inputs'), the loss's sum and add backward
    per_table_forward, per_table_update = (f3 - f1) / 2 - 2, (u3 - u1) / 2 - 2
    assert abs(per_table_forward - EXECUTOR_HOST_OPS_FORWARD) <= 2, per_table_forward
    assert abs(per_table_update - EXECUTOR_HOST_OPS_UPDATE) <= 3, per_table_update
    assert abs(f1 - (per_table_forward + 2) - EXECUTOR_HOST_OPS_FORWARD_PER_EXCHANGE) <= 2, f1
    assert abs(u1 - (per_table_update + 2) - EXECUTOR_HOST_OPS_BACKWARD_PER_EXCHANGE) <= 2, u1
    cpu = cluster(1, 2, op_overhead_s=1e-5, device="cpu")
    assert cpu.host_bound
    config = EmbeddingConfig(global_batch=8)
    t = table("t", rows=1000, dim=64)
    plain, _ = placement_loads(t, TablePlacement("t", TableSharding.TABLE_WISE, (0,)), HAND, config)
    host, _ = placement_loads(t, TablePlacement("t", TableSharding.TABLE_WISE, (0,)), cpu, config)
    assert host.lookup_s - plain.lookup_s == pytest.approx(EXECUTOR_HOST_OPS_FORWARD * 1e-5)


def test_criteo_tb_hybrid_plan_prices_no_dense_table_gradients(capsys):
    """`planner plan` of the Criteo-TB DLRM prices the dense MLPs by the estimate and the
    tables by the placement only: the executor never writes a table's dense gradient
    (it steps looked-up rows), so the step is milliseconds. Pricing the tables' traced
    dense backward (a 40M x 128 fp32 gradient per large table, bytes wrongly scaled by
    the 4096 samples per rank) once predicted 118 s."""
    from planner.cli import main

    assert main(["plan", "dlrm-criteo-tb", "--cluster", "a100-80g", "--nodes", "2",
                 "--global-batch", "65536", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    predicted = report.get("predicted", report)
    assert predicted["iteration_seconds"] < 0.01, predicted["iteration_seconds"]
    assert predicted["time"]["embedding"] > 0


def test_pinned_shardings_cycle_over_the_tables_and_a_bad_pin_is_one_line():
    """`plan-tables --sharding a,b`: table i takes pins[i % len(pins)], ranks searched."""
    from ir.errors import PlannerError

    tables = [table(f"t{i}", rows=5_000, dim=64, ids=2) for i in range(4)]
    config = EmbeddingConfig(global_batch=4 * 256)
    pins = [TableSharding.TABLE_WISE, TableSharding.ROW_RANGE]
    plan = plan_tables(tables, cluster(1, 4), config, NO_DENSE, pins=pins)
    assert [p.sharding for p in plan.placements] == pins * 2
    assert [p.sharding for p in plan.greedy_placements] == pins * 2
    assert plan.lower_bound_s <= plan.cost.step_s * (1 + 1e-12)
    # 64 columns split in 4 leaves 16 < MIN_SHARD_COLUMNS: column-wise on 4 ranks is no option
    narrow = [table("n", rows=5_000, dim=16, ids=2)]
    with pytest.raises(PlannerError, match="table n: column_wise is not one of its options"):
        plan_tables(narrow, cluster(1, 4), config, NO_DENSE, pins=[TableSharding.COLUMN_WISE])
