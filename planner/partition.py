"""The outer program: the exact stage partition over the layers' cut points,
minimising sum_r T_r + (m-1) max_r T_r over Pareto fronts of (sum, max)
(`planner.search`'s docstring; T_r from `stage_program.StageSolver`).
"""

from __future__ import annotations

import bisect
import math

from planner.pareto import FrontEntry, pareto_front
from planner.search_space import OuterCandidate
from planner.stage_program import StageSolver

INF = math.inf


def partition(graph, solver: StageSolver, cand: OuterCandidate, ks: list[float],
              sends: list[tuple[float, ...]], host_s, incumbent: float = INF,
              floor_s: float = 0.0,
              keep: int = 1) -> list[tuple[float, list[tuple[int, int, int]]]] | None:
    """Exact stage partition minimising sum T + (m-1) max T (module docstring): the
    objective and (first layer, last layer, layout) per rank of the best partition, then
    of the next ones of the final (sum, max) front, best first, `keep` at most; or None.
    The front's others are the partitions the estimate may rank above the best: its
    1F1B and GPipe forms are not functions of sum T and max T alone (`cost_models.pipeline`:
    a slow first rank hides the later ranks' round trip in its warm-up).

    A stage a..b (not the last) sends its output on and the next stage sends that
    output's gradient back (where it has one: `LayerGraph.carries_gradient`), each
    `sends[b][c]` seconds, c the layout layer b ends in
    (`layer_tables.sends`: the estimate's `boundary_send_s`). So T_r carries the send
    of its own last layer's layout and the one its predecessor's ended in: fronts are
    kept per (last layer, send left to the next rank), and a stage's layouts per send
    (`StageSolver.sent`).

    Front entries (`pareto.FrontEntry`) for the ranks placed so far end at layer b.
    Memory and time only grow as a stage gets longer, so once a..b does not fit, or
    (m-1) T alone reaches `incumbent` (an objective already found elsewhere), no longer
    stage from a helps (`host_s(a, b, r)`: the step's host terms, `planner.stage_host`,
    with the edge layers' placed change, `StageSolver.placed`, at least `floor_s`);
    partial partitions whose objective reaches it are dropped too.
    The last rank must end at the last layer."""
    n, p, m = len(graph.layers), cand.pp, cand.num_microbatches
    cut_set = set(graph.cut_points)
    ends = [b for b in range(n) if b in cut_set or b == n - 1]
    starts = [0] + [c + 1 for c in graph.cut_points]

    def stages_from(a: int, r: int):
        """(b, t, layout, send) for the stages rank r could run starting at layer a: t
        with the forward send, `send` the one the next rank pays back."""
        if r == p - 1:
            for b, t, _, node in solver.bests(a, ks[r], [n - 1]):
                if t < INF and (m - 1) * (t + floor_s) < incumbent:
                    t, c = solver.least(solver.placed(a, b, ks[r], r, node),
                                        solver.units_within(a, b))
                    if t < INF:
                        yield n - 1, t + host_s(a, n - 1, r), c, 0.0
            return
        last_end = n - 1 - (p - 1 - r)  # the later ranks need a layer each
        reachable = ends[bisect.bisect_left(ends, a):bisect.bisect_right(ends, last_end)]
        for b, t, _, node in solver.bests(a, ks[r], reachable):
            if t == INF or (m - 1) * (t + floor_s) >= incumbent:
                break
            h = host_s(a, b, r)
            placed = solver.placed(a, b, ks[r], r, node)
            for sent_t, c, send in solver.sent(placed, sends[b], solver.units_within(a, b)):
                yield b, sent_t + h, c, send

    # (last layer, send the next rank pays back) -> front
    front: dict[tuple[int, float], list[FrontEntry]] = {}
    for b, t, c, send in stages_from(0, 0):
        front[(b, send)] = [FrontEntry(t, t, None, 0, b, c)]
    for r in range(1, p):
        by_end: dict[int, list] = {}
        for (b, send), entries in front.items():
            by_end.setdefault(b, []).append((send, entries))
        new: dict[tuple[int, float], list[FrontEntry]] = {}
        for a in starts:
            if a < r or (a - 1) not in by_end:
                continue
            options = list(stages_from(a, r))
            carries = graph.carries_gradient(a - 1)  # else no gradient goes back
            for back, previous in by_end[a - 1]:
                for b, t, c, send in options:
                    t += back if carries else 0.0
                    entries = new.setdefault((b, send), [])
                    # `previous` is a front (sum up, max down): past the first entry whose
                    # max is <= t, every sum is larger and every max is t: all dominated.
                    for e in previous:
                        if e.max_s > t:
                            entries.append(FrontEntry(e.sum_s + t, e.max_s, e, a, b, c))
                        else:
                            entries.append(FrontEntry(e.sum_s + t, t, e, a, b, c))
                            break
        front = {key: kept for key, entries in new.items()
                 if (kept := [e for e in pareto_front(entries) if e.objective_s(m) < incumbent])}
        if not front:
            return None
    final = front.get((n - 1, 0.0))
    if not final:
        return None
    final = sorted(final, key=lambda e: e.objective_s(m))[:keep]
    return [(e.objective_s(m), e.stages()) for e in final]
