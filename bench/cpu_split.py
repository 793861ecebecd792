"""A rank's step in CPU terms (issue 17), for `bench_dp_phases`: on a shared 2-core machine
the wall clock of a multi-rank step moves 20-50% between minutes, the calling thread's
CPU time far less, and the kernel's per-thread run-queue delay says how long the thread
was ready to run but had no core (`/proc/thread-self/schedstat`, field 2: "time spent
waiting on a runqueue", Documentation/scheduler/sched-stats.rst).

`CpuSplit` counts, over the steps run inside it, on the calling (main) thread:
  forward_backward_cpu_s   CPU in `ParallelModel._forward_backward`
  dp_hooks_cpu_s           of that, CPU in FSDP2's hooks (outermost calls only: the
                           state's pre/post forward, pre-backward, the root's final
                           callback, a group's post_backward), less their collectives
  comm_cpu_s               CPU inside the collective calls (launch, copies, the wait's
                           own CPU)
  optimizer_cpu_s          CPU in the optimizer's step
  thread_cpu_s             all the thread's CPU; `off_cpu_s` = wall - CPU - run-queue
                           delay: time blocked (collectives waiting on peers, sleeps)
  runqueue_s               ready but not running: the cores were busy (its own gloo
                           threads, the peer ranks, other processes)
  other_threads_cpu_s      the process's other threads (gloo's loop and workers)
and a timeline: each collective call's (enter, leave) on the host's wall clock
(`time.time`, one clock for every process) with the thread's CPU and run-queue delay so
far at each, plus each step's start as a mark; `wait_split` joins the ranks' timelines
and splits the time each rank waited for the last one into why the last was late.
Construct it before the model is built (FSDP2 binds its hooks when applied), `attach`
the built model, enter it around each step, `detach` when done.
"""

from __future__ import annotations

import sys
import time

import torch.distributed as dist

from planner.trial.sched import thread_schedstat

COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast",
               "all_gather", "reduce_scatter")
STATE_HOOKS = ("_root_pre_forward", "_pre_forward", "_post_forward", "_pre_backward",
               "_root_post_backward_final_callback")
GROUP_HOOKS = ("post_backward",)


def _schedstat() -> tuple[float, float]:
    """(CPU seconds, run-queue seconds) of the calling thread."""
    reading = thread_schedstat()
    if reading is None:
        sys.exit("cpu_split: this kernel gives no per-thread schedstat "
                 "(/proc/self/task/<tid>/schedstat): run it on Linux with schedstats on")
    return reading


