"""The issue-14 matrix's work before its groups start (`real_models_groups.run_matrix`): per
architecture, its single-process reference, its layer graph and the plan of each of its
cases, in up to PREP_WORKERS_MAX forked processes at once.

    refs, failed = prepare_all(cases)  # {arch: reference + "graph" + "plans"}, {arch: reason}

Every rank of every case used to trace its model and rank 0 to search while the others
waited (4 ranks on 2 cores traced at half speed); the graph is the same on every rank
(measured on meta), so each architecture is traced once here and its cases searched
here, and the ranks run what they are handed (`real_models.run_case`). An architecture
whose trace or search fails here gets no graph or plan, and its ranks trace and search
as before, so the failure is the case's outcome, not the harness's.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback

import torch

import real_models as rm

# Processes preparing at once: one per core (make test runs one test at a time), at most
# this many (each holds a torch and transformers of its own beyond the fork's pages).
PREP_WORKERS_MAX = 4
RESULTS_FILE = "prepared{worker}.pt"


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


def prepare(arch: str, cases: list[rm.Case]) -> dict:
    """{"failed": reason} where the model cannot be built; else the reference (`rm.reference`)
    with its "graph" (None where the trace failed) and "plans" {case key: `search_plan`
    text} of `cases` that search (a replay carries its plan)."""
    try:
        model, inputs, target, loss_fn = rm.build(arch)
    except Exception as exc:  # the ranks would fail the same way: no group needed
        return {"failed": f"before training, load: {rm._first_line(exc)}"}
    ref = rm.reference(arch)
    ref["graph"], ref["plans"] = None, {}
    try:
        from ir.measure import build_layer_graph

        ref["graph"] = build_layer_graph(model, inputs, target, loss_fn,
                                         name=type(model).__name__, dtype=torch.float32)
    except Exception:  # noqa: BLE001 - the ranks trace again and record it as the case's
        return ref
    for case in cases:
        if not case.plan_json and case.key not in ref["plans"]:
            try:
                ref["plans"][case.key] = search_plan(case, ref["graph"], case.world)
            except Exception:  # noqa: BLE001 - rank 0 searches again and records it
                pass
    return ref


def prepare_main(worker: int, archs: list[str], cases: list[rm.Case], out_dir: str) -> None:
    """One preparing process: `prepare` each of `archs`; a reference that raises is the
    harness's error (as it was in the parent), its trace handed back."""
    torch.set_num_threads(1)  # as the ranks run
    results = {}
    for arch in archs:
        try:
            results[arch] = prepare(arch, [c for c in cases if c.arch == arch])
        except Exception:  # noqa: BLE001 - re-raised in the parent
            results[arch] = {"harness_error": traceback.format_exc()}
    torch.save(results, os.path.join(out_dir, RESULTS_FILE.format(worker=worker)))


def prepare_all(selected: list[rm.Case]) -> tuple[dict[str, dict], dict[str, str]]:
    """({arch: prepared reference}, {arch: reason it cannot be built}) of `selected`'s
    architectures, spread over the workers in turn."""
    from dist_utils import forked_call, save_arguments, start_method

    archs = list(dict.fromkeys(c.arch for c in selected))
    workers = max(1, min(os.cpu_count() or 1, PREP_WORKERS_MAX, len(archs)))
    context = multiprocessing.get_context(start_method())
    with tempfile.TemporaryDirectory(prefix="real-models-prep-") as out_dir:
        procs = []
        for worker in range(workers):
            folder = os.path.join(out_dir, str(worker))  # one arguments file per worker
            os.mkdir(folder)
            arguments = save_arguments(folder, (archs[worker::workers], selected, out_dir))
            procs.append(context.Process(target=forked_call, daemon=True,
                                         args=(worker, dict(os.environ), prepare_main,
                                               arguments)))
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        results = {}
        for worker, p in enumerate(procs):
            path = os.path.join(out_dir, RESULTS_FILE.format(worker=worker))
            if p.exitcode != 0 or not os.path.exists(path):
                raise RuntimeError(f"real_models_prep: worker {worker} exited with code "
                                   f"{p.exitcode} and no results")
            results.update(torch.load(path, weights_only=False))  # our worker's, just now
    refs, failed = {}, {}
    for arch in archs:
        result = results[arch]
        if "harness_error" in result:
            raise RuntimeError(f"reference of {arch} failed:\n{result['harness_error']}")
        if "failed" in result:
            failed[arch] = result["failed"]
        else:
            refs[arch] = result
    return refs, failed
