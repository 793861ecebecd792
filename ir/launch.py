"""Starting local ranks: forks of one preloaded server, not fresh interpreters.

    context = start_ranks(fn, nprocs, (a, b), folder)   # fn(rank, a, b) on every rank
    while not context.join(timeout=1.0): ...             # torch.multiprocessing.ProcessContext

Every rank this project starts on one host (`planner validate`'s trial ranks, the
probes of `planner profile-cluster`, the tests' gloo groups in tests/dist_utils.py) is
a fork of multiprocessing's fork server ("forkserver"): one process per caller, started
on first use or ahead of it (`start_server`), that has imported PRELOAD_MODULES once. A
spawned rank imports them itself, ~4-7 s of CPU each, so 4 ranks took 14-40 s to start
on a loaded 2-core machine and ~1.4 s forked (the tests' figures; bench/bench_launch.py
measures it). The caller is never forked itself ("fork"): it may hold threads or an
OpenMP team a fork does not get (the child's first parallel region then waits for ever).

The server holds no thread when it forks: it only imports, so no OpenMP team exists (a
rank sets its own thread count, `torch.set_num_threads`). numpy's OpenBLAS starts worker
threads as it loads, but stops them before every fork (its pthread_atfork handler) and
restarts them only when the server calls BLAS, which it never does.

A rank runs `forked_call`, which first
  1. ties itself to the caller: SIGKILL when its parent, the server, dies
     (`die_with_parent`); then it closes its copy of the server's "alive" pipe, so the
     server, which leaves when every copy is closed, lives as long as the caller and no
     longer (`_leave_server`): a caller killed outright takes its ranks with it;
  2. takes the caller's environment (a fork starts with the server's, from when it started);
  3. reads its arguments from a file (`save_arguments`): the server's socket would pass
     every tensor in them as a file descriptor, and it refuses more than ~250.

The server's bookkeeping is CPython's own (multiprocessing/forkserver.py's one
`_forkserver` instance and its `_forkserver_*` fields, 3.11): this module closes and
resets them in a rank and in a fork of the caller. They are private, so `start_method`
checks them first; a Python without them starts plain "spawn" ranks (slower, each imports
for itself) and says so in one line on stderr.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import threading
from collections.abc import Callable
from multiprocessing import forkserver

import torch

PREFERRED_START_METHOD = "forkserver"
FALLBACK_START_METHOD = "spawn"  # where the fork server's internals are missing
# CPython's fork-server internals used here (`_leave_server`, `_forget_inherited_server`):
# fields of multiprocessing.forkserver._forkserver, and the module's public functions.
SERVER_FIELDS = ("_forkserver_alive_fd", "_forkserver_address", "_forkserver_pid")
SERVER_FUNCTIONS = ("ensure_running", "set_forkserver_preload")
# What ranks import anyway; a module that fails to import is skipped by the server (the
# rank then imports it itself, as a spawned one would). Named, not imported: this module
# sits below them (ir <- cost_models <- planner, ir <- executors).
PRELOAD_MODULES = ("torch", "torch.distributed", "executors", "cost_models.profile_cluster",
                   "planner.trial.spawn", "planner.models", "planner.api")
# For ranks that build Hugging Face models (`hf:` specs, the tests): transformers'
# modeling_utils and auto classes are ~1.5 s of a rank's first build, and ~3 s of the
# server's start at load ~18 when no rank needs them (so not in PRELOAD_MODULES).
HF_PRELOAD_MODULES = ("transformers", "transformers.modeling_utils",
                      "transformers.models.auto.modeling_auto")
PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): a signal for when the parent dies

_server_lock = threading.Lock()
_server_owner_pid: int | None = None  # the process that started the server it knows of
_fallback_said = False  # start_method's warning line: once per process


def start_method() -> str:
    """"forkserver" where this Python's multiprocessing has the fork-server internals this
    module uses (SERVER_FIELDS, SERVER_FUNCTIONS), else "spawn", said once on stderr."""
    global _fallback_said
    missing = _missing_internals()
    if not missing:
        return PREFERRED_START_METHOD
    if not _fallback_said:
        _fallback_said = True
        print(f"warning: Python {sys.version.split()[0]}'s multiprocessing.forkserver lacks "
              f"{', '.join(missing)}: ranks start with '{FALLBACK_START_METHOD}' (slower: "
              "each imports torch itself)", file=sys.stderr)
    return FALLBACK_START_METHOD


def _missing_internals() -> list[str]:
    """The names `_server` needs that this Python's multiprocessing.forkserver lacks."""
    server = getattr(forkserver, "_forkserver", None)
    if server is None:
        return ["_forkserver"]
    return ([f"_forkserver.{f}" for f in SERVER_FIELDS if not hasattr(server, f)]
            + [f for f in SERVER_FUNCTIONS if not callable(getattr(forkserver, f, None))])


