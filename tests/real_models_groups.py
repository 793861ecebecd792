"""The issue-14 matrix's group runner: the cases of `real_models` on spawned gloo ranks,
under time limits, each case ending in one `real_models.Outcome`.

    outcomes = run_matrix(real_models.cases(worlds=(2,)))  # [Outcome], in the order given

Isolation: all cases of one world size run in ONE spawned group (spawning is the
expensive part on 2 cores), each case in its own default process group (a fresh prefix
of one TCPStore) destroyed after it: the DeviceMesh sub-groups auto_parallel makes never
reach the next case, nor does a collective a failing rank left half-done. Ranks agree a
case is over through the store, not gloo, and log progress to files; the parent kills a
group that died or stalled, marks that case and restarts a group for the rest.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from real_models import BEFORE_TRAINING, CRASH, HANG, Case, Outcome, classify, run_case

GLOO_TIMEOUT_S = 60  # a collective one rank never joins fails after this (a hang -> error)
CASE_LIMIT_S = 240  # a case with no result after this is a HANG; covers one gloo timeout
# A group whose ranks have not started the next case after this is stalled (HANG): room
# for spawning and importing torch and transformers on a loaded 2-core machine.
START_LIMIT_S = 180
# A rank waits this long in the store for its peers to finish a case: the parent's limits
# decide first; this only keeps a rank orphaned by a killed parent from waiting forever.
STORE_WAIT_S = 2 * CASE_LIMIT_S
POLL_S = 0.5  # how often the parent reads the ranks' progress files


@dataclass(frozen=True)
class Limits:  # a group's time limits (the harness's own test shortens them)
    gloo_timeout_s: float = GLOO_TIMEOUT_S
    case_limit_s: float = CASE_LIMIT_S


def rank_main(rank: int, world: int, port: int, log_dir: str, work: list, case_fn,
              limits: Limits) -> None:
    """One rank of a group: `case_fn` on every case in `work` [(index, case, reference)]."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    with open(os.path.join(log_dir, f"rank{rank}.out"), "w") as sink:  # warnings, not the console
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0,
                          timeout=timedelta(seconds=STORE_WAIT_S))
    with open(os.path.join(log_dir, f"rank{rank}.jsonl"), "a") as out:
        for index, case, ref in work:
            def log(event, **fields):
                out.write(json.dumps({"index": index, "event": event, "t": time.time(),
                                      **fields}) + "\n")
                out.flush()

            log("start")
            dist.init_process_group("gloo", store=dist.PrefixStore(f"case{index}", store),
                                    rank=rank, world_size=world,
                                    timeout=timedelta(seconds=limits.gloo_timeout_s))
            result = case_fn(case, ref, rank, log)
            # Every rank has left the case's collectives before anyone tears gloo down.
            store.set(f"done/{index}/{rank}", "1")
            store.wait([f"done/{index}/{r}" for r in range(world)],
                       timedelta(seconds=STORE_WAIT_S))
            log("done", **result)
            dist.destroy_process_group()
            gc.collect()


# ----------------------------------------------------------------------------- groups


def _read_log(path: str) -> dict[int, dict]:
    """index -> {"start": t, "stage": last stage, "done": result, "done_t": t}."""
    cases_seen: dict[int, dict] = {}
    with open(path, "a+") as f:  # the rank may not have created it yet
        f.seek(0)
        for line in f:
            if not line.endswith("\n"):
                break  # a line still being written
            event = json.loads(line)
            # A case's first event is its start; events with a stage move it on.
            entry = cases_seen.setdefault(event["index"], {"stage": "load", "start": event["t"]})
            entry["stage"] = event.get("stage", entry["stage"])
            if event["event"] == "done":
                entry["done"], entry["done_t"] = event, event["t"]
    return cases_seen


