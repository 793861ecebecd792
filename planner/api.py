"""One call: trace, plan, shard — `auto_parallel(model, example_batch, ...)`.

    import torch, torch.nn.functional as F
    from planner import auto_parallel

    pm = auto_parallel(model, ({"input_ids": ids}, labels), loss_fn=lm_loss,
                       optimizer=torch.optim.AdamW, cluster="local", global_batch=32)
    for inputs, target in global_batches:        # the GLOBAL batch, the same on every rank
        loss = pm.train_step((inputs, target))   # each rank keeps its own share

Run it under `torchrun` (or in one plain process: world size 1). Every rank builds the
same model from the same seed and calls `auto_parallel` with the same arguments. Build
it on the meta device and no rank ever holds it whole: each materializes only its
shards, with the values the CPU build would have (`executors.materialize`):

    with executors.meta_init():          # torch.device("meta"), plus a record of the build
        torch.manual_seed(0)
        model = build()
    pm = auto_parallel(model, batch, loss_fn=lm_loss)   # init="empty": for a checkpoint Rank 0
searches the plan and broadcasts it as plan JSON (data, never pickle), so every rank
runs the same plan even where measured cluster speeds differ. Pass `plan=` (a path, a
PlanDocument or a ParallelPlan) to skip the search.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from cost_models.clusters import get_cluster
from executors import ParallelModel, apply, default_device, init_distributed
from executors.grad_clip import check_max_grad_norm
from executors.sparse_optimizer import SparseOptimizerSpec
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.measure import build_layer_graph
from ir.plan import (ParallelPlan, PlanDocument, load_plan, model_identity, plan_from_dict,
                     plan_to_json)
from ir.strategy import Precision
from planner.plan_report import plan_document
from planner.search import search
from planner.search_space import SearchOptions
from planner.table_hybrid import DEFAULT_SPARSE_OPTIMIZER, hybrid_document, plan_hybrid, recommendation_tables


@dataclass
class AutoParallel:
    """What `auto_parallel` returns: the plan and the sharded model, ready to train."""

    plan: ParallelPlan
    document: PlanDocument
    graph: LayerGraph
    parallel: ParallelModel
    input_names: tuple[str, ...] = ()  # forward()'s parameters, to name a bare tensor input

    @property
    def module(self) -> nn.Module:
        return self.parallel.module

    @property
    def optimizer(self):
        return self.parallel.optimizer

    def train_step(self, batch) -> float:
        """One optimizer step on a GLOBAL batch `(inputs, target)`; returns its mean loss."""
        inputs, target = _split_batch(batch, self.input_names)
        return self.parallel.train_step(inputs, target)

    @property
    def last_grad_norm(self) -> float | None:
        """The last step's global gradient norm before clipping (`max_grad_norm`)."""
        return self.parallel.last_grad_norm

    @property
    def steps(self) -> int:
        """Optimizer steps taken (restored by `resume`): the position in the data."""
        return self.parallel.steps

    def save(self, directory: str, step: int | None = None, keep: int | None = None) -> str:
        """Checkpoint model, optimizer, RNG and step into `directory/step-N/` on every rank
        (atomic; `executors.checkpoint`); returns the folder."""
        from executors.checkpoint import save_checkpoint

        return save_checkpoint(self.parallel, directory, step, keep)

    def resume(self, path: str) -> int:
        """Load the newest complete checkpoint under `path` (or the folder `path` itself),
        saved under any plan or world size; returns its step, 0 when there is none."""
        from executors.checkpoint import MARKER, latest_checkpoint, load_checkpoint

        if os.path.isfile(os.path.join(path, MARKER)) or os.path.basename(
                os.path.normpath(path)).startswith("step-"):
            return load_checkpoint(self.parallel, path)
        latest = latest_checkpoint(path)
        return load_checkpoint(self.parallel, latest) if latest else 0


