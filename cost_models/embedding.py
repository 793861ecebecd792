"""Cost of sharded embedding tables, per rank: lookups, sparse optimizer, all-to-alls, memory.

A table placement (ir.embedding_tables.TablePlacement) puts shards on ranks. Each shard
adds a `RankLoad` to the rank that holds it, and every sharded table adds a requester-side
load to every rank (its local ids out, its pooled rows in). Loads are additive vectors;
`rank_time` turns one rank's sum into seconds. With B the global batch, b = B/n the
local batch, p ids per sample, d the shard's columns, e bytes per element:

  lookup (forward)   gather ids_served x d x e  + write out_rows x d x e     over HBM
  backward+optimizer read out_rows x d x e + ids_served x d x e (per-id grads), then per
                     unique row touched: weight read+write 2 d e + optimizer state r+w
  unique rows        occupancy: N (1 - (1 - 1/N)^m) distinct of N rows after m draws,
                     hot and cold rows counted apart when a hot-row fraction is known
  all-to-all         bytes per phase (ids forward, pooled forward, pooled gradients
                     backward): max(V f_intra / B_intra, V f_inter / B_inter), V = max(bytes
                     sent, bytes received) by the rank, ids as (id, bag) int64 pairs plus
                     the (count, bags) header; latency per call the executor makes: all
                     sharded tables share ONE call per phase (header, ids, pooled forward,
                     gradients backward: 4 per step per dtype exchanged, every rank joins
                     each, executors/table_exchange.py): (n-1) alpha + the measured
                     blocking wait of a call on CPU processes (`cost_models.embedding_comm`)
  replicated tables  each rank's sparse gradient (its distinct rows and their ids) is
                     all-gathered after backward (executors/hybrid_step.py), then every
                     rank steps the global batch's distinct rows: never a dense gradient
  clip (optional)    a clipping step (`EmbeddingConfig.clip_grad_norm`) reads each shard's
                     stepped rows for the norm and reads and writes them for the scale
                     (`_clip_s`), and every rank runs its host op for every table
                     (`_clip_host_load`); its scalar all-reduce is the dense estimate's

The slowest rank sets the step (the all-to-alls synchronise every rank):
    step_s = dense_s + max_r embedding_s[r]
with dense_s the dense layers' whole step as `cost_models.estimate` prices it (their
compute, their data-parallel all-reduce and optimizer: `DenseCost.of`), which is TorchRec's
planner's accounting too (per-shard perf summed per rank, the step is the maximum over
ranks: torchrec/distributed/planner/stats.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from ir.cluster import ClusterSpec
from ir.embedding_tables import (EmbeddingTable, HashRing, TablePlacement, TableSharding,
                                 column_shard_bounds, row_shard_bounds)
from ir.errors import PlannerError
from cost_models.common import GB
from cost_models.compute import (CLIP_NORM_PASSES, CLIP_SCALE_PASSES, clip_host_seconds,
                                  with_host)
from cost_models.embedding_comm import (EXECUTOR_A2A_CALLS_PER_EXCHANGE, AllToAllLink,
                                        exchange_bit, replicated_gather_s)
from cost_models.estimate import Estimate

# Ids travel as int64: the zoo's sparse tensor and TorchRec's KeyedJaggedTensor values.
ID_BYTES = 8
# The executor sends each id with its bag index, both int64 (executors/table_exchange.py
# phase 2), and to every rank a (count, bags) int64 header per table (phase 1).
ID_PAIR_BYTES = 2 * ID_BYTES
HEADER_BYTES_PER_PEER = 2 * ID_BYTES
# EmbeddingTable.hot_row_fraction counts lookups that hit the most frequent 1% of rows.
HOT_ROW_SHARE = 0.01
# Achievable share of datasheet HBM bandwidth for streaming kernels: a device-to-device
# copy moved 3.0 of 3.35 TB/s on H100 (REFERENCES.md); row gathers of >= 128-byte rows
# are assumed to stream as well as a copy does.
HBM_ACHIEVED_FRACTION = 3.0 / 3.35
# Optimizer state bytes per row = per_row + per_element x d (fp32 each):
# row-wise Adagrad keeps one fp32 per row (FBGEMM's EXACT_ROWWISE_ADAGRAD), Adam two
# moments per element (Kingma & Ba 2015), SGD none.
OPTIMIZER_STATE = {"rowwise_adagrad": (4, 0), "adam": (0, 8), "sgd": (0, 0)}
FP32_BYTES = 4


@dataclass(frozen=True, slots=True)
class EmbeddingConfig:
    """What one step looks like for the tables."""

    global_batch: int
    optimizer: str = "rowwise_adagrad"
    # the step clips by global norm (`ParallelPlan.clip_grad_norm`, `executors.grad_clip`)
    clip_grad_norm: bool = False

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise PlannerError(f"--global-batch must be >= 1, got {self.global_batch}")
        if self.optimizer not in OPTIMIZER_STATE:
            raise PlannerError(f"unknown sparse optimizer {self.optimizer!r}; use one of "
                               f"{', '.join(OPTIMIZER_STATE)}")


@dataclass(frozen=True, slots=True)
class RankLoad:
    """What shards and requests add to one rank; loads add up field by field."""

    lookup_s: float = 0.0  # forward gathers
    update_s: float = 0.0  # backward gradient gather + sparse optimizer update
    gather_s: float = 0.0  # replicated tables: the all-gathers of their sparse gradients
    ids_send_bytes: float = 0.0  # ids all-to-all, forward
    ids_recv_bytes: float = 0.0
    out_send_bytes: float = 0.0  # pooled all-to-all forward (and its gradient backward)
    out_recv_bytes: float = 0.0
    memory_bytes: float = 0.0  # table shard + optimizer state (+ gradient if replicated)
    optimizer_bytes: float = 0.0  # column-wise row-wise Adagrad: row sums sent to the shards
    # joins the one all-to-all of column-wise tables' row sums (row-wise Adagrad); OR-ed
    optimizer_exchange: bool = False
    # bit (`embedding_comm.exchange_bit`) per dtype of the sharded tables the rank
    # exchanges: one fused exchange per dtype (executors/table_exchange.py); OR-ed
    exchange_dtypes: int = 0
    sharded: bool = False  # takes part in the all-to-alls

    def __add__(self, other: RankLoad) -> RankLoad:
        return RankLoad(self.lookup_s + other.lookup_s, self.update_s + other.update_s,
                        self.gather_s + other.gather_s,
                        self.ids_send_bytes + other.ids_send_bytes,
                        self.ids_recv_bytes + other.ids_recv_bytes,
                        self.out_send_bytes + other.out_send_bytes,
                        self.out_recv_bytes + other.out_recv_bytes,
                        self.memory_bytes + other.memory_bytes,
                        self.optimizer_bytes + other.optimizer_bytes,
                        self.optimizer_exchange or other.optimizer_exchange,
                        self.exchange_dtypes | other.exchange_dtypes,
                        self.sharded or other.sharded)

    @property
    def exchanges(self) -> int:
        """Fused exchanges the rank joins per step: one per dtype of sharded tables."""
        return bin(self.exchange_dtypes).count("1")


ZERO = RankLoad()


@dataclass(frozen=True, slots=True)
class RankTime:
    lookup_s: float
    update_s: float
    comm_s: float  # all-to-alls, replicated tables' all-gathers

    @property
    def total_s(self) -> float:
        return self.lookup_s + self.update_s + self.comm_s


def hbm_bytes_per_s(cluster: ClusterSpec) -> float:
    return cluster.hbm_gbps * GB * HBM_ACHIEVED_FRACTION


def unique_rows(draws: float, rows: float, hot_fraction: float | None = None) -> float:
    """Expected distinct rows after `draws` lookups over `rows` rows: the occupancy count
    N(1 - (1-1/N)^m) (Feller 1968, ch. II.11), the hot 1% and cold 99% of rows apart."""
    def distinct(m: float, n: float) -> float:
        if n <= 0 or m <= 0:
            return 0.0
        if n <= 1:
            return 1.0
        return n * -math.expm1(m * math.log1p(-1.0 / n))
    if hot_fraction is None:
        return distinct(draws, rows)
    hot_rows = max(1.0, HOT_ROW_SHARE * rows)
    return distinct(draws * hot_fraction, hot_rows) + \
        distinct(draws * (1 - hot_fraction), rows - hot_rows)


# Rows sampled (evenly spaced ids) to measure each hash shard's share of a table.
RING_SAMPLE_IDS = 1 << 14


@functools.lru_cache(maxsize=4096)
def ring_shares(table: str, rows: int, num_shards: int) -> tuple[float, ...]:
    """Share of a ROW_HASH table's rows each shard owns under the executor's own ring
    (`HashRing.owner`), counted over RING_SAMPLE_IDS evenly spaced ids (every id when
    fewer): what the shard holds, and serves of uniformly spread lookups."""
    count = min(rows, RING_SAMPLE_IDS)
    ids = torch.arange(count, dtype=torch.int64) * rows // count  # distinct: rows >= count
    owners = HashRing.build(table, num_shards).owner(ids, table)
    counts = torch.bincount(owners, minlength=num_shards).to(torch.float64)
    return tuple((counts / counts.sum()).tolist())


def lookup_shares(table: EmbeddingTable, sharding: TableSharding, num_shards: int,
                  measured: list[float] | None = None) -> tuple[list[float], list[float]]:
    """(share of the ids each shard serves, share of the rows it holds).

    Range shards hold even key ranges; with a hot-row fraction h the hot 1% of rows are
    assumed to lie in ONE range (ids numbered by frequency, as Criteo preprocessing does
    when it assigns ids by count), so shard 0 serves h of the lookups more. Hash shards
    hold their ring arcs and spread hot rows with the rest. A measured split (from
    `planner.table_inventory.measured_shard_shares`) replaces the served shares."""
    if sharding is TableSharding.ROW_HASH:
        rows = list(ring_shares(table.name, table.rows, num_shards))
        served = list(rows)
    else:
        bounds = row_shard_bounds(table.rows, num_shards)
        rows = [(stop - start) / table.rows for start, stop in bounds]
        served = list(rows)
        h = table.hot_row_fraction
        if h is not None and h > HOT_ROW_SHARE:
            hot_rows = HOT_ROW_SHARE * table.rows
            served = [(1 - h) * max(0.0, stop - start - (hot_rows if i == 0 else 0))
                      / (table.rows - hot_rows) for i, (start, stop) in enumerate(bounds)]
            served[0] += h
    if measured is not None:
        if len(measured) != num_shards:
            raise PlannerError(f"table {table.name}: {len(measured)} measured shard shares "
                               f"for {num_shards} shards")
        served = list(measured)
    return served, rows


def _shard_load(table: EmbeddingTable, cluster: ClusterSpec, config: EmbeddingConfig,
                cols: int, served: float, row_share: float, replicated: bool) -> RankLoad:
    """The owner side of one shard: `cols` columns, `served` of the ids, `row_share` of rows."""
    n = cluster.world_size
    B = config.global_batch
    e = table.dtype_bytes
    batch = B / n if replicated else B  # replicated tables serve their own local batch
    ids = batch * table.ids_per_sample * served  # lookups this shard answers
    # a partial sum for EVERY bag of the batch (an unpooled table: every id is a bag), empty
    # ones as zeros: the executor sends each source's every bag (executors/table_exchange.py)
    out_rows = batch * (1 if table.pooling else table.ids_per_sample)
    rows_held = table.rows * row_share
    per_row, per_element = OPTIMIZER_STATE[config.optimizer]
    state_row_bytes = per_row + per_element * cols
    # rows the optimizer steps: on a replicated table every rank steps the global batch's
    # distinct rows (the all-gathered gradient, coalesced), on a shard those it served
    touched = unique_rows(B * table.ids_per_sample, rows_held, table.hot_row_fraction) \
        if replicated else unique_rows(ids, rows_held, table.hot_row_fraction)
    hbm = hbm_bytes_per_s(cluster)
    # Roofline for memory-bound kernels (Williams et al. 2009): time = bytes / bandwidth.
    lookup_s = (ids + out_rows) * cols * e / hbm
    # FBGEMM-style fused backward + optimizer: per-id gradients read, then per touched row
    # the weight read and written and its optimizer state read and written.
    update_s = ((out_rows + ids) * cols * e + touched * (2 * cols * e + 2 * state_row_bytes)) / hbm
    update_s += _clip_s(cluster, config, touched * cols * e)
    memory = rows_held * (cols * e + state_row_bytes)
    if replicated:
        # its sparse gradient: every rank's looked-up rows and their ids, all-gathered
        # (executors.hybrid_step.all_gather_sparse), never a whole-table tensor
        memory += B * table.ids_per_sample * (cols * e + ID_BYTES)
        local_rows = unique_rows(ids, rows_held, table.hot_row_fraction)  # coalesced, sent
        gathered = n * local_rows  # read again when the optimizer coalesces them
        return RankLoad(lookup_s=lookup_s, update_s=update_s + gathered * cols * e / hbm,
                        gather_s=replicated_gather_s(local_rows, cols * e, cluster),
                        memory_bytes=memory)
    return RankLoad(lookup_s=lookup_s, update_s=update_s, ids_recv_bytes=ids * ID_PAIR_BYTES,
                    out_send_bytes=out_rows * cols * e, memory_bytes=memory, sharded=True)


def _clip_s(cluster: ClusterSpec, config: EmbeddingConfig, gradient_bytes: float) -> float:
    """Seconds of the global-norm clip over one shard's coalesced gradient (the rows the
    optimizer steps): executors.grad_clip's _foreach_norm reads it, _foreach_mul_ reads
    and writes it (cost_models.compute's CLIP_* rule for dense gradients; its host ops
    are every rank's, `_clip_host_load`; its scalar all-reduce is the dense estimate's,
    `cost_models.step_host.clip_all_reduce_s`). 0 when not clipping."""
    if not config.clip_grad_norm:
        return 0.0
    return gradient_bytes * (CLIP_NORM_PASSES + CLIP_SCALE_PASSES) / hbm_bytes_per_s(cluster)


def _clip_host_load(cluster: ClusterSpec, config: EmbeddingConfig) -> RankLoad:
    """The clip's per-tensor Python for one table on EVERY rank: executors.grad_clip
    coalesces and norms each table module's gradient, a rank holding no shard of it an
    empty one (`compute.clip_host_seconds`, the dense clip's rule). On CPU processes only,
    as `_host_load`: on GPUs it overlaps the kernels (`compute.with_host`'s max)."""
    if not (config.clip_grad_norm and cluster.host_bound):
        return ZERO
    return RankLoad(update_s=clip_host_seconds(1, cluster))


# Host-side torch ops the executor runs on every rank, counted with a TorchDispatchMode on
# table-wise tables of a model with `table_inputs` (tests/test_table_placement.py checks
# them, from 1 and 3 tables): per sharded table, forward routing and pooling 44 and
# backward 14 + the row-wise Adagrad step 22; per fused exchange (whatever the table
# count), forward 49 and backward 4. On host-bound clusters (CPU processes) each costs
# the spec's measured op_overhead_s; on GPUs they overlap with the kernels.
EXECUTOR_HOST_OPS_FORWARD = 44
EXECUTOR_HOST_OPS_UPDATE = 14 + 22
EXECUTOR_HOST_OPS_FORWARD_PER_EXCHANGE = 49
EXECUTOR_HOST_OPS_BACKWARD_PER_EXCHANGE = 4


def _host_load(cluster: ClusterSpec) -> RankLoad:
    """The framework overhead of one sharded table's step on every rank (CPU processes)."""
    if not cluster.host_bound:
        return ZERO
    return RankLoad(lookup_s=EXECUTOR_HOST_OPS_FORWARD * cluster.op_overhead_s,
                    update_s=EXECUTOR_HOST_OPS_UPDATE * cluster.op_overhead_s)


def _requester_load(table: EmbeddingTable, cluster: ClusterSpec, config: EmbeddingConfig,
                    placement: TablePlacement) -> RankLoad:
    return _host_load(cluster) + _clip_host_load(cluster, config) + \
        _exchange_load(table, cluster, config, placement)


def _exchange_load(table: EmbeddingTable, cluster: ClusterSpec, config: EmbeddingConfig,
                   placement: TablePlacement) -> RankLoad:
    """What every rank sends and receives for a sharded table: its header to every rank,
    its local (id, bag) pairs out (once per column shard), its pooled rows back (once per
    column shard, once per row shard)."""
    b = config.global_batch / cluster.world_size
    ids = b * table.ids_per_sample
    rows_back = b if table.pooling else ids  # bags: every id is one when unpooled
    k = len(placement.ranks)
    e = table.dtype_bytes
    header = cluster.world_size * HEADER_BYTES_PER_PEER  # sent and received, equal splits
    if placement.sharding is TableSharding.COLUMN_WISE:
        copies, partials = k, 1
    elif placement.sharding is TableSharding.TABLE_WISE:
        copies, partials = 1, 1
    else:
        # row-wise (table-row-wise too: the executor runs it as row-wise over the node's
        # ranks, no reduce-scatter inside the node): ids split among the k shards, and
        # every shard sends a partial for every bag of every requester (zeros where it
        # held none of the bag's ids), so a rank receives k blocks
        copies, partials = 1, k
    return RankLoad(ids_send_bytes=copies * ids * ID_PAIR_BYTES + header, ids_recv_bytes=header,
                    out_recv_bytes=partials * rows_back * table.dim * e,
                    exchange_dtypes=exchange_bit(table.dtype), sharded=True)


def placement_loads(table: EmbeddingTable, placement: TablePlacement, cluster: ClusterSpec,
                    config: EmbeddingConfig,
                    measured: list[float] | None = None) -> tuple[RankLoad, list[tuple[int, RankLoad]]]:
    """(load every rank gets, [(rank, owner load)]) of one table under one placement."""
    s, k = placement.sharding, len(placement.ranks)
    if s is TableSharding.REPLICATED:
        if k != cluster.world_size:
            raise PlannerError(f"table {table.name}: replicated on {k} of "
                               f"{cluster.world_size} ranks; replicate it on every rank")
        owner = _shard_load(table, cluster, config, table.dim, 1.0, 1.0, replicated=True)
        return owner + _clip_host_load(cluster, config), []
    if s is TableSharding.TABLE_WISE:
        pieces = [_shard_load(table, cluster, config, table.dim, 1.0, 1.0, False)]
    elif s is TableSharding.COLUMN_WISE:
        pieces = [_shard_load(table, cluster, config, stop - start, 1.0, 1.0, False)
                  for start, stop in column_shard_bounds(table.dim, k)]
        if config.optimizer == "rowwise_adagrad":
            # every shard sends its sum of squares of each touched row to the k shards
            # (itself included): executors/sparse_optimizer.py `_column_totals`, one call
            # for all column-wise tables that every rank joins
            touched = unique_rows(config.global_batch * table.ids_per_sample, table.rows,
                                  table.hot_row_fraction)
            sums = RankLoad(optimizer_bytes=touched * table.dtype_bytes * k)
            pieces = [piece + sums for piece in pieces]
            common = _requester_load(table, cluster, config, placement)
            return RankLoad(optimizer_exchange=True) + common, list(zip(placement.ranks, pieces))
    else:
        node_wise = s is TableSharding.TABLE_ROW_WISE
        if node_wise and len({r // cluster.devices_per_node for r in placement.ranks}) != 1:
            raise PlannerError(f"table {table.name}: table_row_wise keeps its shards on one "
                               f"node; ranks {list(placement.ranks)} span nodes")
        kind = TableSharding.ROW_RANGE if node_wise else s
        served, rows = lookup_shares(table, kind, k, measured)
        pieces = [_shard_load(table, cluster, config, table.dim, served[i], rows[i], False)
                  for i in range(k)]
    return _requester_load(table, cluster, config, placement), list(zip(placement.ranks, pieces))


def rank_time(load: RankLoad, cluster: ClusterSpec, link: AllToAllLink | None = None) -> RankTime:
    """Seconds of one rank's embedding work: the latency of every all-to-all call the
    executor makes (EXECUTOR_A2A_CALLS_PER_EXCHANGE per fused exchange, every rank joins
    each) with the host ops of each exchange, and the bytes of three phases (ids forward,
    pooled forward, pooled gradients backward: the reverse of forward, same volume).
    Lookups and updates are busy time of the rank's process: on CPU processes sharing
    cores they stretch by the spec's host_share (`host_busy_s`), as the dense layers'
    compute does; the all-to-alls were measured with every process running."""
    link = link or AllToAllLink.of(cluster)
    comm = load.exchanges * EXECUTOR_A2A_CALLS_PER_EXCHANGE * link.latency_s() + load.gather_s
    lookup_s, update_s = load.lookup_s, load.update_s
    if cluster.host_bound:
        lookup_s += load.exchanges * EXECUTOR_HOST_OPS_FORWARD_PER_EXCHANGE * cluster.op_overhead_s
        update_s += load.exchanges * EXECUTOR_HOST_OPS_BACKWARD_PER_EXCHANGE * cluster.op_overhead_s
    if load.sharded:
        comm += link.bandwidth_s(max(load.ids_send_bytes, load.ids_recv_bytes))
        comm += 2 * link.bandwidth_s(max(load.out_send_bytes, load.out_recv_bytes))
    if load.optimizer_exchange:  # one call, its bytes as one phase
        comm += link.latency_s() + link.bandwidth_s(load.optimizer_bytes)
    return RankTime(host_busy_s(lookup_s, cluster), host_busy_s(update_s, cluster), comm)


def host_busy_s(busy_s: float, cluster: ClusterSpec) -> float:
    """Wall seconds of `busy_s` of a rank's own work (gathers and host ops alike): CPU
    processes on fewer cores than processes take turns (`compute.with_host`, the dense
    layers' rule: what one rank waits for at the next all-to-all is its peers' share of
    the cores); on GPUs unchanged."""
    return with_host(busy_s, 0.0, cluster)


@dataclass(frozen=True, slots=True)
class DenseCost:
    """The data-parallel dense part (MLPs, interaction), the same on every rank: what
    `cost_models.estimate` predicts for the plan's dense layers (`DenseCost.of`), the one
    dense figure the table planner, `planner estimate` and `planner validate` share."""

    step_s: float  # its whole iteration: compute, data-parallel all-reduce, optimizer
    state_bytes: float  # its peak bytes (params, grads, optimizer state, activations)

    @classmethod
    def of(cls, dense: Estimate) -> DenseCost:
        """From the estimate of the dense layers alone (planner.table_hybrid.dense_estimate);
        its bytes without the runtime overhead, which `capacity_bytes` takes off."""
        stage = dense.memory.worst_stage
        return cls(dense.iteration_seconds, float(stage.peak_bytes - stage.overhead))


NO_DENSE = DenseCost(step_s=0.0, state_bytes=0.0)  # the tables alone


@dataclass
class PlacementCost:
    """Per-rank breakdown and the predicted step of one full placement."""

    per_rank: list[RankTime]
    memory_bytes: list[float]
    capacity_bytes: float
    dense_s: float
    embedding_s: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.embedding_s = [t.total_s for t in self.per_rank]

    @property
    def max_embedding_s(self) -> float:
        return max(self.embedding_s)

    @property
    def step_s(self) -> float:
        return self.dense_s + self.max_embedding_s

    @property
    def imbalance(self) -> float:
        """(max - mean) / mean of the per-rank embedding seconds."""
        mean = sum(self.embedding_s) / len(self.embedding_s)
        return self.max_embedding_s / mean - 1 if mean > 0 else 0.0

    @property
    def fits(self) -> bool:
        return max(self.memory_bytes) <= self.capacity_bytes


def capacity_bytes(cluster: ClusterSpec, dense: DenseCost) -> float:
    """Device memory left for tables: the runtime's and the dense part's share taken off."""
    return cluster.device_memory_bytes - cluster.runtime_overhead_bytes - dense.state_bytes


def evaluate(tables: list[EmbeddingTable], placements: list[TablePlacement],
             cluster: ClusterSpec, config: EmbeddingConfig, dense: DenseCost,
             measured: dict[str, list[float]] | None = None) -> PlacementCost:
    """Price a full placement (one TablePlacement per table, same order)."""
    n = cluster.world_size
    loads = [ZERO] * n
    by_name = {t.name: t for t in tables}
    for p in placements:
        table = by_name[p.table]
        common, owned = placement_loads(table, p, cluster, config, (measured or {}).get(p.table))
        loads = [load + common for load in loads]
        for rank, piece in owned:
            loads[rank] = loads[rank] + piece
    return cost_of_loads(loads, cluster, dense)


def cost_of_loads(loads: list[RankLoad], cluster: ClusterSpec, dense: DenseCost) -> PlacementCost:
    link = AllToAllLink.of(cluster)
    return PlacementCost(
        per_rank=[rank_time(load, cluster, link) for load in loads],
        memory_bytes=[load.memory_bytes for load in loads],
        capacity_bytes=capacity_bytes(cluster, dense), dense_s=dense.step_s)
