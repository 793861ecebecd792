"""A table's dtype (`EmbeddingTable.dtype`, read off its weight at trace time) keys its
exchange: the executor exchanges each dtype's tables in collectives of their own
(`executors.table_exchange.lookup_tables`), and the cost model counts one fused exchange
per dtype (`cost_models.embedding_comm.exchange_bit`), so a bf16 and an fp16 table are
two exchanges though both are 2 bytes per element. The plan file records the dtype;
older plans without it load with the model's traced dtype."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json

import pytest
import torch
import torch.distributed as dist

import tests.sharded_dlrm as S
from cost_models.clusters import get_cluster
from cost_models.embedding import ZERO, EmbeddingConfig, placement_loads
from cost_models.embedding_comm import EXECUTOR_A2A_CALLS_PER_EXCHANGE
from executors.hybrid_step import HybridTrainer
from executors.sharded_embedding import apply_table_placements
from executors.sparse_optimizer import SparseOptimizerSpec, SparseRowOptimizer
from ir.embedding_tables import EmbeddingPlan, EmbeddingTable, PlacedTable, TableDtype
from ir.errors import PlannerError
from ir.plan import PlanDocument, plan_from_dict, plan_to_dict, uniform_plan
from planner.table_inventory import find_tables
from tests.dist_utils import spawn

WORLD = 2
# tables.1 in bf16 and tables.3 in fp16, the rest fp32: three exchanges, not two
DTYPES = {"tables.1": torch.bfloat16, "tables.3": torch.float16}
KIND = "sgd"


def _model():
    model = S.build_model()
    for name, dtype in DTYPES.items():
        model.get_submodule(name).to(dtype)
    return model


def _tables(model) -> list[EmbeddingTable]:
    """The tables as the planner traces them (`planner.table_inventory`)."""
    inputs, _ = S.DATA.batch(0, S.GLOBAL_BATCH)
    return find_tables(model, inputs)


def test_the_dtype_is_read_off_the_weight():
    tables = {t.name: t for t in _tables(_model())}
    assert tables["tables.1"].dtype is TableDtype.BFLOAT16
    assert tables["tables.3"].dtype is TableDtype.FLOAT16
    assert tables["tables.0"].dtype is TableDtype.FLOAT32
    assert tables["tables.1"].dtype_bytes == tables["tables.3"].dtype_bytes == 2
    with pytest.raises(PlannerError, match="tables.0"):
        EmbeddingTable("tables.0", 4, 2, "int8", "sum", 1)


def _loads(tables, placements, cluster):
    config = EmbeddingConfig(S.GLOBAL_BATCH, KIND)
    loads = [ZERO] * cluster.world_size
    for table, placement in zip(tables, placements):
        common, owned = placement_loads(table, placement, cluster, config)
        loads = [load + common for load in loads]
        for rank, piece in owned:
            loads[rank] = loads[rank] + piece
    return loads


def test_bf16_and_fp16_tables_are_two_exchanges():
    tables = _tables(_model())
    placements = S.placements("row_range", WORLD)
    cluster = get_cluster("local", gpus_per_node=WORLD)
    assert {load.exchanges for load in _loads(tables, placements, cluster)} == {3}
    same = [dataclasses.replace(t, dtype="float32") for t in tables]
    assert {load.exchanges for load in _loads(same, placements, cluster)} == {1}


def dtype_worker(rank: int, world: int, _payload) -> dict:
    """STEPS steps of the sharded DLRM with mixed-dtype tables; every all_to_all_single
    this rank issues, counted with the bytes it sends and receives."""
    model = _model()
    tables = apply_table_placements(model, S.placements("row_range", world),
                                    node_size=S.NODE_SIZE)
    opt = SparseRowOptimizer(tables, SparseOptimizerSpec(KIND, lr=S.LR[KIND]))
    trainer = HybridTrainer(model, tables, S.dense_optimizer(KIND, tables.dense_parameters(model)),
                            opt, S.dlrm.loss_fn)
    calls, sent, received, real = [0], [0], [0], dist.all_to_all_single

    def counted(output, input, *args, **kwargs):
        calls[0] += 1
        sent[0] += input.numel() * input.element_size()
        received[0] += output.numel() * output.element_size()
        return real(output, input, *args, **kwargs)

    losses = []
    dist.all_to_all_single = counted
    try:
        for step in range(S.STEPS):
            inputs, clicks = S.DATA.batch(step, S.GLOBAL_BATCH, part=(rank, world))
            losses.append(trainer.step(inputs, clicks, S.GLOBAL_BATCH))
    finally:
        dist.all_to_all_single = real
    return {"calls": calls[0], "sent": sent[0], "received": received[0], "losses": losses}


@functools.lru_cache(maxsize=None)
def _run() -> list:
    return spawn(dtype_worker, WORLD, timeout_s=240)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_predicted_exchanges_are_the_collectives_the_executor_issues():
    tables = _tables(_model())
    placements = S.placements("row_range", WORLD)
    loads = _loads(tables, placements, get_cluster("local", gpus_per_node=WORLD))
    for rank, r in enumerate(_run()):
        load = loads[rank]
        per_step = load.exchanges * EXECUTOR_A2A_CALLS_PER_EXCHANGE + load.optimizer_exchange
        assert r["calls"] == per_step * S.STEPS, (rank, r, load)
        # a rank sends its header and (id, bag) pairs, its shards' partial sums forward
        # and its pooled rows' gradients backward (exact: every bag is sent), each in
        # its table's dtype
        assert r["sent"] == pytest.approx(
            S.STEPS * (load.ids_send_bytes + load.out_send_bytes + load.out_recv_bytes),
            rel=1e-12), (rank, r, load)
        assert all(torch.isfinite(torch.tensor(r["losses"])))


# ---- the plan file ------------------------------------------------------------------------

def _document(tables) -> PlanDocument:
    placed = tuple(PlacedTable(t, p) for t, p in zip(tables, S.placements("row_range", WORLD)))
    plan = dataclasses.replace(uniform_plan(1, dp=WORLD, global_batch=S.GLOBAL_BATCH),
                               embeddings=EmbeddingPlan(placed, KIND, S.NODE_SIZE))
    return PlanDocument(plan, "dlrm", "f" * 16, ("tables",), {}, graph_dtype="float32")


def test_plan_file_keeps_the_dtype_and_old_plans_take_the_traced_one():
    tables = _tables(_model())
    data = plan_to_dict(_document(tables))
    rows = data["embedding_tables"]["tables"]
    assert [r["dtype"] for r in rows] == [t.dtype.value for t in tables]
    back = plan_from_dict(json.loads(json.dumps(data)))
    assert [t.table for t in back.plan.embeddings.tables] == tables
    # a plan written before the dtype was recorded: fp32 tables take the traced fp32
    fp32 = [dataclasses.replace(t, dtype="float32") for t in tables]
    old = plan_to_dict(_document(fp32))
    for row in old["embedding_tables"]["tables"]:
        del row["dtype"]
    assert [t.table for t in plan_from_dict(old).plan.embeddings.tables] == fp32
    # ... and one whose 2-byte tables cannot be the traced fp32 is refused, by name
    older = copy.deepcopy(data)
    for row in older["embedding_tables"]["tables"]:
        del row["dtype"]
    with pytest.raises(PlannerError, match=r"tables\[1\]\.dtype_bytes"):
        plan_from_dict(older)
    bad = copy.deepcopy(data)
    bad["embedding_tables"]["tables"][0]["dtype"] = "int8"
    with pytest.raises(PlannerError, match=r"tables\[0\]\.dtype.*one of"):
        plan_from_dict(bad)
