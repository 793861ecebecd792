"""Embedding tables sharded over the ranks (TorchRec's model-parallel tables, on plain
torch.distributed): each table gets a `TablePlacement`, each rank holds only its shard.

    tables = apply_table_placements(model, placements, node_size=2, init=init)
    loss = model(**this_ranks_share_of_the_batch)  # the model's own forward, unchanged

A table is a list of `Shard`s (rank, rows, columns): TABLE_WISE is one shard of every
row and column; ROW_RANGE / TABLE_ROW_WISE split rows into `row_shard_bounds`; ROW_HASH
gives each row to its `HashRing` shard (the holder keeps its ids sorted, `local_ids`);
COLUMN_WISE splits `column_shard_bounds`. REPLICATED keeps the dense module on every rank
with sparse gradients (their cross-rank sum is `hybrid_step`'s job).

One lookup, for a batch whose bags (samples) are split over the ranks (data parallel):
  1. route   each id goes to the rank holding its row (column-wise: to every shard's
             rank); all_to_all_single of (count, bags) headers, then of (id, bag) pairs
  2. pool    each holder sums the rows it holds per (source rank, bag): a partial bag
             (row-wise) or a column block (column-wise), zeros for bags it holds none of
  3. return  all_to_all_single of the pooled blocks back; the requester adds each
             holder's block into columns [col_start, col_stop) of its (bags, dim) output
Backward runs 3 in reverse (the pooled gradient's column blocks go to the holders), and
each holder gathers the gradient of every id it served: a sparse COO gradient of its
shard (rows, values) with duplicates left for the optimizer to coalesce. Every rank calls
the same collectives in the same order, also when it holds nothing or looks nothing up.

Fused (TorchRec's one input dist and one output dist for all tables): when the model
has `table_inputs(*args, **kwargs) -> {table name: ids or (ids, offsets)}` (the zoo's
DLRM does), a forward pre-hook looks up every sharded table at once, ONE all_to_all_single
per phase (`executors.table_exchange`), and each table's forward takes its share. A
model without it gets one exchange per table call (same values, more calls).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ir.embedding_tables import (EmbeddingTable, HashRing, Shard, TableDtype, TablePlacement,
                                 TableSharding, table_shards)
from executors.table_exchange import lookup_tables
from ir.errors import PlannerError

POOLING_MODES = ("sum", "mean")  # EmbeddingBag modes whose partial bags add up ("max" does not)
# Rows hashed per pass when a holder lists its ROW_HASH rows: 2 MiB per int64 temporary,
# so the listing never costs more than a few MiB whatever the table's size.
HASH_SCAN_ROWS = 1 << 18

# init(table, rows (int64), col_start, col_stop) -> (len(rows), col_stop - col_start) values
RowInit = Callable[[EmbeddingTable, torch.Tensor, int, int], torch.Tensor]


def table_of(name: str, module: nn.Module) -> EmbeddingTable:
    """The EmbeddingTable of an nn.EmbeddingBag / nn.Embedding; PlannerError for options
    a sharded lookup cannot reproduce."""
    pooling = module.mode if isinstance(module, nn.EmbeddingBag) else None
    if pooling is not None and pooling not in POOLING_MODES:
        raise PlannerError(f"table {name}: mode {pooling!r} cannot be sharded (partial bags "
                           f"of {POOLING_MODES} add up); replicate it")
    for option in ("max_norm", "padding_idx"):
        if getattr(module, option, None) is not None:
            raise PlannerError(f"table {name}: {option} is not supported by sharded tables; "
                               "drop it or replicate the table")
    if getattr(module, "scale_grad_by_freq", False):
        raise PlannerError(f"table {name}: scale_grad_by_freq is not supported by sharded "
                           "tables; drop it or replicate the table")
    rows, dim = module.weight.shape
    return EmbeddingTable(name, rows, dim, TableDtype.of(module.weight.dtype, name), pooling,
                          ids_per_sample=1)


def hash_rows(table: EmbeddingTable, ring: HashRing, shard_index: int) -> torch.Tensor:
    """The sorted ids ROW_HASH shard `shard_index` holds, hashed HASH_SCAN_ROWS at a time."""
    owned = []
    for start in range(0, table.rows, HASH_SCAN_ROWS):
        ids = torch.arange(start, min(start + HASH_SCAN_ROWS, table.rows), dtype=torch.int64)
        owned.append(ids[ring.owner(ids, table.name) == shard_index])
    return torch.cat(owned) if owned else torch.empty(0, dtype=torch.int64)


class ShardedEmbedding(nn.Module):
    """This rank's shard of one table; forward takes this rank's share of the batch and
    returns its pooled (bags, dim) — or (*ids.shape, dim) for an nn.Embedding — exactly
    as the unsharded module would."""

    def __init__(self, table: EmbeddingTable, placement: TablePlacement,
                 shards: tuple[Shard, ...], rank: int, world_size: int,
                 weight: torch.Tensor, local_ids: torch.Tensor | None):
        super().__init__()
        self.table, self.placement, self.shards = table, placement, shards
        self.rank, self.world_size = rank, world_size
        self.shard_index = next((i for i, s in enumerate(shards) if s.rank == rank), None)
        self.weight = nn.Parameter(weight)  # (shard rows, shard columns); (0, dim) if none
        self.local_ids = local_ids  # ROW_HASH: the sorted ids of this rank's rows
        # ((ids, offsets), request, pooled sums) from this step's fused exchange, until forward
        self.prefetched: tuple | None = None
        kind = placement.sharding
        self.ring = HashRing.build(table.name, len(shards)) if kind is TableSharding.ROW_HASH \
            else None
        self._row_starts = torch.tensor([s.row_start for s in shards], dtype=torch.int64)
        self._shard_ranks = torch.tensor([s.rank for s in shards], dtype=torch.int64)
        by_rank = {s.rank: s for s in shards}
        self.col_ranges = [(by_rank[r].col_start, by_rank[r].col_stop) if r in by_rank
                            else None for r in range(world_size)]

    @property
    def shard(self) -> Shard | None:
        return None if self.shard_index is None else self.shards[self.shard_index]

    def extra_repr(self) -> str:
        return (f"{self.table.name}: {self.placement.sharding} over {len(self.shards)} ranks, "
                f"this rank {self.shard}")

    def _shard_of(self, ids: torch.Tensor) -> torch.Tensor:
        kind = self.placement.sharding
        if kind is TableSharding.ROW_HASH:
            return self.ring.owner(ids, self.table.name)
        return torch.searchsorted(self._row_starts, ids, right=True) - 1  # range (or one) shard

    def destinations(self, ids: torch.Tensor, bags: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rank, id, bag) of every id this rank sends: to the holder of its row, or to
        every shard's rank (column-wise)."""
        if self.placement.sharding is TableSharding.COLUMN_WISE:
            count = len(self.shards)
            return (self._shard_ranks.repeat_interleave(len(ids)), ids.repeat(count),
                    bags.repeat(count))
        return self._shard_ranks[self._shard_of(ids)], ids, bags

    def to_local(self, ids: torch.Tensor) -> torch.Tensor:
        """Global ids this rank holds -> rows of its shard."""
        if self.local_ids is None:
            return ids - self.shard.row_start
        rows = torch.searchsorted(self.local_ids, ids)
        if len(ids) and not torch.equal(self.local_ids[rows.clamp(max=len(self.local_ids) - 1)],
                                        ids):
            raise RuntimeError(f"table {self.table.name}: an id was routed to rank {self.rank}, "
                               "which does not hold it (hash ring mismatch)")
        return rows

    def request(self, input: torch.Tensor, offsets: torch.Tensor | None = None) -> tuple:
        """(self, ids, bags, num_bags) of one call: what `lookup_tables` exchanges."""
        if self.table.pooling is None:  # nn.Embedding: every id is its own bag
            ids = input.reshape(-1)
            bags, num_bags = torch.arange(len(ids)), len(ids)
        elif input.dim() == 2:  # (bags, ids per bag)
            num_bags = input.shape[0]
            ids = input.reshape(-1)
            bags = torch.arange(num_bags).repeat_interleave(input.shape[1])
        else:  # flat ids with bag offsets, as nn.EmbeddingBag takes them
            if offsets is None:
                raise ValueError(f"table {self.table.name}: 1-D input needs offsets")
            num_bags = len(offsets)
            lengths = torch.diff(offsets, append=torch.tensor([len(input)]))
            ids, bags = input, torch.arange(num_bags).repeat_interleave(lengths)
        ids = ids.to(torch.int64)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.table.rows):
            raise IndexError(f"table {self.table.name}: ids must lie in [0, {self.table.rows}), "
                             f"got [{int(ids.min())}, {int(ids.max())}]")
        return self, ids, bags, num_bags

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        taken = self._take_prefetched(input, offsets)
        if taken is None:  # not fused with the other tables: this table's own exchange
            request = self.request(input, offsets)
            pooled = lookup_tables([request])[0]
        else:
            request, pooled = taken
        _, _, bags, num_bags = request
        if self.table.pooling == "mean":
            lengths = torch.bincount(bags, minlength=num_bags).clamp(min=1)
            pooled = pooled / lengths[:, None].to(pooled.dtype)
        return pooled.view(*input.shape, self.table.dim) if self.table.pooling is None else pooled

    def _take_prefetched(self, input: torch.Tensor, offsets: torch.Tensor | None):
        """This step's pooled sums from the fused exchange, if its ids are these."""
        pending, self.prefetched = self.prefetched, None
        if pending is None:
            return None
        (ids, ids_offsets), request, pooled = pending
        same = ids.shape == input.shape and torch.equal(ids, input) and (
            (offsets is None and ids_offsets is None) or
            (offsets is not None and ids_offsets is not None and torch.equal(offsets, ids_offsets)))
        if not same:
            raise PlannerError(f"table {self.table.name}: the model's table_inputs() gave "
                               "other ids than its forward passes the table; make them agree")
        return request, pooled


