"""The issue-14 matrix's work before its groups start (`real_models_groups.run_matrix`): per
architecture, its single-process reference, its layer graph and the plan of each of its
cases, in up to PREP_WORKERS_MAX forked processes at once.

    refs, failed = prepare_all(cases)  # {arch: reference + "graph" + "plans"}, {arch: reason}

Every rank of every case used to trace its model and rank 0 to search while the others
waited (4 ranks on 2 cores traced at half speed); the graph is the same on every rank
(measured on meta), so each architecture is traced once here and its cases searched
here, and the ranks run what they are handed (`real_models.run_case`). An architecture
whose trace or search fails here gets no graph or plan, and its ranks trace and search
as before, so the failure is the case's outcome, not the harness's. So does what is not
prepared within PREP_LIMIT_S: the workers save as they go and the late ones are killed,
so one stuck search is its own case's HANG (under the case limit), not the matrix's.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import tempfile
import time
import traceback

import torch

import real_models as rm
from real_models_groups import CASE_LIMIT_S

# Processes preparing at once: one per core (make test runs one test at a time), at most
# this many (each holds a torch and transformers of its own beyond the fork's pages).
PREP_WORKERS_MAX = 4
# All preparing, at most: one case's limit. Rank 0 used to search inside its case, under
# CASE_LIMIT_S, so a stuck search cost the matrix this much and the other cases still
# ran; the subset test (timeout 480 s) keeps time for its groups after it.
PREP_LIMIT_S = CASE_LIMIT_S
RESULTS_FILE = "prepared-{arch}.pt"  # one per architecture: a save rewrites only its own


def search_plan(case: rm.Case, graph, world: int) -> str:
    """`case`'s plan JSON from a search of `graph`, as `auto_parallel` searches with
    `cluster="local"`; "error: ..." when the search finds none."""
    from cost_models.clusters import get_cluster
    from ir.errors import PlannerError
    from ir.plan import plan_to_json
    from ir.strategy import Precision
    from planner.plan_report import plan_document
    from planner.search import search
    from planner.search_space import SearchOptions

    try:
        spec = get_cluster("local", nodes=1, gpus_per_node=world)
        options = SearchOptions(precision=Precision.FP32, **rm.MODES[case.mode])
        result = search(graph, spec, rm.GLOBAL_BATCH, options)
        return (plan_to_json(plan_document(graph, spec, result.best, result.stats,
                                           {"made_by": "tests/real_models.py"}))
                if result.best else "error: no plan fits")
    except PlannerError as exc:
        return f"error: {exc}"


def prepare(arch: str, cases: list[rm.Case], search=search_plan, save=lambda ref: None,
            trace: bool = True) -> dict:
    """{"failed": reason} where the model cannot be built; else the reference (`rm.reference`)
    with its "graph" (None where the trace failed or `trace` is off) and "plans" {case key:
    `search` text} of `cases` that search (a replay carries its plan). `save(result)`
    after each step, so a worker killed late hands over what it made."""
    try:
        model, inputs, target, loss_fn = rm.build(arch)
    except Exception as exc:  # the ranks would fail the same way: no group needed
        result = {"failed": f"before training, load: {rm._first_line(exc)}"}
        save(result)
        return result
    ref = rm.reference(arch)
    ref["graph"], ref["plans"] = None, {}
    save(ref)
    if not trace:
        return ref
    try:
        from ir.measure import build_layer_graph

        ref["graph"] = build_layer_graph(model, inputs, target, loss_fn,
                                         name=type(model).__name__, dtype=torch.float32)
    except Exception:  # noqa: BLE001 - the ranks trace again and record it as the case's
        return ref
    save(ref)
    for case in cases:
        if not case.plan_json and case.key not in ref["plans"]:
            try:
                ref["plans"][case.key] = search(case, ref["graph"], case.world)
            except Exception:  # noqa: BLE001 - rank 0 searches again and records it
                continue
            save(ref)
    return ref


def prepare_main(worker: int, archs: list[str], cases: list[rm.Case], out_dir: str,
                 search) -> None:
    """One preparing process: `prepare` each of `archs` with `search`, saving its results
    after every step (the parent may kill it at any time); a reference that raises is the
    harness's error (as it was in the parent), its trace handed back."""
    torch.set_num_threads(1)  # as the ranks run
    for arch in archs:
        path = os.path.join(out_dir, RESULTS_FILE.format(arch=arch))

        def save(result: dict, path=path) -> None:  # whole or not at all: a kill may come
            torch.save(result, path + ".tmp")
            os.replace(path + ".tmp", path)

        try:
            prepare(arch, [c for c in cases if c.arch == arch], search, save)
        except Exception:  # noqa: BLE001 - re-raised in the parent
            save({"harness_error": traceback.format_exc()})


def wait_for_workers(procs: list, limit_s: float) -> None:
    """The prep's deadline: join `procs` until each has exited or `limit_s` has passed."""
    deadline = time.monotonic() + limit_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))


def prepare_all(selected: list[rm.Case], limit_s: float = PREP_LIMIT_S, search=search_plan,
                wait=wait_for_workers) -> tuple[dict[str, dict], dict[str, str]]:
    """({arch: prepared reference}, {arch: reason it cannot be built}) of `selected`'s
    architectures, spread over the workers in turn. Workers still running once
    `wait(procs, limit_s)` returns (the deadline: `wait_for_workers`) are killed: what
    they saved stands, the rest is left to the ranks, and an architecture they never
    reached gets its reference here (no graph, no plans)."""
    from dist_utils import forked_call, save_arguments, start_method

    archs = list(dict.fromkeys(c.arch for c in selected))
    workers = max(1, min(os.cpu_count() or 1, PREP_WORKERS_MAX, len(archs)))
    context = multiprocessing.get_context(start_method())
    with tempfile.TemporaryDirectory(prefix="real-models-prep-") as out_dir:
        procs = []
        for worker in range(workers):
            folder = os.path.join(out_dir, str(worker))  # one arguments file per worker
            os.mkdir(folder)
            arguments = save_arguments(folder, (archs[worker::workers], selected, out_dir,
                                                search))
            procs.append(context.Process(target=forked_call, daemon=True,
                                         args=(worker, dict(os.environ), prepare_main,
                                               arguments)))
        for p in procs:
            p.start()
        wait(procs, limit_s)
        late = [p.is_alive() for p in procs]
        for p in procs:
            p.kill()  # a no-op on a process that has exited
            p.join()
        for worker, p in enumerate(procs):
            if not late[worker] and p.exitcode != 0:
                raise RuntimeError(f"real_models_prep: worker {worker} exited with code "
                                   f"{p.exitcode}")
        results = {}
        for arch in archs:  # what the workers saved, just now
            path = os.path.join(out_dir, RESULTS_FILE.format(arch=arch))
            if os.path.exists(path):
                results[arch] = torch.load(path, weights_only=False)
    if any(late):
        left = [c.key for c in selected if not c.plan_json and "failed" not in
                results.get(c.arch, {}) and c.key not in results.get(c.arch, {}).get("plans", {})]
        print(f"real_models_prep: not prepared within {limit_s:.0f} s, left to the ranks: "
              f"{', '.join(left)}", file=sys.stderr)
    refs, failed = {}, {}
    for arch in archs:
        result = results.get(arch) or prepare(arch, [], trace=False)  # never reached
        if "harness_error" in result:
            raise RuntimeError(f"reference of {arch} failed:\n{result['harness_error']}")
        if "failed" in result:
            failed[arch] = result["failed"]
        else:
            refs[arch] = result
    return refs, failed
