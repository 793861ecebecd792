"""`planner estimate MODEL --cluster PRESET|spec.json [strategy flags] [--json]`: time and memory.

    planner estimate gpt3-175b --cluster a100-80g --nodes 128 --tp 8 --pp 8 \\
        --global-batch 1536 --checkpoint selective --sequence-parallel --zero 1
    planner estimate gpt-tiny --cluster local --json
    planner estimate --plan plan.json

The strategy flags describe one strategy for every layer (`--dp` defaults to
world / (tp * pp)); `--plan` prices a plan file instead. The shared flag handling lives
here and `planner memory` reuses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

from cost_models.advice import suggest_fixes
from torch import nn

from cost_models.clusters import get_cluster, preset_names
from cost_models.common import model_layer_configs
from cost_models.compute_profile import ComputeProfile
from cost_models.compute_breakdown import compute_by_class
from cost_models.estimate import estimate
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.plan import (KNOWN_OPTIMIZERS, OPTIMIZER_IMPLEMENTATIONS, ParallelPlan, load_plan,
                     optimizer_implementation, uniform_plan)
from ir.safe_json import read_json
from ir.strategy import Checkpoint, Precision, Schedule
from planner import report
from planner.arg_types import count, n_devices, n_samples, n_tokens
from planner.models import executor_model, graph_for_plan, planned_on_meta
from planner.plan_report import predicted_lines
from planner.table_hybrid import combined_prediction, price_hybrid
from planner.table_report import plan_tables_text

# Model chunks per pipeline rank when --schedule interleaved is given without --virtual-stages.
DEFAULT_VIRTUAL_STAGES = 2
# Flags a plan file fixes; giving them with --plan is a contradiction.
STRATEGY_FLAGS = ("dp", "tp", "pp", "zero", "checkpoint", "sequence_parallel", "micro_batch",
                  "global_batch", "schedule", "precision", "optimizer", "optimizer_impl",
                  "clip_grad_norm", "virtual_stages")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """MODEL, cluster and strategy flags shared by `estimate` and `memory`."""
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="preset, family:overrides, package.module:factory or hf:config.json")
    p.add_argument("--cluster", default=None,
                   help=f"preset ({', '.join(preset_names())}) or spec JSON (default local)")
    p.add_argument("--nodes", type=n_devices, default=None, help="number of nodes (preset's: 1)")
    p.add_argument("--gpus-per-node", type=n_devices, default=None,
                   help="devices per node (preset's: 8 on GPU presets, 1 on local)")
    p.add_argument("--dp", type=n_devices, default=None,
                   help="data-parallel degree (world/(tp*pp))")
    p.add_argument("--tp", type=n_devices, default=None, help="tensor-parallel degree (1)")
    p.add_argument("--pp", type=n_devices, default=None, help="pipeline-parallel degree (1)")
    p.add_argument("--zero", type=int, default=None, choices=[0, 1, 2, 3],
                   help="ZeRO stage of the data-parallel group (0)")
    p.add_argument("--checkpoint", default=None, choices=[c.value for c in Checkpoint],
                   help="activation checkpointing (none)")
    p.add_argument("--sequence-parallel", action="store_true", default=None,
                   help="Megatron sequence parallelism (needs --tp > 1)")
    p.add_argument("--micro-batch", type=n_samples, default=None,
                   help="samples per micro-batch (1)")
    p.add_argument("--global-batch", type=n_samples, default=None,
                   help="samples per step (micro-batch x dp x pp)")
    p.add_argument("--schedule", default=None, choices=[s.value for s in Schedule],
                   help="pipeline schedule (1f1b)")
    p.add_argument("--virtual-stages", type=count(1, 1024, 2), default=None,
                   help=f"model chunks per pipeline rank, interleaved only "
                        f"({DEFAULT_VIRTUAL_STAGES})")
    p.add_argument("--seq-len", type=n_tokens, default=None, help="sequence length (model default)")
    p.add_argument("--precision", default=None, choices=[x.value for x in Precision],
                   help="bf16-mixed on GPU clusters, fp32 on local")
    p.add_argument("--optimizer", default=None, choices=KNOWN_OPTIMIZERS,
                   help="optimizer whose states count (adamw)")
    p.add_argument("--optimizer-impl", default=None, choices=OPTIMIZER_IMPLEMENTATIONS,
                   help="how torch steps it (Adam on GPUs: fused; else torch's default)")
    p.add_argument("--clip-grad-norm", action="store_true", default=None,
                   help="the step clips gradients by global norm (apply's max_grad_norm)")
    p.add_argument("--plan", default=None, help="price this plan file instead of the flags")
    p.add_argument("--meta-init", action="store_true", default=None,
                   help="the executor gets the model built on meta (executors.meta_init): "
                        "on a CPU cluster it runs the lean host path, priced so (a plan file "
                        "made with --meta-init is priced so without it)")
    p.add_argument("--profile", default=None,
                   help="measured layer times from `planner profile` (same device and dtype)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def register(sub) -> None:
    p = sub.add_parser("estimate", help="time and memory of one training iteration",
                       description=__doc__.split("\n\n")[0])
    add_model_arguments(p)
    p.set_defaults(func=run)


def load_cluster(args) -> ClusterSpec:
    return get_cluster(args.cluster or "local", nodes=args.nodes,
                       gpus_per_node=args.gpus_per_node)


def _graph(spec: str, micro_batch: int, seq_len: int | None, precision: Precision
           ) -> LayerGraph:
    import torch

    from planner.fmt import Progress
    from planner.models import load_layer_graph

    dtype = getattr(torch, precision.compute_dtype)
    progress = Progress(f"tracing {spec}")
    try:
        return load_layer_graph(spec, micro_batch=micro_batch, seq_len=seq_len, dtype=dtype,
                                progress=progress)
    finally:
        progress.close()


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise PlannerError(f"--{name} must be >= 1, got {value}")


def plan_from_flags(args, graph_layers: int, cluster: ClusterSpec) -> ParallelPlan:
    """A uniform plan from the strategy flags, with defaults and checks that name the flag."""
    for name in ("dp", "tp", "pp", "micro_batch", "global_batch", "virtual_stages"):
        _positive(name.replace("_", "-"), getattr(args, name))
    tp, pp = args.tp or 1, args.pp or 1
    world = cluster.world_size
    if args.dp is None:
        if world % (tp * pp):
            raise PlannerError(f"--tp {tp} x --pp {pp} = {tp * pp} does not divide the "
                               f"{world} devices of {cluster.name}: give --dp or change "
                               "--nodes/--gpus-per-node")
        dp = world // (tp * pp)
    else:
        dp = args.dp
    if dp * tp * pp > world:
        raise PlannerError(f"--dp {dp} x --tp {tp} x --pp {pp} = {dp * tp * pp} devices but "
                           f"{cluster.name} has {world} ({cluster.num_nodes} x "
                           f"{cluster.devices_per_node}): add --nodes or lower a degree")
    if args.sequence_parallel and tp == 1:
        raise PlannerError("--sequence-parallel needs --tp > 1")
    schedule = Schedule(args.schedule or "1f1b")
    virtual = args.virtual_stages
    if virtual is not None and schedule is not Schedule.INTERLEAVED and virtual != 1:
        raise PlannerError(f"--virtual-stages {virtual} needs --schedule interleaved")
    if schedule is Schedule.INTERLEAVED:
        virtual = virtual or DEFAULT_VIRTUAL_STAGES
        if pp == 1:
            raise PlannerError("--schedule interleaved needs --pp > 1")
    micro_batch = args.micro_batch or 1
    precision = Precision(args.precision) if args.precision else default_precision(cluster)
    optimizer = args.optimizer or "adamw"
    if pp * (virtual or 1) > graph_layers:
        raise PlannerError(f"--pp {pp} x --virtual-stages {virtual or 1} stages need at least "
                           f"that many layers; the model has {graph_layers}")
    global_batch = args.global_batch
    if global_batch is not None and global_batch % (dp * micro_batch):
        raise PlannerError(f"--global-batch {global_batch} is not a multiple of --dp {dp} x "
                           f"--micro-batch {micro_batch} = {dp * micro_batch}")
    plan = uniform_plan(graph_layers, tp=tp, dp=dp, pp=pp, zero=args.zero or 0,
                        checkpoint=Checkpoint(args.checkpoint or "none"),
                        sequence_parallel=bool(args.sequence_parallel),
                        micro_batch=micro_batch, global_batch=global_batch,
                        schedule=schedule, precision=precision, optimizer=optimizer,
                        virtual_stages=virtual or 1, optimizer_impl=args.optimizer_impl)
    return dataclasses.replace(plan, clip_grad_norm=bool(args.clip_grad_norm))


def default_precision(cluster: ClusterSpec) -> Precision:
    """bf16 mixed precision on GPUs, plain fp32 on CPUs (the `local` preset)."""
    return Precision.FP32 if cluster.device.lower() == "cpu" else Precision.BF16_MIXED


def load_inputs(args) -> tuple[LayerGraph, ParallelPlan, ClusterSpec, ComputeProfile | None,
                                nn.Module | None]:
    """(graph, plan, cluster, profile, model) from the command line: flags or a plan file;
    `model` is the module the executor gets under --meta-init (`executor_model`), else None."""
    _positive("nodes", args.nodes)
    _positive("gpus-per-node", args.gpus_per_node)
    _positive("seq-len", args.seq_len)
    profile = read_profile(args.profile) if args.profile else None  # cheap: before tracing
    if args.plan:
        given = [f"--{f.replace('_', '-')}" for f in STRATEGY_FLAGS
                 if getattr(args, f, None) is not None]
        if given:
            raise PlannerError(f"{given[0]} cannot be combined with --plan: the plan file "
                               "fixes the strategy (drop the flag or the plan)")
        graph, plan, cluster, spec, meta_init = _from_plan_file(args)
    else:
        if not args.model:
            raise PlannerError("name a MODEL (e.g. gpt-tiny) or give --plan plan.json")
        cluster = load_cluster(args)
        precision = Precision(args.precision) if args.precision else default_precision(cluster)
        graph = _graph(args.model, args.micro_batch or 1, args.seq_len, precision)
        plan = plan_from_flags(args, len(graph.layers), cluster)
        spec, meta_init = args.model, bool(args.meta_init)
    model = executor_model(spec, graph) if meta_init else None
    return graph, plan, cluster, profile, model



def read_profile(path: str) -> ComputeProfile:
    """A `planner profile` file, read as bounded data (ir.safe_json) and checked."""
    from cost_models.layer_profile import PROFILE_SCHEMA

    fix = "re-run `planner profile MODEL --out FILE`"
    data = read_json(path, "profile", fix)
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != PROFILE_SCHEMA:
        raise PlannerError(f"{path}: schema is {schema!r:.60}, expected {PROFILE_SCHEMA!r}; "
                           f"{fix}")
    profile = ComputeProfile.from_dict(data, path)
    for i, layer in enumerate(profile.layers):
        for name in ("forward_seconds", "backward_seconds"):
            value = getattr(layer, name)
            if not (math.isfinite(value) and value >= 0):
                raise PlannerError(f"{path}: layers[{i}].{name} must be a finite number >= 0, "
                                   f"got {value!r}; {fix}")
    return profile


def _from_plan_file(args) -> tuple[LayerGraph, ParallelPlan, ClusterSpec, str, bool]:
    """(graph, plan, cluster, MODEL spec, meta_init) of a plan file: --meta-init, or the
    plan made with it (`planner plan --meta-init` records it in its search block)."""
    from planner.models import plan_model_spec

    doc = load_plan(args.plan)
    plan = doc.plan
    if args.cluster:
        cluster = load_cluster(args)
    else:
        try:
            cluster = ClusterSpec.from_dict(doc.cluster, f"{args.plan}: cluster")
        except PlannerError as exc:
            raise PlannerError(f"{exc}; pass --cluster to price the plan on a known cluster") \
                from None
        cluster = cluster.with_nodes(args.nodes, args.gpus_per_node)
    graph = graph_for_plan(doc, args.model)
    meta_init = bool(args.meta_init) or planned_on_meta(doc)
    return graph, plan, cluster, plan_model_spec(doc, args.model), meta_init


def describe(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec) -> str:
    return (f"{graph.model} on {cluster.name} ({cluster.num_nodes} x "
            f"{cluster.devices_per_node} {cluster.device}, plan uses {plan.world_size}): "
            f"{plan}, global batch {plan.global_batch}, {plan.precision}, {plan.optimizer} "
            f"({optimizer_implementation(plan.optimizer, cluster.device, plan.optimizer_impl)})")


def run(args) -> int:
    graph, plan, cluster, profile, model = load_inputs(args)
    if plan.embeddings is not None:
        return _run_hybrid(args, graph, plan, cluster, profile, model)
    est = estimate(graph, plan, cluster, profile,
                   configs=model_layer_configs(graph, plan, cluster.device, model))
    by_class = compute_by_class(graph, plan, cluster, est.pipeline.critical_rank, profile)
    if args.json:
        print(json.dumps({**est.to_json(), "compute_by_class": by_class.to_json()}, indent=2))
        return 0
    print(describe(graph, plan, cluster))
    print()
    print(report.time_table(est, by_class))
    print()
    print(report.throughput_lines(est))
    print()
    print(report.memory_table(est.memory))
    fixes = () if est.memory.fits else suggest_fixes(graph, plan, cluster)
    print(report.memory_verdict(est.memory, fixes))
    return 0


def _run_hybrid(args, graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec,
                profile: ComputeProfile | None, model: nn.Module | None) -> int:
    """A plan with sharded tables: the dense part as usual, then its tables (placements,
    per-rank seconds and bytes) and the step they make together (`table_hybrid`)."""
    dense, cost = price_hybrid(graph, plan, cluster, profile, model)
    predicted = combined_prediction(dense.to_json(), cost, plan.global_batch)
    if args.json:
        print(json.dumps(predicted, indent=2))
        return 0
    print(describe(graph, plan, cluster))
    print()
    print("dense layers (data parallel; the tables' parameters are priced below):")
    print(report.time_table(dense))
    print()
    print(report.memory_table(dense.memory))
    print()
    print(plan_tables_text(plan.embeddings, plan.world_size, predicted["embedding"]))
    print()
    print(predicted_lines(predicted))
    peak, device = predicted["memory"]["peak_bytes"], predicted["memory"].get("device_bytes", 0)
    print("fits" if peak <= device else
          f"does not fit: a rank needs {peak / 2**30:.2f} GiB of {device / 2**30:.2f} GiB; "
          "spread the tables over more ranks (planner plan-tables)")
    return 0