class ReplicatedEmbedding(nn.Module):
    """A REPLICATED table: the whole table on every rank, looked up locally with a sparse
    gradient (rows of this rank's ids); `hybrid_step` sums it over the ranks."""

    def __init__(self, table: EmbeddingTable, placement: TablePlacement, weight: torch.Tensor):
        super().__init__()
        self.table, self.placement = table, placement
        self.weight = nn.Parameter(weight)

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        if self.table.pooling is None:
            return F.embedding(input, self.weight, sparse=True)
        return F.embedding_bag(input, self.weight, offsets, mode=self.table.pooling, sparse=True)


@dataclass
class ShardedTables:
    """What apply_table_placements did: the table modules by qualified name."""

    modules: dict[str, nn.Module]  # ShardedEmbedding or ReplicatedEmbedding, model order

    def prefetch(self, inputs: dict) -> None:
        """Look up every sharded table of `inputs` ({name: ids or (ids, offsets)}) in one
        exchange per phase; each table's forward then takes its share (and checks that
        its ids are these)."""
        calls, requests = [], []  # (module, ids, offsets), module.request(ids, offsets)
        for name, given in inputs.items():
            module = self.modules.get(name)
            if module is None:
                raise PlannerError(f"table_inputs() names {name!r}, which is no table of the "
                                   f"model (it has {sorted(self.modules)[:4]}...)")
            if isinstance(module, ShardedEmbedding):
                ids, offsets = given if isinstance(given, tuple) else (given, None)
                calls.append((module, ids, offsets))
                requests.append(module.request(ids, offsets))
        for (module, ids, offsets), request, pooled in zip(calls, requests,
                                                           lookup_tables(requests)):
            module.prefetched = ((ids, offsets), request, pooled)

    def parameter_ids(self) -> set[int]:
        return {id(m.weight) for m in self.modules.values()}

    def dense_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """The model's parameters outside the tables (data parallel), in model order."""
        tables = self.parameter_ids()
        return [p for p in model.parameters() if id(p) not in tables]


