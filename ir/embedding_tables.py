"""Embedding tables and where their rows live: the one vocabulary the table planner
(`planner`), its cost model (`cost_models`) and the sharded-embedding executor
(`executors`) share.

A recommendation model's tables are placed table by table (TorchRec's sharding types;
the parameter server's key-range and consistent-hash partitions):

    REPLICATED      every rank holds the whole table (data parallel; small tables)
    TABLE_WISE      one rank holds the whole table
    ROW_RANGE       rows split into contiguous key ranges, one per rank (range partitioning)
    ROW_HASH        rows assigned by consistent hashing: adding a rank moves ~1/N of rows
    COLUMN_WISE     the embedding dimension split into column blocks, one per rank
    TABLE_ROW_WISE  ROW_RANGE over the ranks of one node (lookups stay on the node's links)

`TablePlacement` says which sharding a table gets and which ranks hold its shards, in
shard order; `row_shard_bounds`, `column_shard_bounds` and `HashRing` are the one
definition of which rows / columns / ids each shard holds.

    >>> p = TablePlacement("tables.3", TableSharding.ROW_RANGE, ranks=(0, 1, 2))
    >>> row_shard_bounds(10, len(p.ranks))
    ((0, 4), (4, 7), (7, 10))
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

import torch

from ir.errors import PlannerError


class TableSharding(str, enum.Enum):
    REPLICATED = "replicated"
    TABLE_WISE = "table_wise"
    ROW_RANGE = "row_range"
    ROW_HASH = "row_hash"
    COLUMN_WISE = "column_wise"
    TABLE_ROW_WISE = "table_row_wise"

    @property
    def splits_rows(self) -> bool:
        return self in (TableSharding.ROW_RANGE, TableSharding.ROW_HASH,
                        TableSharding.TABLE_ROW_WISE)

    def __str__(self) -> str:
        return self.value


class TableDtype(str, enum.Enum):
    """A table's element type. The executor exchanges each dtype's tables in collectives of
    their own (`executors.table_exchange.lookup_tables`), so it is the exchange's key: a
    bf16 and an fp16 table are two exchanges though both are 2 bytes per element."""

    FLOAT64 = "float64"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.value)

    @classmethod
    def of(cls, dtype: torch.dtype, where: str) -> TableDtype:
        """The TableDtype of a weight's `dtype` (read at trace time); PlannerError naming
        `where` (the table) for one no table trains in."""
        try:
            return cls(str(dtype).removeprefix("torch."))
        except ValueError:
            raise PlannerError(f"table {where}: its weight is {dtype}; keep tables in one of "
                               f"{', '.join(d.value for d in cls)}") from None

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class EmbeddingTable:
    """One table as the IR sees it. `dtype`: its weight's element type (a `TableDtype` or
    its name); `ids_per_sample`: lookups one sample makes (multi-hot bag size);
    `hot_row_fraction`: the share of lookups that hit the most frequent 1% of rows,
    measured from a sample of the user's ids (None: not measured, assume uniform)."""

    name: str  # the module's qualified name in the model
    rows: int
    dim: int
    dtype: TableDtype
    pooling: str | None  # "sum" / "mean" / "max" for EmbeddingBag, None for Embedding
    ids_per_sample: int
    hot_row_fraction: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, TableDtype):
            try:
                object.__setattr__(self, "dtype", TableDtype(self.dtype))
            except ValueError:
                raise PlannerError(f"table {self.name}: dtype {self.dtype!r} is not one of "
                                   f"{', '.join(d.value for d in TableDtype)}; use one") from None

    @property
    def dtype_bytes(self) -> int:
        return self.dtype.element_bytes

    @property
    def param_bytes(self) -> int:
        return self.rows * self.dim * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class TablePlacement:
    table: str  # EmbeddingTable.name
    sharding: TableSharding
    ranks: tuple[int, ...]  # shard holders in shard order (every rank for REPLICATED)

    def __post_init__(self) -> None:
        if not self.ranks or len(set(self.ranks)) != len(self.ranks):
            raise PlannerError(f"table {self.table}: its ranks {list(self.ranks)} must be "
                               "distinct and at least one")
        if self.sharding is TableSharding.TABLE_WISE and len(self.ranks) != 1:
            raise PlannerError(f"table {self.table}: table_wise puts it on one rank, got "
                               f"{list(self.ranks)}")


def _even_bounds(size: int, parts: int) -> tuple[tuple[int, int], ...]:
    """`size` split into `parts` contiguous pieces, the first `size % parts` one larger."""
    base, extra = divmod(size, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)


def row_shard_bounds(rows: int, num_shards: int) -> tuple[tuple[int, int], ...]:
    """[start, stop) rows of each shard of a ROW_RANGE / TABLE_ROW_WISE table."""
    return _even_bounds(rows, num_shards)


