"""Spawn gloo process groups on free localhost ports and collect each rank's result.

    results = spawn(worker, 4, payload, timeout_s=120)   # worker(rank, world_size, payload)

`worker` must be importable by module and name (a module-level function). Each rank runs
with one intra-op thread (the ranks share the machine's cores), its result is saved with
`torch.save` and returned to the caller in rank order. An exception on any rank fails
the call with that rank's traceback; ranks still running at the deadline are killed.

Ranks are forked from one server process that imported torch, torch.distributed, the
executors and transformers once for the whole session (`START_METHOD`), not started as
fresh interpreters that each import them again: that import was most of a group's start
(~4-6 s of CPU per rank, so 4 ranks took 14-40 s to start on a loaded 2-core machine and
1.4 s forked). A forked rank has the server's environment, so the caller's is sent along
and put in place before anything else runs (`forked_call`).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import socket
import tempfile
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# multiprocessing's "forkserver": each rank is a fork of one server process, started on the
# first use and alive until the session ends, that has imported PRELOAD_MODULES once.
START_METHOD = "forkserver"
# What every rank imports anyway; a module that fails to import is skipped by the server
# (the rank then imports it itself, as a spawned one would).
# (transformers' modeling_utils and auto classes: ~1.5 s of a rank's first Hugging Face build)
PRELOAD_MODULES = ("torch", "torch.distributed", "executors", "cost_models", "planner.api",
                   "planner.models", "transformers", "transformers.modeling_utils",
                   "transformers.models.auto.modeling_auto")


def start_method() -> str:
    """The start method for every test's ranks (`START_METHOD`), its server's preloads set
    (they take effect when the server starts, on the first call that uses it)."""
    multiprocessing.set_forkserver_preload(list(PRELOAD_MODULES))
    return START_METHOD


def save_arguments(folder: str, arguments: tuple) -> str:
    """Write a rank's arguments (but its rank) to a file in `folder` for `forked_call`: the
    fork server's socket would pass every tensor in them as a file descriptor, and it
    refuses a process with more than ~250."""
    path = os.path.join(folder, "arguments.pt")
    torch.save(arguments, path, pickle_protocol=pickle.DEFAULT_PROTOCOL)  # as multiprocessing
    return path


def forked_call(rank: int, environment: dict[str, str], fn: Callable, arguments_path: str):
    """A forked rank's target: `fn(rank, *arguments)` in the caller's `environment` (a
    fork starts with the server's, from whenever the server started) with the arguments
    `save_arguments` wrote."""
    os.environ.clear()
    os.environ.update(environment)
    return fn(rank, *torch.load(arguments_path, weights_only=False))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, fn: Callable, world_size: int, port: int, out_dir: str,
               payload: Any) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))
    try:
        result = fn(rank, world_size, payload)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        # Nobody tears gloo down while a peer still has an operation in flight with it: a
        # rank that did aborted ("terminate called without an active exception", once in
        # a fresh-clone CI run of test_api).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, world_size: int, payload: Any = None, *, timeout_s: float = 300) -> list:
    """Run `fn(rank, world_size, payload)` on `world_size` gloo ranks; their results."""
    with tempfile.TemporaryDirectory() as out_dir:
        arguments = save_arguments(out_dir, (fn, world_size, free_port(), out_dir, payload))
        context = mp.start_processes(forked_call, args=(dict(os.environ), _rank_main, arguments),
                                     nprocs=world_size, join=False, start_method=start_method())
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                raise TimeoutError(f"{world_size} ranks of {fn.__name__} ran past {timeout_s} s")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]


def train_one_device(model: torch.nn.Module, loss_fn: Callable, batches,
                     optimizer_kwargs: dict) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The reference: AdamW on one process over `batches` of (inputs, target); each step's
    loss and the final parameters."""
    from ir.trace import model_output_tensor

    opt = torch.optim.AdamW(model.parameters(), **optimizer_kwargs)
    losses = []
    for inputs, target in batches:
        opt.zero_grad()
        loss = loss_fn(model_output_tensor(model(**inputs)), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def zero_dropout(module: torch.nn.Module, config=None) -> torch.nn.Module:
    """Dropout 0 everywhere: nn.Dropout modules, the float rates HF layers pass to
    F.dropout (attention_dropout, activation_dropout, layerdrop) and the config they
    read at forward time (a zoo model's frozen config sets its dropout at build time)."""
    configs = [c for c in (config, getattr(module, "config", None)) if hasattr(c, "to_dict")]
    configs += [v for c in configs for v in vars(c).values() if hasattr(v, "to_dict")]
    for holder in list(module.modules()) + configs:  # sub-configs: encoder, text, vision
        if isinstance(holder, torch.nn.Dropout):
            holder.p = 0.0
        for name, value in list(vars(holder).items()):
            if "drop" in name and isinstance(value, float):
                setattr(holder, name, 0.0)
    return module
