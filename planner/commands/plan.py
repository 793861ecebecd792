"""`planner plan MODEL --cluster ... --global-batch B`: search the fastest plan that fits.

    planner plan gpt3-175b --cluster a100-80g --nodes 128 --global-batch 1536 --out plan.json
    planner plan llama3-70b --cluster h100-80g --nodes 8 --global-batch 512 --top 5
    planner plan gpt-tiny --cluster local --gpus-per-node 4 --global-batch 8 --tp 2 --pp 2

Strategy flags pin that dimension; --uniform makes every layer use one strategy.
"""

from __future__ import annotations

import json

import torch

from cost_models.clusters import preset_names
from ir.errors import PlannerError
from ir.plan import KNOWN_OPTIMIZERS, OPTIMIZER_IMPLEMENTATIONS, plan_to_dict, save_plan
from ir.strategy import Checkpoint, Precision, Schedule
from planner.arg_types import check_out, count, gib, n_devices, n_samples, n_tokens, seconds
from planner.commands.estimate import default_precision, load_cluster
from planner.fmt import Progress, human_bytes, table
from planner.models import META_INIT_KEY, executor_model, load_layer_graph
from planner.plan_report import (plan_document, predicted_lines, stage_memory_table,
                                  strategy_table, summary_line)
from planner.baselines import least_memory
from planner.layer_tables import reserved_bytes
from planner.search import search
from planner.search_space import SearchOptions
from planner.search_stats import SearchStats
from planner import table_report
from planner.table_hybrid import hybrid_document, plan_spec_hybrid

GiB = 2**30


def register(sub) -> None:
    p = sub.add_parser("plan", help="search the fastest parallel plan that fits",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--cluster", default=None,
                   help=f"preset ({', '.join(preset_names())}) or spec JSON (default local)")
    p.add_argument("--nodes", type=n_devices, default=None)
    p.add_argument("--gpus-per-node", type=n_devices, default=None)
    p.add_argument("--global-batch", type=n_samples, required=True,
                   help="samples per optimizer step")
    p.add_argument("--seq-len", type=n_tokens, default=None)
    p.add_argument("--memory-budget", type=gib(), default=None, metavar="GiB",
                   help="per-device budget (default: the device's memory)")
    p.add_argument("--out", default=None, help="write the plan JSON here")
    p.add_argument("--json", action="store_true", help="print the plan JSON")
    p.add_argument("--top", type=count(1, 1000, 5), default=1, metavar="K",
                   help="list the K best plans")
    p.add_argument("--time-limit", type=seconds(), default=None, metavar="S",
                   help="stop searching new pipeline configurations after S seconds")
    p.add_argument("--no-baselines", action="store_true", help="skip the uniform baselines")
    p.add_argument("--meta-init", action="store_true",
                   help="the executor gets the model built on meta (executors.meta_init): on "
                        "a CPU cluster its memory is priced as the lean host path runs it")
    g = p.add_argument_group("restrictions and pins")
    g.add_argument("--uniform", action="store_true", help="one strategy for every layer")
    g.add_argument("--max-tp", type=n_devices, default=None,
                   help="largest TP degree (default: devices per node)")
    g.add_argument("--no-pp", action="store_true", help="no pipeline parallelism")
    g.add_argument("--no-checkpoint", action="store_true", help="no activation checkpointing")
    g.add_argument("--no-offload", action="store_true",
                   help="no CPU offload (offered for ZeRO-3 layers where the cluster spec "
                        "gives pcie_gbps, host_memory_bytes and host_memory_gbps)")
    g.add_argument("--dp", type=n_devices, default=None)
    g.add_argument("--tp", type=n_devices, default=None)
    g.add_argument("--pp", type=n_devices, default=None)
    g.add_argument("--zero", type=int, default=None, choices=[0, 1, 2, 3])
    g.add_argument("--checkpoint", default=None, choices=[c.value for c in Checkpoint])
    g.add_argument("--sequence-parallel", action="store_true", default=None)
    g.add_argument("--schedule", default=None, choices=[s.value for s in Schedule])
    g.add_argument("--micro-batch", type=n_samples, default=None)
    g.add_argument("--precision", default=None, choices=[x.value for x in Precision])
    g.add_argument("--optimizer", default="adamw", choices=KNOWN_OPTIMIZERS)
    g.add_argument("--optimizer-impl", default=None, choices=OPTIMIZER_IMPLEMENTATIONS,
                   help="how torch steps it (Adam on GPUs: fused; else torch's default)")
    g.add_argument("--clip-grad-norm", action="store_true",
                   help="the step clips gradients by global norm (apply's max_grad_norm)")
    p.set_defaults(func=run)


