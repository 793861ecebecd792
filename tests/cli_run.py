"""Running `planner` on bad input fast, and checking the bad-input contract.

`run_cli` calls `planner.cli.main(argv)` in this process (no interpreter start-up, so a
hundred cases take seconds); `run_forked` runs a callable in a forked child, for what
must not touch this process (dropping privileges, a program that initialises a process
group) or might block (a FIFO): the child is killed at the timeout.

`check_contract` is the contract of issue 16: exit status 2, exactly one stderr line, no
traceback, the files of the case's folder unchanged (content and mode).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import signal
import stat
import tempfile
import time
import warnings
from dataclasses import dataclass

# Words a one-line error uses to say what to do.
FIX_WORDS = re.compile(r"\b(use|give|write|re-create|re-plan|re-run|rerun|remove|delete|keep|"
                       r"create|fix|pass|add|point|save|try|check|drop|raise|must|expected|need|"
                       r"needs|launch|see|name|pick|lower|allow|make)\b")


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    seconds: float


def run_cli(argv: list[str]) -> Result:
    """`planner ARGV` in this process; SystemExit (argparse) becomes the exit code."""
    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Result(int(code), out.getvalue(), err.getvalue(), time.perf_counter() - start)


def run_cli_strict(argv: list[str]) -> Result:
    """`run_cli`, strict about what a fresh interpreter would print on stderr that pytest
    captures instead: any Python warning fails (an error, whether or not this process has
    shown it before), and so does any log record at WARNING or above (logging's
    last-resort handler prints those). For one-line contracts without an interpreter's
    start-up (~2-3 s of CPU each)."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger().addHandler(handler)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = run_cli(argv)
    finally:
        logging.getLogger().removeHandler(handler)
    assert not records, [record.getMessage() for record in records]
    return result


def run_forked(fn, argv: list[str], timeout_s: float = 10.0, uid: int | None = None) -> Result:
    """`fn(argv)` (returning an exit code) in a forked child with its stdout and stderr
    captured; the child drops to `uid` first when given. Killed after `timeout_s`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                import torch

                # libgomp's thread team does not survive a fork: once the parent (pytest)
                # has run a parallel region, the child's next one waits forever for
                # threads it does not have (gomp_team_barrier_wait_end). One thread runs
                # no team.
                torch.set_num_threads(1)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                import sys

                sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False),
                                              write_through=True)
                sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False),
                                              write_through=True)
                if uid is not None:
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                code = fn(list(argv))
                if isinstance(code, bool) or not isinstance(code, int):
                    code = 0 if code is None else 1
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 - report it the way an uncaught error would
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        deadline = start + timeout_s
        status = None
        while time.perf_counter() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return Result(124, "", f"timed out after {timeout_s} s", time.perf_counter() - start)
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        return Result(os.waitstatus_to_exitcode(status), out.read().decode(errors="replace"),
                      err.read().decode(errors="replace"), seconds)


def snapshot(folder: str) -> dict[str, tuple]:
    """Every entry under `folder` without opening special files: regular files by
    content (size and mtime when large) and mode, others by type and mode."""
    out: dict[str, tuple] = {}
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_size <= 2**20 and info.st_mode & 0o400:
                with open(path, "rb") as fh:
                    out[path] = ("file", info.st_mode, fh.read())
            else:
                out[path] = ("entry", info.st_mode, info.st_size, info.st_mtime_ns)
    return out


def check_contract(result: Result, want: str, before: dict, after: dict,
                   limit_s: float = 10.0) -> str:
    """Assert the bad-input contract; returns the one stderr line."""
    lines = result.stderr.strip().splitlines()
    context = f"\nexit {result.code}\nstderr: {result.stderr[-2000:]}\nstdout: {result.stdout[-500:]}"
    assert result.code == 2, context
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, context
    assert len(lines) == 1, context
    line = lines[0]
    assert re.search(want, line), f"\n got: {line}\nwant: {want}"
    assert FIX_WORDS.search(line.split("error:", 1)[-1]), f"no fix in: {line}"
    assert before == after, "a file of the case's folder was written or changed"
    assert result.seconds < limit_s, f"took {result.seconds:.1f} s"
    return line
