"""A lower bound on one outer candidate's objective, for pruning (`planner.search`)."""

from __future__ import annotations

import math

import numpy as np

from planner.layer_tables import LayerTable, unique
from planner.search_space import OuterCandidate

INF = math.inf

# Outer candidates whose lower bound reaches the k-th best objective times this are
# skipped: 1.0 loses nothing the dynamic program could find.
LOWER_BOUND_SLACK = 1.0


def bound_budget_bytes(cand: OuterCandidate, tables: list[LayerTable], budget_bytes: float,
                       buffers=None) -> float:
    """What `_lower_bound` may let a rank's states and kept activations fill: the budget
    less the largest of the layers' least transients, which every plan needs, and less
    the least pipeline buffers any rank holds (`buffers`: `layer_tables.buffers_floor`)."""
    held = 0.0 if buffers is None else buffers.least_rank_bytes
    return budget_bytes - max(float(_memory(cand, t)[2].min()) for t in unique(tables)) - held


def _memory(cand: OuterCandidate, t: LayerTable):
    """The memory figures no plan of `cand` can undercut: the walk's floors where
    `cost_models.walk_floor` bounds the schedule (not interleaved), else the program's."""
    return t.memory(cand.virtual_stages == 1)


def _lower_bound(cand: OuterCandidate, tables: list[LayerTable], budget_bytes: float) -> float:
    """No plan of this candidate beats it.

    Every rank's time is at least the average, so sum T + (m-1) max T >= f * sum_i t_i
    with f = 1 + (m-1)/p (interleaved: m/p). And every rank keeps at least one micro-batch
    in flight within its budget, so sum_i (state_i + kept_i) <= p * budget: for any
    lambda >= 0 (Lagrangian relaxation)
        sum_i t_i >= sum_i min_s (t_is + lambda * mem_is) - lambda * p * budget.
    The best lambda of a log-spaced grid gives the bound. Also, some rank holds at least
    ceil(L / p) layers over its chunks (pigeonhole), so max T is at least the sum of
    that many of the smallest fastest layer times."""
    p, m, v = cand.pp, cand.num_microbatches, cand.virtual_stages
    mins = {id(t): (float(t.time_s.min()), float(_kept_once(cand, t).min()))
            for t in unique(tables)}
    fastest_each = sorted(mins[id(t)][0] for t in tables)
    pigeon = sum(fastest_each[: -(-len(tables) // p)])
    fastest = sum(mins[id(t)][0] for t in tables)
    capacity = p * budget_bytes
    if capacity <= 0:
        return INF
    # Provably infeasible: a layer that fits nowhere, or more memory than all ranks have.
    least = [mins[id(t)][1] for t in tables]
    if max(least) > budget_bytes * v or sum(least) > capacity:
        return INF
    lams = (fastest / capacity) * np.logspace(-2, 3, 26)
    relaxed = -lams * capacity
    lagrangian: dict[int, np.ndarray] = {}  # min_s (t_is + lambda mem_is), once per table
    for t in tables:  # summed layer by layer
        row = lagrangian.get(id(t))
        if row is None:
            mem = _kept_once(cand, t)
            row = lagrangian[id(t)] = (t.time_s[:, None] + mem[:, None] * lams[None, :]).min(axis=0)
        relaxed = relaxed + row
    best = max(fastest, float(relaxed.max()))
    if v > 1:  # m max T + (sum T - max T)/v
        return max(m * best / p, m * pigeon)
    return best + (m - 1) * max(best / p, pigeon)


def _kept_once(cand: OuterCandidate, t: LayerTable):
    """Per strategy, its state plus one micro-batch's kept bytes (every rank keeps one)."""
    state, kept, _ = _memory(cand, t)
    return state + kept
