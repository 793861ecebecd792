"""Spawn gloo process groups on free localhost ports and collect each rank's result.

    results = spawn(worker, 4, payload, timeout_s=120)   # worker(rank, world_size, payload)

`worker` must be importable by module and name (a module-level function). Each rank runs
with one intra-op thread (the ranks share the machine's cores), its result is saved with
`torch.save` and returned to the caller in rank order. An exception on any rank fails
the call with that rank's traceback; ranks still running at the deadline are killed.

Ranks are forks of the product's preloaded fork server (`ir.launch`, with the Hugging
Face modules preloaded too: the tests build HF models), not fresh interpreters that each
import torch, the executors and transformers again: that import was most of a group's
start (~4-6 s of CPU per rank, so 4 ranks took 14-40 s to start on a loaded 2-core
machine and 1.4 s forked). `start_method`, `save_arguments` and `forked_call` are for
tests that start their own processes.
"""

from __future__ import annotations

import faulthandler
import os
import tempfile
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from ir import launch
from ir.launch import (HF_PRELOAD_MODULES, forked_call, free_port,  # noqa: F401
                       save_arguments, start_ranks, start_server)


def start_method() -> str:
    """The start method for a test's own processes (`ir.launch.start_method`), its server
    started with the Hugging Face modules preloaded as well."""
    start_server(HF_PRELOAD_MODULES)
    return launch.start_method()


def _fault_path(out_dir: str, rank: int) -> str:
    return os.path.join(out_dir, f"rank{rank}.fault")


def _rank_main(rank: int, fn: Callable, world_size: int, port: int, out_dir: str,
               payload: Any) -> None:
    # A rank killed by a fatal signal (a SIGSEGV in one CI run's 4-rank group, never seen
    # again) leaves every thread's Python stack here, for `spawn`'s error
    faulthandler.enable(open(_fault_path(out_dir, rank), "w"), all_threads=True)
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
        start_method()
        context = start_ranks(_rank_main, world_size,
                              (fn, world_size, free_port(), out_dir, payload), out_dir)
        deadline = time.monotonic() + timeout_s
        while not _joined(context, out_dir, world_size):
            if time.monotonic() > deadline:
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                raise TimeoutError(f"{world_size} ranks of {fn.__name__} ran past {timeout_s} s")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]


def _joined(context, out_dir: str, world_size: int) -> bool:
    """`context.join(timeout=1.0)`; a rank that died of a signal fails it with the stacks
    faulthandler wrote (which rank, which thread, in which call)."""
    from torch.multiprocessing import ProcessExitedException

    try:
        return context.join(timeout=1.0)
    except ProcessExitedException as exc:
        dumps = [f"rank {r}:\n{text}" for r in range(world_size)
                 if (text := _read(_fault_path(out_dir, r)))]
        raise ProcessExitedException("\n".join([str(exc), *dumps]), exc.error_index,
                                     exc.error_pid, exc.exit_code, exc.signal_name) from exc


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


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
