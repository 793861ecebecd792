"""What the kernel's scheduler says about the calling thread: its CPU time and how long it
waited for a core (issue 17: on a shared machine a trial step's wall clock holds the
other processes' turns on the cores, which no cost model prices).

`/proc/thread-self/schedstat` (Linux, CONFIG_SCHEDSTATS or sched_info): three fields,
"time spent on the cpu", "time spent waiting on a runqueue" (both ns) and timeslices
run (Documentation/scheduler/sched-stats.rst). A thread waiting on the run queue was
ready to run but every core was busy: load, not work.
"""

from __future__ import annotations

import threading

NS_PER_S = 1e9


def thread_schedstat() -> tuple[float, float] | None:
    """(CPU seconds, run-queue seconds) of the calling thread so far; None where the
    kernel does not say (not Linux, schedstats off)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as fh:
            cpu_ns, wait_ns, _ = fh.read().split()
    except (OSError, ValueError):
        return None
    return int(cpu_ns) / NS_PER_S, int(wait_ns) / NS_PER_S