def _materialize(module: nn.Module, table: EmbeddingTable, rows: torch.Tensor | slice,
                 cols: tuple[int, int], init: RowInit | None) -> torch.Tensor:
    """The shard's values: sliced from a real table, or produced by `init` (meta table)."""
    if module.weight.is_meta:
        if init is None:
            raise PlannerError(f"table {table.name} is on the meta device but no `init` was "
                               "given to produce its shard; pass init=")
        if isinstance(rows, slice):
            rows = torch.arange(rows.start, rows.stop, dtype=torch.int64)
        return init(table, rows, *cols)
    return module.weight.detach()[rows, cols[0]:cols[1]].clone()


def embedding_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules()
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag))}


def _table_digests(plans: dict, by_name: dict, node_size: int | None) -> torch.Tensor:
    """(tables, 32) uint8: SHA-256 of each table's name, shape, sharding, ranks, node size."""
    rows = []
    for name, (table, _) in plans.items():
        p = by_name[name]
        text = f"{name}|{table.rows}x{table.dim}|{p.sharding}|{list(p.ranks)}|{node_size}"
        rows.append(torch.frombuffer(bytearray(hashlib.sha256(text.encode()).digest()),
                                     dtype=torch.uint8))
    return torch.stack(rows) if rows else torch.zeros((0, 32), dtype=torch.uint8)


