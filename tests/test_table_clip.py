"""Clipping beside embedding tables: the executor's clip over the tables' sparse gradients
(`executors.grad_clip`) and its price (`cost_models.embedding`)."""

from __future__ import annotations

import pytest
import torch


def clip_extra_update_s(cluster) -> list[float]:
    """Per rank, what clipping adds to the tables' update seconds: tables a (table-wise on
    rank 0) and b (replicated on both), 1000 rows of 64 fp32 each, 2 ids a sample, a
    global batch of 8 under SGD, priced with and without the clip."""
    from cost_models.embedding import NO_DENSE, EmbeddingConfig, evaluate
    from ir.embedding_tables import EmbeddingTable, TablePlacement, TableSharding

    tables = [EmbeddingTable("a", 1000, 64, "float32", "sum", 2),
              EmbeddingTable("b", 1000, 64, "float32", "sum", 2)]
    placements = [TablePlacement("a", TableSharding.TABLE_WISE, (0,)),
                  TablePlacement("b", TableSharding.REPLICATED, (0, 1))]
    priced = {clip: evaluate(tables, placements, cluster,
                             EmbeddingConfig(8, "sgd", clip_grad_norm=clip), NO_DENSE)
              for clip in (False, True)}
    return [c.update_s - p.update_s
            for c, p in zip(priced[True].per_rank, priced[False].per_rank)]


def test_a_float64_table_clips_as_its_dense_gradient_in_float64():
    """A float64 table (TableDtype.FLOAT64) beside a float64 dense weight: its norm is
    taken in float64 (fp32 is no wider), so the clip equals clip_grad_norm_ on the dense
    gradients to float64's precision."""
    from executors.grad_clip import clip_grad_norm
    from executors.sharded_embedding import ReplicatedEmbedding, ShardedTables, table_of
    from ir.embedding_tables import TableDtype, TablePlacement, TableSharding

    bag = torch.nn.EmbeddingBag(10, 3, mode="sum", dtype=torch.float64)
    table = table_of("t", bag)
    assert table.dtype is TableDtype.FLOAT64
    module = ReplicatedEmbedding(table, TablePlacement("t", TableSharding.REPLICATED, (0,)),
                                 bag.weight.detach().clone())
    dense = torch.nn.Parameter(torch.arange(3, dtype=torch.float64))
    ids = torch.tensor([1, 1, 4, 7])  # a duplicate id: the norm is the coalesced one's
    (module(ids, torch.tensor([0, 2])) * dense).sum().mul(1e3).backward()
    expected = [torch.nn.Parameter(torch.zeros_like(g)) for g in (module.weight, dense)]
    for p, grad in zip(expected, (module.weight.grad.to_dense(), dense.grad.clone())):
        p.grad = grad
    want = torch.nn.utils.clip_grad_norm_(expected, 0.5)
    assert float(want) > 1.0  # clipped
    norm, _ = clip_grad_norm([("w", dense)], lambda p: 1, 0.5, torch.device("cpu"),
                             tables=ShardedTables({"t": module}))
    assert float(norm) == pytest.approx(float(want), rel=1e-12)
    assert torch.allclose(module.weight.grad.to_dense(), expected[0].grad, rtol=1e-12, atol=0)
    assert torch.allclose(dense.grad, expected[1].grad, rtol=1e-12, atol=0)


def test_every_rank_pays_the_clip_host_op_of_every_table_on_cpu_processes():
    """On CPU processes (the `local` cluster, host-bound) the clip's per-tensor Python
    (coalesce, norm list) runs for EVERY table module on every rank: a rank holding no
    shard of a table still gets its (empty) sparse gradient. Rank 1 holds none of table
    a (table-wise on rank 0) and steps b's rows (replicated): it pays both tables' host
    op (`compute.clip_host_seconds`, the dense clip's) and b's rows; rank 0 a's rows too."""
    from cost_models.clusters import get_cluster
    from cost_models.compute import clip_host_seconds
    from cost_models.embedding import hbm_bytes_per_s, unique_rows

    cluster = get_cluster("local", nodes=1, gpus_per_node=2)
    assert cluster.host_bound
    rows_s = unique_rows(16, 1000) * 64 * 4 * 3 / hbm_bytes_per_s(cluster)
    extra = clip_extra_update_s(cluster)
    host_s = 2 * clip_host_seconds(1, cluster)
    assert host_s > 0
    assert extra == pytest.approx([(2 * rows_s + host_s) * cluster.host_share,
                                   (rows_s + host_s) * cluster.host_share])
