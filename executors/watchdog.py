"""A rank that stops making progress is reported within a bounded time, not after the
process-group timeout: `ensure_watchdog(limit_s)` from `ParallelModel.train_step`.

Every rank runs one background thread. Each tick (limit / CHECKS_PER_LIMIT) it publishes
this rank's heartbeat to the process group's store, `planner/heartbeat/<rank>`:

    {"rank": 1, "seq": 17, "count": 5, "step": 5, "in_step": false, "done": false}

(`seq` counts ticks, `count` the train steps this process finished, `step` the model's
step counter, shown in messages) and reads every peer's. The step hooks only set two
attributes: no collective, no store call, nothing a step would notice. Durations are
measured on the observer's monotonic clock from when it saw a value change, so hosts'
clocks need not agree. A peer is watched once it has finished a step (set-up may be
slow), until it says `done` (its process group was destroyed, or it exited). It stalls:

  A. frozen: its `seq` has not changed for longer than the limit (SIGSTOP, a hung host,
     a dead process) — "rank 1 stopped responding (...; it last reported 5 steps done)" — or
     it has published nothing for longer than the limit since this rank's first step;
  B. holding the others up: it has sat between steps after step k for longer than the
     limit while another rank has waited inside step k+1 for longer than the limit.

Then this rank prints one line naming the stalled rank and its last step to stderr and
leaves with STALL_EXIT_CODE (os._exit: the main thread is blocked in a collective), so
the launcher (torchrun, `planner validate`) tears the job down. A rank whose own thread
was stopped (its tick came late by more than the limit) forgets what it saw instead of
blaming its peers. A store host that stops answering (rank 0 under env://) is named as
well. The limit: `stall_limit_s`, else PLANNER_STALL_LIMIT_S, else
STALL_LIMIT_S; a step, or what a rank does alone between steps, must fit in it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch.distributed as dist

from executors.mesh import seconds_setting

# Default stall limit: above a large model's step or checkpoint save (minutes), below
# the process-group timeout (executors.mesh.PG_TIMEOUT_S) so the watchdog speaks first.
STALL_LIMIT_S = 300.0
STALL_LIMIT_ENV = "PLANNER_STALL_LIMIT_S"
# Ticks per stall limit: a stall is reported within limit x (1 + 1/CHECKS_PER_LIMIT).
CHECKS_PER_LIMIT = 5
# Exit status of a rank that reports a stall: not 1 (a Python error) nor 2 (bad input).
STALL_EXIT_CODE = 3
KEY_PREFIX = "planner/heartbeat/"
# Seconds to wait for the thread at exit (one store round trip; it must not delay exit).
STOP_WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    rank: int
    seq: int  # ticks published: a frozen rank's stops changing
    count: int  # train steps this process finished (what the rules compare)
    step: int  # the model's step counter (what messages show)
    in_step: bool
    done: bool = False

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode("utf-8")

    @staticmethod
    def from_bytes(data: bytes) -> Heartbeat:
        return Heartbeat(**json.loads(data))


class PeerView:
    """What one rank has seen of every rank's heartbeats, and the stall rules (pure logic:
    `observe` heartbeats at a time, ask `stalled` at a time)."""

    def __init__(self, me: int, world_size: int, limit_s: float):
        self.me, self.world_size, self.limit_s = me, world_size, limit_s
        self.beats: dict[int, Heartbeat] = {}
        self.seq_since: dict[int, float] = {}  # when each rank's seq last changed
        self.state_since: dict[int, float] = {}  # when its (count, in_step) last changed
        self.armed_since: float | None = None  # when this rank had finished its first step

    def observe(self, beats: dict[int, Heartbeat], now: float) -> None:
        for rank, beat in beats.items():
            old = self.beats.get(rank)
            if old is None or old.seq != beat.seq:
                self.seq_since[rank] = now
            if old is None or (old.count, old.in_step) != (beat.count, beat.in_step):
                self.state_since[rank] = now
            self.beats[rank] = beat
        if self.armed_since is None and self.me in beats and beats[self.me].count >= 1:
            self.armed_since = now

    def forget_times(self, now: float) -> None:
        """This rank was stopped itself: what it measured meanwhile proves nothing."""
        for rank in self.beats:
            self.seq_since[rank] = self.state_since[rank] = now
        if self.armed_since is not None:
            self.armed_since = now

    def stalled(self, now: float) -> str | None:
        """A description of the first stalled peer, or None."""
        if self.armed_since is not None and now - self.armed_since > self.limit_s:
            # steps are collective: once this rank finished one, every rank had started it
            for rank in range(self.world_size):
                if rank not in self.beats:
                    return (f"rank {rank} stopped responding (no heartbeat in "
                            f"{now - self.armed_since:.0f} s since this rank's first step)")
        watched = {r: b for r, b in self.beats.items() if b.count >= 1 and not b.done}
        for rank, beat in sorted(watched.items()):
            if rank == self.me:
                continue
            silent = now - self.seq_since[rank]
            if silent > self.limit_s:
                return (f"rank {rank} stopped responding (no heartbeat for {silent:.0f} s; "
                        f"it last reported {beat.step} steps done)")
            idle = now - self.state_since[rank]
            if beat.in_step or idle <= self.limit_s:
                continue
            waiting = sorted(r for r, b in watched.items()
                             if b.in_step and b.count == beat.count
                             and now - self.state_since[r] > self.limit_s)
            if waiting:
                return (f"rank {rank} has not started a step for {idle:.0f} s after finishing "
                        f"{beat.step} steps while rank{'s' if len(waiting) > 1 else ''} "
                        f"{','.join(map(str, waiting))} wait{'' if len(waiting) > 1 else 's'} "
                        "in the next one")
        return None


class Watchdog:
    """This process's heartbeat thread (module docstring). `step_started` /
    `step_finished` are the hooks; `stop` ends it and tells the peers (also at exit)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, limit_s: float):
        self.rank, self.world_size, self.limit_s = rank, world_size, limit_s
        self.group = dist.group.WORLD  # the default process group it watches
        self.interval_s = limit_s / CHECKS_PER_LIMIT
        # a connection of its own: a frozen store host blocks this one, not the group's
        self.store = store.clone()
        self.store.set_timeout(timedelta(seconds=limit_s))
        self.count = self.step = 0
        self.in_step = False
        self.seq = 0
        self.view = PeerView(rank, world_size, limit_s)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set: publish now (the first step, or stop)
        self._thread = threading.Thread(target=self._run, name="planner-watchdog", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    # -------------------------------------------------------------- step hooks

    def step_started(self) -> None:
        self.in_step = True

    def step_finished(self, step: int) -> None:
        self.count, self.step, self.in_step = self.count + 1, step, False
        if self.count == 1:  # peers watch a rank from its first step: tell them now
            self._wake.set()

    # -------------------------------------------------------------- thread

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """End the thread and publish `done` (best effort: the store may be gone)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(STOP_WAIT_S)
        if not self._group_alive():  # the thread says done when it sees the group go
            return
        try:
            self._publish(done=True)
        except Exception:  # noqa: BLE001 - the job is ending; peers that still run know
            pass

    def _beat(self, done: bool = False) -> Heartbeat:
        return Heartbeat(self.rank, self.seq, self.count, self.step, self.in_step, done)

    def _publish(self, done: bool = False) -> None:
        self.seq += 1
        self.store.set(f"{KEY_PREFIX}{self.rank}", self._beat(done).to_bytes())

    def _read_peers(self) -> dict[int, Heartbeat]:
        keys = [f"{KEY_PREFIX}{r}" for r in range(self.world_size) if r != self.rank]
        present = keys if self.store.check(keys) else [k for k in keys if self.store.check([k])]
        values = self.store.multi_get(present) if present else []
        return {int(k[len(KEY_PREFIX):]): Heartbeat.from_bytes(bytes(v))
                for k, v in zip(present, values)}

    def _exchange(self) -> dict[int, Heartbeat]:
        """Publish this rank's heartbeat and read the peers'; TimeoutError when the store
        does not answer within the limit (its host is frozen: a TCPStore call to a
        stopped host blocks for ever, whatever the store's own timeout)."""
        result: dict = {}

        def work() -> None:
            try:
                self._publish()
                result["beats"] = self._read_peers()
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                result["error"] = exc

        worker = threading.Thread(target=work, name="planner-watchdog-store", daemon=True)
        worker.start()
        worker.join(self.limit_s)
        if worker.is_alive():
            raise TimeoutError
        if "error" in result:
            raise result["error"]
        return result["beats"]

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            if not self._group_alive():  # the job ended its process group: done
                self._finish()
                return
            try:
                beats = self._exchange()
            except TimeoutError:
                self._fail(f"{_store_host()}, which holds the process group's store, stopped "
                           f"responding (the store did not answer for {self.limit_s:g} s)")
                return
            except Exception:  # noqa: BLE001 - the store's host exited (its launcher reports
                return  # that exit) or the job is ending
            now = time.monotonic()
            if now - last > self.limit_s + self.interval_s:
                self.view.forget_times(now)  # this process was stopped, not its peers
            last = now
            beats[self.rank] = self._beat()
            self.view.observe(beats, now)
            found = self.view.stalled(now)
            if found:
                self._fail(found)
                return

    def _group_alive(self) -> bool:
        """The process group this watchdog was made for is still the default one (a
        process may destroy it and make another: tests, validate's dropout re-run)."""
        return dist.is_initialized() and dist.group.WORLD is self.group

    def _finish(self) -> None:
        """`stop` from the thread itself (it cannot join itself)."""
        self._stop.set()
        try:
            self._publish(done=True)
        except Exception:  # noqa: BLE001 - best effort, as in stop()
            pass

    def _fail(self, what: str) -> None:
        print(f"planner watchdog on rank {self.rank}: {what}; the job exits now instead of "
              f"waiting for the process-group timeout (stall limit {self.limit_s:g} s: "
              f"stall_limit_s or {STALL_LIMIT_ENV})", file=sys.stderr, flush=True)
        os._exit(STALL_EXIT_CODE)


_current: Watchdog | None = None


def _store_host() -> str:
    """Who holds the default group's store: torchrun's agent (init_distributed under
    torchrun) or rank 0 (torch's env:// and tcp:// rendezvous)."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return "torchrun's agent" if agent else "rank 0"


def ensure_watchdog(stall_limit_s: float | None = None) -> Watchdog | None:
    """This process's watchdog for the current default process group, started on the
    first call (None with one rank: nobody to wait for)."""
    global _current
    if dist.get_world_size() == 1:
        return None
    if _current is not None and _current.alive and _current._group_alive():
        return _current
    if _current is not None:
        _current.stop()
    limit = seconds_setting(stall_limit_s, "stall_limit_s", STALL_LIMIT_ENV, STALL_LIMIT_S)
    store = dist.distributed_c10d._get_default_store()  # the group's own rendezvous store
    _current = Watchdog(store, dist.get_rank(), dist.get_world_size(), limit)
    return _current