def _stopped(case: Case, logs: list[dict], index: int, dead: list, since: float,
             limit_s: float) -> Outcome:
    """The outcome of the case a group was stopped in: a rank died, or time ran out."""
    stages = {rank: log.get(index, {}).get("stage", "not started") for rank, log in enumerate(logs)}
    seconds = time.time() - since
    if dead:
        rank, code = dead[0]
        stage = stages[rank]
        when = "before training" if stage in BEFORE_TRAINING else "during training"
        return Outcome(case, CRASH, f"{when}, {stage}, rank {rank}: process died "
                                    f"(exit code {code})", seconds)
    where = ", ".join(f"rank {r}: {s}" for r, s in stages.items())
    return Outcome(case, HANG, f"no result within {limit_s:.0f} s ({where})", seconds)


def run_group(world: int, work: list, progress=lambda outcome: None, case_fn=run_case,
              limits: Limits = Limits()) -> dict[int, Outcome]:
    """Run `case_fn` on `work` [(index, case, reference)] on `world` spawned ranks; a group
    that dies or stalls is killed and a new one takes the remaining cases. (`case_fn` is
    a module-level function(case, reference, rank, log) -> result dict; see run_case.)"""
    from dist_utils import forked_call, free_port, save_arguments, start_method

    outcomes: dict[int, Outcome] = {}

    def record(index: int, outcome: Outcome) -> None:
        outcomes[index] = outcome
        progress(outcome)

    pending = list(work)
    context = multiprocessing.get_context(start_method())
    while pending:
        log_dir = tempfile.mkdtemp(prefix=f"real-models-{world}r-")
        paths = [os.path.join(log_dir, f"rank{r}.jsonl") for r in range(world)]
        port = free_port()
        arguments = save_arguments(log_dir, (world, port, log_dir, pending, case_fn, limits))
        procs = [context.Process(target=forked_call, daemon=True,
                                 args=(r, dict(os.environ), rank_main, arguments))
                 for r in range(world)]
        for p in procs:
            p.start()
        since = time.time()  # when the current case could first start
        while True:
            time.sleep(POLL_S)
            logs = [_read_log(p) for p in paths]
            for index, case, _ in pending:
                if index in outcomes or not all("done" in log.get(index, {}) for log in logs):
                    continue
                first = logs[0][index]
                record(index, classify(case, [log[index]["done"] for log in logs],
                                       first["done_t"] - first.get("start", since)))
                since = max(log[index]["done_t"] for log in logs)
            remaining = [w for w in pending if w[0] not in outcomes]
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if not p.is_alive()]
            if not remaining:
                break
            index, case, _ = remaining[0]
            # The case's clock starts when its first rank starts it.
            starts = [log[index]["start"] for log in logs if "start" in log.get(index, {})]
            limit = limits.case_limit_s if starts else START_LIMIT_S
            started = min(starts, default=since)
            if dead or time.time() - started > limit:
                for p in procs:
                    p.kill()  # a no-op on a process that has exited
                record(index, _stopped(case, logs, index, dead, started, limit))
                remaining = remaining[1:]
                break
        for p in procs:
            p.join()
        shutil.rmtree(log_dir, ignore_errors=True)  # what a failure needs is in its Outcome
        pending = remaining
    return outcomes


# ----------------------------------------------------------------------------- the matrix


def run_matrix(selected: list[Case], progress=lambda outcome: None) -> list[Outcome]:
    """Every case's outcome, in the order given. References, graphs and searches run
    first, once per arch (`real_models_prep.prepare_all`)."""
    from real_models_prep import prepare_all

    refs, failed = prepare_all(selected)
    outcomes = {i: Outcome(c, CRASH, failed[c.arch]) for i, c in enumerate(selected)
                if c.arch in failed}
    for outcome in outcomes.values():
        progress(outcome)
    for world in sorted({c.world for c in selected}):
        work = [(i, c, refs[c.arch]) for i, c in enumerate(selected)
                if c.world == world and c.arch in refs]
        if work:
            outcomes.update(run_group(world, work, progress))
    return [outcomes[i] for i in range(len(selected))]
