"""Place embedding tables on ranks: exact for small instances, LPT + local search with a
printed optimality gap for large ones, and the TorchRec-style greedy baseline.

The problem. Tables t = 1..T, ranks r = 1..n. Each table takes one option o (a sharding
and shard count, `table_options`); an option adds `common_o` to every rank and has pieces
(shards) placed on distinct ranks (table-wise: 1, column-wise: k) or on fixed ranks
(row-wise over all ranks, table-row-wise over one node, replicated). With L_r the sum of
the loads rank r receives (cost_models.embedding.RankLoad) and f the rank's seconds
(`rank_time`):

    minimise  step = dense_s + max_r f(L_r) + exposed_allreduce(dense + replicated bytes)
    s.t.      memory(L_r) <= capacity  for every r

f is monotone in every field of L, so a partial assignment's step never exceeds the
final one: the branch and bound (`exact`) prunes on it and on `lower_bound`, the average
bound [sum of all work, each table at its cheapest option] / n, and the largest-piece
bound. Rank symmetry: ranks of one node with identical loads are interchangeable, so a
piece goes only to the first of them.

Large instances (`heuristic`): start from each table's cheapest option; place pieces by
LPT (largest first, each on the rank where it ends lowest: Graham 1969, makespan within
4/3 - 1/(3n) of the optimum for a fixed set of additive pieces); then local search (move
or swap pieces off the slowest rank) and re-optioning (split a table on the slowest rank
column- or row-wise, or join one) while the step improves. The TorchRec-style greedy plan
seeds the search too, so the result is never worse than it. The printed gap is against
`lower_bound`, a certificate, not an estimate.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, fields

from cost_models.comm import collective_s
from cost_models.embedding import (ZERO, AllToAllLink, DenseCost, EmbeddingConfig, PlacementCost, RankLoad,
                                   all_to_all_rank_s, allreduce_exposed_s, capacity_bytes,
                                   cost_of_loads, placement_loads, rank_time)
from cost_models.estimate import overlap_efficiency
from ir.cluster import ClusterSpec
from ir.embedding_tables import EmbeddingTable, TablePlacement, TableSharding
from ir.errors import PlannerError

# Fewest columns a column-wise shard keeps: 32 fp32 = one 128-byte memory transaction
# per row, below which gathers stop streaming full lines.
MIN_SHARD_COLUMNS = 32
# Instances up to this many tables x ranks are solved exactly (branch and bound).
EXACT_MAX_TABLES = 8
EXACT_MAX_RANKS = 4
# Seconds the heuristic's improvement rounds may take: the 5 s planning target less
# option pricing and bounds, with room for a loaded machine.
HEURISTIC_TIME_LIMIT_S = 1.5


@dataclass(frozen=True)
class Option:
    """One way to shard table `table`: `common` on every rank, `pieces` on `fixed_ranks`
    (in order) or, when those are None, on any distinct ranks."""

    table: int
    sharding: TableSharding
    common: RankLoad
    pieces: tuple[RankLoad, ...]
    fixed_ranks: tuple[int, ...] | None
    replicated_bytes: float

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


class _Problem:
    """Options, cluster and dense part: what the searches share."""

    def __init__(self, tables, cluster: ClusterSpec, config: EmbeddingConfig, dense: DenseCost):
        self.tables, self.cluster, self.config, self.dense = tables, cluster, config, dense
        self.n = cluster.world_size
        self.capacity = capacity_bytes(cluster, dense)
        self.link = AllToAllLink.of(cluster)
        self._allreduce: dict[float, float] = {}
        self.options = [table_options(i, t, cluster, config) for i, t in enumerate(tables)]

    def f(self, load: RankLoad) -> float:
        return rank_time(load, self.cluster, self.link).total_s

    def perf(self, o: Option) -> float:
        """Seconds an option costs summed over ranks (TorchRec's per-option perf): every
        rank's share, each piece, and for a replicated table its gradient all-reduce on
        every rank."""
        allreduce = collective_s("all_reduce", o.replicated_bytes, self.n, self.cluster) \
            if o.replicated_bytes else 0.0
        return self.n * (self.f(o.common) + allreduce) + sum(self.f(p) for p in o.pieces)

    def allreduce(self, replicated: float) -> float:
        if replicated not in self._allreduce:
            self._allreduce[replicated] = allreduce_exposed_s(
                self.dense.grad_bytes + replicated, self.dense, self.cluster)
        return self._allreduce[replicated]

    def step(self, loads: list[RankLoad], replicated: float) -> float:
        return self.dense.compute_s + max(self.f(x) for x in loads) + self.allreduce(replicated)

    def fits(self, load: RankLoad) -> bool:
        return load.memory_bytes <= self.capacity

    def solution(self, choice: list[Option], ranks: list[tuple[int, ...]]) -> Solution:
        loads, replicated = self.loads(choice, ranks)
        return Solution(list(choice), list(ranks),
                        cost_of_loads(loads, replicated, self.cluster, self.dense))

    def loads(self, choice, ranks) -> tuple[list[RankLoad], float]:
        loads = [ZERO] * self.n
        for opt, where in zip(choice, ranks):
            loads = [x + opt.common for x in loads]
            for r, piece in zip(where, opt.pieces):
                loads[r] = loads[r] + piece
        return loads, sum(o.replicated_bytes for o in choice)

    def placements(self, sol: Solution) -> list[TablePlacement]:
        return [opt.placement(self.tables[opt.table].name, where, self.n)
                for opt, where in zip(sol.choice, sol.ranks)]


# ---- bounds -------------------------------------------------------------------------------


def lower_bound(problem: _Problem) -> float:
    """No placement's step is below this. Every plan either replicates every table (priced
    exactly) or has all-to-alls, and then:
      average bound   sum_r f(L_r) >= compute + beta * max(sum of sends, sum of receives)
                      per all-to-all phase (a sum of maxima exceeds the maximum of sums),
                      so max_r f(L_r) >= that / n + the all-to-all latencies; each table
                      at its cheapest option, a replicated one charged its gradient's
                      share of the all-reduce at the all-reduce's smallest per-byte slope
                      (ring and tree are affine in bytes, so the minimum of them grows at
                      least that fast) beyond what the dense backward can hide;
      largest piece   some rank holds the largest piece of each table's best option."""
    cl, n, dense = problem.cluster, problem.n, problem.dense
    beta = _beta_per_byte(problem.link)
    slope = _allreduce_slope(cl)
    dense_only = problem.allreduce(0.0)
    hidden = overlap_efficiency(cl) * dense.backward_s
    dense_ar = collective_s("all_reduce", dense.grad_bytes, n, cl)
    intra_bw = problem.link.intra_bytes_per_s
    sums = {"send": 0.0, "recv": 0.0}
    largest = 0.0
    for opts in problem.options:
        for side in sums:
            best = float("inf")
            for o in opts:
                t = _total(o, n)
                moved = (t.ids_send_bytes + 2 * t.out_send_bytes) if side == "send" else \
                    (t.ids_recv_bytes + 2 * t.out_recv_bytes)
                work = (t.lookup_s + t.update_s + beta * moved + t.intra_node_bytes / intra_bw) / n
                best = min(best, work + slope * o.replicated_bytes)
            sums[side] += best
        largest = max(largest, min(problem.f(o.common + max(o.pieces, key=problem.f, default=ZERO))
                                   for o in opts))
    latency = 3 * problem.link.seconds(0.0)  # three all-to-all phases
    # exposed(ar(D + R)) >= ar(D) + slope R - hidden, and >= exposed(ar(D))
    average = max(sums.values()) + latency + min(0.0, dense_ar - hidden)
    sharded = max(average, largest + dense_only)  # f of the piece already has its latency
    everything_replicated = [next(o for o in opts if o.sharding is TableSharding.REPLICATED)
                             for opts in problem.options]
    loads, replicated = problem.loads(everything_replicated, [o.fixed_ranks for o in everything_replicated])
    replicated_step = problem.step(loads, replicated) if all(problem.fits(x) for x in loads) \
        else float("inf")
    return dense.compute_s + min(sharded, replicated_step - dense.compute_s)


