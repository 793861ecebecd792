"""Communication of sharded and replicated embedding tables, as the executor issues it.

Sharded tables (executors/table_exchange.py): all of a step's sharded tables of one dtype
(`EmbeddingTable.dtype`, not its element size: bf16 and fp16 tables are two exchanges,
`exchange_bit`) share ONE fused exchange of four all_to_all_single calls (header, (id, bag) pairs,
pooled rows forward, their gradients backward); every rank joins each call. One rank's
part of a call is `AllToAllLink.seconds`: (n-1) alpha + its bytes over the link, with
gloo's measured all-to-all alpha-beta (`planner profile-cluster`) where the spec has it.

Replicated tables (executors/hybrid_step.py `all_gather_sparse`): each table's sparse
gradient is all-gathered in three blocking all_gather calls: the row count (one int64),
the rows (int64) and their values, each padded to the largest rank's count:
`replicated_gather_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.comm import blocking_s
from cost_models.common import GB
from ir.cluster import ClusterSpec
from ir.embedding_tables import TableDtype

# all_to_all_single calls of one fused exchange per step (executors/table_exchange.py):
# the (count, bags) header and the (id, bag) pairs in `_route`, the pooled blocks forward
# and their gradients backward in `_FusedLookup`, for every sharded table at once.
EXECUTOR_A2A_CALLS_PER_EXCHANGE = 4
# all_gather calls per replicated table per step (executors/hybrid_step.py
# `all_gather_sparse`): the count, the row ids, the row values.
EXECUTOR_GATHERS_PER_REPLICATED_TABLE = 3
# The row ids and the count travel as int64.
GATHER_ID_BYTES = 8


def exchange_bit(dtype: TableDtype) -> int:
    """The bit of `dtype`'s fused exchange in a rank's set of exchanges
    (`cost_models.embedding.RankLoad.exchange_dtypes`): one per table dtype, as the executor
    groups the tables it exchanges by their weights' dtype (`table_exchange.lookup_tables`)."""
    return 1 << _EXCHANGE_ORDER[TableDtype(dtype)]


_EXCHANGE_ORDER = {d: i for i, d in enumerate(TableDtype)}


@dataclass(frozen=True, slots=True)
class AllToAllLink:
    """What one rank's all-to-all sees: latency per step, bandwidth to its node's peers and
    to other nodes' peers, the group shape, and (CPU processes) the wait a blocking call
    adds beyond its wire time."""

    alpha_s: float
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    world: int
    per_node: int
    blocking_wait_s: float = 0.0

    @classmethod
    def of(cls, cluster: ClusterSpec) -> AllToAllLink:
        """Measured all_to_all fits (`planner profile-cluster`) when the spec has them: the
        intra-node one measured over the node's G ranks (or the widest group measured),
        the inter-node one over all n; else the spec's latency and link bandwidth. On
        host-bound clusters, the measured blocking wait of an all-to-all of n ranks."""
        n, G = cluster.world_size, min(cluster.devices_per_node, cluster.world_size)
        intra_fit = cluster.calibration.collective_fit("all_to_all", "intra_node", G)
        inter_fit = cluster.calibration.collective_fit("all_to_all", "inter_node", n)
        if n > G:
            alpha = inter_fit.alpha_s if inter_fit else cluster.inter_node_latency_s
        else:
            alpha = intra_fit.alpha_s if intra_fit else cluster.intra_node_latency_s
        wait = cluster.calibration.blocking_wait_seconds("all_to_all", n) if cluster.host_bound else 0.0
        return cls(alpha, intra_fit.bytes_per_s if intra_fit else cluster.intra_node_gbps * GB,
                   inter_fit.bytes_per_s if inter_fit else cluster.inter_node_gbps * GB, n, G,
                   wait)

    def latency_s(self) -> float:
        """One call's fixed part: (n-1) alpha (pairwise exchange, Thakur et al. 2005) plus
        the measured blocking wait."""
        return (self.world - 1) * self.alpha_s + self.blocking_wait_s if self.world > 1 else 0.0

    def bandwidth_s(self, nbytes: float) -> float:
        """The bytes part of a call moving `nbytes` through this rank: the peers on its node
        over NVLink and the others over its own NIC at once, max(S (G-1)/n / B_intra,
        S (n-G)/n / B_inter) ((n-1)/n S/B on one node, as comm.all_to_all_s)."""
        n, G = self.world, self.per_node
        if n <= 1:
            return 0.0
        return max(nbytes * (G - 1) / n / self.intra_bytes_per_s,
                   nbytes * (n - G) / n / self.inter_bytes_per_s)

    def seconds(self, nbytes: float) -> float:
        """One rank's part of one all-to-all moving `nbytes` through it (the larger of what
        it sends and receives)."""
        return self.latency_s() + self.bandwidth_s(nbytes)


def replicated_gather_s(touched_rows: float, row_bytes: float, cluster: ClusterSpec) -> float:
    """One rank's seconds to all-gather a replicated table's sparse gradient: `touched_rows`
    distinct rows of its local batch (the coalesced gradient), each `row_bytes` of values and
    an int64 id, in the executor's three blocking all_gathers (comm.blocking_s: the ring's
    (n-1) alpha + (n-1)/n S/B of the S-byte result, plus the measured blocking wait)."""
    n = cluster.world_size
    if n <= 1:
        return 0.0
    return (blocking_s("all_gather", n * GATHER_ID_BYTES, n, cluster)
            + blocking_s("all_gather", n * touched_rows * GATHER_ID_BYTES, n, cluster)
            + blocking_s("all_gather", n * touched_rows * row_bytes, n, cluster))
