"""Place embedding tables on ranks: exact for small instances, LPT + local search with a
printed optimality gap for large ones, and the TorchRec-style greedy baseline.

The problem. Tables t = 1..T, ranks r = 1..n. Each table takes one option o (a sharding
and shard count, `table_options`); an option adds `common_o` to every rank and has pieces
(shards) placed on distinct ranks (table-wise: 1, column-wise: k) or on fixed ranks
(row-wise over all ranks, table-row-wise over one node, replicated). With L_r the sum of
the loads rank r receives (cost_models.embedding.RankLoad) and f the rank's seconds
(`rank_time`):

    minimise  step = dense_s + max_r f(L_r)
    s.t.      memory(L_r) <= capacity  for every r

f is monotone in every field of L, so a partial assignment's step never exceeds the
final one: the branch and bound (`exact`, tables largest first) prunes every branch whose
partial step already reaches the best complete one. Rank symmetry: ranks of one node with
identical loads are interchangeable, so a piece goes only to the first of them.

Large instances (`heuristic`). Seeds: each table at its cheapest option (TorchRec's perf:
seconds summed over ranks, a replicated table's gradient all-gathers included), with replication
allowed only up to each of REPLICATE_LIMITS_BYTES, and column-split (`split_until`) until
there are n, 1.5n, 2n pieces; pieces placed by LPT (largest first, each on the rank
where it ends lowest: Graham 1969, makespan within 4/3 - 1/(3n) of the optimum for a
fixed set of additive pieces). The TorchRec-style greedy plan is a seed too, so the
result is never worse than it. The best seeds then get local search (move or swap
pieces off the slowest rank) and re-optioning (another option for a table on the
slowest rank, re-placed by LPT) while the step improves, within HEURISTIC_TIME_LIMIT_S.
The printed gap is against `table_problem.lower_bound`, a certificate, not an estimate.
"""

from __future__ import annotations

import time
from dataclasses import fields

from cost_models.embedding import ZERO, DenseCost, EmbeddingConfig, RankLoad
from ir.cluster import ClusterSpec
from ir.embedding_tables import EmbeddingTable, TableSharding
from ir.errors import PlannerError
from planner.table_greedy import greedy
from planner.table_problem import (Option, PlacementProblem, Solution, TablePlan,
                                   lower_bound)

# Instances up to this many tables x ranks are solved exactly (branch and bound).
EXACT_MAX_TABLES = 8
EXACT_MAX_RANKS = 4
# Seconds the heuristic's improvement rounds may take: the 5 s planning target less
# option pricing and bounds, with room for a loaded machine.
HEURISTIC_TIME_LIMIT_S = 1.5
# Seeds: replicate only tables up to each of these sizes (the all-reduce that replication
# adds is shared by all ranks, so one table at a time never pays to move it), and the
# best few seeds go on to local search.
REPLICATE_LIMITS_BYTES = (float("inf"), 64 * 2**20, 8 * 2**20, 1 * 2**20, 0.0)
HEURISTIC_SEEDS = 4
# Seconds `--method auto` gives the branch and bound before falling back to the heuristic.
EXACT_TIME_LIMIT_S = 3.0


# ---- exact: branch and bound ------------------------------------------------------------


def exact(problem: PlacementProblem, time_limit_s: float | None = None) -> Solution | None:
    """The optimal placement (None when nothing fits), by depth-first branch and bound."""
    order = sorted(range(len(problem.tables)),
                   key=lambda i: -max(problem.f(p) for o in problem.options[i] for p in o.pieces or (o.common,)))
    G = problem.cluster.devices_per_node
    best: list = [float("inf"), None]
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    choice: dict[int, tuple[Option, tuple[int, ...]]] = {}
    signatures = rank_signatures(problem)

    def rec(depth: int, loads: list[RankLoad]) -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutError
        if problem.step(loads) >= best[0]:
            return
        if depth == len(order):
            best[0] = problem.step(loads)
            best[1] = dict(choice)
            return
        i = order[depth]
        for opt in problem.options[i]:
            base = [x + opt.common for x in loads]
            if opt.fixed_ranks is not None:
                rank_sets = [opt.fixed_ranks]
            else:
                rank_sets = _distinct_sets(base, len(opt.pieces), G, signatures)
            for ranks in rank_sets:
                new = list(base)
                for r, piece in zip(ranks, opt.pieces):
                    new[r] = new[r] + piece
                if not all(problem.fits(x) for x in new):
                    continue
                choice[i] = (opt, tuple(ranks))
                rec(depth + 1, new)
                del choice[i]

    rec(0, [ZERO] * problem.n)
    if best[1] is None:
        return None
    picked = [best[1][i] for i in range(len(problem.tables))]
    return problem.solution([o for o, _ in picked], [r for _, r in picked])


def rank_signatures(problem: PlacementProblem) -> list[tuple]:
    """Per rank, the piece every fixed-rank option puts on it: two ranks are
    interchangeable only if these agree (a hash ring's shards differ in size, so a later
    ROW_HASH table tells ranks apart that hold identical loads now)."""
    out = []
    for r in range(problem.n):
        out.append(tuple(o.pieces[o.fixed_ranks.index(r)] if r in o.fixed_ranks else None
                         for opts in problem.options for o in opts
                         if o.fixed_ranks is not None and o.pieces))
    return out