def _split_batch(batch, input_names: tuple[str, ...]) -> tuple[dict, Any]:
    """(inputs dict, target) from `(inputs, target)`; a bare tensor input is named after
    forward()'s first parameter."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise PlannerError("a batch is (inputs, target): inputs a dict of forward() "
                           "arguments or one tensor, target the loss target")
    inputs, target = batch
    if isinstance(inputs, torch.Tensor):
        if not input_names:
            raise PlannerError("cannot name a bare tensor input: pass inputs as a dict")
        inputs = {input_names[0]: inputs}
    if not isinstance(inputs, dict):
        raise PlannerError(f"batch inputs must be a dict or a tensor, got {type(inputs).__name__}")
    return inputs, target


def _cluster_for(cluster: str | ClusterSpec, world: int) -> ClusterSpec:
    """The cluster spec sized to this job's world size."""
    spec = cluster if isinstance(cluster, ClusterSpec) else get_cluster(cluster)
    if spec.world_size == world:
        return spec
    if world <= spec.devices_per_node or spec.device.lower() == "cpu":
        return get_cluster(cluster, nodes=1, gpus_per_node=world) if isinstance(cluster, str) \
            else spec.with_nodes(1, world)
    if world % spec.devices_per_node:
        raise PlannerError(f"world size {world} is not a whole number of {spec.name} nodes of "
                           f"{spec.devices_per_node} devices")
    return spec.with_nodes(world // spec.devices_per_node)


def _broadcast_text(text: str | None, device: torch.device) -> str:
    """Rank 0's text on every rank, as UTF-8 bytes in a tensor (no pickle)."""
    payload = torch.zeros(1, dtype=torch.int64, device=device)
    if dist.get_rank() == 0:
        data = torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8, device=device)
        payload[0] = data.numel()
    dist.broadcast(payload, src=0)
    if dist.get_rank() != 0:
        data = torch.empty(int(payload[0]), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    return bytes(data.cpu().tolist()).decode("utf-8")


def auto_parallel(model: nn.Module, example_batch, *, loss_fn: Callable,
                  optimizer: type[torch.optim.Optimizer] = torch.optim.AdamW,
                  optimizer_kwargs: dict | None = None, cluster: str | ClusterSpec = "local",
                  global_batch: int | None = None, plan: str | PlanDocument | ParallelPlan | None = None,
                  precision: Precision | str | None = None,
                  options: SearchOptions | None = None,
                  loss_weight: Callable | None = None, tp_self_check: bool = True,
                  timeout_s: float | None = None,
                  stall_limit_s: float | None = None, init: str = "model",
                  checkpoint: str | os.PathLike | None = None,
                  sparse_optimizer: SparseOptimizerSpec | None = None,
                  table_init: Callable | None = None,
                  max_grad_norm: float | None = None) -> AutoParallel:
    """Trace `model`, plan it for this job (or take `plan`), and shard it on every rank.

    `example_batch` is `(inputs, target)` with the micro-batch shape the plan is made
    for (the model IR is measured at that size); `global_batch` defaults to its rows.
    `loss_weight` (target -> how many elements `loss_fn` averages over) weights each
    micro-batch's loss; see `executors.apply` (default: targets != -100, or all elements).
    `tp_self_check=False` skips checking tensor-parallel layers against their unsplit
    selves at set-up (`executors.tp_check`).
    `timeout_s`: the process-group timeout when this call creates the group
    (`executors.init_distributed`); `stall_limit_s`: how long a rank may stop making
    progress before the job exits (`executors.watchdog`); both default to their
    PLANNER_PG_TIMEOUT_S / PLANNER_STALL_LIMIT_S environment variables.
    `init` (a model built under `executors.meta_init()`): "model" initialises each rank's
    shards as the CPU build would, "empty" leaves parameters for a checkpoint loader;
    tracing and planning never need the values (the layer IR is measured on meta).
    `checkpoint`: a Hugging Face safetensors folder or a DCP checkpoint whose weights each
    rank loads for its own shards only (`executors.pretrained`); a meta-built model then
    skips its own initialisation.
    A recommendation model (pooled embedding tables that are layers of their own) gets a
    hybrid plan: the tables sharded over the ranks, the rest data parallel
    (`planner.table_hybrid`); `sparse_optimizer` is the tables' row-sparse optimizer
    (default row-wise Adagrad, `executors.apply.DEFAULT_SPARSE_LR`), `optimizer` the
    dense part's; `table_init` makes each rank's shard of a meta-built table
    (`executors.apply`), so no rank ever holds a whole table.
    `max_grad_norm`: clip the gradients to this global L2 norm before each step, as
    `torch.nn.utils.clip_grad_norm_` on one device (`executors.grad_clip`); the step's
    norm is `last_grad_norm`. None (the default): no clipping. A searched plan is priced
    with it; a given `plan` priced otherwise runs as `max_grad_norm` says, with a
    warning (`executors.apply`).
    """
    max_grad_norm = check_max_grad_norm(max_grad_norm)  # before any set-up
    init_distributed(timeout_s=timeout_s)
    world = dist.get_world_size()
    input_names = tuple(inspect.signature(model.forward).parameters)
    inputs, target = _split_batch(example_batch, input_names)
    rows = next(iter(inputs.values())).shape[0]
    global_batch = global_batch or rows * world
    spec = _cluster_for(cluster, world)
    if precision is None:
        precision = Precision.FP32 if spec.device.lower() == "cpu" else Precision.BF16_MIXED
    precision = Precision(precision)
    graph = build_layer_graph(model, inputs, target, loss_fn, name=type(model).__name__,
                              dtype=getattr(torch, precision.compute_dtype))
    device = default_device()
    if plan is not None:
        doc = _given_plan(plan, graph, spec)
    else:
        text = None
        if dist.get_rank() == 0:
            try:
                opts = _search_options(options, optimizer, optimizer_kwargs, spec.device,
                                       precision)
                # priced with the clip the executor will run (`cost_models.compute`)
                opts = dataclasses.replace(
                    opts, clip_grad_norm=opts.clip_grad_norm or max_grad_norm is not None)
                tables = recommendation_tables(model, inputs, graph)
                if tables:  # tables model parallel, the rest data parallel
                    hybrid = plan_hybrid(graph, tables, spec, global_batch, opts, model, inputs,
                                         sparse_optimizer.kind if sparse_optimizer
                                         else DEFAULT_SPARSE_OPTIMIZER, executor_model=model)
                    text = plan_to_json(hybrid_document(graph, spec, hybrid,
                                                        {"made_by": "auto_parallel"}))
                else:
                    # priced as `apply` runs this model: a meta-built one on the host
                    # takes the lean path (`cost_models.common.lean_host_model`)
                    result = search(graph, spec, global_batch, opts, model=model)
                    # made_by: the plan names no MODEL spec, a Python model made it
                    text = (plan_to_json(plan_document(graph, spec, result.best, result.stats,
                                                       {"made_by": "auto_parallel"}))
                            if result.best else json.dumps({"error": "no plan fits "
                                                            f"{spec.device_memory_bytes / 2**30:.1f} GiB per device"}))
            except PlannerError as exc:
                text = json.dumps({"error": str(exc)})
        data = json.loads(_broadcast_text(text, device))
        if "error" in data:
            raise PlannerError(f"auto_parallel could not plan {type(model).__name__}: {data['error']}")
        doc = plan_from_dict(data, "<plan from rank 0>")
    doc.check_world_size(world)
    parallel = apply(model, doc.plan, graph, loss_fn=loss_fn, device=device, optimizer=optimizer,
                     optimizer_kwargs=optimizer_kwargs, example_inputs=inputs,
                     loss_weight=loss_weight, tp_self_check=tp_self_check,
                     init="empty" if checkpoint is not None else init,
                     sparse_optimizer=sparse_optimizer, table_init=table_init,
                     max_grad_norm=max_grad_norm)
    if checkpoint is not None:
        parallel.load_pretrained(os.fspath(checkpoint))
    parallel.stall_limit_s = stall_limit_s
    return AutoParallel(doc.plan, doc, graph, parallel, input_names)


# torch.optim classes beyond Adam/AdamW/SGD (and their subclasses), priced as the plan
# optimizer holding the same fp32 states per element: two (NAdam, RAdam: exp_avg and
# exp_avg_sq; Adamax: exp_avg and exp_inf) or one (Adagrad's sum). None has a fused GPU step.
_STATE_TWINS = ((torch.optim.NAdam, "adamw"), (torch.optim.RAdam, "adamw"),
                (torch.optim.Adamax, "adamw"), (torch.optim.Adagrad, "sgd-momentum"))


def _search_options(options: SearchOptions | None, optimizer, kwargs: dict | None,
                    device: str, precision: Precision) -> SearchOptions:
    """The caller's options, stepping the optimizer as the executor will (where they leave
    `optimizer_impl` unset); else options for `optimizer`'s class (`_optimizer_choice`)."""
    if options is None:
        return SearchOptions(precision=precision, **_optimizer_choice(optimizer, kwargs, device))
    if options.optimizer_impl is None:
        return dataclasses.replace(options,
                                   optimizer_impl=_optimizer_impl(optimizer, kwargs, device))
    return options


def _optimizer_choice(optimizer, kwargs: dict | None, device: str) -> dict:
    """SearchOptions' `optimizer` (whose states the memory model counts) and
    `optimizer_impl` (how the executor will step it: the caller's fused/foreach, else the
    default rule where the class has that step, else torch's default) for a torch
    optimizer class; one the planner cannot price is refused, naming it."""
    cls = optimizer if isinstance(optimizer, type) else type(None)
    if issubclass(cls, (torch.optim.Adam, torch.optim.AdamW)):
        name = "adamw" if issubclass(cls, torch.optim.AdamW) else "adam"
    elif issubclass(cls, torch.optim.SGD):
        name = "sgd-momentum" if (kwargs or {}).get("momentum", 0) else "sgd"
    else:
        name = next((twin for c, twin in _STATE_TWINS if issubclass(cls, c)), None)
    if name is None:
        raise PlannerError(
            f"auto_parallel cannot price the optimizer {getattr(optimizer, '__qualname__', optimizer)}: "
            "it prices torch.optim.Adam, AdamW, SGD (and their subclasses), NAdam, RAdam, "
            "Adamax and Adagrad; pass one of them, or plan= a plan made for one with the same "
            "states")
    return {"optimizer": name, "optimizer_impl": _optimizer_impl(optimizer, kwargs, device)}


def _optimizer_impl(optimizer, kwargs: dict | None, device: str) -> str:
    """How the executor will step `optimizer` on `device` (a cluster spec's device name):
    the caller's fused/foreach, else the default rule where the class has that step."""
    from executors.optimizer import step_implementation

    implementation, _ = step_implementation(optimizer, kwargs or {}, None,
                                            "cpu" if device.lower() == "cpu" else "cuda")
    return implementation


def _given_plan(plan, graph: LayerGraph, spec: ClusterSpec) -> PlanDocument:
    if isinstance(plan, ParallelPlan):
        return PlanDocument(plan, graph.model, cluster=spec.to_dict(), **model_identity(graph))
    doc = load_plan(plan) if not isinstance(plan, PlanDocument) else plan
    doc.check_model(graph)
    return doc