def options_from_args(args, precision: Precision) -> SearchOptions:
    if args.top < 1:
        raise PlannerError(f"--top must be >= 1, got {args.top}")
    if args.memory_budget is not None and args.memory_budget <= 0:
        raise PlannerError(f"--memory-budget must be > 0 GiB, got {args.memory_budget}")
    return SearchOptions(
        tp=args.tp, dp=args.dp, pp=args.pp, zero=args.zero,
        checkpoint=Checkpoint(args.checkpoint) if args.checkpoint else None,
        sequence_parallel=args.sequence_parallel,
        schedule=Schedule(args.schedule) if args.schedule else None,
        micro_batch=args.micro_batch, precision=precision, optimizer=args.optimizer,
        optimizer_impl=args.optimizer_impl, clip_grad_norm=args.clip_grad_norm,
        uniform=args.uniform, max_tp=args.max_tp, no_pp=args.no_pp,
        no_checkpoint=args.no_checkpoint, no_offload=args.no_offload,
        memory_budget_bytes=int(args.memory_budget * GiB) if args.memory_budget else None,
        time_limit_s=args.time_limit, top_k=args.top)


def run(args) -> int:
    check_out(args.out)  # before the search, not after it
    cluster = load_cluster(args)
    precision = Precision(args.precision) if args.precision else default_precision(cluster)
    options = options_from_args(args, precision)
    if args.micro_batch is not None and args.global_batch % args.micro_batch:
        raise PlannerError(f"--micro-batch {args.micro_batch} does not divide --global-batch "
                           f"{args.global_batch}: use a micro-batch that divides it, or drop "
                           "--micro-batch to let the search choose")
    progress = Progress(f"tracing {args.model}")
    graph = load_layer_graph(args.model, 1, args.seq_len,
                             getattr(torch, precision.compute_dtype), progress=progress)
    progress.close()
    hybrid = plan_spec_hybrid(args.model, graph, cluster, args.global_batch, options,
                              meta_init=args.meta_init)
    if hybrid is not None:  # a recommendation model: tables sharded, the rest data parallel
        return _print_hybrid(args, graph, cluster, hybrid)
    model = executor_model(args.model, graph) if args.meta_init else None
    result = search(graph, cluster, args.global_batch, options,
                    with_baselines=not args.no_baselines, model=model)
    if result.best is None:
        raise PlannerError(nothing_fits(graph, cluster, args, options, result.stats, model))
    base = result.baselines
    summary = {b.name: ({"plan": str(b.candidate.plan),
                         "iteration_seconds": b.candidate.estimate.iteration_seconds}
                        if b.candidate else {"fits": False, "needs_bytes": b.needs_bytes,
                                             "excluded_by": b.excluded_by, "reason": b.reason})
               for b in base}
    doc = plan_document(graph, cluster, result.best, result.stats,
                        {"baselines": summary, **_meta_init_entry(args)}, model_spec=args.model)
    if _write_or_print_json(doc, args):
        return 0
    _print_head(doc, graph)
    print(predicted_lines(doc.predicted))
    print(stage_memory_table(doc.predicted))
    if args.top > 1:
        print()
        print(top_table(result.candidates[: args.top]))
    if base:
        print()
        print(baseline_table(result.best, base, cluster))
    stats = result.stats
    print(f"\nsearched {stats.outer_searched} of {stats.outer_candidates} pipeline "
          f"configurations ({stats.outer_pruned} pruned by bound) in "
          f"{stats.search_seconds:.2f} s" + (" (time limit hit)" if stats.timed_out else "")
          + (f"; wrote {args.out}" if args.out else ""))
    return 0


def _write_or_print_json(doc, args) -> bool:
    """Save the plan (--out) and print its JSON (--json); True when that was all."""
    if args.out:
        save_plan(doc, args.out)
    if args.json:
        print(json.dumps(plan_to_dict(doc), indent=2))
    return bool(args.json)


def _print_head(doc, graph) -> None:
    print(summary_line(doc))
    print()
    print(strategy_table(doc, graph))
    print()


def _meta_init_entry(args) -> dict:
    """The search block's record of --meta-init (`estimate --plan` prices the plan so)."""
    return {META_INIT_KEY: True} if args.meta_init else {}


