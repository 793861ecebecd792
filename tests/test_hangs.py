"""Never hang silently (issue 16): explicit process-group timeouts, ranks that agree on the
plan, a watchdog that names a stalled rank, and spawned ranks that are always reaped.

Jobs run in their own session (tests/test_faults.py `run_in_own_group`); afterwards no
process of that session may remain, checked in /proc (no psutil).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from executors.agreement import disagreement_message, plan_digest, plan_record
from executors.mesh import Meshes, ParallelDims, pg_timeout_s
from executors.watchdog import Heartbeat, PeerView
from ir.errors import PlannerError
from ir.plan import uniform_plan

pytestmark = [pytest.mark.multiprocess]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
SCRIPT = os.path.join(ROOT, "examples", "train_resumable.py")
STALL_LIMIT_S = 5  # short, so the frozen-rank drill ends quickly
# torchrun's agent waits 30 s for a frozen worker to take SIGTERM before SIGKILL; the
# issue's bound for the whole job is 2 minutes
FROZEN_JOB_BOUND_S = 120
DISAGREE_BOUND_S = 60  # set-up of 2 ranks on a busy 2-core machine, then at once
LIMIT = 10.0  # the PeerView tests' stall limit (fake clock)


# ------------------------------------------------------------------ /proc helpers


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (field 3 = state, 4 = ppid, 6 = session)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2:].split()


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def children(ppid: int) -> set[int]:
    return {pid for pid in _pids() if (f := _stat_fields(pid)) and int(f[1]) == ppid}


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def processes_naming(marker: str) -> list[int]:
    """Processes (zombies too: their command line is empty, so by state) whose command
    line holds `marker` (a test's unique tmp_path)."""
    return [pid for pid in _pids() if marker in _cmdline(pid)]


def assert_none_left(marker: str, wait_s: float = 10.0) -> None:
    deadline = time.monotonic() + wait_s
    while processes_naming(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_naming(marker)
    for pid in left:  # do not leak them into the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {[(p, _cmdline(p)[:200]) for p in left]}"


def run_job(argv: list[str], env: dict, bound_s: float):
    """torchrun on 2 ranks in a session of its own: (result, seconds). Past `bound_s` the
    session is killed (the workers die with the agent) and the test fails."""
    from test_faults import run_in_own_group

    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.2",
           SCRIPT, *argv]
    start = time.monotonic()
    return run_in_own_group(cmd, bound_s, env), time.monotonic() - start


class BackgroundJob:
    """`run_job` started now and collected later, its output in files (a pipe nobody reads
    could fill and block it): the frozen-rank job spends ~30 s in torchrun's fixed SIGTERM
    grace for a stopped worker, idle, while the rest of this file runs."""

    def __init__(self, argv: list[str], env: dict, folder: str):
        cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.2",
               SCRIPT, *argv]
        self.cmd, self.folder = cmd, folder
        self.out_path, self.err_path = (os.path.join(folder, n) for n in ("stdout", "stderr"))
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.start = time.monotonic()
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True,
                                         start_new_session=True,
                                         env={**os.environ, "OMP_NUM_THREADS": "1", **env})
        self.end: float | None = None
        self.waiter = threading.Thread(target=self._wait, daemon=True)
        self.waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.end = time.monotonic()

    def result(self, bound_s: float):
        """(CompletedProcess, seconds), as `run_job`; past `bound_s` from its start the
        session is killed and the test fails."""
        self.waiter.join(max(0.0, self.start + bound_s - time.monotonic()))
        if self.end is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.waiter.join()
            with open(self.err_path) as fh:
                pytest.fail(f"torchrun ran past {bound_s} s:\n{fh.read()[-3000:]}")
        with open(self.out_path) as out, open(self.err_path) as err:
            done = subprocess.CompletedProcess(self.cmd, self.proc.returncode, out.read(),
                                               err.read())
        return done, self.end - self.start


# ------------------------------------------------------------------ whole jobs


