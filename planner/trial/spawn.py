"""Starting a trial run's ranks; none outlives the run, none is left a zombie.

Each rank is a fork of the preloaded fork server (`ir.launch`: torch and the executors are
imported once, not once per rank), joins a process group on a free localhost port (the
configured process-group timeout, `executors.mesh.pg_timeout_s`), runs
`planner.trial.rank.run_rank` and writes its `RankMeasurement` as JSON into a temporary
folder the parent reads back. A rank dies with its parent (`ir.launch.forked_call`); the
parent kills and joins every rank on any way out, after REAP_GRACE_S for the others
once one fails.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ir.errors import PlannerError
from ir.launch import HF_PRELOAD_MODULES, free_port, start_ranks, start_server
from planner.trial.rank import run_rank
from planner.trial.records import RankMeasurement, RankPayload

SPAWN_TIMEOUT_S = 600.0
# Seconds the other ranks get to exit after one fails, before SIGTERM and again before
# SIGKILL (torch's default is 30: a frozen rank ignores SIGTERM until SIGKILL).
REAP_GRACE_S = 5.0


def start_rank_server(model: str) -> None:
    """Start the ranks' fork server now (`ir.launch.start_server`: it imports in the
    background, while this process traces and predicts before `spawn_ranks`); the ranks
    of a Hugging Face MODEL get transformers preloaded as well."""
    start_server(HF_PRELOAD_MODULES if model.startswith("hf:") else ())


def spawn_ranks(payload: RankPayload, nproc: int,
                timeout_s: float = SPAWN_TIMEOUT_S) -> list[RankMeasurement]:
    """Run `run_rank` on `nproc` forked ranks; their measurements in rank order."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="planner-validate-") as out_dir:
        context = start_ranks(_rank_main, nproc, (nproc, free_port(), out_dir, payload),
                              out_dir)
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1.0, grace_period=REAP_GRACE_S):
                if time.monotonic() > deadline:
                    raise PlannerError(f"validation ran past {timeout_s:.0f} s on {nproc} ranks: "
                                       "lower --steps or validate a smaller model")
        except mp.ProcessRaisedException as exc:
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            raise PlannerError(f"rank {exc.error_index} failed while running the plan ({last}); "
                               "rerun with --debug for the traceback") from exc
        except mp.ProcessExitedException as exc:
            written = os.path.exists(os.path.join(out_dir, f"rank{exc.error_index}.json"))
            when = "after writing its measurement" if written else "while running the plan"
            raise PlannerError(f"rank {exc.error_index} died {when} (exit code "
                               f"{exc.exit_code}); rerun with --debug") from exc
        finally:  # on any way out: no rank left running, none left a zombie
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            for process in context.processes:
                process.join()
        results = []
        for r in range(nproc):
            with open(os.path.join(out_dir, f"rank{r}.json")) as fh:
                results.append(RankMeasurement.from_json(json.load(fh)))
        return results


def _rank_main(rank: int, world_size: int, port: int, out_dir: str,
               payload: RankPayload) -> None:
    torch.set_num_threads(payload.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    if payload.backend == "nccl":
        torch.cuda.set_device(rank)
    from executors.mesh import pg_timeout_s

    dist.init_process_group(payload.backend, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=pg_timeout_s()))
    try:
        result = run_rank(payload)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(result.to_json(), fh)
    finally:
        dist.destroy_process_group()
    # Measured and written: leave without the interpreter's finalization, where a library
    # thread still joinable at static destruction can abort the rank ("terminate called
    # without an active exception", exit -6: seen in about 1 of 15 runs on a loaded host).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
