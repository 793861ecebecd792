"""`apply(model, plan, graph, loss_fn=...)`: run a ParallelPlan on torch.distributed.

Call it on every rank inside an initialised process group (torchrun, or spawned ranks),
with the same model built from the same seed on every rank: on CPU, or on the meta
device under `executors.meta_init()` (each rank then allocates only its own shards).
The composition order is fixed (torchtitan's: TP -> AC -> FSDP, embeddings/blocks/head
one unit each, root last):

    0. agree_on_plan       every rank holds the same plan (a digest all-gather), then
       check_plan          reject what cannot run (PlannerError), before any other collective
    1. Meshes              one (pp, dp, tp) DeviceMesh per TP degree, TP innermost
  1½. apply_tables        plan.embeddings: every table replaced by its sharded module
                           (`executors.sharded_embedding`); the dense layers stay data
                           parallel (steps 4-7 skip the table layers), the tables get the
                           row-sparse optimizer (`executors.sparse_optimizer`)
    2. untie               each layer its own copy of shared weights (`executors.tied`)
    3. build_stage_module  this rank's pipeline stage(s): the model, other stages' layers
                           stood in for (`executors.pipeline`); TPSelfCheck.record runs
                           the whole model once before (`executors.tp_check`)
    per stage module, per layer in order:
    4. apply_tp            DTensor TP / SP styles on the layer's TP mesh; then the
                           self-check runs each split layer against its record
    5. re-layouts          hooks where neighbouring layers lay activations out differently;
                           the self-check runs each once against the unsplit activation
    6. apply_ac            activation checkpointing of the layer
    7. apply_dp            fully_shard / replicate on the layer's DP mesh; then the root
    then:
  7½. materialize         a meta-built model: allocate this rank's shards, fill them one
                           layer at a time (`executors.materialize`); `init=` says how
    8. TiedGradients       sum the gradients of tied copies (needs the final parameters)
    9. build_optimizer     one optimizer; ZeRO-1 layers shard its state
   10. build_schedule      PipelineStage(s) and the plan's schedule (pp > 1)

    >>> pm = apply(model, plan, graph, loss_fn=loss_fn)
    >>> loss = pm.train_step({"input_ids": ids}, labels)   # the GLOBAL batch on every rank
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from executors.agreement import agree_on_plan
from executors.checkpointing import apply_ac
from executors.data_parallel import apply_dp, apply_dp_root, offloaded_params
from executors.grad_clip import check_max_grad_norm
from executors.host_memory import keep_freed_memory_off_heap
from executors.layout import add_input_relayout, add_output_relayout
from executors.materialize import capture, materialize
from executors.mesh import Meshes, pg_timeout_s
from executors.optimizer import build_optimizer, step_implementation
from executors.pipeline import (StageAnalysis, build_schedule, build_stage_module, rank_stages,
                                stage_layers)
from executors.runtime import ParallelModel, loss_weight as default_loss_weight
from executors.sharded_embedding import RowInit, ShardedTables, apply_table_placements
from executors.sparse_optimizer import SparseOptimizerSpec, SparseRowOptimizer
from executors.tensor_parallel import apply_tp, is_loss_parallel_head
from executors.tp_check import TPSelfCheck
from executors.tied import TiedGradients, find_tie_groups, untie
from executors.validate import check_plan, layer_layout
from ir.launch import die_with_parent
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.lean_host import runs_lean_host
from ir.plan import ParallelPlan, optimizer_for
from ir.strategy import DPMode


def default_device() -> torch.device:
    """cuda:LOCAL_RANK under NCCL, else CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def rank_device(device: torch.device | str | None) -> torch.device:
    """The device this rank runs on: `default_device()` for None, and a GPU named without
    an index ("cuda") as this rank's, cuda:LOCAL_RANK (torch 2.11's set_device refuses an
    index-less device: every `apply(..., device="cuda")` failed on an H100, 2026-11-25)."""
    if device is None:
        return default_device()
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        local = os.environ.get("LOCAL_RANK")  # else a spawned world: its rank's GPU
        return torch.device("cuda", int(local) if local is not None else
                            dist.get_rank() % torch.cuda.device_count())
    return device


def _layer_module(stage_module: nn.Module, name: str) -> nn.Module:
    return stage_module.get_submodule(name) if name else stage_module


# The tables' learning rate when the caller gives none: FBGEMM's
# SplitTableBatchedEmbeddingBagsCodegen default (learning_rate=0.01).
DEFAULT_SPARSE_LR = 0.01