@pytest.fixture(scope="module", autouse=True)
def frozen_job(request, tmp_path_factory):
    """The frozen-rank drill, started before this file's first test and checked by its
    last (`test_a_frozen_rank_ends_the_job_naming_it`, when selected); never left running."""
    if not any(item.name == "test_a_frozen_rank_ends_the_job_naming_it"
               for item in request.session.items):
        yield None
        return
    folder = str(tmp_path_factory.mktemp("frozen"))
    job = BackgroundJob(["--ckpt-dir", os.path.join(folder, "ckpt"), "--steps", "6",
                         "--stop-at-step", "2", "--kill-rank", "1",
                         "--stall-limit-s", str(STALL_LIMIT_S)], {}, folder)
    yield job
    try:
        job.result(FROZEN_JOB_BOUND_S)
    finally:
        assert_none_left(folder)


def test_ranks_given_different_plans_fail_at_once_naming_both(tmp_path):
    proc, seconds = run_job(["--ckpt-dir", str(tmp_path / "ckpt"), "--steps", "2",
                                  "--zero-on-rank", "1:3"], {"PLANNER_PG_TIMEOUT_S": "300"},
                                 DISAGREE_BOUND_S)
    errors = [l for l in proc.stderr.splitlines() if l.startswith("train_resumable: error:")]
    # torchrun stops the other worker once one has failed, so the slower rank may be
    # stopped before it prints; whoever prints says the same
    assert proc.returncode != 0 and errors, proc.stderr[-3000:]
    assert len(set(errors)) == 1
    assert "ranks disagree on the plan: rank 0 runs plan(" in errors[0]
    assert "tp1·dp2) and rank 1 runs plan(" in errors[0] and "tp1·dp2·z3)" in errors[0]
    assert "layers[0].dp_mode: replicate vs zero3" in errors[0]
    assert seconds < DISAGREE_BOUND_S
    assert_none_left(str(tmp_path))


def test_workers_die_with_a_killed_torchrun(tmp_path):
    """torchrun's workers lead their own sessions: killing the agent's session used to
    leave them running (issue 16); now they die with their parent."""
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", SCRIPT, "--ckpt-dir",
           str(tmp_path / "ckpt"), "--steps", "1000000", "--save-every", "1000000"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        for line in proc.stdout:  # training has started on every rank
            if "starting at step 0" in line:
                break
        workers = [p for p in processes_naming(str(tmp_path)) if p in children(proc.pid)]
        assert len(workers) == 2
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert_none_left(str(tmp_path))


# ------------------------------------------------------------------ spawned ranks


def sleeping_factory(micro_batch=1, seq_len=None, device="meta"):
    """A model factory that never returns: a rank stuck in set-up. It first writes its pid
    where the test looks (PLANNER_TEST_MARKERS)."""
    with open(os.path.join(os.environ["PLANNER_TEST_MARKERS"], str(os.getpid())), "w"):
        pass
    time.sleep(3600)


def _rank_payload():
    from ir.plan import PlanDocument, plan_to_json
    from ir.strategy import Precision
    from planner.trial.records import RankPayload

    plan = uniform_plan(2, dp=2, micro_batch=1, global_batch=2, precision=Precision.FP32)
    doc = PlanDocument(plan, "sleeper", "0" * 16, ("a", "b"), {})
    return RankPayload(plan_json=plan_to_json(doc), plan_path="<test>",
                       model="tests.test_hangs:sleeping_factory", seq_len=None, graph=None,
                       batches=[], memory_steps=1, steps=1, backend="gloo", check_steps=0,
                       threads=1)


def _descendants(pid: int) -> set[int]:
    """Children, their children and so on, but multiprocessing's long-lived helpers of
    this process: its resource tracker and its fork server (whose forks, the ranks, have
    the server's command line but the server as parent)."""
    found, frontier = set(), [pid]
    while frontier:
        for child in children(frontier.pop()):
            helper = any(name in _cmdline(child) for name in
                         ("multiprocessing.resource_tracker", "multiprocessing.forkserver"))
            if not (helper and _stat_fields(child) and int(_stat_fields(child)[1]) == pid):
                found.add(child)
            frontier.append(child)
    return found


