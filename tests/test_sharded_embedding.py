"""Sharded embedding tables on 2 and 4 gloo ranks equal one-process training (issue 18):
table-wise, row-wise by range and by hash, column-wise, table-row-wise and mixed
placements, with SGD, row-wise Adagrad and lazy Adam, over 3 steps; rows nobody looked up
keep their values and optimizer state bit for bit; impossible placements are refused."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from executors.sharded_embedding import apply_table_placements
from ir.embedding_tables import TablePlacement, TableSharding as K, init_table_rows, mix64
from ir.errors import PlannerError
from planner.zoo.criteo_data import CriteoSynthetic
from tests import sharded_dlrm as S
from tests import sharded_phases as P
from tests.dist_utils import free_port, spawn

PLACEMENTS = ("table_wise", "row_range", "row_hash", "column_wise", "table_row_wise", "mixed")
OPTIMIZERS = ("sgd", "rowwise_adagrad", "adam")
# Which (placement, optimizer) runs each world size does: 4 ranks all of them, 2 ranks
# every placement with SGD and with one of row-wise Adagrad / Adam (alternating), and
# mixed with all three (the bar: each placement with SGD and with Adagrad or Adam).
RUNS = {4: [(p, o) for p in PLACEMENTS for o in OPTIMIZERS],
        2: [(p, o) for i, p in enumerate(PLACEMENTS)
            for o in ("sgd", ("rowwise_adagrad", "adam")[i % 2])] + [("mixed", "rowwise_adagrad")]}
RTOL = 1e-5  # the bar: equal to one process within 1e-5 relative
# Clipping by global norm at 2 ranks (`S.CLIP_MAX_NORMS`): `mixed` holds a replicated,
# a table-wise, a row-wise (range and hash) and a column-wise table, with every optimizer.
CLIP_RUNS = [("mixed", o) for o in OPTIMIZERS] + [("table_wise", "sgd")]


@pytest.fixture(scope="module")
def references():
    return {kind: S.reference_run(kind) for kind in OPTIMIZERS}


@pytest.fixture(scope="module")
def phases(tmp_path_factory):
    """Every multi-rank check in one spawned 4-rank job (tests/sharded_phases.py)."""
    payload = {"runs": RUNS, "checkpoint_dir": str(tmp_path_factory.mktemp("ckpt")),
               "ports": [free_port(), free_port()], "clip_runs": CLIP_RUNS}
    return spawn(P.all_phases, 4, payload, timeout_s=400)


@pytest.fixture(scope="module", params=[2, 4])
def sharded(request, phases):
    world = request.param
    return world, [r[f"eq{world}"] for r in phases[:world]]


def test_every_placement_runs_with_sgd_and_a_stateful_optimizer_on_2_and_4_ranks():
    for world, runs in RUNS.items():
        for placement in PLACEMENTS:
            kinds = {o for p, o in runs if p == placement}
            assert "sgd" in kinds and kinds & {"rowwise_adagrad", "adam"}, (world, placement)


def test_equals_one_process(sharded, references):
    world, ranks = sharded
    for key in RUNS[world]:
        placement_kind, kind = key
        ref = references[kind]
        where = f"{world} ranks, {placement_kind}, {kind}"
        S.assert_run_matches(ranks, key, ref, where, RTOL)


@pytest.fixture(scope="module")
def clipped_references():
    return {kind: S.reference_run(kind, S.CLIP_MAX_NORMS) for kind in OPTIMIZERS}


def test_clipped_reference_clips_two_steps_by_over_4x_and_leaves_one(clipped_references):
    """The clipped runs cannot pass unclipped: steps 0 and 2 have norms over 4 x max_norm,
    step 1 is under it (coefficient 1); the replicated table (tables.0 in `mixed`) looks
    up some id twice within one rank's half of a batch and some id on both ranks."""
    for kind, ref in clipped_references.items():
        norms, limits = ref["norms"], S.CLIP_MAX_NORMS
        assert norms[0] > 4 * limits[0] and norms[2] > 4 * limits[2], (kind, norms)
        assert norms[1] < limits[1], (kind, norms)
    halves = [S.DATA.batch(0, S.GLOBAL_BATCH, part=(r, 2))[0]["sparse"][:, 0] for r in range(2)]
    assert all(len(h.unique()) < h.numel() for h in halves)
    assert len(set(halves[0].unique().tolist()) & set(halves[1].unique().tolist())) > 0


def test_clipped_runs_equal_one_process_clipped(phases, clipped_references):
    """HybridTrainer(max_grad_norm=) on 2 ranks equals one process whose tables have dense
    gradients, clipped by torch's clip_grad_norm_: every rank's norm of every step, the
    losses, tables, optimizer state, (clipped) dense gradients and parameters."""
    ranks = [r["clip2"] for r in phases[:2]]
    for key in CLIP_RUNS:
        ref = clipped_references[key[1]]
        where = f"2 ranks clipped, {key[0]}, {key[1]}"
        for r in ranks:
            torch.testing.assert_close(torch.tensor(r[key]["norms"]), torch.tensor(ref["norms"]),
                                       rtol=RTOL, atol=0, msg=lambda m: f"{where}: norms {m}")
        S.assert_run_matches(ranks, key, ref, where, RTOL)