def apply_tables(model: nn.Module, plan: ParallelPlan, graph: LayerGraph,
                 spec: SparseOptimizerSpec | None, table_init: RowInit | None = None
                 ) -> tuple[ShardedTables, SparseRowOptimizer]:
    """Step 1½: replace the plan's tables by their sharded modules (each table must be a
    layer of its own, so that no data-parallel unit holds a shard) and build their
    row-sparse optimizer (`spec`, else the plan's kind at DEFAULT_SPARSE_LR)."""
    layer_names = {layer.name for layer in graph.layers}
    for placed in plan.embeddings.tables:
        if placed.table.name not in layer_names:
            raise PlannerError(f"table {placed.table.name}: not a layer of its own in the "
                               "model's layer graph, so a data-parallel unit would hold its "
                               "shard; make the table a module the layers name")
    tables = apply_table_placements(model, plan.embeddings.placements,
                                    node_size=plan.embeddings.node_size, init=table_init)
    spec = spec or SparseOptimizerSpec(plan.embeddings.sparse_optimizer, DEFAULT_SPARSE_LR)
    if spec.kind != plan.embeddings.sparse_optimizer:
        raise PlannerError(f"sparse optimizer {spec.kind} but the plan was priced for "
                           f"{plan.embeddings.sparse_optimizer}: pass that kind, or re-plan")
    return tables, SparseRowOptimizer(tables, spec)


def _parallelize_stage(module: nn.Module, layers: list[int], plan: ParallelPlan,
                       graph: LayerGraph, meshes: Meshes, incoming, is_last: bool,
                       zero1: list, loss_parallel: bool, tp_check: TPSelfCheck,
                       table_layers: frozenset[str] = frozenset(),
                       lean_host: bool = False) -> None:
    """Steps 4-7 for one stage module holding `layers` (in order); layers named in
    `table_layers` are sharded tables: no TP, no data-parallel unit. `lean_host`: ZeRO-2/3
    units on gloo use `executors.host_collectives` (a meta-built model's set-up)."""
    strategies = plan.layer_strategies
    # 4. tensor / sequence parallel
    for j in layers:
        apply_tp(_layer_module(module, graph.layers[j].name), graph.layers[j], strategies[j],
                 meshes.tp_mesh(strategies[j].tp),
                 loss_parallel=loss_parallel and j == len(graph.layers) - 1)
    tp_check.check(module, layers, plan, graph, meshes, _layer_module)
    # 5. re-layouts: each layer converts its input from the layout of the one before it
    relayouts = []  # (layer, side, from, to): the self-check runs each once
    for j in layers:
        layout = layer_layout(plan, graph, j)
        if incoming != layout:
            add_input_relayout(_layer_module(module, graph.layers[j].name), incoming, layout,
                               meshes)
            relayouts.append((j, "input", incoming, layout))
        incoming = layout
    if is_last and incoming.seq_sharded:  # the loss sees whole sequences
        add_output_relayout(_layer_module(module, graph.layers[layers[-1]].name), incoming,
                            incoming.full_sequence, meshes)
        relayouts.append((layers[-1], "output", incoming, incoming.full_sequence))
    tp_check.check_relayouts(relayouts, plan, graph, meshes)
    # 6. activation checkpointing
    for j in layers:
        apply_ac(_layer_module(module, graph.layers[j].name), strategies[j].checkpoint)
    # 7. data parallel: each layer, then the stage module as the root unit
    root_mesh = None
    for j in layers:
        s = strategies[j]
        if graph.layers[j].name in table_layers:
            continue  # model parallel: its rows are summed by the all-to-all
        layer_module = _layer_module(module, graph.layers[j].name)
        mesh = meshes.dp_mesh(s.tp)
        if apply_dp(layer_module, s, mesh, plan.precision, lean_host) is not None:
            root_mesh = root_mesh or mesh
            if s.dp_mode is DPMode.ZERO1 and s.dp > 1:
                zero1.append((list(layer_module.parameters()), mesh.get_group()))
    if root_mesh is not None:
        apply_dp_root(module, root_mesh, plan.precision)


