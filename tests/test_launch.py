"""Ranks forked from the preloaded server (`ir.launch`): what a fork must not inherit, what
it must get from the caller, and that it never outlives the caller.

Processes are read in /proc (no psutil), as in tests/test_hangs.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import types
import time

import pytest

from ir.errors import PlannerError
from ir.launch import PRELOAD_MODULES, start_ranks, start_server
from tests.cli_run import run_forked
from tests.test_hangs import _descendants, _rank_payload, _stat_fields

pytestmark = [pytest.mark.multiprocess]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER_VARIABLE = "PLANNER_TEST_LAUNCH"  # set by a test after the server started
RANKS = 2


def _report(rank: int, out_dir: str) -> None:
    """What a rank sees of itself and of its parent, the server."""
    server = os.getppid()
    with open(f"/proc/{server}/cmdline", "rb") as fh:
        server_cmdline = fh.read().replace(b"\0", b" ").decode()
    info = {"server": server, "server_cmdline": server_cmdline,
            "server_threads": len(os.listdir(f"/proc/{server}/task")),
            "marker": os.environ.get(MARKER_VARIABLE),
            "cwd": os.getcwd(),
            # imported by the server, not by this module's imports (planner.*, cost_models.*)
            "not_preloaded": [m for m in PRELOAD_MODULES if m not in sys.modules]}
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as fh:
        json.dump(info, fh)


def _run(out_dir: str) -> list[dict]:
    context = start_ranks(_report, RANKS, (out_dir,), out_dir)
    while not context.join(timeout=1.0):
        pass
    reports = []
    for rank in range(RANKS):
        with open(os.path.join(out_dir, f"{rank}.json")) as fh:
            reports.append(json.load(fh))
    return reports


def test_ranks_are_forks_of_a_threadless_server_with_the_callers_environment(
        tmp_path, monkeypatch):
    start_server()
    monkeypatch.setenv(MARKER_VARIABLE, str(tmp_path))  # after the server started
    monkeypatch.chdir(tmp_path)
    reports = _run(str(tmp_path))
    for info in reports:
        assert "multiprocessing.forkserver" in info["server_cmdline"], info
        # a thread in the server at fork time (an OpenMP team, a module's own thread) is
        # one the rank lacks: its first parallel region could wait for it for ever
        assert info["server_threads"] == 1, info
        assert info["marker"] == str(tmp_path), info
        assert info["cwd"] == str(tmp_path), info
        assert not info["not_preloaded"], info
    assert len({info["server"] for info in reports}) == 1


def _launch_in_fork(argv: list[str]) -> int:
    """run_forked's callable: ranks from a fork (os.fork) of a process whose server runs."""
    reports = _run(argv[0])
    with open(os.path.join(argv[0], "servers.json"), "w") as fh:
        json.dump([info["server"] for info in reports], fh)
    return 0


def test_a_fork_of_the_caller_starts_a_server_of_its_own(tmp_path):
    """A fork inherits multiprocessing's record of its parent's server, which is not its
    child (multiprocessing's waitpid check raised ChildProcessError): it starts its own."""
    parent_servers = {info["server"] for info in _run(str(tmp_path))}
    result = run_forked(_launch_in_fork, [str(tmp_path)], timeout_s=300)
    assert result.code == 0, result.stderr[-3000:]
    servers = set(json.loads((tmp_path / "servers.json").read_text()))
    assert len(servers) == 1 and not servers & parent_servers, (servers, parent_servers)
    deadline = time.monotonic() + 30  # the fork's server leaves with the fork
    while any(_running(p) for p in servers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in servers if _running(p)], "the fork's server outlived it"


