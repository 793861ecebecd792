"""What one search did: counts for the plan file and `planner plan`'s last line."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class SearchStats:
    outer_candidates: int = 0  # (pp, schedule, m) configurations in the space
    outer_searched: int = 0  # solved by the dynamic program
    outer_pruned: int = 0  # skipped: their lower bound cannot beat the plans found
    timed_out: bool = False  # --time-limit stopped the search
    strategies_per_layer_max: int = 0  # after dropping dominated strategies
    dp_extensions: int = 0  # inner-program steps (`stage_program._extend` calls)
    refits: int = 0  # re-solves after the full memory model rejected a plan
    feasible_candidates: int = 0  # outer candidates with a plan that fits
    search_seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
