"""The table-placement problem: each table's sharding options priced per rank, a
solution's loads and cost, and a lower bound on any placement's step.

An option of a table adds `common` to every rank and has pieces (shards) placed on
distinct ranks (table-wise: 1, column-wise: k) or on fixed ranks (row-wise over all
ranks, table-row-wise over one node, replicated). `PlacementProblem.f` is one rank's
seconds (cost_models.embedding.rank_time), monotone in every field of the rank's load;
`lower_bound` is what no placement can beat. The searches live in
`planner.table_placement`, the greedy baseline in `planner.table_greedy`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.embedding import (ZERO, DenseCost, EmbeddingConfig, PlacementCost, RankLoad,
                                   capacity_bytes, cost_of_loads, host_busy_s, placement_loads,
                                   rank_time)
from cost_models.embedding_comm import EXECUTOR_A2A_CALLS_PER_EXCHANGE, AllToAllLink
from ir.cluster import ClusterSpec
from ir.embedding_tables import EmbeddingTable, TablePlacement, TableSharding
from ir.errors import PlannerError

# Fewest columns a column-wise shard keeps: 32 fp32 = one 128-byte memory transaction
# per row, below which gathers stop streaming full lines.
MIN_SHARD_COLUMNS = 32


@dataclass(frozen=True)
class Option:
    """One way to shard table `table`: `common` on every rank, `pieces` on `fixed_ranks`
    (in order) or, when those are None, on any distinct ranks."""

    table: int
    sharding: TableSharding
    common: RankLoad
    pieces: tuple[RankLoad, ...]
    fixed_ranks: tuple[int, ...] | None
    replicated_bytes: float  # the table's bytes when this option replicates it, else 0

    def placement(self, name: str, ranks: tuple[int, ...], world: int) -> TablePlacement:
        if self.sharding is TableSharding.REPLICATED:
            ranks = tuple(range(world))
        return TablePlacement(name, self.sharding, ranks)


def table_options(index: int, table: EmbeddingTable, cluster: ClusterSpec,
                  config: EmbeddingConfig) -> list[Option]:
    """Every sharding the planner considers for one table."""
    n, G = cluster.world_size, cluster.devices_per_node
    kinds: list[tuple[TableSharding, tuple[int, ...], bool]] = [
        (TableSharding.REPLICATED, tuple(range(n)), True),
        (TableSharding.TABLE_WISE, (0,), False)]
    k = 2
    while k <= n and table.dim % k == 0 and table.dim // k >= MIN_SHARD_COLUMNS:
        kinds.append((TableSharding.COLUMN_WISE, tuple(range(k)), False))
        k *= 2
    if n > 1:
        kinds.append((TableSharding.ROW_RANGE, tuple(range(n)), True))
        kinds.append((TableSharding.ROW_HASH, tuple(range(n)), True))
    if cluster.num_nodes > 1 and G > 1:
        for node in range(cluster.num_nodes):
            kinds.append((TableSharding.TABLE_ROW_WISE, tuple(range(node * G, node * G + G)), True))
    out = []
    for sharding, ranks, fixed in kinds:
        if sharding.splits_rows and table.rows < len(ranks):
            continue
        p = TablePlacement(table.name, sharding, ranks)
        common, owned = placement_loads(table, p, cluster, config)
        out.append(Option(index, sharding, common, tuple(load for _, load in owned),
                          ranks if fixed else None,
                          table.param_bytes if sharding is TableSharding.REPLICATED else 0.0))
    return out


@dataclass
class Solution:
    choice: list[Option]
    ranks: list[tuple[int, ...]]  # where each table's pieces went
    cost: PlacementCost


@dataclass
class TablePlan:
    tables: list[EmbeddingTable]
    placements: list[TablePlacement]
    cost: PlacementCost
    greedy_placements: list[TablePlacement]
    greedy_cost: PlacementCost
    lower_bound_s: float  # no placement can have a smaller step
    method: str  # "exact" or "heuristic"
    plan_s: float  # seconds the planning took

    @property
    def gap(self) -> float:
        return self.cost.step_s / self.lower_bound_s - 1


class PlacementProblem:
    """Options, cluster and dense part: what the searches share."""

    def __init__(self, tables, cluster: ClusterSpec, config: EmbeddingConfig, dense: DenseCost,
                 pins: list[TableSharding] | None = None):
        """`pins`: a sharding per table (cycled over the tables in order) that each must
        take; the searches still choose its ranks."""
        self.tables, self.cluster, self.config, self.dense = tables, cluster, config, dense
        self.n = cluster.world_size
        self.capacity = capacity_bytes(cluster, dense)
        self.link = AllToAllLink.of(cluster)
        self.options = [table_options(i, t, cluster, config) for i, t in enumerate(tables)]
        if pins:
            self.options = [_pinned(t, opts, pins[i % len(pins)])
                            for i, (t, opts) in enumerate(zip(tables, self.options))]

    def f(self, load: RankLoad) -> float:
        return rank_time(load, self.cluster, self.link).total_s

    def perf(self, o: Option) -> float:
        """Seconds an option costs summed over ranks (TorchRec's per-option perf): every
        rank's share (a replicated table's: its lookups, update and gradient all-gathers)
        and each piece."""
        return self.n * self.f(o.common) + sum(self.f(p) for p in o.pieces)

    def step(self, loads: list[RankLoad]) -> float:
        return self.dense.step_s + max(self.f(x) for x in loads)

    def fits(self, load: RankLoad) -> bool:
        return load.memory_bytes <= self.capacity

    def solution(self, choice: list[Option], ranks: list[tuple[int, ...]]) -> Solution:
        return Solution(list(choice), list(ranks),
                        cost_of_loads(self.loads(choice, ranks), self.cluster, self.dense))

    def loads(self, choice, ranks) -> list[RankLoad]:
        loads = [ZERO] * self.n
        for opt, where in zip(choice, ranks):
            loads = [x + opt.common for x in loads]
            for r, piece in zip(where, opt.pieces):
                loads[r] = loads[r] + piece
        return loads

    def placements(self, sol: Solution) -> list[TablePlacement]:
        return [opt.placement(self.tables[opt.table].name, where, self.n)
                for opt, where in zip(sol.choice, sol.ranks)]


def _pinned(table: EmbeddingTable, options: list[Option], sharding: TableSharding) -> list[Option]:
    kept = [o for o in options if o.sharding is sharding]
    if not kept:
        raise PlannerError(f"table {table.name}: {sharding} is not one of its options here "
                           f"({', '.join(sorted({str(o.sharding) for o in options}))}); pin "
                           "another sharding")
    return kept


# ---- bounds -------------------------------------------------------------------------------


def lower_bound(problem: PlacementProblem) -> float:
    """No placement's step is below this. Every plan either replicates every table (priced
    exactly) or has all-to-alls, and then:
      average bound   sum_r f(L_r) >= compute + beta * max(sum of sends, sum of receives)
                      per all-to-all phase (a sum of maxima exceeds the maximum of sums),
                      so max_r f(L_r) >= that / n, plus the latency of one fused
                      exchange's calls (every rank joins them); each table at its
                      cheapest option (a replicated one with its gradient all-gathers);
      largest piece   some rank holds the largest piece of each table's best option."""
    n = problem.n
    beta = _beta_per_byte(problem.link)
    call_s = problem.link.latency_s()
    sums = {"send": 0.0, "recv": 0.0}
    largest = 0.0
    for opts in problem.options:
        for side in sums:
            best = float("inf")
            for o in opts:
                t = _total(o, n)
                moved = (t.ids_send_bytes + 2 * t.out_send_bytes) if side == "send" else \
                    (t.ids_recv_bytes + 2 * t.out_recv_bytes)
                busy_s = host_busy_s(t.lookup_s + t.update_s, problem.cluster)
                best = min(best, (busy_s + t.gather_s + beta * moved) / n)
            sums[side] += best
        largest = max(largest, min(problem.f(o.common + max(o.pieces, key=problem.f, default=ZERO))
                                   for o in opts))
    # + the fused exchange's calls: a plan with a sharded table makes at least one, every
    # rank pays their latency once whatever the table count
    average = max(sums.values()) + EXECUTOR_A2A_CALLS_PER_EXCHANGE * call_s
    sharded = max(average, largest)  # f of the piece already has its latency
    everything_replicated = [next((o for o in opts if o.sharding is TableSharding.REPLICATED),
                                  None) for opts in problem.options]
    replicated_step = float("inf")
    if all(o is not None for o in everything_replicated):
        loads = problem.loads(everything_replicated, [o.fixed_ranks for o in everything_replicated])
        if all(problem.fits(x) for x in loads):
            replicated_step = problem.step(loads)
    return problem.dense.step_s + min(sharded, replicated_step - problem.dense.step_s)


def _beta_per_byte(link: AllToAllLink) -> float:
    """Seconds per byte of the all-to-all bandwidth term (its alpha part taken off)."""
    return link.bandwidth_s(1e9) / 1e9


def _total(opt: Option, n: int) -> RankLoad:
    total = ZERO
    for _ in range(n):
        total = total + opt.common
    for piece in opt.pieces:
        total = total + piece
    return total
