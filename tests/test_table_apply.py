"""`auto_parallel` on a recommendation model (issue 18): with no plan it searches the
dense part and places the tables, `executors.apply` swaps the tables for their sharded
modules and the training step uses the row-sparse optimizer for them and the user's
optimizer for the rest; 3 steps on 2 and 4 gloo ranks equal one-process training within
1e-5, searched and with every sharding at once, also on a meta-built model; a checkpoint saved on 4 ranks under the
model's own parameter names resumes on 2 ranks and back on 4 with the losses of an
uninterrupted run. Compared each step: the dense gradients (Adam is blind to their scale),
and at the end the dense parameters, under Adam on the scale they travelled
(`sharded_dlrm.adam_travel_bound`)."""

from __future__ import annotations

import pytest
import torch

from ir.plan import plan_from_dict
from tests import sharded_dlrm as S
from tests import table_apply_phases as T
from tests.dist_utils import spawn

RTOL = 1e-5  # the bar (Adam's dense parameters: relative to max|p| + its travel)
# 4 ranks: every optimizer; 2 ranks: a searched and a mixed run. The checkpoint run
# trains Adam (dense Adam + lazy sparse Adam: both keep per-element state).
# "meta": the mixed placement on a model built on the meta device (each rank makes only
# its shards, with the row initializer), equal to the CPU-built run. "clipped": mixed,
# `max_grad_norm` (S.CLIP_MAX_NORMS), against the clipped one-process reference.
RUNS = {4: [("sgd", "searched"), ("rowwise_adagrad", "mixed"), ("adam", "mixed"),
            ("sgd", "meta")],
        2: [("adam", "searched"), ("sgd", "mixed"), ("rowwise_adagrad", "clipped")]}
