"""The co-scheduling probe (cost_models.coschedule_probes, issue 17): its summary's
arithmetic by hand, and its loops on 4 gloo ranks in TP pairs with DP groups across."""

from __future__ import annotations

import math

from cost_models.coschedule_probes import (COSCHEDULE_ROUNDS, LOOPS, PROCESS_CLOCK_LAG_S,
                                           CoscheduleCost, LoopReading, calls_per_loop,
                                           coschedule_loops, coschedule_summary)
from dist_utils import spawn


def _round(alone, pairs, coupled) -> dict[str, LoopReading]:
    return {"alone": LoopReading(*alone), "pairs": LoopReading(*pairs),
            "coupled": LoopReading(*coupled)}


def test_summary_by_hand():
    """Three rounds at a 0.2 ms gap, coupling every 5th call; per round (wall, thread CPU,
    process CPU) in ms per iteration:
        alone (0.40, 0.20, 0.21)  pairs (1.40, 0.33, 0.61)  coupled (1.80, 0.34, 0.62)
        alone (0.50, 0.20, 0.21)  pairs (1.30, 0.32, 0.62)  coupled (1.50, 0.33, 0.63)
        alone (0.40, 0.20, 0.21)  pairs (1.60, 0.34, 0.64)  coupled (1.70, 0.35, 0.64)
    pair call: median(1.00, 0.80, 1.20) = 1.00 ms;
    coupling: median(0.40, 0.20, 0.10) * 5 = 1.00 ms per cross call;
    caller CPU: median(0.13, 0.12, 0.14) = 0.13 ms;
    other threads: pairs' (0.28, 0.30, 0.30) less alone's 0.01 each: median 0.29 ms."""
    ms = 1e-3
    rounds = [_round((0.40 * ms, 0.20 * ms, 0.21 * ms), (1.40 * ms, 0.33 * ms, 0.61 * ms),
                     (1.80 * ms, 0.34 * ms, 0.62 * ms)),
              _round((0.50 * ms, 0.20 * ms, 0.21 * ms), (1.30 * ms, 0.32 * ms, 0.62 * ms),
                     (1.50 * ms, 0.33 * ms, 0.63 * ms)),
              _round((0.40 * ms, 0.20 * ms, 0.21 * ms), (1.60 * ms, 0.34 * ms, 0.64 * ms),
                     (1.70 * ms, 0.35 * ms, 0.64 * ms))]
    cost = coschedule_summary(0.2 * ms, rounds, coupling_every=5)
    expected = CoscheduleCost(gap_s=0.2 * ms, pair_call_s=1.00 * ms, coupling_s=1.00 * ms,
                              caller_cpu_s=0.13 * ms, other_threads_cpu_s=0.29 * ms)
    for field in ("gap_s", "pair_call_s", "coupling_s", "caller_cpu_s", "other_threads_cpu_s"):
        assert math.isclose(getattr(cost, field), getattr(expected, field), rel_tol=1e-9), field


def test_summary_keeps_sign():
    """A coupled loop that read faster than the pairs' (noise) gives a negative coupling,
    not 0: clamping would bias the median up."""
    reading = _round((1.0, 1.0, 1.0), (2.0, 1.1, 1.2), (1.9, 1.1, 1.2))
    assert coschedule_summary(1.0, [reading], coupling_every=4).coupling_s < 0


def _probe_rank(rank: int, world: int, gaps_s) -> dict:
    import torch.distributed as dist

    tp_group = dp_group = None
    for first in (0, 2):  # TP pairs (0, 1), (2, 3); DP groups (0, 2), (1, 3)
        group = dist.new_group([first, first + 1])
        if rank in (first, first + 1):
            tp_group = group
    for offset in (0, 1):
        group = dist.new_group([offset, offset + 2])
        if rank % 2 == offset:
            dp_group = group
    return coschedule_loops(dist, tp_group, dp_group, gaps_s)


def test_loops_on_four_ranks():
    """Every rank reads COSCHEDULE_ROUNDS rounds of the three loops; the process's CPU holds
    the calling thread's (over a loop, less the process clock's lag PROCESS_CLOCK_LAG_S), and a loop with calls takes at least the work alone's CPU on the
    calling thread less scheduling noise (the calls add their CPU, never remove work)."""
    gap_s = 0.4e-3
    results = spawn(_probe_rank, 4, (gap_s,), timeout_s=300)
    for readings in results:
        rounds = readings[gap_s]
        assert len(rounds) == COSCHEDULE_ROUNDS and all(set(r) == set(LOOPS) for r in rounds)
        for r in rounds:
            for loop in r.values():
                assert loop.wall_s > 0 and loop.thread_cpu_s > 0
                lag_s = (loop.thread_cpu_s - loop.process_cpu_s) * calls_per_loop(gap_s)
                assert lag_s <= PROCESS_CLOCK_LAG_S, (loop, lag_s)
        cost = coschedule_summary(gap_s, rounds)
        assert cost.caller_cpu_s > 0, cost  # a funcol call costs its caller some CPU