def _sleep_rank(rank: int, out_dir: str) -> None:
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"pid": os.getpid(), "server": os.getppid()}, fh)
    time.sleep(3600)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may never reap what it inherits)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def test_a_killed_caller_takes_its_ranks_and_its_server_with_it(tmp_path):
    """SIGKILL: no finally runs in the caller. The server leaves when the caller's end of
    its pipe closes (the ranks closed theirs), and the ranks die with the server."""
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        from ir.launch import start_ranks
        from tests.test_launch import _sleep_rank
        if __name__ == "__main__":
            start_ranks(_sleep_rank, {RANKS}, ({str(tmp_path)!r},), {str(tmp_path)!r}).join()
    """))
    caller = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, start_new_session=True,
                              env={**os.environ, "PYTHONPATH": ROOT})
    try:
        deadline = time.monotonic() + 240
        while (len(list(tmp_path.glob("rank*.json"))) < RANKS and caller.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.2)
        time.sleep(0.5)  # the last report written in full
        reports = [json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")]
        assert len(reports) == RANKS, f"the ranks never started (caller: {caller.poll()})"
    finally:
        caller.kill()
        caller.wait()
    processes = {r["pid"] for r in reports} | {r["server"] for r in reports}
    assert len(processes) == RANKS + 1  # the ranks and their one server
    deadline = time.monotonic() + 30
    while any(_running(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [p for p in processes if _running(p)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "ranks or their server outlived the killed caller"


def crashing_factory(micro_batch=1, seq_len=None, device="meta"):
    """Rank 1 dies in set-up, as a segfault or an OOM kill would end it; rank 0 raises
    when PLANNER_TEST_RAISE is set."""
    if os.environ["RANK"] == "1" and "PLANNER_TEST_RAISE" not in os.environ:
        os._exit(7)
    if os.environ["RANK"] == "0" and "PLANNER_TEST_RAISE" in os.environ:
        raise ValueError("the factory refused rank 0")
    time.sleep(3600)


@pytest.mark.parametrize("how, message", [
    ("exit", r"^rank 1 died while running the plan \(exit code 7\); rerun with --debug$"),
    ("raise", r"^rank 0 failed while running the plan \(.*the factory raised ValueError: "
              r"the factory refused rank 0.*\); rerun with --debug for the traceback$")])
def test_a_failed_rank_is_one_line_naming_it_and_no_rank_is_left(how, message, monkeypatch):
    from planner.trial.spawn import spawn_ranks

    if how == "raise":
        monkeypatch.setenv("PLANNER_TEST_RAISE", "1")
    payload = dataclasses.replace(_rank_payload(), model="tests.test_launch:crashing_factory")
    before = _descendants(os.getpid())
    with pytest.raises(PlannerError, match=message):
        spawn_ranks(payload, 2, timeout_s=240)
    left = _descendants(os.getpid()) - before
    assert not left, [(p, _stat_fields(p)) for p in left]


def _parent_report(rank: int, out_dir: str) -> None:
    with open(os.path.join(out_dir, f"parent{rank}.json"), "w") as fh:
        json.dump({"parent": os.getppid()}, fh)


def _refuse(*_args, **_kwargs):
    raise AssertionError("a fork-server function was called on a Python said to lack one")


def _without_server(monkeypatch, server) -> None:
    """`ir.launch` sees a multiprocessing.forkserver whose `_forkserver` is `server` (None:
    no instance at all) and whose functions refuse every call."""
    from ir import launch

    stand_in = types.SimpleNamespace(ensure_running=_refuse, set_forkserver_preload=_refuse)
    if server is not None:
        stand_in._forkserver = server
    monkeypatch.setattr(launch, "forkserver", stand_in)
    monkeypatch.setattr(launch, "_fallback_said", False)


@pytest.mark.parametrize("server", [None, types.SimpleNamespace(_forkserver_pid=None)],
                         ids=["no-instance", "missing-fields"])
def test_a_python_without_the_fork_server_internals_falls_back_with_one_warning(
        server, monkeypatch, capsys):
    """multiprocessing.forkserver's `_forkserver` and its `_forkserver_*` fields are CPython
    3.11 internals: where they are missing, ranks start with plain spawn, no server is
    started, and stderr says so in one line, once, naming the gap."""
    from ir import launch

    _without_server(monkeypatch, server)
    capsys.readouterr()
    assert launch.start_method() == launch.FALLBACK_START_METHOD
    launch.start_server()  # nothing to start: the stand-in refuses every call
    launch._leave_server()  # a rank's clean-up finds no server to leave
    assert launch.start_method() == launch.FALLBACK_START_METHOD  # said once, not twice
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "spawn" in lines[0], lines
    assert ("_forkserver_alive_fd" in lines[0]) == (server is not None), lines  # names the gap


def test_a_python_without_the_fork_server_spawns_ranks_of_the_caller(tmp_path, monkeypatch,
                                                                       capsys):
    """Where the internals are missing, `start_ranks` starts the ranks as children of the
    caller (no server). One variant spawns: what the ranks run does not depend on which
    internal is missing (both make `start_method` answer "spawn", checked above for each),
    and a spawned rank imports torch afresh (~5 s of CPU a rank here)."""
    _without_server(monkeypatch, None)
    context = start_ranks(_parent_report, RANKS, (str(tmp_path),), str(tmp_path))
    while not context.join(timeout=1.0):
        pass
    parents = {json.loads((tmp_path / f"parent{r}.json").read_text())["parent"]
               for r in range(RANKS)}
    assert parents == {os.getpid()}  # spawned by this process, not forked by a server
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "spawn" in lines[0], lines
