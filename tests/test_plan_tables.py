"""Plan JSON with embedding-table placements (issue 18): typed records written and read
back equal, every shard's rows and columns listed, and a bad "embedding_tables" section
refused by one line that names its key."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ir.embedding_tables import (EmbeddingPlan, EmbeddingTable, PlacedTable, TablePlacement,
                                 TableSharding as K)
from ir.errors import PlannerError
from ir.plan import PlanDocument, load_plan, plan_to_dict, save_plan, uniform_plan
from ir.strategy import DPMode, LayerStrategy, Precision

NAMES = ("bottom_mlp", "tables.0", "tables.1", "tables.2", "tables.3", "tables.4", "top_mlp")
WORLD = 4


def _table(i: int, rows: int = 10, dim: int = 8) -> EmbeddingTable:
    return EmbeddingTable(f"tables.{i}", rows, dim, "float32", "sum", 3)


def _embeddings() -> EmbeddingPlan:
    placements = [(K.ROW_RANGE, (3, 2, 1, 0)), (K.ROW_HASH, (0, 1)), (K.COLUMN_WISE, (1, 2)),
                  (K.TABLE_ROW_WISE, (2, 3)), (K.REPLICATED, (0, 1, 2, 3))]
    return EmbeddingPlan(tuple(PlacedTable(_table(i), TablePlacement(f"tables.{i}", kind, ranks))
                               for i, (kind, ranks) in enumerate(placements)),
                         "rowwise_adagrad", node_size=2)


def _doc(embeddings=None, **kw) -> PlanDocument:
    plan = uniform_plan(len(NAMES), dp=WORLD, micro_batch=2, global_batch=8,
                        precision=Precision.FP32, **kw)
    plan = dataclasses.replace(plan, embeddings=embeddings or _embeddings())
    return PlanDocument(plan, "dlrm-small", "abc123", NAMES, {"name": "local"})


def test_round_trip_keeps_every_placement(tmp_path):
    doc = _doc()
    path = tmp_path / "plan.json"
    save_plan(doc, path)
    back = load_plan(path)
    assert back == doc and back.plan.embeddings == _embeddings()
    data = json.loads(path.read_text())
    tables = data["embedding_tables"]["tables"]
    # 10 rows over 4 ranks in the order given: 3, 3, 2, 2 rows; column-wise 4 + 4 columns
    assert [s["rows"] for s in tables[0]["shards"]] == [[0, 3], [3, 6], [6, 8], [8, 10]]
    assert [s["rank"] for s in tables[0]["shards"]] == [3, 2, 1, 0]
    assert [s["columns"] for s in tables[2]["shards"]] == [[0, 4], [4, 8]]
    assert tables[0]["sharding"] == "row_range" and data["embedding_tables"]["node_size"] == 2


def _write(tmp_path, mutate) -> str:
    data = plan_to_dict(_doc())
    mutate(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return str(path)


def _t(data, i):
    return data["embedding_tables"]["tables"][i]


BAD = [
    ("unknown table", lambda d: _t(d, 0).update(table="tables.9"),
     "embedding_tables.tables[0].table: unknown table 'tables.9'"),
    ("rank out of range", lambda d: _t(d, 1).update(ranks=[0, 4]),
     "embedding_tables.tables[1].ranks[1]: rank 4 is out of range: the plan has 4 ranks"),
    ("negative rank", lambda d: _t(d, 1).update(ranks=[-1, 0]),
     "embedding_tables.tables[1].ranks[0]: expected a rank"),
    ("overlapping rows", lambda d: _t(d, 0)["shards"][1].update(rows=[2, 6]),
     "embedding_tables.tables[0].shards: shards 0 and 1 both hold rows [2, 3)"),
    ("missing rows", lambda d: _t(d, 0)["shards"][3].update(rows=[9, 10]),
     "embedding_tables.tables[0].shards: rows [8, 9) are held by no shard"),
    ("rows past the table", lambda d: _t(d, 0)["shards"][3].update(rows=[8, 11]),
     "embedding_tables.tables[0].shards[3].rows: [8, 11) is not a range inside [0, 10)"),
    ("column gap", lambda d: _t(d, 2)["shards"][1].update(columns=[5, 8]),
     "embedding_tables.tables[2].shards: columns [4, 5) are held by no shard"),
    ("uneven split", lambda d: (_t(d, 0)["shards"][0].update(rows=[0, 2]),
                                _t(d, 0)["shards"][1].update(rows=[2, 6])),
     "embedding_tables.tables[0].shards: [r3[0:2, 0:8]"),
    ("row-wise across nodes", lambda d: _t(d, 3).update(ranks=[1, 2], shards=[]),
     "embedding_tables.tables[3]: table tables.3: table_row_wise keeps a table inside one node"),
    ("bad sharding", lambda d: _t(d, 0).update(sharding="diagonal"),
     "embedding_tables.tables[0].sharding: 'diagonal' is not one of replicated"),
    ("table twice", lambda d: _t(d, 1).update(table="tables.0"),
     "embedding_tables.tables[1].table: tables.0 is placed twice"),
    ("unknown key", lambda d: _t(d, 0).update(owner=1),
     "embedding_tables.tables[0].owner: unknown key"),
    ("unknown optimizer", lambda d: d["embedding_tables"].update(sparse_optimizer="lamb"),
     "embedding_tables.sparse_optimizer: 'lamb' is not one of sgd, rowwise_adagrad, adam"),
    ("no tables", lambda d: d["embedding_tables"].update(tables=[]),
     "embedding_tables.tables: must not be empty"),
    ("string rows", lambda d: _t(d, 0).update(rows="10"),
     "embedding_tables.tables[0].rows: expected an integer"),
]


@pytest.mark.parametrize("name, mutate, message", BAD, ids=[b[0] for b in BAD])
def test_bad_table_sections_are_one_line_errors(tmp_path, name, mutate, message):
    path = _write(tmp_path, mutate)
    with pytest.raises(PlannerError) as info:
        load_plan(path)
    text = str(info.value)
    assert "\n" not in text, text
    assert text.startswith(f"{path}: "), text
    assert message in text, text


def test_tables_need_one_data_parallel_stage():
    def with_tables(**kw):
        plan = uniform_plan(len(NAMES), micro_batch=1, global_batch=8,
                            precision=Precision.FP32, **kw)
        return dataclasses.replace(plan, embeddings=_embeddings())

    assert with_tables(dp=4).embeddings == _embeddings()
    with pytest.raises(PlannerError, match="runs in one stage, got 2"):
        with_tables(dp=2, pp=2)
    with pytest.raises(PlannerError, match="layer 0: tp=2 but a plan with sharded tables"):
        with_tables(tp=2, dp=2)
    with pytest.raises(PlannerError, match="tables.0: ranks \\[3, 2\\] are outside the 2 ranks"):
        with_tables(dp=2)  # tables.0 is placed on ranks 0..3


def test_planner_plan_writes_the_placements_of_a_zoo_dlrm(tmp_path, capsys):
    """`planner plan` on a recommendation model: one data-parallel stage, every table
    placed, the placement table and its greedy baseline printed, the file read back."""
    from planner.cli import main

    path = tmp_path / "plan.json"
    assert main(["plan", "dlrm-small", "--cluster", "a100-80g", "--gpus-per-node", "4",
                 "--global-batch", "64", "--out", str(path)]) == 0
    text = capsys.readouterr().out
    assert "TorchRec-style greedy" in text and "tables.3" in text
    doc = load_plan(path)
    assert doc.plan.pp == 1 and all(s.tp == 1 for s in doc.plan.layer_strategies)
    assert [t.table.name for t in doc.plan.embeddings.tables] == [f"tables.{i}" for i in range(4)]
    assert doc.predicted["time"]["embedding"] > 0
    assert len(doc.predicted["memory"]["stages"][0]["device_peak_bytes"]) == 4


def test_estimate_and_show_price_and_print_a_plans_tables(tmp_path, capsys):
    """`planner estimate --plan` and `planner show` of a DLRM plan written by `planner
    plan`: every table with its sharding and ranks, a per-rank row, and (estimate) the
    step = the dense part's + the slowest rank's tables, as the plan file recorded it."""
    import json

    from planner.cli import main

    path = tmp_path / "plan.json"
    assert main(["plan", "dlrm-small", "--cluster", "a100-80g", "--gpus-per-node", "4",
                 "--global-batch", "64", "--out", str(path)]) == 0
    capsys.readouterr()
    doc = load_plan(path)
    placements = doc.plan.embeddings.placements
    for command in (["estimate", "--plan", str(path)], ["show", str(path)]):
        assert main(command) == 0
        lines = capsys.readouterr().out.splitlines()
        for p in placements:  # the placement table's row of every table
            row = next(line for line in lines if line.split()[:1] == [p.table])
            assert str(p.sharding) in row.split(), (command[0], row)
        ranks = [line for line in lines if line.split()[:1] in (["0"], ["1"], ["2"], ["3"])]
        assert len(ranks) >= 4, command[0]
        assert any(line.startswith("tables: slowest rank") for line in lines), command[0]
    assert main(["estimate", "--plan", str(path), "--json"]) == 0
    priced = json.loads(capsys.readouterr().out)
    slowest = max(r["total_s"] for r in priced["embedding"]["ranks"])
    assert priced["time"]["embedding"] == pytest.approx(slowest) and slowest > 0
    assert priced["iteration_seconds"] == pytest.approx(doc.predicted["iteration_seconds"])
    assert len(priced["memory"]["stages"][0]["device_peak_bytes"]) == 4
    # one dense cost (table_hybrid.dense_estimate): the step the placement search ranked
    # is the step `planner estimate` prints, and its dense part is the estimate's
    assert doc.search["tables"]["step_s"] == pytest.approx(priced["iteration_seconds"])
    assert priced["embedding"]["dense_s"] == pytest.approx(priced["iteration_seconds"] - slowest)


def test_table_layers_cost_the_dense_estimate_no_collectives():
    """The executor makes a sharded table no data-parallel unit, so the dense estimate of
    a hybrid plan (table_hybrid.dense_estimate: the table layers' parameters taken out)
    charges them no gradient sync: its DP traffic is the MLP layers' alone."""
    from cost_models.clusters import get_cluster
    from cost_models.comm import dp_comm_s
    from cost_models.model_states import bytes_per_param
    from planner.models import load_layer_graph
    from planner.table_hybrid import dense_graph

    graph = load_layer_graph("dlrm-small", 1, None, torch.float32)
    tables = {layer.name for layer in graph.layers if layer.kind == "EmbeddingBag"}
    assert len(tables) == 4
    cluster = get_cluster("a100-80g", gpus_per_node=4)
    per_param = bytes_per_param(Precision.FP32, "adamw")
    for mode in DPMode:
        for layer in dense_graph(graph, tables).layers:
            seconds = dp_comm_s(layer, LayerStrategy(dp=4, dp_mode=mode), cluster, per_param)
            assert (sum(seconds) == 0) == (layer.name in tables), (mode, layer.name, seconds)
