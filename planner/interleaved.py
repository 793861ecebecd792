"""The interleaved schedule's stage program (`planner.search`): v chunks per rank at
equal compute, each chunk's strategies by `stage_program.StageSolver`."""

from __future__ import annotations

from cost_models.pipeline import microbatches_in_flight
from ir.strategy import Schedule
from planner.layer_tables import LayerTable, restrict
from planner.search_space import OuterCandidate
from planner.stage_host import StageHost
from planner.stage_program import INF
from planner.uniform import even_chunks


def interleaved(graph, tables: list[LayerTable], make_solver, cand: OuterCandidate,
                sends: list[tuple[float, ...]], host_s, host: StageHost | None = None):
    """v chunks per rank at equal compute; each chunk gets 1/v of the rank's memory.

    The chunks of one rank read the model inputs in one layout (`executors.pipeline`), so
    their first layers share one TP degree: each rank takes the degree that makes its
    chunks fastest (ranks are independent, so that also minimises the max and the sum).
    A chunk's sends (`layer_tables.sends`) are at the layout its last layer takes, the one
    least with both (its own forward send and the next chunk's gradient send back, chosen
    at the layout chunk i-1 takes under the same degree, priced at the one it finally
    takes)."""
    p, v, m = cand.pp, cand.virtual_stages, cand.num_microbatches
    pieces = even_chunks(graph, tables, p * v)
    if pieces is None:
        return None
    if host is not None:
        host.with_pieces(pieces)
    firsts = {a for a, _ in pieces}
    per_rank = [INF] * p
    ranges: list = [None] * len(pieces)
    times = [INF] * len(pieces)  # each chunk's time with its forward send, as chosen
    for tp in sorted({s.tp for a in firsts for s in tables[a].strategies}):
        # chunks that start at identical layers share one restricted table (and so the
        # solver's per-table steps)
        by_table: dict[int, list[LayerTable] | None] = {}
        for a in firsts:
            if id(tables[a]) not in by_table:
                by_table[id(tables[a])] = restrict([tables[a]], lambda s, tp=tp: s.tp == tp)
        pinned = {a: by_table[id(tables[a])] for a in firsts}
        solver = make_solver([pinned[i][0] if pinned.get(i) else t
                              for i, t in enumerate(tables)])
        picks = []  # per chunk: (its time with its forward send, layout, send)
        for i, (a, b) in enumerate(pieces):
            k = microbatches_in_flight(Schedule.INTERLEAVED, p, i % p, m, v)
            if not pinned[a]:
                picks.append((INF, -1, 0.0, k))
            elif i == len(pieces) - 1:
                node, u = solver.placed(a, b, k, i % p), solver.units_within(a, b)
                picks.append((*solver.least(node, u), 0.0, k))
            else:
                node, u = solver.placed(a, b, k, i % p), solver.units_within(a, b)
                sent = solver.sent(node, sends[b], u)
                back = graph.carries_gradient(b)  # the next chunk sends o[2] back too
                picks.append((*min(sent, key=lambda o: o[0] + o[2] * back), k) if sent
                             else (INF, -1, 0.0, k))
        for r in range(p):
            total, chosen = 0.0, []
            for i in range(r, len(pieces), p):
                (a, b), (t, c, _, k) = pieces[i], picks[i]
                if t == INF:
                    total = INF
                    break
                back = picks[i - 1][2] if i and graph.carries_gradient(a - 1) else 0.0
                total += t + back + host_s(a, b, r)
                chosen.append((i, (a, b, c, k, r, solver)))
            if total < per_rank[r]:
                per_rank[r] = total
                for i, entry in chosen:
                    ranges[i], times[i] = entry, picks[i][0]
    if INF in per_rank:
        return None
    # Each gradient send back at the layout the chunk before finally takes: its rank may
    # have kept another degree than the one this rank's loop priced it at.
    per_rank = [0.0] * p
    for i, (a, b) in enumerate(pieces):
        back = (sends[pieces[i - 1][1]][ranges[i - 1][2]]
                if i and graph.carries_gradient(a - 1) else 0.0)
        per_rank[i % p] += times[i] + back + host_s(a, b, i % p)
    worst = max(per_rank)
    return m * worst + (sum(per_rank) - worst) / v, ranges  # pipeline.pipeline_time