def _agree_on_placements(plans: dict, by_name: dict, node_size: int | None) -> None:
    """Every rank must shard the same tables the same way, or their all-to-alls pair up
    wrongly or hang: one all-gather of the table count, one of per-table digests;
    PlannerError naming the first table the ranks disagree on."""
    world = dist.get_world_size()
    count = torch.tensor([len(plans)])
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count)
    if len({int(c) for c in counts}) > 1:
        raise PlannerError(f"ranks disagree on the tables: they place {[int(c) for c in counts]} "
                           "tables; give every rank the same model and placements")
    mine = _table_digests(plans, by_name, node_size)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    for i, name in enumerate(plans):
        differ = [r for r in range(world) if not torch.equal(gathered[r][i], gathered[0][i])]
        if differ:
            raise PlannerError(f"table {name}: ranks {differ} place it differently from rank 0 "
                               f"(or it differs in shape); give every rank the same placements")


def apply_table_placements(model: nn.Module, placements: list[TablePlacement], *,
                           node_size: int | None = None, init: RowInit | None = None,
                           rank: int | None = None, world_size: int | None = None
                           ) -> ShardedTables:
    """Replace every table of `model` by its sharded module, in place; every rank calls it
    with the same placements (checked: one all-gather of digests). A table on the meta
    device is never built whole: each rank asks `init` for its own shard only. Every
    embedding of the model needs a placement;
    any placement that cannot run raises PlannerError naming the table, before anything
    is built."""
    rank = dist.get_rank() if rank is None else rank
    world_size = dist.get_world_size() if world_size is None else world_size
    found = embedding_modules(model)
    by_name = {p.table: p for p in placements}
    unknown = sorted(set(by_name) - set(found))
    if unknown:
        raise PlannerError(f"table {unknown[0]}: the model has no nn.Embedding(Bag) of that "
                           f"name (it has {sorted(found)[:4]}...)")
    missing = [name for name in found if name not in by_name]
    if missing:
        raise PlannerError(f"table {missing[0]}: no placement given; place every table")
    plans = {}
    for name, module in found.items():  # check all before building any
        table = table_of(name, module)
        plans[name] = (table, table_shards(table, by_name[name], world_size, node_size))
    if dist.is_initialized() and dist.get_world_size() == world_size:
        _agree_on_placements(plans, by_name, node_size)
    built: dict[str, nn.Module] = {}
    for name, module in found.items():
        table, shards = plans[name]
        placement = by_name[name]
        if placement.sharding is TableSharding.REPLICATED:
            weight = _materialize(module, table, slice(0, table.rows), (0, table.dim), init)
            built[name] = ReplicatedEmbedding(table, placement, weight)
        else:
            mine = next((i for i, s in enumerate(shards) if s.rank == rank), None)
            local_ids = None
            if mine is None:
                weight = torch.empty((0, table.dim), dtype=module.weight.dtype)
            elif placement.sharding is TableSharding.ROW_HASH:
                local_ids = hash_rows(table, HashRing.build(name, len(shards)), mine)
                weight = _materialize(module, table, local_ids, (0, table.dim), init)
            else:
                s = shards[mine]
                weight = _materialize(module, table, slice(s.row_start, s.row_stop),
                                      (s.col_start, s.col_stop), init)
            built[name] = ShardedEmbedding(table, placement, shards, rank, world_size, weight,
                                           local_ids)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, built[name])
    sharded = ShardedTables(built)
    table_inputs = getattr(model, "table_inputs", None)
    if callable(table_inputs):  # fuse the tables' exchanges: one all-to-all per phase
        model.register_forward_pre_hook(
            lambda module, args, kwargs: sharded.prefetch(table_inputs(*args, **kwargs)),
            with_kwargs=True)
    return sharded
