"""What a TP collective costs when a node's CPU processes outnumber its cores (issue 17:
gpt-tp2-dp2-sp, 4 processes on 2 cores, took ~2x its prediction while every op and
collective was counted right, and one rank waited ~3x as long as another).

A collective completes only when every member of its group reached it. With P processes
on C < P cores, P - C of them are off a core at any instant, so a group's members reach
a call at different times. Two TP pairs alone can take turns on the cores (a pair runs,
its peer pair waits its turn: little is lost); a data-parallel call between the pairs
couples them, and whatever skew the pairs built up is paid at once.

`coschedule_loops(dist, tp_group, dp_group)` measures it on every process of the node
at once (the node's processes in TP groups and DP groups across them, as a tp x dp plan
places them): for each gap in COSCHEDULE_GAPS_S of the calling thread's CPU time, three
loops of the same COSCHEDULE_LOOP_CPU_S of matmul work split into calls, run back to
back COSCHEDULE_ROUNDS times:
  alone     the work, no calls;
  pairs     the work with a tiny all-reduce over the TP group after each gap, issued as
            DTensor issues a TP collective (funcol, then `wait_tensor`);
  coupled   the same, but every COUPLING_EVERY-th call goes to the DP group instead;
each as (wall, calling thread's CPU, the process's CPU) per iteration. A tiny message
keeps the wire out. `coschedule_summary` turns the readings into seconds per call.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

# The work between two calls, in seconds of the calling thread's CPU: from a tenth of a
# millisecond (gpt-tiny's sequence-parallel step: 23.8 ms of predicted compute CPU over
# ~84 collectives per step, 0.28 ms each) to a few (a layer's backward in the DP cases).
COSCHEDULE_GAPS_S = (0.1e-3, 0.4e-3, 1.6e-3)
# Work per timed loop: it must outlast several scheduler slices (EEVDF's base slice 0.75
# ms x (1 + log2 cores), Linux 6.6+ kernel/sched/fair.c) for the loop to read the
# steady skew, not one lucky slice: 120 calls at the smallest gap.
COSCHEDULE_LOOP_CPU_S = 12e-3
COSCHEDULE_ROUNDS = 7  # rounds of the three loops, the median of each paired difference
COSCHEDULE_MATMUL = 32  # edge of the square matmul the work repeats (a few us each)
COSCHEDULE_MESSAGE_FLOATS = 16  # the all-reduce's message: latency only
# One call in this many crosses the TP pairs: gpt-tp2-dp2-sp issues ~14 data-parallel
# calls beside ~70 TP ones per step (bench_dp_phases, 2026-11-25: 14 `dist` calls/step).
COUPLING_EVERY = 5
LOOPS = ("alone", "pairs", "coupled")
# How far the process CPU clock may read behind the calling thread's over one loop: it
# folds a running thread's time in lazily. Seen here (Firecracker VM, Linux 6.18,
# 2026-11-25): up to 0.16 ms behind over a single-threaded spin; CI: 0.09 ms over a loop.
PROCESS_CLOCK_LAG_S = 0.5e-3


@dataclass(frozen=True, slots=True)
class LoopReading:
    """One loop's seconds per iteration: wall, the calling thread's CPU, all threads' CPU."""

    wall_s: float
    thread_cpu_s: float
    process_cpu_s: float


@dataclass(frozen=True, slots=True)
class CoscheduleCost:
    """Seconds per call at one gap (`coschedule_summary`)."""

    gap_s: float
    pair_call_s: float  # wall one TP-pair call adds to the work alone
    coupling_s: float  # wall one call across the pairs adds beyond a pair call
    caller_cpu_s: float  # the calling thread's CPU per pair call
    other_threads_cpu_s: float  # gloo's threads' CPU per pair call