ELASTIC_KIND = "adam"
ELASTIC_STEPS = 6


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three spawned jobs: 4 ranks (runs, then 6 straight steps saving after 2), 2 ranks
    (runs, then resume at 2 and save after 4), 4 ranks (resume at 4, 2 steps)."""
    folder = str(tmp_path_factory.mktemp("ckpt"))
    first = spawn(T.phase, 4, {"runs": RUNS[4], "checkpoint": {
        "kind": ELASTIC_KIND, "steps": ELASTIC_STEPS, "save_after": 2, "directory": folder}},
        timeout_s=500)
    second = spawn(T.phase, 2, {"runs": RUNS[2], "checkpoint": {
        "kind": ELASTIC_KIND, "steps": 2, "resume": first[0]["saved"], "save_after": 4,
        "directory": folder}}, timeout_s=500)
    third = spawn(T.phase, 4, {"checkpoint": {
        "kind": ELASTIC_KIND, "steps": 2, "resume": second[0]["saved"]}}, timeout_s=500)
    return {"first": first, "second": second, "third": third, "folder": folder}


@pytest.fixture(scope="module")
def references():
    clipped = {key for runs in RUNS.values() for key in runs if key[1] == "clipped"}
    return {**{kind: S.reference_run(kind) for kind in ("sgd", "rowwise_adagrad", "adam")},
            **{key: S.reference_run(key[0], S.CLIP_MAX_NORMS) for key in clipped}}


@pytest.mark.parametrize("world", [2, 4])
def test_auto_parallel_equals_one_process(runs, references, world):
    ranks = runs["first"] if world == 4 else runs["second"]
    for key in RUNS[world]:
        kind, given = key
        ref = references[key] if given == "clipped" else references[kind]
        where = f"{world} ranks, {given} placement, {kind}"
        S.assert_run_matches(ranks, key, ref, where, RTOL)
        if given == "clipped":  # every rank's norm of every step, before the clip
            for r in ranks:
                assert r[key]["norms"] == pytest.approx(ref["norms"], rel=RTOL), where


def test_adam_travel_bound_bounds_adam_and_is_reached():
    """Torch Adam moves no element further than the bound; a gradient of constant sign
    moves it by the bound within 1% (so the scale is not loose)."""
    lr, steps = S.LR["adam"], S.STEPS
    bound = S.adam_travel_bound(lr, steps)
    torch.manual_seed(0)
    p = torch.zeros(4096, requires_grad=True)
    opt = torch.optim.Adam([p], lr=lr, betas=S.ADAM_BETAS)
    scales = torch.logspace(-6, 2, steps)  # growing, shrinking and sign-flipping gradients
    for t in range(steps):
        p.grad = torch.randn(4096) * scales[(t * 2) % steps]
        opt.step()
    assert float(p.detach().abs().max()) <= bound
    q = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([q], lr=lr, betas=S.ADAM_BETAS)
    for _ in range(steps):
        q.grad = torch.ones(1)
        opt.step()
    assert 0.99 * bound <= float(q.detach().abs()) <= bound


def test_searched_plan_places_every_table_and_runs_the_sharded_modules(runs):
    doc = plan_from_dict(runs["first"][0]["doc"], "<auto_parallel plan>")
    plan = doc.plan
    assert plan.embeddings is not None and plan.pp == 1
    assert [t.table.name for t in plan.embeddings.tables] == S.names()
    assert all(s.tp == 1 and s.dp == 4 for s in plan.layer_strategies)
    assert doc.predicted["time"]["embedding"] > 0 and len(doc.predicted["embedding"]["ranks"]) == 4
    assert doc.search["tables"]["greedy_step_s"] is not None
    mixed = runs["first"][0][("adam", "mixed")]
    assert mixed["modules"] == {"tables.0": "ReplicatedEmbedding",
                                **{n: "ShardedEmbedding" for n in S.names()[1:]}}
    assert any("row_hash" in p for p in mixed["placements"])


def test_checkpoint_uses_model_names_and_reshards_4_2_4(runs):
    straight = runs["first"][0]["checkpoint"]["losses"]
    assert len(straight) == ELASTIC_STEPS
    resumed = runs["second"][0]["checkpoint"]["losses"] + runs["third"][0]["checkpoint"]["losses"]
    assert runs["second"][0]["checkpoint"]["start"] == 2
    assert runs["third"][0]["checkpoint"]["start"] == 4
    # 2 ranks sum gradients in another order: ulp-level differences, hence 1e-6
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(straight[2:]), rtol=1e-6,
                               atol=0)
    from torch.distributed.checkpoint import FileSystemReader
    keys = set(FileSystemReader(runs["second"][0]["saved"]).read_metadata().state_dict_metadata)
    assert {f"model/{n}.weight" for n in S.names()} <= keys
    assert {f"optim/{n}.weight/{slot}" for n in S.names()[1:]
            for slot in ("exp_avg", "exp_avg_sq", "step")} <= keys
    assert not any(k.startswith("tables/") for k in keys)


def test_validate_reference_clips_tables_as_their_dense_gradients():
    """`planner validate`'s one-process reference of a clipping plan with tables
    (`planner.trial.reference._SparseTables.clip`): torch has no norm of a sparse
    gradient, so the clip sees the tables' gradients dense; after it the whole model's
    gradient (tables dense, duplicate ids summed) has norm max_norm, and the tables'
    gradients are still sparse, on the same rows."""
    from ir.embedding_tables import EmbeddingPlan, PlacedTable, TablePlacement
    from ir.embedding_tables import TableSharding as K
    from planner.trial.reference import _SparseTables

    model = S.build_model()
    placed = tuple(PlacedTable(S._table(n), TablePlacement(n, K.TABLE_WISE, (0,)))
                   for n in S.names())
    tables = _SparseTables(model, EmbeddingPlan(placed, "sgd"))
    inputs, clicks = S.DATA.batch(0, S.GLOBAL_BATCH)
    S.dlrm.loss_fn(model(**inputs), clicks).backward()
    rows = [w.grad.coalesce().indices() for w in tables.weights]
    max_norm = S.CLIP_MAX_NORMS[0]
    tables.clip(model, max_norm)
    grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in model.parameters()]
    assert float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]))) == \
        pytest.approx(max_norm, rel=1e-5)
    assert all(w.grad.is_sparse and torch.equal(w.grad.coalesce().indices(), r)
               for w, r in zip(tables.weights, rows))