def apply(model: nn.Module, plan: ParallelPlan, graph: LayerGraph, *, loss_fn: Callable,
          device: torch.device | str | None = None,
          optimizer: type[torch.optim.Optimizer] | None = None,
          optimizer_kwargs: dict[str, Any] | None = None,
          example_inputs: dict | None = None, loss_parallel: bool = True,
          loss_weight: Callable | None = None, tp_self_check: bool = True,
          init: str = "model", sparse_optimizer: SparseOptimizerSpec | None = None,
          table_init: RowInit | None = None,
          max_grad_norm: float | None = None) -> ParallelModel:
    """Shard `model` as `plan` says on this rank; see the module docstring for the order.
    `model` is changed in place (moved to `device`, pruned to this rank's stage, its
    modules replaced by DTensor / FSDP versions); use `ParallelModel.module` afterwards.

    optimizer / optimizer_kwargs default to `plan.optimizer` with torch's defaults; the
    step runs as `plan.optimizer_impl` (a conflicting fused/foreach kwarg is refused).
    example_inputs (optional) lets check_plan run the pipeline's stage checks at once.
    loss_parallel: when the last layer is a TP-split head, keep its logits split and run
    `loss_fn` under `torch.distributed.tensor.parallel.loss_parallel()` (cross-entropy
    losses); False gathers the logits for any loss function.
    loss_weight: target -> how many elements `loss_fn` averages over (default
    `executors.runtime.loss_weight`: integer targets count entries != -100, others all
    elements); each micro-batch's loss is weighted by its share of the global count.
    tp_self_check: run each tensor-parallel layer once split and unsplit on the first
    rows of `example_inputs` and refuse a split that differs (`executors.tp_check`;
    skipped for a meta-built model, which has no values to run before step 7½).
    init: for a model built under `executors.meta_init()`: "model" gives each rank's
    shards the values of a CPU build from the same seed, "empty" leaves the parameters
    uninitialised for a checkpoint loader (buffers are still computed); see
    `executors.materialize`.
    sparse_optimizer: the tables' row-sparse optimizer and learning rate when the plan
    places tables (`plan.embeddings`); default the plan's kind at DEFAULT_SPARSE_LR.
    table_init: for tables built on the meta device, (table, rows, col_start, col_stop)
    -> the shard's values (e.g. `ir.embedding_tables.init_table_rows`): each rank makes
    only its own shard.
    max_grad_norm: clip the gradients before each optimizer step to this global L2 norm,
    exactly as `torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)` on one
    device, whatever the plan shards (`executors.grad_clip`; fp16: after the unscale, and
    not on a skipped step); `ParallelModel.last_grad_norm` is the step's norm before the
    clip. None (the default): no clipping. Sharded tables' sparse gradients are clipped
    with the rest (`executors.grad_clip`). The plan's
    `clip_grad_norm` records what was priced; this argument decides what runs (as
    torchtitan's job config does), and a mismatch warns once, naming both.
    """
    max_grad_norm = check_max_grad_norm(max_grad_norm)
    if plan.clip_grad_norm != (max_grad_norm is not None):
        warnings.warn(f"the plan was priced with clip_grad_norm={plan.clip_grad_norm} but "
                      f"runs with max_grad_norm={max_grad_norm}: the run clips as "
                      "max_grad_norm says, its estimate assumed otherwise", stacklevel=2)
    if not dist.is_initialized():
        raise PlannerError("executors.apply needs an initialised process group: run under "
                           "torchrun, or call executors.init_distributed() first")
    # every rank runs the same plan, or all fail together naming the ranks (no hang)
    device = rank_device(device)
    agree_on_plan(plan, graph, device, max_grad_norm)
    world_size = dist.get_world_size()
    # 0. reject before any collective
    dims = check_plan(model, plan, graph, world_size, example_inputs)
    cls, kwargs = (optimizer, {}) if optimizer is not None else optimizer_for(plan.optimizer)
    implementation, kwargs = step_implementation(cls, {**kwargs, **(optimizer_kwargs or {})},
                                                 plan.optimizer_impl, device.type)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # 1. meshes
    meshes = Meshes(dims, device.type)
    # 1½. sharded tables (before any other change: they are the model's own modules); a
    # meta-built table is never built whole: `table_init` gives each rank its shard, which
    # the meta capture then keeps as a real tensor
    tables = sparse = None
    if plan.embeddings is not None:
        tables, sparse = apply_tables(model, plan, graph, sparse_optimizer, table_init)
    meta = capture(model, init)  # None: a model with real tensors
    if meta is None:
        model.to(device)
    # A meta-built model is one too big to build whole: on the host, freed tensors leave
    # the resident set and gloo's collectives make no full-size copies. Not for the rest,
    # whose time and memory the cost model prices as FSDP2 and malloc run by default.
    lean_host = runs_lean_host(meta is not None, device.type)
    if lean_host:
        keep_freed_memory_off_heap()
    table_layers = frozenset(tables.modules) if tables is not None else frozenset()
    # 2. shared weights
    ties = find_tie_groups(model, graph)
    untie(model, ties)
    # 3. pipeline stages held by this rank; the TP self-check records the whole model first
    analysis = None
    if plan.pp == 1:
        stage_ids: list[int | None] = [None]
        layer_sets = [list(range(len(graph.layers)))]
    else:
        stage_ids = list(rank_stages(plan, meshes.pp_rank))
        layer_sets = [stage_layers(plan, s) for s in stage_ids]
    tp_check = TPSelfCheck.record(model, plan, graph, example_inputs, len(layer_sets),
                                  enabled=tp_self_check)
    if plan.pp == 1:
        modules = [model]
    else:
        analysis = StageAnalysis(model, graph, plan)  # a fake copy, before any stand-in
        modules = [build_stage_module(model, graph, plan, s, make_copy=len(stage_ids) > 1,
                                      analysis=analysis) for s in stage_ids]
    # 4-7. per stage module
    last = len(graph.layers) - 1
    # Split logits go straight to the loss, unless the model's own forward still adds a
    # tensor of its own to them (BART's final_logits_bias): then they are gathered.
    root_tensors = any(True for _ in model.parameters(recurse=False)) or any(
        True for _ in model.buffers(recurse=False))
    loss_parallel = loss_parallel and not root_tensors and is_loss_parallel_head(
        graph.layers[last], plan.layer_strategies[last], is_last=True)
    zero1: list = []
    for module, layers in zip(modules, layer_sets):
        first = layers[0]
        if first == 0:
            incoming = layer_layout(plan, graph, 0).full_sequence  # the data layout
        else:
            incoming = layer_layout(plan, graph, first - 1)  # what the previous stage sent
        _parallelize_stage(module, layers, plan, graph, meshes, incoming,
                           is_last=layers[-1] == last, zero1=zero1,
                           loss_parallel=loss_parallel, tp_check=tp_check,
                           table_layers=table_layers, lean_host=lean_host)
    # 7½. a meta-built model gets its local tensors and their values
    if meta is not None:
        materialize(modules, meta, graph, device)
    # 8. tied copies
    layer_stage = [plan.stage_of(j) for j in range(len(graph.layers))]
    by_layer = {j: module for module, layers in zip(modules, layer_sets) for j in layers}
    tied = TiedGradients(ties, layer_stage, plan.pp, dims.stage_devices, by_layer)
    # 9. optimizer
    table_params = tables.parameter_ids() if tables is not None else set()
    params = list({id(p): p for m in modules for p in m.parameters()
                   if id(p) not in table_params}.values())
    opt = build_optimizer(params, zero1, cls, kwargs, offloaded_params(modules), implementation)
    pm = ParallelModel(
        plan=plan, module=modules[0] if len(modules) == 1 else nn.ModuleList(modules),
        stage_modules=list(zip(stage_ids, modules)), optimizer=opt, loss_fn=loss_fn,
        meshes=meshes, device=device, input_layout=layer_layout(plan, graph, 0).full_sequence,
        output_layout=layer_layout(plan, graph, last).full_sequence, tied=tied,
        loss_parallel=loss_parallel, loss_weight_fn=loss_weight or default_loss_weight,
        tables=tables, sparse_optimizer=sparse, max_grad_norm=max_grad_norm)
    # 10. pipeline schedule
    if plan.pp > 1:
        pm.schedule, pm.pipeline_stages = build_schedule(
            plan, list(zip(stage_ids, modules)), device, meshes.pp_group(), pm._weighted_loss)
        pm.pipeline_analysis = analysis
        # every stage runs the glue from the inputs, laid out as its first layer's (one
        # layout per rank: check_plan)
        pm.input_layout = layer_layout(plan, graph, layer_sets[0][0]).full_sequence
    return pm