def column_shard_bounds(dim: int, num_shards: int) -> tuple[tuple[int, int], ...]:
    """[start, stop) columns of each shard of a COLUMN_WISE table."""
    if num_shards > dim:
        raise PlannerError(f"a column-wise table of dimension {dim} cannot split over "
                           f"{num_shards} ranks")
    return _even_bounds(dim, num_shards)


SPARSE_OPTIMIZERS = ("sgd", "rowwise_adagrad", "adam")  # the tables' row-sparse optimizers


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard of a table: its rank, its row range (ROW_HASH: all rows, the ring picks)
    and its column range, [start, stop) each."""

    rank: int
    row_start: int
    row_stop: int
    col_start: int
    col_stop: int

    def __str__(self) -> str:
        return f"r{self.rank}[{self.row_start}:{self.row_stop}, {self.col_start}:{self.col_stop}]"


def table_shards(table: EmbeddingTable, placement: TablePlacement, world_size: int,
                 node_size: int | None) -> tuple[Shard, ...]:
    """The shards of `table` under `placement`: the one definition of which rank holds
    which rows and columns (the executor builds them, the plan file writes them).
    PlannerError naming the table when the placement cannot run on `world_size` ranks
    (nodes of `node_size` ranks)."""
    kind, ranks, name = placement.sharding, placement.ranks, table.name
    outside = [r for r in ranks if not 0 <= r < world_size]
    if outside:
        raise PlannerError(f"table {name}: ranks {outside} are outside the {world_size} ranks")
    if kind is TableSharding.REPLICATED:
        if sorted(ranks) != list(range(world_size)):
            raise PlannerError(f"table {name}: replicated tables live on every rank (each "
                               f"looks up its own share of the batch), got ranks {list(ranks)}")
        return tuple(Shard(r, 0, table.rows, 0, table.dim) for r in ranks)
    if kind is TableSharding.COLUMN_WISE:
        if len(ranks) > table.dim:
            raise PlannerError(f"table {name}: {table.dim} columns cannot split over "
                               f"{len(ranks)} ranks")
        return tuple(Shard(r, 0, table.rows, c0, c1)
                     for r, (c0, c1) in zip(ranks, column_shard_bounds(table.dim, len(ranks))))
    if kind.splits_rows and len(ranks) > table.rows:
        raise PlannerError(f"table {name}: {table.rows} rows cannot split over {len(ranks)} ranks")
    if kind is TableSharding.TABLE_ROW_WISE:
        if node_size is None or node_size < 1:
            raise PlannerError(f"table {name}: table_row_wise needs the node size (ranks per "
                               "node); pass node_size")
        nodes = sorted({r // node_size for r in ranks})
        if len(nodes) != 1:
            raise PlannerError(f"table {name}: table_row_wise keeps a table inside one node, "
                               f"but ranks {list(ranks)} span nodes {nodes} of {node_size} ranks")
    if kind is TableSharding.ROW_HASH:
        return tuple(Shard(r, 0, table.rows, 0, table.dim) for r in ranks)
    if kind is TableSharding.TABLE_WISE:
        return (Shard(ranks[0], 0, table.rows, 0, table.dim),)
    return tuple(Shard(r, start, stop, 0, table.dim)
                 for r, (start, stop) in zip(ranks, row_shard_bounds(table.rows, len(ranks))))


@dataclass(frozen=True, slots=True)
class PlacedTable:
    """One table of a plan: what it is and where its shards live."""

    table: EmbeddingTable
    placement: TablePlacement

    def __post_init__(self) -> None:
        if self.placement.table != self.table.name:
            raise PlannerError(f"table {self.table.name}: its placement names "
                               f"{self.placement.table!r}")

    def __str__(self) -> str:
        return f"{self.table.name}: {self.placement.sharding} on {list(self.placement.ranks)}"


@dataclass(frozen=True, slots=True)
class EmbeddingPlan:
    """The tables of a plan (model parallel; the dense part is the plan's layers):
    every table's placement, the row-sparse optimizer of the tables, and the ranks per
    node that table_row_wise stays inside."""

    tables: tuple[PlacedTable, ...]
    sparse_optimizer: str = "rowwise_adagrad"
    node_size: int = 1

    def __post_init__(self) -> None:
        if not self.tables:
            raise PlannerError("an embedding plan needs at least one table")
        if self.sparse_optimizer not in SPARSE_OPTIMIZERS:
            raise PlannerError(f"unknown sparse optimizer {self.sparse_optimizer!r}; use one of "
                               f"{', '.join(SPARSE_OPTIMIZERS)}")
        if isinstance(self.node_size, bool) or not isinstance(self.node_size, int) \
                or self.node_size < 1:
            raise PlannerError(f"node_size must be an integer >= 1, got {self.node_size!r}")
        seen = set()
        for t in self.tables:
            if t.table.name in seen:
                raise PlannerError(f"table {t.table.name} is placed twice; place it once")
            seen.add(t.table.name)

    @property
    def placements(self) -> list[TablePlacement]:
        return [t.placement for t in self.tables]

    def shards(self, world_size: int) -> dict[str, tuple[Shard, ...]]:
        """Every table's shards on `world_size` ranks (PlannerError naming a bad table)."""
        return {t.table.name: table_shards(t.table, t.placement, world_size, self.node_size)
                for t in self.tables}


# Points per shard on the hash ring: with V virtual nodes a shard's share of the rows
# deviates by ~1/sqrt(V) (Karger et al. 1997, consistent hashing); 64 gives ~12%.
HASH_RING_POINTS_PER_SHARD = 64

# splitmix64's constants (Steele, Lea, Flood 2014), as signed int64 for torch's wrapping
# int64 arithmetic: a bijective mixer, so distinct ids get distinct ring positions.
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's `>>` is arithmetic: it copies the sign bit,
    which would make every output non-negative and the mixer not bijective)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix64(values: torch.Tensor, salt: int) -> torch.Tensor:
    """splitmix64 of int64 `values` xor `salt`, elementwise (torch int64 wraps)."""
    z = (values.to(torch.int64) ^ salt) + _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def _salt(table: str) -> int:
    return int.from_bytes(hashlib.blake2b(table.encode(), digest_size=7).digest(), "big")