def _print_hybrid(args, graph, cluster, hybrid) -> int:
    doc = hybrid_document(graph, cluster, hybrid, _meta_init_entry(args) or None,
                          model_spec=args.model)
    if _write_or_print_json(doc, args):
        return 0
    _print_head(doc, graph)
    print(table_report.render(hybrid.tables, cluster.world_size))
    print()
    print(predicted_lines(doc.predicted))
    print(stage_memory_table(doc.predicted))
    if args.out:
        print(f"\nwrote {args.out}")
    return 0


def top_table(candidates) -> str:
    rows = [[i + 1, str(c.outer), f"{c.estimate.iteration_seconds:.4g}",
             f"{c.estimate.samples_per_second:,.1f}", f"{100 * c.estimate.mfu:.1f}%",
             human_bytes(c.estimate.memory.peak_bytes),
             "/".join(sorted({str(s) for s in c.plan.layer_strategies}))[:60]]
            for i, c in enumerate(candidates)]
    return table(["#", "pipeline", "iter s", "samples/s", "MFU", "peak", "strategies"], rows,
                 right={0, 2, 3, 4, 5})


def baseline_table(best, base, cluster) -> str:
    device = cluster.device_memory_bytes
    rows = [["chosen (per-layer)", f"{best.estimate.iteration_seconds:.4g}",
             f"{best.estimate.samples_per_second:,.1f}", f"{100 * best.estimate.mfu:.1f}%",
             human_bytes(best.estimate.memory.peak_bytes), str(best.plan)[:70]]]
    for b in base:
        if b.candidate is not None:
            e = b.candidate.estimate
            rows.append([b.name, f"{e.iteration_seconds:.4g}", f"{e.samples_per_second:,.1f}",
                         f"{100 * e.mfu:.1f}%", human_bytes(e.memory.peak_bytes),
                         str(b.candidate.plan)[:70]])
        elif b.excluded_by:
            rows.append([b.name, "-", "-", "-", "-", f"excluded by {b.excluded_by}"])
        else:
            needs = (f"does not fit: needs {b.needs_bytes / GiB:.1f} GiB of {device / GiB:.1f} GiB"
                     if b.needs_bytes else f"not possible: {(b.reason or 'no legal configuration').split(';')[0]}")
            rows.append([b.name, "-", "-", "-", "-", needs])
    return table(["plan", "iter s", "samples/s", "MFU", "peak", "details"], rows,
                 right={1, 2, 3, 4})


def nothing_fits(graph, cluster, args, options: SearchOptions, stats: SearchStats | None = None,
                 model=None) -> str:
    """Why no plan came out, without contradicting itself: the smallest memory any plan
    would need and the knob that would help most."""
    import dataclasses

    budget = options.memory_budget_bytes or cluster.device_memory_bytes
    if stats and stats.timed_out:
        return (f"no plan found within --time-limit {options.time_limit_s:g} s (searched "
                f"{stats.outer_searched} of {stats.outer_candidates} "
                "pipeline configurations); raise --time-limit or pin degrees (--tp/--pp)")
    frugal = dataclasses.replace(options, memory_budget_bytes=None, top_k=1)
    needs, _ = least_memory(graph, cluster, args.global_batch, frugal, model=model)
    head = f"no plan fits {human_bytes(budget)} per device"
    reserved = reserved_bytes(cluster)
    if needs is not None and needs <= budget:
        # The full estimate fits, but the search sets a flat reserve aside first.
        return (f"{head}: the search sets {human_bytes(reserved)} aside per device before any "
                f"layer (runtime {human_bytes(cluster.runtime_overhead_bytes)} + "
                f"data-parallel buckets in flight), more than the "
                f"{human_bytes(needs)} the most frugal plan's full estimate peaks at; give "
                f"--memory-budget (GiB) well above {reserved / GiB:.2f}")
    if needs is not None:
        head += f"; the most frugal plan needs {human_bytes(needs)}"
    hints = []
    if options.no_checkpoint or options.checkpoint is Checkpoint.NONE:
        hints.append("allow activation checkpointing (drop --no-checkpoint)")
    if any(v is not None for v in (options.tp, options.dp, options.pp, options.zero,
                                   options.micro_batch)) or options.uniform or options.no_pp:
        hints.append("remove pins (--tp/--dp/--pp/--zero/--micro-batch/--uniform/--no-pp)")
    if options.no_offload and cluster.offload_known:
        hints.append("allow CPU offload (drop --no-offload)")
    hints.append(f"more devices (--nodes {cluster.num_nodes * 2})")
    hints.append("a smaller --global-batch or --seq-len")
    return head + "; try: " + ", ".join(hints)