def _server():
    """CPython's one ForkServer instance, or None where a name used here is missing."""
    return None if _missing_internals() else forkserver._forkserver


def start_server(extra_modules: tuple[str, ...] = ()) -> None:
    """Start this process's fork server unless it runs; returns at once, the server
    imports PRELOAD_MODULES and `extra_modules` in the background (call it before other
    work to overlap the two). Preloads take effect only on a server this call starts.
    A no-op where ranks start with "spawn" (`start_method`)."""
    global _server_owner_pid
    if start_method() != PREFERRED_START_METHOD:
        return
    with _server_lock:
        if _server_owner_pid not in (None, os.getpid()):
            _forget_inherited_server()
        forkserver.set_forkserver_preload(list(PRELOAD_MODULES) + list(extra_modules))
        forkserver.ensure_running()
        _server_owner_pid = os.getpid()


def start_ranks(fn: Callable, nprocs: int, arguments: tuple, folder: str):
    """`fn(rank, *arguments)` on `nprocs` forked ranks, not joined; the arguments travel
    in a file in `folder`, which must outlive the ranks. A torch ProcessContext."""
    import torch.multiprocessing as mp

    start_server()
    path = save_arguments(folder, arguments)
    return mp.start_processes(forked_call, args=(dict(os.environ), fn, path), nprocs=nprocs,
                              join=False, start_method=start_method())


def save_arguments(folder: str, arguments: tuple) -> str:
    """Write a rank's arguments (but its rank) to a file in `folder` for `forked_call`."""
    path = os.path.join(folder, "arguments.pt")
    torch.save(arguments, path, pickle_protocol=pickle.DEFAULT_PROTOCOL)  # as multiprocessing
    return path


def forked_call(rank: int, environment: dict[str, str], fn: Callable, arguments_path: str):
    """A rank's target: `fn(rank, *arguments)` tied to the caller's life, in the caller's
    `environment`, with the arguments `save_arguments` wrote."""
    die_with_parent()  # the server: it cannot leave while this rank holds its pipe
    _leave_server()
    os.environ.clear()
    os.environ.update(environment)
    return fn(rank, *torch.load(arguments_path, weights_only=False))


def die_with_parent() -> None:
    """SIGKILL this process when its parent (the fork server, torchrun's agent) dies, so
    that no orphaned rank waits on in a collective. Linux only (prctl)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG, SIGKILL) failed")
    if os.getppid() != parent:  # it died before prctl: no signal will come
        os._exit(1)


def free_port() -> int:
    """A localhost port free now (another process may take it before it is bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _leave_server() -> None:
    """In a forked rank: close the rank's copy of the write end of the server's "alive"
    pipe (multiprocessing hands one to every child; the server leaves at its EOF). A no-op
    in a process the server did not fork (or with no fork server, `start_method`)."""
    server = _server()  # CPython's one instance (3.11: multiprocessing/forkserver.py)
    if server is not None and server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def _forget_inherited_server() -> None:
    """In a fork (os.fork) of the process that started the server: that server is not
    this process's child (multiprocessing's liveness check, waitpid, would raise), so
    let go of it and start one of our own (`start_server` checked `_server` first)."""
    server = _server()
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
    server._forkserver_alive_fd = server._forkserver_address = server._forkserver_pid = None