def test_spawn_ranks_timeout_reaps_every_rank(tmp_path, monkeypatch):
    from planner.trial.spawn import spawn_ranks

    # The ranks must find where to write (a forked rank reaches the factory within the
    # limit; without it, it would fail on a KeyError instead of sleeping).
    monkeypatch.setenv("PLANNER_TEST_MARKERS", str(tmp_path))
    before = _descendants(os.getpid())
    with pytest.raises(PlannerError, match="validation ran past"):
        spawn_ranks(_rank_payload(), 2, timeout_s=1.0)
    left = _descendants(os.getpid()) - before  # the ranks are the fork server's children
    assert not left, [(p, _stat_fields(p)[0]) for p in left]  # state Z: not reaped


def test_spawned_ranks_die_with_their_parent(tmp_path):
    """`planner validate` killed (SIGKILL: no finally runs) while its ranks are busy: the
    ranks die too instead of running on as orphans."""
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from tests.test_hangs import _rank_payload
        from planner.trial.spawn import spawn_ranks
        spawn_ranks(_rank_payload(), 2)
    """)
    env = {**os.environ, "PLANNER_TEST_MARKERS": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": ROOT}
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = [int(name) for name in os.listdir(tmp_path)]
        assert len(ranks) == 2, "the ranks never reached the model factory"
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_stat_fields(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [p for p in ranks if _stat_fields(p)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "orphaned ranks outlived planner validate"


# ------------------------------------------------------------------ the watchdog's rules


def beat(rank, seq, count, in_step=False, done=False):
    return Heartbeat(rank, seq, count, count, in_step, done)


def test_a_frozen_peer_is_named_after_the_limit_and_not_before():
    view = PeerView(me=0, world_size=2, limit_s=LIMIT)
    view.observe({0: beat(0, 1, 3, in_step=True), 1: beat(1, 1, 3)}, now=0.0)
    for t in (2.0, 4.0, 6.0, 8.0, 10.0):  # rank 0 ticks on, rank 1 is frozen
        view.observe({0: beat(0, int(t), 3, in_step=True), 1: beat(1, 1, 3)}, now=t)
        assert view.stalled(t) is None
    view.observe({0: beat(0, 11, 3, in_step=True), 1: beat(1, 1, 3)}, now=10.5)
    assert view.stalled(10.5) == ("rank 1 stopped responding (no heartbeat for 10 s; it last "
                                  "reported 3 steps done)")


def test_an_idle_peer_is_named_only_while_another_waits_in_the_next_step():
    view = PeerView(me=0, world_size=3, limit_s=LIMIT)
    for t in range(0, 12):  # everyone alive; rank 2 sits after step 4, ranks 0,1 in step 5
        view.observe({0: beat(0, t, 4, in_step=True), 1: beat(1, t, 4, in_step=True),
                      2: beat(2, t, 4)}, now=float(t))
    assert view.stalled(11.0) == ("rank 2 has not started a step for 11 s after finishing 4 "
                                  "steps while ranks 0,1 wait in the next one")
    calm = PeerView(me=0, world_size=2, limit_s=LIMIT)  # both between steps (a long save)
    for t in range(0, 30):
        calm.observe({0: beat(0, t, 4), 1: beat(1, t, 4)}, now=float(t))
    assert calm.stalled(29.0) is None


def test_no_alarm_before_the_first_step_for_done_ranks_or_after_being_stopped_oneself():
    view = PeerView(me=0, world_size=2, limit_s=LIMIT)
    view.observe({0: beat(0, 1, 0), 1: beat(1, 1, 0)}, now=0.0)  # set-up: no steps yet
    view.observe({0: beat(0, 2, 0)}, now=100.0)
    assert view.stalled(100.0) is None
    view.observe({0: beat(0, 3, 1), 1: beat(1, 2, 1, done=True)}, now=101.0)
    assert view.stalled(500.0) is None  # rank 1 ended its process group
    view = PeerView(me=0, world_size=2, limit_s=LIMIT)
    view.observe({0: beat(0, 1, 2), 1: beat(1, 1, 2)}, now=0.0)
    view.forget_times(60.0)  # this rank was the one stopped for a minute
    assert view.stalled(61.0) is None


def test_a_peer_that_never_reports_is_named_once_this_rank_has_stepped():
    view = PeerView(me=1, world_size=2, limit_s=LIMIT)
    view.observe({1: beat(1, 1, 0)}, now=0.0)
    assert view.stalled(50.0) is None  # set-up may be slow
    view.observe({1: beat(1, 2, 1)}, now=50.0)
    assert view.stalled(55.0) is None
    assert view.stalled(61.0) == ("rank 0 stopped responding (no heartbeat in 11 s since this "
                                  "rank's first step)")


# ------------------------------------------------------------------ settings, agreement


def test_timeouts_come_from_the_argument_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv("PLANNER_PG_TIMEOUT_S", raising=False)
    assert pg_timeout_s() == 600.0 and pg_timeout_s(7) == 7.0
    monkeypatch.setenv("PLANNER_PG_TIMEOUT_S", "45")
    assert pg_timeout_s() == 45.0
    for bad in ("nan", "-1", "soon", "inf"):
        monkeypatch.setenv("PLANNER_PG_TIMEOUT_S", bad)
        with pytest.raises(PlannerError, match=f"^PLANNER_PG_TIMEOUT_S='{bad}' is not a "
                                               "positive number of seconds"):
            pg_timeout_s()
    with pytest.raises(PlannerError, match="^timeout_s=0 is not a positive number"):
        pg_timeout_s(0)


def test_the_disagreement_message_names_every_group_of_ranks():
    graph = SimpleNamespace(fingerprint="f" * 16)  # all of the LayerGraph a record reads
    ddp = uniform_plan(2, dp=2, micro_batch=2, global_batch=4)
    z3 = uniform_plan(2, dp=2, zero=3, micro_batch=2, global_batch=4)
    mb = uniform_plan(2, dp=2, micro_batch=1, global_batch=4)
    assert plan_digest(ddp, graph) == plan_digest(uniform_plan(2, dp=2, micro_batch=2,
                                                               global_batch=4), graph)
    assert plan_digest(ddp, graph) != plan_digest(z3, graph)
    records = [plan_record(p, graph) for p in (ddp, z3, ddp, mb)]
    message = disagreement_message(records, [str(p) for p in (ddp, z3, ddp, mb)])
    assert message == (f"ranks disagree on the plan: ranks 0,2 run {ddp}, rank 1 runs {z3} "
                       f"and rank 3 runs {mb} (layers[0].dp_mode: replicate vs zero3); give "
                       "every rank the same plan file")
    # the clip is a collective too: a rank given no max_grad_norm would skip its all-reduce
    assert plan_digest(ddp, graph, 1.0) != plan_digest(ddp, graph)
    clipping = [plan_record(ddp, graph, max_grad_norm) for max_grad_norm in (None, 1.0, 0.5)]
    message = disagreement_message(clipping, [str(ddp)] * 3)
    assert message.endswith("(max_grad_norm: None vs 1.0); pass the same max_grad_norm to "
                            "apply/auto_parallel on every rank"), message
    assert "rank 2 runs" in message


def _mesh_rank(rank: int, port: int, out: str) -> None:
    from executors import init_distributed
    from executors.agreement import agree_on_plan

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", PLANNER_PG_TIMEOUT_S="42")
    init_distributed("gloo")
    # tp1: a 1-rank pp axis and a world-wide dp axis; tp2: 1-rank pp and dp, a 2-rank tp
    meshes = Meshes(ParallelDims(world_size=2, pp=1, stage_devices=2, tp_degrees=(1, 2)), "cpu")
    timeouts = {f"{axis}{tp}": meshes.world(tp)[axis].get_group()._get_backend(
        torch.device("cpu")).options._timeout.total_seconds()
        for tp in (1, 2) for axis in ("pp", "dp", "tp")}
    graph = SimpleNamespace(fingerprint="f" * 16)
    agree_on_plan(uniform_plan(2, dp=2, micro_batch=1, global_batch=2), graph, torch.device("cpu"))
    with open(os.path.join(out, f"{rank}.json"), "w") as fh:
        json.dump(timeouts, fh)
    dist.destroy_process_group()


def test_mesh_sub_groups_get_the_default_groups_timeout(tmp_path):
    """torch gives a `new_group` 30 minutes unless told; every axis of every mesh must get
    PLANNER_PG_TIMEOUT_S (42 s here), and equal plans agree without a word."""
    import socket

    from dist_utils import forked_call, save_arguments, start_method

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    arguments = save_arguments(str(tmp_path), (port, str(tmp_path)))
    mp.start_processes(forked_call, args=(dict(os.environ), _mesh_rank, arguments), nprocs=2,
                       start_method=start_method())
    for rank in range(2):
        timeouts = json.loads((tmp_path / f"{rank}.json").read_text())
        assert set(timeouts.values()) == {42.0}, (rank, timeouts)


def test_a_frozen_store_host_is_named(tmp_path):
    """Under env:// rank 0 holds the store; frozen, it blocks every store call for ever.
    The watchdog gives up on the store after the limit and names rank 0."""
    code = textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        from datetime import timedelta
        sys.path.insert(0, {ROOT!r})
        import torch.distributed as dist
        from executors.watchdog import Watchdog
        host = subprocess.Popen([sys.executable, "-c", "import sys, time; "
            "from ir.launch import die_with_parent; die_with_parent(); "
            "import torch.distributed as d; from datetime import timedelta; "
            "s = d.TCPStore('127.0.0.1', 0, is_master=True, timeout=timedelta(seconds=60)); "
            "print(s.port, flush=True); time.sleep(120)"], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)  # it dies with us, frozen or not
        port = int(host.stdout.readline())
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        watchdog = Watchdog(store, rank=1, world_size=2, limit_s=1.0)
        time.sleep(1.5)  # a few heartbeats get through
        os.kill(host.pid, signal.SIGSTOP)
        time.sleep(20)
        os.kill(host.pid, signal.SIGKILL)
        print("the watchdog never fired")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1",
                                           "PYTHONPATH": ROOT})
    assert proc.returncode == 3, proc.stdout + proc.stderr[-2000:]
    lines = [l for l in proc.stderr.splitlines() if l.startswith("planner watchdog")]
    assert lines == ["planner watchdog on rank 1: rank 0, which holds the process group's "
                     "store, stopped responding (the store did not answer for 1 s); the job "
                     "exits now instead of waiting for the process-group timeout (stall limit "
                     "1 s: stall_limit_s or PLANNER_STALL_LIMIT_S)"], proc.stderr[-2000:]


# ------------------------------------------------------------------ the frozen-rank drill
# Last in the file: its job (`frozen_job`) has been running since the first test.


def test_a_frozen_rank_ends_the_job_naming_it(frozen_job):
    proc, seconds = frozen_job.result(FROZEN_JOB_BOUND_S)
    assert proc.returncode != 0
    assert "rank 1: fault drill, freezing (SIGSTOP) before step 2" in proc.stdout
    lines = [l for l in proc.stderr.splitlines() if l.startswith("planner watchdog on rank 0")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert re.search(r"rank 1 stopped responding \(no heartbeat for \d+ s; it last reported "
                     r"[12] steps done\)", lines[0]), lines[0]
    assert seconds < FROZEN_JOB_BOUND_S
    assert_none_left(frozen_job.folder)