def test_every_step_makes_four_all_to_alls_whatever_the_table_count(sharded):
    """The DLRM's 5 tables (4 sharded in `mixed`) share one exchange per phase: header,
    ids, pooled bags, gradients — 4 all_to_all_single calls a step on every rank, and
    with row-wise Adagrad and column-wise tables one more for all their row sums."""
    world, ranks = sharded
    for r in ranks:
        for (placement, kind), run in r.items():
            extra = kind == "rowwise_adagrad" and placement in ("column_wise", "mixed")
            assert run["all_to_all_calls"] == (4 + extra) * S.STEPS, \
                (world, placement, kind, run["all_to_all_calls"])


def test_untouched_rows_keep_values_and_state(sharded):
    world, ranks = sharded
    for key in RUNS[world]:
        # every run checked some rows nobody looked up (64 rows, <= 48 ids per table-step)
        assert sum(r[key]["untouched"] for r in ranks) > 0, key


# ------------------------------------------------------------------ refused before running


def _model():
    return S.build_model()


@pytest.mark.parametrize("placement, needle", [
    (TablePlacement("tables.0", K.TABLE_ROW_WISE, (1, 2)), "span nodes"),
    (TablePlacement("tables.0", K.COLUMN_WISE, tuple(range(9))), "8 columns cannot split"),
    (TablePlacement("tables.0", K.ROW_RANGE, (0, 4)), "outside the 4 ranks"),
    (TablePlacement("tables.0", K.REPLICATED, (0, 1)), "every rank"),
])
def test_impossible_placement_is_one_line_error(placement, needle):
    world = 9 if placement.sharding is K.COLUMN_WISE else 4
    others = [TablePlacement(n, K.TABLE_WISE, (0,)) for n in S.names()[1:]]
    with pytest.raises(PlannerError, match=needle) as info:
        apply_table_placements(_model(), [placement] + others, node_size=2, rank=0,
                               world_size=world)
    assert "tables.0" in str(info.value) and "\n" not in str(info.value)


def test_ranks_with_different_placements_all_refuse(phases):
    messages = {r["disagreement"] for r in phases}
    assert len(messages) == 1, messages  # the same one line on every rank
    message = messages.pop()
    assert message.startswith("table tables.2: ranks [1] place it differently"), message


def test_every_table_needs_a_placement_and_a_summable_mode():
    with pytest.raises(PlannerError, match="tables.4: no placement"):
        apply_table_placements(_model(), [TablePlacement(n, K.TABLE_WISE, (0,))
                                          for n in S.names()[:4]], rank=0, world_size=2)
    model = _model()
    model.tables["2"] = nn.EmbeddingBag(64, 8, mode="max")
    with pytest.raises(PlannerError, match="tables.2: mode 'max'"):
        apply_table_placements(model, [TablePlacement(n, K.TABLE_WISE, (0,)) for n in S.names()],
                               rank=0, world_size=2)


def test_meta_table_without_init_is_refused():
    model = _model()
    model.tables["1"].to("meta")
    with pytest.raises(PlannerError, match="tables.1 is on the meta device"):
        apply_table_placements(model, [TablePlacement(n, K.TABLE_WISE, (0,)) for n in S.names()],
                               rank=0, world_size=1)


def test_embedding_and_mean_bags_with_offsets(phases):
    """nn.Embedding (every id its own row out) and mode="mean" bags given as flat ids with
    offsets, empty bags included: outputs and row gradients equal the unsharded modules'."""
    for r in phases:
        for case, error in r["lookup_variants"].items():
            assert error <= 1e-6, f"{case}: differs by {error:.2e}"


# ------------------------------------------------------------------ resharding checkpoints


def test_checkpoint_reshards_4_to_2_to_4(phases):
    """Saved at 4 ranks after 2 steps, resumed on 2 for 2 steps, saved, resumed on 4:
    the losses are those of the uninterrupted 4-rank run. Not bit for bit: 2 ranks add
    the dense gradients and the partial bags in another order (1 ulp-level differences),
    so the bar is 1e-6 relative; a same-layout reload is bit for bit."""
    straight = phases[0]["straight"]
    resumed = phases[0]["resumed"]
    assert len(resumed) == len(straight) == P.ELASTIC_STEPS
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(straight), rtol=1e-6, atol=0)
    for r in phases:  # every rank resumed at the saved steps and agrees on the losses
        assert r["resumed_at_step"][-1] == 4 and r["roundtrip_equal"]
        assert r["resumed_tail"] == phases[0]["resumed_tail"]
    assert phases[0]["resumed_at_step"] == [2, 4]


# ------------------------------------------------------------------ memory