def init_distributed(backend: str | None = None, timeout_s: float | None = None) -> None:
    """Initialise the default process group: from torchrun's environment when present
    (nccl with GPUs, else gloo), else a single-process group (world size 1).

    timeout_s: how long a collective (and the store) may wait before it fails; default
    PLANNER_PG_TIMEOUT_S or `executors.mesh.PG_TIMEOUT_S`. The executor's meshes give
    their sub-groups the same timeout (`executors.mesh`).

    Under torchrun's agent store the keys are namespaced by TORCHELASTIC_RESTART_COUNT:
    the store outlives a failed attempt, and a restarted rank could otherwise read a dead
    rank's published address (`connectFullMesh ... Connection refused`). A torchrun
    worker dies with its agent (`ir.launch.die_with_parent`)."""
    if dist.is_initialized():
        return
    timeout = timedelta(seconds=pg_timeout_s(timeout_s))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        if "TORCHELASTIC_RUN_ID" in os.environ:
            die_with_parent()  # torchrun's workers lead their own sessions: no orphans
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                  is_master=False, timeout=timeout)
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            dist.init_process_group(backend, store=dist.PrefixStore(f"planner/attempt{attempt}", store),
                                    rank=int(os.environ["RANK"]),
                                    world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
        else:
            dist.init_process_group(backend, timeout=timeout)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