def _allreduce_slope(cluster: ClusterSpec) -> float:
    """Seconds per byte the all-reduce grows by at least (its smallest slope: large sizes)."""
    big = 1e12
    n = cluster.world_size
    return (collective_s("all_reduce", 2 * big, n, cluster) - collective_s("all_reduce", big, n, cluster)) / big


def _beta_per_byte(link: AllToAllLink) -> float:
    """Seconds per byte of the all-to-all bandwidth term (its alpha part taken off)."""
    return (link.seconds(1e9) - link.seconds(0.0)) / 1e9


def _total(opt: Option, n: int) -> RankLoad:
    total = ZERO
    for _ in range(n):
        total = total + opt.common
    for piece in opt.pieces:
        total = total + piece
    return total


# ---- exact: branch and bound ------------------------------------------------------------


def exact(problem: _Problem, time_limit_s: float | None = None) -> Solution | None:
    """The optimal placement (None when nothing fits), by depth-first branch and bound."""
    order = sorted(range(len(problem.tables)),
                   key=lambda i: -max(problem.f(p) for o in problem.options[i] for p in o.pieces or (o.common,)))
    G = problem.cluster.devices_per_node
    best: list = [float("inf"), None]
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    choice: dict[int, tuple[Option, tuple[int, ...]]] = {}

    def rec(depth: int, loads: list[RankLoad], replicated: float) -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutError
        if problem.step(loads, replicated) >= best[0]:
            return
        if depth == len(order):
            best[0] = problem.step(loads, replicated)
            best[1] = dict(choice)
            return
        i = order[depth]
        for opt in problem.options[i]:
            base = [x + opt.common for x in loads]
            if opt.fixed_ranks is not None:
                rank_sets = [opt.fixed_ranks]
            else:
                rank_sets = _distinct_sets(base, len(opt.pieces), G)
            for ranks in rank_sets:
                new = list(base)
                for r, piece in zip(ranks, opt.pieces):
                    new[r] = new[r] + piece
                if not all(problem.fits(x) for x in new):
                    continue
                choice[i] = (opt, tuple(ranks))
                rec(depth + 1, new, replicated + opt.replicated_bytes)
                del choice[i]

    rec(0, [ZERO] * problem.n, 0.0)
    if best[1] is None:
        return None
    picked = [best[1][i] for i in range(len(problem.tables))]
    return problem.solution([o for o, _ in picked], [r for _, r in picked])


