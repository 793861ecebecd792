"""The outer program: the exact stage partition over the layers' cut points,
minimising sum_r T_r + (m-1) max_r T_r over Pareto fronts of (sum, max)
(`planner.search`'s docstring; T_r from `stage_program.StageSolver`).
"""

from __future__ import annotations

import bisect
import math

from cost_models.comm import p2p_s
from planner.pareto import FrontEntry, pareto_front
from planner.search_space import OuterCandidate
from planner.stage_program import StageSolver

INF = math.inf


def edge_costs(crossing: list[float], cluster, stage_devices, scale) -> list[float]:
    """p2p seconds of sending the activation after layer j (and its gradient back)."""
    return [p2p_s(nbytes * scale, cluster, stage_devices) for nbytes in crossing]


def stage_edges_s(edges: list[float], a: int, b: int) -> float:
    """A stage sends its output forward (not the last) and its input's gradient back."""
    return (edges[b] if b < len(edges) - 1 else 0.0) + (edges[a - 1] if a > 0 else 0.0)


def partition(graph, solver: StageSolver, cand: OuterCandidate, ks: list[float],
              edge_cost, incumbent: float = INF,
              floor_s: float = 0.0) -> tuple[float, list[tuple[int, int, int]]] | None:
    """Exact stage partition minimising sum T + (m-1) max T (module docstring): the
    objective and (first layer, last layer, layout) per rank, or None.

    Front entries (`pareto.FrontEntry`) for the ranks placed so far end at layer b.
    Memory and time only grow as a stage gets longer, so once a..b does not fit, or
    (m-1) T alone reaches `incumbent` (an objective already found elsewhere), no longer
    stage from a helps (`edge_cost(a, b, r)`: the sends and the step's host terms,
    `planner.stage_host`, at least `floor_s`); partial partitions whose objective
    reaches it are dropped too.
    The last rank must end at the last layer."""
    n, p, m = len(graph.layers), cand.pp, cand.num_microbatches
    cut_set = set(graph.cut_points)
    ends = [b for b in range(n) if b in cut_set or b == n - 1]
    starts = [0] + [c + 1 for c in graph.cut_points]

    def stages_from(a: int, r: int):
        """(b, t, layout) for the stages rank r could run starting at layer a."""
        if r == p - 1:
            for b, t, c in solver.bests(a, ks[r], [n - 1]):
                if t < INF and (m - 1) * (t + floor_s) < incumbent:
                    yield n - 1, t + edge_cost(a, n - 1, r), c
            return
        last_end = n - 1 - (p - 1 - r)  # the later ranks need a layer each
        reachable = ends[bisect.bisect_left(ends, a):bisect.bisect_right(ends, last_end)]
        for b, t, c in solver.bests(a, ks[r], reachable):
            if t == INF or (m - 1) * (t + floor_s) >= incumbent:
                break
            yield b, t + edge_cost(a, b, r), c

    front: dict[int, list[FrontEntry]] = {}
    for b, t, c in stages_from(0, 0):
        front[b] = [FrontEntry(t, t, None, 0, b, c)]
    for r in range(1, p):
        new: dict[int, list[FrontEntry]] = {}
        for a in starts:
            if a < r or (a - 1) not in front:
                continue
            previous = front[a - 1]
            for b, t, c in stages_from(a, r):
                entries = new.setdefault(b, [])
                # `previous` is a front (sum up, max down): past the first entry whose max
                # is <= t, every sum is larger and every max is t, so all are dominated.
                for e in previous:
                    if e.max_s > t:
                        entries.append(FrontEntry(e.sum_s + t, e.max_s, e, a, b, c))
                    else:
                        entries.append(FrontEntry(e.sum_s + t, t, e, a, b, c))
                        break
        front = {b: kept for b, entries in new.items()
                 if (kept := [e for e in pareto_front(entries) if e.objective_s(m) < incumbent])}
        if not front:
            return None
    final = front.get(n - 1)
    if not final:
        return None
    entry = min(final, key=lambda e: e.objective_s(m))
    return entry.objective_s(m), entry.stages()