def _distinct_sets(loads: list[RankLoad], k: int, G: int, signatures: list[tuple]):
    """k distinct ranks, skipping sets that differ from a kept one only by swapping ranks
    of one node that hold identical loads and get identical fixed pieces (they price the
    same)."""
    seen_class: dict = {}
    for r, load in enumerate(loads):
        key = (r // G, load, signatures[r])
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


# ---- heuristic: LPT + local search + re-optioning ---------------------------------------


def _key(problem: PlacementProblem, loads: list[RankLoad]) -> tuple[float, float]:
    """Compare by step, then by the sum of squared rank times (flatter is better)."""
    times = [problem.f(x) for x in loads]
    return max(times), sum(t * t for t in times)


def lpt(problem: PlacementProblem, choice: list[Option]) -> list[tuple[int, ...]] | None:
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


def local_search(problem: PlacementProblem, choice: list[Option], ranks: list[tuple[int, ...]],
                 deadline: float) -> list[tuple[int, ...]]:
    """Move or swap free pieces off the slowest rank while (step, sum of squares) drops."""
    ranks = [list(r) for r in ranks]
    loads = problem.loads(choice, ranks)
    current = _key(problem, loads)
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
                    k = _key(problem, trial)
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
                    k = _key(problem, trial)
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
        loads = problem.loads(choice, ranks)
        current = _key(problem, loads)
    return [tuple(r) for r in ranks]


def _minus(a: RankLoad, b: RankLoad) -> RankLoad:
    """a - b field by field (a piece leaving a rank); the rank stays in the all-to-alls
    (its exchanges and `sharded` are a's)."""
    return RankLoad(*(getattr(a, f.name) - getattr(b, f.name) for f in fields(RankLoad)[:-3]),
                    a.optimizer_exchange, a.exchange_dtypes, a.sharded)


def heuristic(problem: PlacementProblem, seeds: list[Solution],
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
        loads = problem.loads(best.choice, best.ranks)
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


def split_until(problem: PlacementProblem, choice: list[Option], pieces: int) -> list[Option]:
    """Column-split the table with the slowest piece (table-wise -> 2 -> 4 ... columns)
    until there are `pieces` free pieces: LPT can only balance pieces it has."""
    choice = list(choice)

    def count() -> int:
        return sum(len(o.pieces) for o in choice if o.fixed_ranks is None)

    while count() < pieces:
        splittable = []
        for t, o in enumerate(choice):
            if o.fixed_ranks is not None or not o.pieces:
                continue
            wider = [w for w in problem.options[t] if w.sharding is TableSharding.COLUMN_WISE
                     and len(w.pieces) > len(o.pieces)]
            if wider:
                splittable.append((max(problem.f(p) for p in o.pieces), t,
                                   min(wider, key=lambda w: len(w.pieces))))
        if not splittable:
            break
        _, t, wider = max(splittable, key=lambda x: (x[0], -x[1]))
        choice[t] = wider
    return choice


def _sol_key(sol: Solution) -> tuple[float, float]:
    return sol.cost.step_s, sum(t * t for t in sol.cost.embedding_s)


# ---- entry point ------------------------------------------------------------------------


def plan_tables(tables: list[EmbeddingTable], cluster: ClusterSpec, config: EmbeddingConfig,
                dense: DenseCost, method: str = "auto",
                pins: list[TableSharding] | None = None) -> TablePlan:
    """Our placement and the greedy baseline's, priced by the same cost model; `pins`:
    the sharding each table must take (cycled over the tables), ranks still searched."""
    if not tables:
        raise PlannerError("the model has no embedding tables to place")
    if method not in ("auto", "exact", "heuristic"):
        raise PlannerError(f"unknown placement method {method!r}; use auto, exact or heuristic")
    start = time.perf_counter()
    problem = PlacementProblem(tables, cluster, config, dense, pins)
    base = greedy(problem)
    auto = method == "auto"
    if auto:
        small = len(tables) <= EXACT_MAX_TABLES and problem.n <= EXACT_MAX_RANKS
        method = "exact" if small else "heuristic"
    sol = None
    if method == "exact":
        try:
            sol = exact(problem, time_limit_s=EXACT_TIME_LIMIT_S if auto else None)
        except TimeoutError:
            method = "heuristic"  # the branch and bound ran out of time: fall back
    if method == "heuristic":
        seeds = [s for s in (base,) if s is not None]
        for limit in REPLICATE_LIMITS_BYTES:
            cheapest = [min((o for o in opts if o.replicated_bytes <= limit), key=problem.perf,
                            default=None) for opts in problem.options]
            if None in cheapest:  # a table pinned to replication: not below this limit
                continue
            for choice in [cheapest] + [split_until(problem, cheapest, pieces)
                                        for pieces in (problem.n, 3 * problem.n // 2, 2 * problem.n)]:
                ranks = lpt(problem, choice)
                if ranks is not None:
                    seeds.append(problem.solution(choice, ranks))
        seeds.sort(key=_sol_key)
        sol = heuristic(problem, seeds[:HEURISTIC_SEEDS])
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