def coschedule_summary(gap_s: float, rounds: list[dict[str, LoopReading]],
                       coupling_every: int = COUPLING_EVERY) -> CoscheduleCost:
    """Seconds per call from `rounds` of the three loops at one gap (medians over rounds of
    each round's differences, so the load a round shared cancels):
      pair call     pairs.wall - alone.wall (one call per iteration);
      coupling      (coupled.wall - pairs.wall) * coupling_every: the coupled loop swaps
                    one pair call in `coupling_every` for a cross call, so its extra per
                    iteration, times the iterations per cross call;
      caller CPU    pairs.thread_cpu - alone.thread_cpu;
      other threads (pairs.process_cpu - pairs.thread_cpu) - (alone's same).
    Signs are kept (noise about 0 is not clamped up)."""
    def median(part) -> float:
        return statistics.median(part(r) for r in rounds)

    return CoscheduleCost(
        gap_s=gap_s,
        pair_call_s=median(lambda r: r["pairs"].wall_s - r["alone"].wall_s),
        coupling_s=median(lambda r: (r["coupled"].wall_s - r["pairs"].wall_s)) * coupling_every,
        caller_cpu_s=median(lambda r: r["pairs"].thread_cpu_s - r["alone"].thread_cpu_s),
        other_threads_cpu_s=median(
            lambda r: (r["pairs"].process_cpu_s - r["pairs"].thread_cpu_s)
            - (r["alone"].process_cpu_s - r["alone"].thread_cpu_s)))


def coschedule_loops(dist, tp_group, dp_group, gaps_s: tuple[float, ...] = COSCHEDULE_GAPS_S
                     ) -> dict[float, list[dict[str, LoopReading]]]:
    """Per gap of `gaps_s` (seconds of this thread's CPU between calls), COSCHEDULE_ROUNDS
    rounds of the three LOOPS (module docstring), every process of the node running them
    at once."""
    import torch
    import torch.distributed._functional_collectives as funcol

    from cost_models.clusters import _one_thread

    a = torch.randn(COSCHEDULE_MATMUL, COSCHEDULE_MATMUL)
    message = torch.ones(COSCHEDULE_MESSAGE_FLOATS)

    def work(reps: int) -> None:
        for _ in range(reps):
            torch.mm(a, a)

    def call(group) -> None:  # as DTensor issues a TP collective: funcol, then wait_tensor
        funcol.wait_tensor(funcol.all_reduce(message, "sum", group))

    def loop(reps: int, calls: int, kind: str) -> LoopReading:
        dist.barrier()
        # The process window encloses the thread's: process first in, last out.
        start, process, thread = time.perf_counter(), time.process_time(), time.thread_time()
        for i in range(calls):
            work(reps)
            if kind == "pairs" or (kind == "coupled" and (i + 1) % COUPLING_EVERY):
                call(tp_group)
            elif kind == "coupled":
                call(dp_group)
        thread_s = time.thread_time() - thread
        process_s = time.process_time() - process
        return LoopReading((time.perf_counter() - start) / calls, thread_s / calls,
                           process_s / calls)

    readings = {}
    with _one_thread():
        per_rep_s = _thread_cpu_per_rep(dist, work)
        call(tp_group)  # first calls: connection setup
        call(dp_group)
        for gap_s in gaps_s:
            reps = max(1, round(gap_s / per_rep_s))
            calls = calls_per_loop(gap_s)
            readings[gap_s] = [{kind: loop(reps, calls, kind) for kind in LOOPS}
                               for _ in range(COSCHEDULE_ROUNDS)]
    return readings


def calls_per_loop(gap_s: float) -> int:
    """Calls in one timed loop at `gap_s`: COSCHEDULE_LOOP_CPU_S of work, whole cross calls."""
    return max(COUPLING_EVERY, round(COSCHEDULE_LOOP_CPU_S / gap_s))


def _thread_cpu_per_rep(dist, work) -> float:
    """Seconds of this thread's CPU per matmul of the work, the same on every rank (the
    mean over the world, so every rank's gap is the same number of matmuls)."""
    import torch

    work(100)  # warm-up
    reps = 400
    start = time.thread_time()
    work(reps)
    per_rep = torch.tensor([(time.thread_time() - start) / reps], dtype=torch.float64)
    dist.all_reduce(per_rep)
    return per_rep.item() / dist.get_world_size()
