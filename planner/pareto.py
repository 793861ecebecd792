"""The partition program's fronts: partial partitions no other beats on both their sum
and their max of stage times (`partition.partition`)."""

from __future__ import annotations

import math
from operator import itemgetter
from typing import NamedTuple


class FrontEntry(NamedTuple):
    """Ranks 0..r placed: their stage times' sum and max, and how the last one was cut."""

    sum_s: float
    max_s: float
    previous: "FrontEntry | None"  # the entry for ranks 0..r-1 (None for rank 0)
    first_layer: int
    last_layer: int
    layout: int  # the (TP, SP) layout the rank's stage ends in

    def objective_s(self, num_microbatches: int) -> float:
        """sum T + (m-1) max T: 1F1B's iteration time (cost_models.pipeline)."""
        return self.sum_s + (num_microbatches - 1) * self.max_s

    def stages(self) -> list[tuple[int, int, int]]:
        """(first layer, last layer, layout) of every rank's stage, first rank first."""
        out, entry = [], self
        while entry is not None:
            out.append((entry.first_layer, entry.last_layer, entry.layout))
            entry = entry.previous
        return out[::-1]


_SUM_THEN_MAX = itemgetter(0, 1)  # (sum_s, max_s) of a FrontEntry, without a Python call


def pareto_front(entries: list[FrontEntry]) -> list[FrontEntry]:
    """The entries no other beats on both sum and max, by increasing sum (ties: the
    first of equal (sum, max) stays)."""
    entries.sort(key=_SUM_THEN_MAX)
    out, best_max = [], math.inf
    for e in entries:
        if e.max_s < best_max:
            out.append(e)
            best_max = e.max_s
    return out