@dataclass(frozen=True)
class HashRing:
    """The consistent-hash ring of one ROW_HASH table over `num_shards` shards: each
    shard owns HASH_RING_POINTS_PER_SHARD points; a row belongs to the shard of the first
    point at or after its own hash. With one more shard only the rows landing just before
    the new shard's points move (~1/(N+1) of them)."""

    points: torch.Tensor  # (num_shards * points,) sorted int64 ring positions
    shards: torch.Tensor  # (same,) the shard index owning each position

    @classmethod
    def build(cls, table: str, num_shards: int) -> HashRing:
        salt = _salt(table)
        keys = torch.arange(num_shards * HASH_RING_POINTS_PER_SHARD, dtype=torch.int64)
        positions = mix64(keys, salt ^ 0x5EED)  # ring points: a different stream than rows
        order = torch.argsort(positions)
        return cls(positions[order], (keys // HASH_RING_POINTS_PER_SHARD)[order])

    def owner(self, rows: torch.Tensor, table: str) -> torch.Tensor:
        """The shard index of every id in `rows` (any shape, int64)."""
        i = torch.searchsorted(self.points, mix64(rows, _salt(table)))
        return self.shards[i % len(self.points)]


# ------------------------------------------------------------------ counter-based init

# Rows generated per chunk: each int64 or float64 temporary of one call is
# 8 x 4096 x dim bytes (1 MiB at dim 32), whatever the shard's size.
INIT_CHUNK_ROWS = 1 << 12
_UNIT_53 = float(2 ** -53)  # a 53-bit integer times this is uniform in [0, 1) (IEEE double)


def init_table_rows(table: str, seed: int, rows: torch.Tensor, col_start: int, col_stop: int,
                    dim: int, bound: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows `rows` (int64, any order) x columns [col_start, col_stop) of table `table`,
    uniform in [-bound, bound): entry (r, c) depends only on (seed, table, r, c), so any
    shard of a table can be produced alone, equal to the same slice of a full build.

    The draw is splitmix64 of the counter r * dim + c (Salmon et al. 2011's
    counter-based idea with Steele et al.'s mixer); the top 53 bits give a double."""
    salt = _salt(f"{table}#{seed}")
    cols = torch.arange(col_start, col_stop, dtype=torch.int64)
    out = torch.empty((len(rows), col_stop - col_start), dtype=dtype)
    for start in range(0, len(rows), INIT_CHUNK_ROWS):
        chunk = rows[start:start + INIT_CHUNK_ROWS].to(torch.int64)
        counters = chunk[:, None] * dim + cols[None, :]  # (n, width)
        bits = _shift_right(mix64(counters, salt), 11)  # the top 53 bits, >= 0
        unit = bits.to(torch.float64) * _UNIT_53  # [0, 1)
        out[start:start + len(chunk)] = ((2.0 * unit - 1.0) * bound).to(dtype)
    return out


def dlrm_table_bound(rows: int) -> float:
    """DLRM's reference table init U(+-sqrt(1/rows)) (Naumov et al. 2019, dlrm_s_pytorch)."""
    return rows ** -0.5
