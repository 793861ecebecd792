"""Pipeline schedules: iteration time with bubble and stage imbalance, and micro-batches in flight.

Per pipeline rank r the caller gives the forward time F_r and backward time B_r of one
micro-batch (compute plus blocking communication; for interleaving, summed over the
rank's v model chunks). With m micro-batches and p ranks:

  GPipe (Huang et al. 2019)   sum_r F_r + (m-1) max_r F_r + sum_r B_r + (m-1) max_r B_r
  1F1B  (Narayanan et al. 2021, PipeDream-Flush)   sum_r T_r + (m-1) max_r T_r,  T = F + B
  interleaved 1F1B, v chunks  m max_r T_r + (sum_r T_r - max_r T_r) / v

Each is a flow shop of m identical jobs: the slowest rank sets the steady state, the
others add their fill and drain once. Balanced, all give the bubble (p-1)/m of the
ideal m*T (interleaving: (p-1)/(v*m)), Narayanan et al. 2021 sec. 2.2.

Activation memory (Korthikanti et al. 2022 sec. 4.2.3; Megatron-LM's schedules):
  GPipe keeps all m micro-batches; 1F1B keeps min(p - r, m) on rank r; interleaved keeps
  min(2(p-r-1) + (v-1)p + 1, m*v) chunk-micro-batches of 1/v of the rank's layers each,
  which on rank 0 is p * (1 + (p-1)/(p*v)) micro-batches' worth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ir.errors import PlannerError
from ir.strategy import Schedule


@dataclass(frozen=True, slots=True)
class PipelineTime:
    iteration_s: float  # first forward to last backward (data-parallel sync not included)
    steady_s: float  # m * the critical rank's per-micro-batch time: the ideal
    bubble_s: float  # iteration_s - steady_s: fill, drain and imbalance
    critical_rank: int  # the rank with the largest F + B

    @property
    def bubble_fraction(self) -> float:
        """Bubble relative to the ideal time, (p-1)/m when balanced."""
        return self.bubble_s / self.steady_s if self.steady_s else 0.0


def pipeline_time(forward_s: Sequence[float], backward_s: Sequence[float],
                  num_microbatches: int, schedule: Schedule,
                  virtual_stages: int = 1) -> PipelineTime:
    """Iteration time of one pipeline (formulas in the module docstring)."""
    if len(forward_s) != len(backward_s) or not forward_s:
        raise PlannerError("pipeline_time needs one forward and one backward time per rank")
    m = num_microbatches
    if m < 1:
        raise PlannerError(f"number of micro-batches must be >= 1, got {m}")
    totals = [f + b for f, b in zip(forward_s, backward_s)]
    worst = max(totals)
    critical = totals.index(worst)
    if schedule is Schedule.GPIPE:
        iteration = (sum(forward_s) + (m - 1) * max(forward_s)
                     + sum(backward_s) + (m - 1) * max(backward_s))
    elif schedule is Schedule.INTERLEAVED and virtual_stages > 1:
        iteration = m * worst + (sum(totals) - worst) / virtual_stages
    else:  # 1F1B, and interleaved with a single chunk
        iteration = sum(totals) + (m - 1) * worst
    steady = m * worst
    return PipelineTime(iteration, steady, max(iteration - steady, 0.0), critical)


def microbatches_in_flight(schedule: Schedule, pp: int, rank: int, num_microbatches: int,
                           virtual_stages: int = 1) -> float:
    """Micro-batches whose activations rank `rank` holds at its peak, in units of the
    rank's whole per-micro-batch activation set (see the module docstring)."""
    m = num_microbatches
    if schedule is Schedule.GPIPE:
        return float(m)
    if schedule is Schedule.INTERLEAVED and virtual_stages > 1:
        v = virtual_stages
        # Megatron-LM interleaved warm-up: 2(p-r-1) + (v-1)p chunk passes, plus the one running.
        chunks = 2 * (pp - rank - 1) + (v - 1) * pp + 1
        return min(chunks, m * v) / v
    return float(min(pp - rank, m))
