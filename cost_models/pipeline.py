"""Pipeline schedules: iteration time with bubble, stage imbalance and p2p, and
micro-batches in flight.

Per (virtual) stage s the caller gives a `pipeline_sim.StageCost`: forward f_s and
backward b_s of one micro-batch (compute plus blocking collectives) and the p2p seconds
of its output (cf_s) and of its input's gradient (cb_s). Stage s runs on rank s mod p.
With m micro-batches, p ranks and, per rank, F_r = f_r + cf_r and B_r = b_r + cb_r:

  GPipe (Huang et al. 2019; sends waited after the loop, so only the first
  micro-batch's cross the pipeline on the critical path: a flow shop with time lags)
      sum_r (F_r + B_r) + (m-1) (max_r f_r + max_r b_r)
  1F1B (Narayanan et al. 2021, PipeDream-Flush; torch waits on each send with the next
  receive, so F_r and B_r hold the rank): the bottleneck rank k works m (F_k + B_k); the
  ranks before it add their fill and drain once; the ranks after it add a round trip
  R_k = sum_{r>k} (F_r + B_r) only where k's n_k = min(m, p-k) - 1 warm-up forwards
  (cool-down backwards) do not cover it:
      max_k  sum_{r<k} (F_r + B_r) + m (F_k + B_k)
             + max(0, R_k - n_k F_k) + max(0, R_k - n_k B_k)
  which is sum_r T_r + (m-1) max_r T_r when the ranks are equal (bubble (p-1)/m); exact
  on the deep grid, within 5% of the replay with stages up to 3x apart (a critical path
  that moves between two slow ranks is not followed). It needs m >= p (as torch's
  Schedule1F1B does); below, the first and last round trips are one, and
  `stage_pipeline_time` replays the order instead.
  interleaved 1F1B, v chunks (Narayanan et al. 2021 sec. 2.2; sends are not waited on),
  with T_r = sum over the rank's chunks of f + b and u_s = f_s + b_s:
      max( m max_r T_r + (sum_r T_r - max_r T_r) / v,          the ranks' work
           sum_s u_s + (m-1) max_s u_s )                        one micro-batch's path
      + sum_s (cf_s + cb_s)                                     every hop, once
  exact when the chunks are equal ((v m + p - 1) t for m >= p, (v p + m - 1) t below:
  the bubble (p-1)/(v m) needs m >= p) and, with p2p, m is a multiple of p or below it.
  With unequal chunks (embedding and head on the end chunks) the warm-up and the chunk
  changes stall the bottleneck rank by amounts no short formula gives, so
  `stage_pipeline_time` replays the schedule there (`pipeline_sim`, exact, linear in
  the passes).

The formulas are checked against `pipeline_sim` on a grid of deep pipelines
(tests/test_pipeline_schedule.py, bench/bench_pipeline_schedule.py).

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

from cost_models.pipeline_sim import SENDS_BLOCK, StageCost, simulate_schedule

# Relative spread of the chunks' f and b (and of the hops' p2p) below which interleaving's
# closed form is used as is: it is exact for equal chunks (tests/test_pipeline_schedule.py);
# 1e-9 only absorbs the rounding of sums of per-layer times.
EQUAL_CHUNKS_RTOL = 1e-9


@dataclass(frozen=True, slots=True)
class PipelineTime:
    iteration_s: float  # first forward to last backward (data-parallel sync not included)
    steady_s: float  # m * the critical rank's per-micro-batch time: the ideal
    bubble_s: float  # iteration_s - steady_s: fill, drain, imbalance and exposed p2p lag
    critical_rank: int  # the rank with the largest per-micro-batch time
    replayed: bool = False  # iteration_s from `pipeline_sim` rather than a closed form

    @property
    def bubble_fraction(self) -> float:
        """Bubble relative to the ideal time, (p-1)/m when balanced."""
        return self.bubble_s / self.steady_s if self.steady_s else 0.0


def pipeline_time(forward_s: Sequence[float], backward_s: Sequence[float],
                  num_microbatches: int, schedule: Schedule,
                  virtual_stages: int = 1) -> PipelineTime:
    """Iteration time from per-rank totals (sends included in F and B, each rank's
    chunks equal): the closed forms of the module docstring."""
    if len(forward_s) != len(backward_s) or not forward_s:
        raise PlannerError("pipeline_time needs one forward and one backward time per rank")
    v = virtual_stages if schedule is Schedule.INTERLEAVED else 1
    stages = [StageCost(f / v, b / v) for _ in range(v) for f, b in zip(forward_s, backward_s)]
    return stage_pipeline_time(stages, len(forward_s), num_microbatches, schedule, v)


def stage_pipeline_time(stages: Sequence[StageCost], pp: int, num_microbatches: int,
                        schedule: Schedule, virtual_stages: int = 1) -> PipelineTime:
    """Iteration time of one pipeline of pp * virtual_stages stages: the closed form, or
    where none holds (interleaving with unequal chunks, 1F1B with fewer micro-batches
    than ranks) the replayed schedule (module docstring)."""
    m, v = num_microbatches, virtual_stages
    if m < 1:
        raise PlannerError(f"number of micro-batches must be >= 1, got {m}")
    if pp < 1 or len(stages) != pp * v:
        raise PlannerError(f"a pipeline of pp={pp} and {v} virtual stages needs {pp * v} "
                           f"stage times, got {len(stages)}")
    blocking = SENDS_BLOCK[schedule]
    totals = [sum(_work(stages[c * pp + r], blocking) for c in range(v)) for r in range(pp)]
    worst = max(totals)
    critical = totals.index(worst)
    replayed = (schedule is Schedule.INTERLEAVED and v > 1
                and not _closed_form_exact(stages, pp, m)) or (
        schedule is Schedule.ONE_F_ONE_B and m < pp)  # torch refuses it; no form derived
    if replayed:
        iteration = simulate_schedule(schedule, stages, pp, m, v).makespan_s
    else:
        iteration = closed_form_s(stages, pp, m, schedule, v)
    steady = m * worst
    return PipelineTime(iteration, steady, max(iteration - steady, 0.0), critical, replayed)


def closed_form_s(stages: Sequence[StageCost], pp: int, num_microbatches: int,
                  schedule: Schedule, virtual_stages: int = 1) -> float:
    """The closed form of the module docstring for `schedule` (for interleaving, exact
    only when the chunks are equal)."""
    m, p, v = num_microbatches, pp, virtual_stages
    if schedule is Schedule.INTERLEAVED and v > 1:
        u = [s.forward_s + s.backward_s for s in stages]
        totals = [sum(u[c * p + r] for c in range(v)) for r in range(p)]
        work = m * max(totals) + (sum(totals) - max(totals)) / v
        path = sum(u) + (m - 1) * max(u)
        hops = sum(s.send_forward_s for s in stages[:-1]) + sum(s.send_backward_s
                                                                 for s in stages[1:])
        return max(work, path) + hops
    if v != 1:
        raise PlannerError(f"{schedule} runs one stage per rank, got {v} virtual stages")
    fwd = [s.forward_s + (s.send_forward_s if r < p - 1 else 0.0) for r, s in enumerate(stages)]
    bwd = [s.backward_s + (s.send_backward_s if r > 0 else 0.0) for r, s in enumerate(stages)]
    if schedule is Schedule.GPIPE:
        return (sum(fwd) + sum(bwd) + (m - 1) * (max(s.forward_s for s in stages)
                                                 + max(s.backward_s for s in stages)))
    best = 0.0
    before = 0.0  # sum_{r<k} (F_r + B_r)
    after = sum(fwd) + sum(bwd)  # becomes R_k = sum_{r>k} (F_r + B_r)
    for k in range(p):
        after -= fwd[k] + bwd[k]
        n = min(m, p - k) - 1
        best = max(best, before + m * (fwd[k] + bwd[k]) + max(0.0, after - n * fwd[k])
                   + max(0.0, after - n * bwd[k]))
        before += fwd[k] + bwd[k]
    return best


def _work(stage: StageCost, blocking: bool) -> float:
    """A stage's seconds per micro-batch on its rank: compute, plus its sends where the
    schedule waits on them."""
    sends = stage.send_forward_s + stage.send_backward_s if blocking else 0.0
    return stage.forward_s + stage.backward_s + sends


def _closed_form_exact(stages: Sequence[StageCost], pp: int, m: int) -> bool:
    """Interleaving's closed form is exact (tests/test_pipeline_schedule.py) when all
    stages have the same f and b and all hops the same p2p, and, with p2p, m is a multiple
    of pp or below it (otherwise a round of more than pp micro-batches hides some hops)."""
    def same(values: list[float]) -> bool:
        return not values or max(values) - min(values) <= EQUAL_CHUNKS_RTOL * max(
            max(abs(x) for x in values), 1e-30)
    hops = [s.send_forward_s for s in stages[:-1]] + [s.send_backward_s for s in stages[1:]]
    return (same([s.forward_s for s in stages]) and same([s.backward_s for s in stages])
            and same(hops) and (not any(hops) or m % pp == 0 or m < pp))


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
