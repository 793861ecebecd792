"""What the kernel's scheduler says about the calling thread: its CPU time and how long it
waited for a core (issue 17: on a shared machine a trial step's wall clock holds the
other processes' turns on the cores, which no cost model prices).

`/proc/thread-self/schedstat` (Linux, CONFIG_SCHEDSTATS or sched_info): three fields,
"time spent on the cpu", "time spent waiting on a runqueue" (both ns) and timeslices
run (Documentation/scheduler/sched-stats.rst). A thread waiting on the run queue was
ready to run but every core was busy: load, not work.

The first field is the kernel's `se.sum_exec_runtime` as last accounted: for a thread on
its core that happens only at a scheduler tick (every 4 ms at CONFIG_HZ=250) or a switch,
so a bare read lags the thread's true CPU by up to a tick. A trial step bracketed by two
such reads lost 0-4 ms of CPU at its end (issue 17: one-rank steps seemed 1-4 ms off their
core with no run-queue wait; `bench/bench_offcore.py` shows none). The CPU is therefore
read from CLOCK_THREAD_CPUTIME_ID (`time.thread_time`), which adds the running thread's
pending runtime ("task_sched_runtime", kernel/sched/core.c), and the wait from the file
after it; the wait needs no bringing up to date: a running thread's wait was added when
it got its core (sched_info_arrive, kernel/sched/stats.h).
"""

from __future__ import annotations

import os
import threading
import time

NS_PER_S = 1e9


def thread_schedstat() -> tuple[float, float] | None:
    """(CPU seconds, run-queue seconds) of the calling thread so far; None where the
    kernel does not say (not Linux, schedstats off)."""
    reader = ThreadSchedstat()
    try:
        return reader.read()
    finally:
        reader.close()


class ThreadSchedstat:
    """The calling thread's schedstat file kept open, for reads inside a timed span: a
    `pread` of the open file costs ~1.7 us here, opening it each time ~19 us (about
    0.9% of a 4.6 ms trial step for the two reads; review, 2026-11-26); a read with the
    thread's CPU clock beside it ~1.9 us of CPU (bench_offcore session, 2026-11-26)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(
                f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def read(self) -> tuple[float, float] | None:
        """(CPU seconds, run-queue seconds) of the thread that opened it, read on that
        thread (the CPU is the calling thread's clock); None where the kernel does not say."""
        if self._fd is None:
            return None
        cpu_s = time.thread_time()  # up to date; the file's first field may lag a tick
        try:
            _, wait_ns, _ = os.pread(self._fd, 256, 0).split()
        except (OSError, ValueError):
            return None
        return cpu_s, int(wait_ns) / NS_PER_S

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
