"""`planner validate` of a sharded DLRM plan on 4 processes (issue 18): the plan from
`planner plan` carries its table placements, the 4 ranks run it (tables sharded, the
rest data parallel), every rank's peak memory is within 5% of the prediction (dense
estimate + the rank's table shards and optimizer state), the losses equal one process
training the same tables with the same row-sparse optimizer, every rank issues the
all-to-all calls per step the cost model prices, and the placement search's step is the
plan's predicted step (one dense cost). The time is printed with its per-phase breakdown,
not asserted: on this shared 2-core machine it moves by more than the 25% target between
runs (bench/bench_validate.py's dlrm cases check it; re-measure them quietly)."""

from __future__ import annotations

import json

import pytest

from cost_models.embedding import ZERO, EmbeddingConfig, placement_loads
from cost_models.embedding_comm import EXECUTOR_A2A_CALLS_PER_EXCHANGE
from ir.cluster import ClusterSpec
from ir.embedding_tables import TableSharding
from ir.plan import load_plan
from planner.cli import main

# 8 tables of 200K x 32 fp32 (25.6 MB each): large enough that the planner shards them
# and that they dominate each rank's memory, small enough for 4 CPU processes.
MODEL = "dlrm:num_tables=8,rows_per_table=200000,embedding_dim=32,lookups_per_table=4"
MEMORY_TARGET = 0.05
TIME_TARGET = 0.25  # the issue's; reported, not asserted (see the docstring)


@pytest.mark.multiprocess
def test_validate_sharded_dlrm_on_4_processes(tmp_path, capsys):
    path = tmp_path / "plan.json"
    # pinned (table-wise and row-wise, alternating): on the unprofiled `local` spec the
    # planner's free choice between sharding and replicating is a close call
    assert main(["plan-tables", MODEL, "--cluster", "local", "--gpus-per-node", "4",
                 "--global-batch", "64", "--sharding", "table_wise,row_range",
                 "--out", str(path)]) == 0
    doc = load_plan(path)
    plan = doc.plan
    assert plan.embeddings is not None and len(plan.embeddings.tables) == 8
    assert doc.search["tables"]["step_s"] == pytest.approx(doc.predicted["iteration_seconds"])
    assert [t.placement.sharding for t in plan.embeddings.tables] == \
        [TableSharding.TABLE_WISE, TableSharding.ROW_RANGE] * 4
    capsys.readouterr()
    assert main(["validate", str(path), "--nproc", "4", "--steps", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for r in out["ranks"]:
        error = abs(r["predicted_peak_bytes"] - r["measured_peak_bytes"]) / r["measured_peak_bytes"]
        assert error <= MEMORY_TARGET, r
    assert out["loss_matches_reference"] is True, (out["losses"], out["reference_losses"])
    # the dense layers' first-step gradients (the tables' are sparse: not compared)
    assert out["grad_norms_match_reference"] is True, out["grad_norm_worst_relative_error"]
    assert out["predicted_time"]["embedding"] > 0
    # one fused exchange (every table fp32): the calls the model prices, on every rank,
    # and the bytes: a rank sends its header and (id, bag) pairs, its shards' partial
    # sums forward and its pooled rows' gradients backward (exact: every bag is sent)
    expected = model_loads(doc)
    for rank, phases in enumerate(out["phase_seconds"]):
        assert phases["a2a_calls"] == EXECUTOR_A2A_CALLS_PER_EXCHANGE, phases
        load = expected[rank]
        sent = load.ids_send_bytes + load.out_send_bytes + load.out_recv_bytes
        assert phases["a2a_sent_bytes"] == pytest.approx(sent, rel=1e-12), (rank, phases)
    time_error = out["measured_iteration_seconds"] / out["predicted_iteration_seconds"] - 1
    print(f"sharded DLRM on 4 processes: predicted {out['predicted_iteration_seconds']:.4g} s, "
          f"measured {out['measured_iteration_seconds']:.4g} s ({100 * time_error:+.1f}%, "
          f"target {100 * TIME_TARGET:.0f}%); machine x{out['machine_slowdown']:.2f}")
    print("predicted ms:", {k: round(1e3 * v, 3) for k, v in out["predicted_time"].items()},
          "tables, rank 0:", {k: round(1e3 * v, 3) for k, v in
                              out["predicted_embedding"]["ranks"][0].items() if k.endswith("_s")})
    for rank, phases in enumerate(out["phase_seconds"]):
        print(f"measured ms, rank {rank}:", {k: round(1e3 * v, 2) for k, v in sorted(phases.items())
                                             if k.endswith("_s")})


def model_loads(doc):
    """Each rank's summed RankLoad of the plan's tables, as cost_models.embedding prices them."""
    cluster = ClusterSpec.from_dict(doc.cluster, "plan cluster")
    embeddings = doc.plan.embeddings
    config = EmbeddingConfig(doc.plan.global_batch, embeddings.sparse_optimizer)
    loads = [ZERO] * cluster.world_size
    for placed in embeddings.tables:
        common, owned = placement_loads(placed.table, placed.placement, cluster, config)
        loads = [load + common for load in loads]
        for rank, piece in owned:
            loads[rank] = loads[rank] + piece
    return loads