def test_tables_three_times_a_rank_budget_train_on_4_ranks(phases):
    budget = P.TABLE_BUDGET_BYTES
    for rank, r in enumerate(phases):
        m = r["memory"]
        print(f"rank {rank}: holds {m['held_bytes'] / 2**20:.1f} MiB of "
              f"{m['tables_bytes'] / 2**20:.0f} MiB of tables; peak RSS "
              f"{m['peak_rss_bytes'] / 2**20:.0f} MiB (phase start "
              f"{m['rss_start_bytes'] / 2**20:.0f} MiB, budget {budget / 2**20:.0f} MiB)")
        assert m["tables_bytes"] >= 3 * budget
        assert all(math.isfinite(x) for x in m["losses"])
        assert all(rows * dim * 4 < m["table_bytes"] for rows, dim in m["held_shapes"].values())
        # RLIMIT_AS bounds the address space; resident pages can also grow inside space
        # mapped before the phase (heap, thread stacks), so RSS is bounded by what a rank
        # holding a whole table besides its shards would exceed: its shards + 1/2 table.
        growth = m["peak_rss_bytes"] - m["rss_start_bytes"]
        assert growth < m["held_bytes"] + m["table_bytes"] // 2, (rank, growth)


# ------------------------------------------------------------------ pure logic


def test_mix64_is_splitmix64():
    # splitmix64 seeded with 0 first returns 0xE220A8397B1DCDAF (Vigna's reference C code)
    value = int(mix64(torch.tensor([0]), 0)) & ((1 << 64) - 1)
    assert value == 0xE220A8397B1DCDAF
    assert (mix64(torch.arange(10_000), 5) < 0).any()  # the sign bit is used


def test_any_shard_of_the_row_initializer_equals_the_full_build():
    full = init_table_rows("t", 3, torch.arange(5000), 0, 16, 16, 0.25)
    rows = torch.tensor([4999, 7, 4096, 4095])  # across INIT_CHUNK_ROWS boundaries
    assert torch.equal(init_table_rows("t", 3, rows, 5, 11, 16, 0.25), full[rows, 5:11])
    assert full.abs().max() <= 0.25 and abs(float(full.mean())) < 0.01
    assert not torch.equal(init_table_rows("u", 3, rows, 0, 16, 16, 0.25), full[rows])


def test_criteo_batches_are_deterministic_shardable_and_power_law():
    data = CriteoSynthetic(rows_per_table=(10_000, 50), lookups_per_table=2, seed=1)
    inputs, clicks = data.batch(4, 4000)
    again, _ = data.batch(4, 4000)
    assert torch.equal(inputs["sparse"], again["sparse"]) and inputs["dense"].shape == (4000, 13)
    parts = [data.batch(4, 4000, part=(r, 4)) for r in range(4)]
    assert torch.equal(torch.cat([p[0]["sparse"] for p in parts]), inputs["sparse"])
    assert torch.equal(torch.cat([p[1] for p in parts]), clicks)
    counts = torch.bincount(inputs["sparse"][:, 0].reshape(-1), minlength=10_000)
    hot = counts.sort(descending=True).values[:100].sum() / counts.sum()
    assert hot > 0.3  # the hottest 1% of rows take >30% of lookups (uniform: 1%)
    assert inputs["sparse"][:, 0].max() > 5000  # hot ids are hashed over the whole range
    assert 0.1 < float(clicks.mean()) < 0.45


def test_tables_share_one_exchange_per_phase(monkeypatch):
    """A model with `table_inputs` (the zoo's DLRM) exchanges all its sharded tables in 4
    all_to_all_single calls per step (header, ids, pooled, gradients), not 4 per table,
    with the same losses and gradients as one exchange per table (no table_inputs)."""
    import torch.distributed as dist

    from executors import table_exchange
    from executors.sharded_embedding import ShardedEmbedding

    calls = []
    real = dist.all_to_all_single

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(table_exchange.dist, "all_to_all_single", counted)
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        inputs, clicks = S.DATA.batch(0, S.GLOBAL_BATCH)
        results = []
        for fused in (True, False):
            model = S.build_model()
            if not fused:
                model.table_inputs = None  # no prefetch: each table call exchanges alone
            apply_table_placements(model, S.placements("row_range", 1))
            calls.clear()
            loss = S.dlrm.loss_fn(model(**inputs), clicks)
            loss.backward()
            grads = {n: m.weight.grad.coalesce().to_dense() for n, m in model.named_modules()
                     if isinstance(m, ShardedEmbedding)}
            results.append((len(calls), loss.detach(), grads))
    finally:
        if owned:
            dist.destroy_process_group()
    (fused_calls, fused_loss, fused_grads), (alone_calls, alone_loss, alone_grads) = results
    assert fused_calls == 4
    assert alone_calls == 4 * S.CONFIG.num_tables
    assert torch.equal(fused_loss, alone_loss)
    assert fused_grads.keys() == alone_grads.keys() and len(fused_grads) == S.CONFIG.num_tables
    for name in fused_grads:
        assert torch.equal(fused_grads[name], alone_grads[name]), name
