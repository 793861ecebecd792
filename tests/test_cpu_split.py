"""`bench.cpu_split.wait_split`: the time ranks wait for the last one to enter a collective,
split by why the last was late, on hand-built timelines (pure logic)."""

from __future__ import annotations

import pytest

from bench.cpu_split import wait_split

MS = 1e-3


def _event(kind, enter_ms, leave_ms, cpu_ms, runq_ms, cpu_leave_ms=None, runq_leave_ms=None):
    """A timeline entry: the thread's CPU and run-queue totals at entry and at leave."""
    return (kind, enter_ms * MS, leave_ms * MS, cpu_ms * MS, runq_ms * MS,
            (cpu_ms if cpu_leave_ms is None else cpu_leave_ms) * MS,
            (runq_ms if runq_leave_ms is None else runq_leave_ms) * MS)


def test_a_preempted_rank_makes_its_peer_wait_its_run_queue_delay():
    """Both ranks start a step at 0 ms and do 5 ms of CPU before an all-reduce; rank 1 is
    also 3 ms on the run queue, so it enters at 8 ms and rank 0 (entered at 5 ms) waits
    3 ms, all of it rank 1's extra run-queue delay. Both leave the call at 9 ms; before
    the next call rank 0 does 2 ms more CPU than rank 1 (4 vs 2) and rank 1 sleeps 1 ms:
    rank 1 enters at 12, rank 0 at 13, and rank 1 waits 1 ms = 2 ms more CPU less 1 ms
    less off-CPU time on rank 0's side."""
    # 0.5 ms of CPU and 1 ms of run-queue delay inside rank 0's first call: not counted
    rank0 = [_event("step", 0, 0, 0, 0), _event("call", 5, 9, 5, 0, 5.5, 1),
             _event("call", 13, 14, 9.5, 1)]
    rank1 = [_event("step", 0, 0, 0, 0), _event("call", 8, 9, 5, 3),
             _event("call", 12, 14, 7, 3)]
    split = wait_split([rank0, rank1], steps=1)
    assert split["wait_s"] == pytest.approx(4 * MS)
    assert split["runqueue_s"] == pytest.approx(3 * MS)
    assert split["cpu_s"] == pytest.approx(2 * MS)
    assert split["off_s"] == pytest.approx(-1 * MS)
    assert split["skew_s"] == pytest.approx(0.0)
    # inside the first call rank 0 (late at the second) had 1 ms more run-queue delay
    assert split["skew_runqueue_s"] == pytest.approx(1 * MS)
    assert sum(split[k] for k in ("skew_s", "cpu_s", "runqueue_s", "off_s")) == \
        pytest.approx(split["wait_s"])


def test_timelines_of_different_shapes_give_nothing():
    one = [_event("step", 0, 0, 0, 0), _event("call", 1, 2, 1, 0)]
    assert wait_split([one, one[:1]], steps=1) == {}