class CpuSplit:
    def __init__(self):
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

        self.on = False
        self.sums: dict[str, float] = {}
        # (kind, enter wall s, leave wall s, thread CPU s and run-queue s at entry, at leave)
        self.timeline: list[tuple[str, float, float, float, float, float, float]] = []
        self._hook_depth = 0
        self._patched = []
        self._in_call = False
        for cls, names in ((FSDPState, STATE_HOOKS), (FSDPParamGroup, GROUP_HOOKS)):
            for name in names:
                self._patch(cls, name, self._hook)

    def _add(self, key: str, seconds: float) -> None:
        if self.on:
            self.sums[key] = self.sums.get(key, 0.0) + seconds

    def _patch(self, owner, name: str, wrapper) -> None:
        plain = getattr(owner, name)
        self._patched.append((owner, name, plain))
        setattr(owner, name, wrapper(plain, name))

    def _hook(self, plain, name):
        def hook(*args, **kwargs):
            self._hook_depth += 1
            start, comm = time.thread_time(), self.sums.get("comm_in_hooks_cpu_s", 0.0)
            try:
                return plain(*args, **kwargs)
            finally:
                self._hook_depth -= 1
                if self._hook_depth == 0:
                    inside = self.sums.get("comm_in_hooks_cpu_s", 0.0) - comm
                    self._add("dp_hooks_cpu_s", time.thread_time() - start - inside)
        return hook

    def _timed(self, plain, key):
        def timed(*args, **kwargs):
            if self.on and key == "comm_cpu_s" and not self._in_call:
                return self._logged(plain, *args, **kwargs)
            start = time.thread_time()
            try:
                return plain(*args, **kwargs)
            finally:
                seconds = time.thread_time() - start
                self._add(key, seconds)
                if key == "comm_cpu_s" and self._hook_depth:
                    self._add("comm_in_hooks_cpu_s", seconds)
        return timed

    def _logged(self, plain, *args, **kwargs):
        """A collective call (outermost), counted and put on the timeline."""
        self._in_call = True
        enter, (cpu, runq) = time.time(), _schedstat()
        start = time.thread_time()
        try:
            return plain(*args, **kwargs)
        finally:
            self._in_call = False
            seconds = time.thread_time() - start
            self._add("comm_cpu_s", seconds)
            if self._hook_depth:
                self._add("comm_in_hooks_cpu_s", seconds)
            self.timeline.append(("call", enter, time.time(), cpu, runq, *_schedstat()))

    def attach(self, pm) -> None:
        """Count the built model's forward+backward and optimizer step, and the
        collectives."""
        self._patch(pm, "_forward_backward", lambda p, _: self._timed(p, "forward_backward_cpu_s"))
        self._patch(pm.optimizer, "step", lambda p, _: self._timed(p, "optimizer_cpu_s"))
        for name in COLLECTIVES:
            if hasattr(dist, name):
                self._patch(dist, name, lambda p, _: self._timed(p, "comm_cpu_s"))

    def __enter__(self):
        """Count from here (one step: enter and leave around each, the barriers outside)."""
        self.on = True
        self._start = (time.perf_counter(), time.thread_time(), time.process_time(),
                       _schedstat()[1])
        now, (cpu, runq) = time.time(), _schedstat()
        self.timeline.append(("step", now, now, cpu, runq, cpu, runq))
        return self

    def __exit__(self, *exc):
        wall0, thread0, process0, runq0 = self._start
        wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        runq = _schedstat()[1]
        for key, seconds in (("wall_s", wall - wall0), ("thread_cpu_s", thread - thread0),
                             ("other_threads_cpu_s", (process - process0) - (thread - thread0)),
                             ("runqueue_s", runq - runq0),
                             ("off_cpu_s", (wall - wall0) - (thread - thread0) - (runq - runq0))):
            self._add(key, seconds)
        self.on = False
        return False

    def detach(self) -> None:
        """Put back every patched function (hooks FSDP2 bound at build stay wrapped, idle)."""
        for owner, name, plain in reversed(self._patched):
            setattr(owner, name, plain)
        self._patched.clear()

    def per_step(self, steps: int) -> dict[str, float]:
        return {key: seconds / steps for key, seconds in self.sums.items()}


def wait_split(timelines: list[list[tuple]], steps: int) -> dict[str, float]:
    """Seconds per step, summed over ranks, that ranks waited for the last to enter each
    collective (`wait_s`), split by where the late rank's time since its previous call
    (or step start) went beyond the waiting rank's: the previous call's later leave
    (`skew_s`), more CPU (`cpu_s`: more work), more run-queue delay (`runqueue_s`: ready
    with no core, preempted) and more time blocked otherwise (`off_s`); the four add up
    to `wait_s`. Of the skew, apart (not in the sum): how much more run-queue delay the
    late rank had inside that previous call (`skew_runqueue_s`). {} when the ranks'
    timelines differ in shape."""
    if len({tuple(e[0] for e in t) for t in timelines}) != 1:
        return {}
    out = dict.fromkeys(("wait_s", "skew_s", "cpu_s", "runqueue_s", "off_s",
                         "skew_runqueue_s"), 0.0)
    for k, event in enumerate(timelines[0]):
        if event[0] != "call" or k == 0:
            continue
        late = max(range(len(timelines)), key=lambda r: timelines[r][k][1])
        for r, t in enumerate(timelines):
            if r == late:
                continue
            (_, le, _, lc, lq, *_), (_, re, _, rc, rq, *_) = timelines[late][k], t[k]
            (_, _, lp, _, lpq0, lpc, lpq), (_, _, rp, _, rpq0, rpc, rpq) = \
                timelines[late][k - 1], t[k - 1]
            cpu, runq = (lc - lpc) - (rc - rpc), (lq - lpq) - (rq - rpq)
            out["wait_s"] += le - re
            out["skew_s"] += lp - rp
            out["skew_runqueue_s"] += (lpq - lpq0) - (rpq - rpq0)
            out["cpu_s"] += cpu
            out["runqueue_s"] += runq
            out["off_s"] += (le - lp) - (re - rp) - cpu - runq
    return {key: seconds / steps for key, seconds in out.items()}
