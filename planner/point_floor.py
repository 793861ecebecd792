"""The walk's floor at one layer's backward, for a candidate without a pipeline.

The forward's floor (`cost_models.walk_floor`, the walk as a forward ends) misses the
peak of a rank whose walk peaks in the last micro-batch's backward. At layer j's
backward the walk holds at least

    F_j = sum_{i < j} (state_i + kept_i)       what the forward left (k = 1)
        + during_j                              layer j's backward at one of its looks
        + sum_{i > j} after_i                   stored weights, moments and gradients
        + output                                the model's output, held all backward

(`walk_floor.backward_floor_row`; the output is the final layer's `output_bytes`), so
F_j <= the walk's peak less the overhead for every plan, as the forward's floor is: the
program adding F_j up admits every plan that fits, and its optimum, where it fits, is
the candidate's best. `planner.search._solve_fitting` solves again at the F_j that
rejects the plan the last solve found (`next_point`) instead of lowering the budget.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from planner.layer_tables import LayerTable


def point_tables(tables: list[LayerTable], j: int) -> list[LayerTable]:
    """`tables` whose floor (k = 1) adds up to F_j: as they are before j, `during` at j,
    `after` behind it, each with the model's output on the final layer. (The stage
    program interns a node by its parent and the layer's content, not its table: sound
    here, where the one stage is one chain of parents.)"""
    made: dict[tuple, LayerTable] = {}
    last = len(tables) - 1
    out = []
    for i, t in enumerate(tables):
        if i < j:
            out.append(t)
            continue
        key = (id(t), i == j, i == last)
        if key not in made:
            nbytes = t.during_bytes if i == j else t.after_bytes
            made[key] = dataclasses.replace(
                t, floor_state_bytes=nbytes + (t.output_bytes if i == last else 0.0),
                floor_kept_bytes=np.zeros_like(nbytes))
        out.append(made[key])
    return out


def point_floor_bytes(tables: list[LayerTable], strategies: list, j: int) -> float:
    """F_j of one plan's strategies (one per layer, from `tables`)."""
    total = 0.0
    for i, (t, s) in enumerate(zip(tables, strategies)):
        r = t.strategies.index(s)
        if i < j:
            total += t.floor_state_bytes[r] + t.floor_kept_bytes[r]
        else:
            total += t.during_bytes[r] if i == j else t.after_bytes[r]
    return total + tables[-1].output_bytes[tables[-1].strategies.index(strategies[-1])]


def next_point(tables: list[LayerTable], strategies: list, budget_bytes: float,
               tried: set[int]) -> int | None:
    """The point j not yet `tried` whose floor rejects this plan the most, or None where
    none rejects it (then F_j's program could find it again)."""
    over = {j: point_floor_bytes(tables, strategies, j) - budget_bytes
            for j in range(len(tables)) if j not in tried}
    j = max(over, key=over.get, default=None)
    return j if j is not None and over[j] > 0 else None