def _distinct_sets(loads: list[RankLoad], k: int, G: int):
    """k distinct ranks, skipping sets that differ from a kept one only by swapping ranks
    of one node that hold identical loads (they price the same)."""
    seen_class: dict = {}
    for r, load in enumerate(loads):
        key = (r // G, load)
        seen_class.setdefault(key, []).append(r)
    classes = list(seen_class.values())
    # choose how many ranks from each class (a prefix of it): a composition of k
    def compose(ci: int, left: int):
        if ci == len(classes):
            if left == 0:
                yield ()
            return
        for take in range(min(left, len(classes[ci])) + 1):
            for rest in compose(ci + 1, left - take):
                yield tuple(classes[ci][:take]) + rest
    return [tuple(sorted(ranks)) for ranks in compose(0, k)]


def brute_force_size(problem: _Problem) -> int:
    """How many assignments a plain enumeration would price (for choosing exact)."""
    total = 1
    for opts in problem.options:
        total *= sum(1 if o.fixed_ranks is not None else _comb(problem.n, len(o.pieces)) for o in opts)
    return total


def _comb(n: int, k: int) -> int:
    import math
    return math.comb(n, k)


# ---- heuristic: LPT + local search + re-optioning ---------------------------------------


def _key(problem: _Problem, loads: list[RankLoad], replicated: float) -> tuple[float, float]:
    """Compare by step, then by the sum of squared rank times (flatter is better)."""
    times = [problem.f(x) for x in loads]
    return max(times) + problem.allreduce(replicated), sum(t * t for t in times)


def lpt(problem: _Problem, choice: list[Option]) -> list[tuple[int, ...]] | None:
    """Place the free pieces largest first, each on the rank where it ends lowest (and
    that has memory for it and no other piece of its table); fixed pieces first."""
    loads = [ZERO] * problem.n
    ranks: list[list[int]] = [[] for _ in choice]
    for t, opt in enumerate(choice):
        loads = [x + opt.common for x in loads]
        if opt.fixed_ranks is not None:
            for r, piece in zip(opt.fixed_ranks, opt.pieces):
                loads[r] = loads[r] + piece
            ranks[t] = list(opt.fixed_ranks)
    free = [(problem.f(piece), t, piece) for t, opt in enumerate(choice) if opt.fixed_ranks is None
            for piece in opt.pieces]
    for _, t, piece in sorted(free, key=lambda x: (-x[0], x[1])):
        best_r, best = None, None
        for r in range(problem.n):
            if r in ranks[t]:
                continue
            new = loads[r] + piece
            if not problem.fits(new):
                continue
            score = (problem.f(new), r)
            if best is None or score < best:
                best_r, best = r, score
        if best_r is None:
            return None
        loads[best_r] = loads[best_r] + piece
        ranks[t].append(best_r)
    if not all(problem.fits(x) for x in loads):
        return None
    return [tuple(r) for r in ranks]


def local_search(problem: _Problem, choice: list[Option], ranks: list[tuple[int, ...]],
                 deadline: float) -> list[tuple[int, ...]]:
    """Move or swap free pieces off the slowest rank while (step, sum of squares) drops."""
    ranks = [list(r) for r in ranks]
    loads, replicated = problem.loads(choice, ranks)
    current = _key(problem, loads, replicated)
    while time.perf_counter() < deadline:
        worst = max(range(problem.n), key=lambda r: problem.f(loads[r]))
        mine = [(t, j) for t, opt in enumerate(choice) if opt.fixed_ranks is None
                for j, r in enumerate(ranks[t]) if r == worst]
        others = [(t, j) for t, opt in enumerate(choice) if opt.fixed_ranks is None
                  for j, r in enumerate(ranks[t]) if r != worst]
        best_move, best_key = None, current
        for t, j in mine:
            piece = choice[t].pieces[j]
            for r in range(problem.n):  # move
                if r == worst or r in ranks[t]:
                    continue
                trial = list(loads)
                trial[worst] = _minus(trial[worst], piece)
                trial[r] = trial[r] + piece
                if problem.fits(trial[r]):
                    k = _key(problem, trial, replicated)
                    if k < best_key:
                        best_move, best_key = ("move", t, j, r), k
            for u, i in others:  # swap
                r = ranks[u][i]
                if u == t or r in ranks[t] or worst in ranks[u]:
                    continue
                other = choice[u].pieces[i]
                trial = list(loads)
                trial[worst] = _minus(trial[worst], piece) + other
                trial[r] = _minus(trial[r], other) + piece
                if problem.fits(trial[r]) and problem.fits(trial[worst]):
                    k = _key(problem, trial, replicated)
                    if k < best_key:
                        best_move, best_key = ("swap", t, j, u, i), k
        if best_move is None:
            break
        if best_move[0] == "move":
            _, t, j, r = best_move
            ranks[t][j] = r
        else:
            _, t, j, u, i = best_move
            ranks[t][j], ranks[u][i] = ranks[u][i], ranks[t][j]
        loads, replicated = problem.loads(choice, ranks)
        current = _key(problem, loads, replicated)
    return [tuple(r) for r in ranks]


def _minus(a: RankLoad, b: RankLoad) -> RankLoad:
    """a - b field by field (a piece leaving a rank); the rank stays in the all-to-alls."""
    return RankLoad(*(getattr(a, f.name) - getattr(b, f.name) for f in fields(RankLoad)[:-1]),
                    a.sharded)


def heuristic(problem: _Problem, seeds: list[Solution],
              time_limit_s: float = HEURISTIC_TIME_LIMIT_S) -> Solution | None:
    """The best of the seeds after local search and re-optioning (see module doc)."""
    deadline = time.perf_counter() + time_limit_s
    best: Solution | None = None
    for seed in seeds:
        ranks = local_search(problem, seed.choice, seed.ranks, deadline)
        sol = problem.solution(seed.choice, ranks)
        if sol.cost.fits and (best is None or _sol_key(sol) < _sol_key(best)):
            best = sol
    if best is None:
        return None
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        loads, _ = problem.loads(best.choice, best.ranks)
        worst = max(range(problem.n), key=lambda r: problem.f(loads[r]))
        touching = [t for t, where in enumerate(best.ranks) if worst in where]
        for t in touching:
            for opt in problem.options[t]:
                if opt is best.choice[t] or time.perf_counter() > deadline:
                    continue
                choice = list(best.choice)
                choice[t] = opt
                ranks = lpt(problem, choice)
                if ranks is None:
                    continue
                ranks = local_search(problem, choice, ranks, deadline)
                sol = problem.solution(choice, ranks)
                if sol.cost.fits and _sol_key(sol) < _sol_key(best):
                    best, improved = sol, True
            if improved:
                break
    return best


def _sol_key(sol: Solution) -> tuple[float, float]:
    return sol.cost.step_s, sum(t * t for t in sol.cost.embedding_s)


# ---- the TorchRec-style greedy baseline -------------------------------------------------


def greedy(problem: _Problem) -> Solution | None:
    """TorchRec's default planner, reduced to its two rules (torchrec/distributed/planner:
    GreedyProposer's first proposal and GreedyPerfPartitioner):
      1. each table takes the sharding option with the lowest perf, perf being the sum of
         its shards' estimated seconds (here: rank_time of each shard and of the every-rank
         part, summed), over the default GPU sharding types (data-parallel, table-wise,
         row-wise, table-row-wise, column-wise);
      2. options are placed in descending perf, each shard on the device with the lowest
         accumulated perf that still has the storage for it (ties: the lowest rank);
      3. when a table finds no device with room, the proposer moves that table to its
         next-best option and partitions again.
    Device perf is additive here as in TorchRec; the result is then priced with the
    full (non-additive) cost model like every other plan."""
    n = problem.n
    ranked = [sorted((o for o in opts if all(problem.fits(p + o.common) for p in o.pieces or (o.common,))),
                     key=lambda o: (problem.perf(o), o.sharding.value)) for opts in problem.options]
    if not all(ranked):
        return None
    index = [0] * len(ranked)
    while True:  # a proposal that cannot be partitioned moves its failing table to its next option
        picks = [options[i] for options, i in zip(ranked, index)]
        ranks, failed = _greedy_partition(problem, picks)
        if failed is None:
            return problem.solution(picks, ranks)
        index[failed] += 1
        if index[failed] == len(ranked[failed]):
            return None


def _greedy_partition(problem: _Problem, picks: list[Option]):
    """GreedyPerfPartitioner: ([ranks per table], None), or (None, the table that did not fit)."""
    n = problem.n
    device_perf = [0.0] * n
    memory = [0.0] * n
    ranks: list[tuple[int, ...]] = [()] * len(picks)
    for opt in picks:  # the every-rank part first: it is on every device whatever happens
        for r in range(n):
            device_perf[r] += problem.f(opt.common)
            memory[r] += opt.common.memory_bytes
    if max(memory) > problem.capacity:
        return None, max(range(len(picks)), key=lambda t: picks[t].common.memory_bytes)
    order = sorted(range(len(picks)), key=lambda t: -sum(problem.f(p) for p in picks[t].pieces))
    for t in order:
        opt = picks[t]
        if opt.fixed_ranks is not None:
            for r, piece in zip(opt.fixed_ranks, opt.pieces):
                device_perf[r] += problem.f(piece)
                memory[r] += piece.memory_bytes
            if any(memory[r] > problem.capacity for r in opt.fixed_ranks):
                return None, t
            ranks[t] = opt.fixed_ranks
            continue
        chosen = []
        for piece in opt.pieces:
            candidates = [r for r in range(n) if r not in chosen
                          and memory[r] + piece.memory_bytes <= problem.capacity]
            if not candidates:
                return None, t
            r = min(candidates, key=lambda r: (device_perf[r], r))
            chosen.append(r)
            device_perf[r] += problem.f(piece)
            memory[r] += piece.memory_bytes
        ranks[t] = tuple(chosen)
    return ranks, None


# ---- entry point ------------------------------------------------------------------------


def plan_tables(tables: list[EmbeddingTable], cluster: ClusterSpec, config: EmbeddingConfig,
                dense: DenseCost, method: str = "auto") -> TablePlan:
    """Our placement and the greedy baseline's, priced by the same cost model."""
    if not tables:
        raise PlannerError("the model has no embedding tables to place")
    start = time.perf_counter()
    problem = _Problem(tables, cluster, config, dense)
    base = greedy(problem)
    if method == "auto":
        small = len(tables) <= EXACT_MAX_TABLES and problem.n <= EXACT_MAX_RANKS
        method = "exact" if small else "heuristic"
    if method == "exact":
        sol = exact(problem)
    else:
        seeds = [s for s in (base,) if s is not None]
        cheapest = [min(opts, key=problem.perf) for opts in problem.options]
        ranks = lpt(problem, cheapest)
        if ranks is not None:
            seeds.append(problem.solution(cheapest, ranks))
        sol = heuristic(problem, seeds)
    if sol is None:
        need = max(t.param_bytes for t in tables)
        raise PlannerError(f"no placement fits: {cluster.world_size} ranks with "
                           f"{problem.capacity / 2**30:.1f} GiB free each for tables "
                           f"totalling {sum(t.param_bytes for t in tables) / 2**30:.1f} GiB "
                           f"(largest {need / 2**30:.1f} GiB); add nodes or shrink the tables")
    bound = lower_bound(problem)
    plan_s = time.perf_counter() - start
    return TablePlan(tables, problem.placements(sol), sol.cost,
                     problem.placements(base) if base else [], base.cost if base else None,
                     min(bound, sol.cost.step_s), method, plan_s)
