"""A parallel plan: stages, per-layer strategies, batching and schedule, as plain data.

`ParallelPlan` is what the search produces, the cost models price and the executors
apply. This module writes the plan JSON (schema "planner.plan/v1"); `ir/plan_reader.py`
reads and validates it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ir.embedding_tables import EmbeddingPlan
from ir.errors import PlannerError
from ir.output_file import write_text_atomic
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Precision, Schedule, Stage

PLAN_SCHEMA = "planner.plan/v1"


# plan.optimizer name -> (torch class, default kwargs): what the executor builds and
# profile-cluster times.
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "adamw": (torch.optim.AdamW, {}),
    "adam": (torch.optim.Adam, {}),
    "sgd": (torch.optim.SGD, {"lr": 1e-3}),
    "sgd-momentum": (torch.optim.SGD, {"lr": 1e-3, "momentum": 0.9}),
}
KNOWN_OPTIMIZERS = tuple(OPTIMIZERS)


# How torch steps the optimizer (`ParallelPlan.optimizer_impl`): "fused" (one kernel per
# tensor list, no temporaries), "foreach" (a kernel per op per list) or "single" (one
# tensor at a time).
OPTIMIZER_IMPLEMENTATIONS = ("fused", "foreach", "single")


def optimizer_implementation(optimizer: str, device: str, chosen: str | None = None) -> str:
    """The step implementation the executor runs and the cost models price: `chosen` (a
    plan's recorded `optimizer_impl`) when given, else the default rule. Adam/AdamW on GPUs
    step fused, as torchtitan does by default: torch's own default there, foreach,
    streamed 1.24B parameters in 45 ms of H100 kernels against the fused kernel's 7 x 4
    bytes per element at copy speed, 12.5 ms (bench/bench_gpu_step.py, 2026-11-25).
    Elsewhere torch's defaults: foreach on GPUs, single-tensor on CPUs.
    `device`: a torch device type or a cluster spec's device name ("cpu" or a GPU's)."""
    if chosen is not None:
        return chosen
    if device.lower() == "cpu":
        return "single"
    return "fused" if optimizer in ("adam", "adamw") else "foreach"


# The plan optimizers whose fused kernel DTensor runs: torch 2.13 registers sharding for
# aten._fused_adam_/_fused_adamw_ only (torch/distributed/tensor/_ops/_pointwise_ops.py).
DTENSOR_FUSED_OPTIMIZERS = ("adam", "adamw")


def host_step_implementation(optimizer: str) -> str:
    """How ZeRO-Offload's host shards (FSDP2 DTensors on the CPU) step: torch's fused CPU
    kernel where DTensor runs it, else foreach (`SGD(fused=True)` on a DTensor raises at
    the first step: no sharding strategy for aten._fused_sgd_)."""
    return "fused" if optimizer in DTENSOR_FUSED_OPTIMIZERS else "foreach"


def requested_implementation(kwargs: dict[str, Any] | None, device: str) -> str | None:
    """The implementation a caller's `fused`/`foreach` optimizer kwargs ask torch for on
    `device` (torch's `_default_to_fused_or_foreach`: foreach by default on GPUs only);
    None when they ask for neither."""
    kwargs = kwargs or {}
    fused, foreach = kwargs.get("fused"), kwargs.get("foreach")
    if fused:
        return "fused"
    if foreach is not None:
        return "foreach" if foreach else "single"
    if fused is not None:  # fused=False alone: torch's default among the others
        return "single" if device.lower() == "cpu" else "foreach"
    return None


def record_implementation(plan: "ParallelPlan", device: str) -> "ParallelPlan":
    """`plan` with the step implementation it runs on `device` recorded (plan files say
    what the executor runs, whatever the default rule becomes)."""
    if plan.optimizer_impl is not None:
        return plan
    return dataclasses.replace(plan, optimizer_impl=optimizer_implementation(plan.optimizer,
                                                                             device))


def optimizer_for(name: str) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    try:
        cls, kwargs = OPTIMIZERS[name]
    except KeyError:
        raise PlannerError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}") \
            from None
    return cls, dict(kwargs)


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """Everything needed to price or run one training iteration.

    Invariants (checked in __post_init__): stages are contiguous, cover every layer once
    and have equal device counts; every layer uses all of its stage's devices
    (tp * dp == devices). Layer i sees `layer_micro_batch(i)` = global_batch /
    (num_microbatches * dp_i) samples per micro-batch per replica, which must be whole;
    `micro_batch` is that figure for the layer with the largest dp (Megatron's
    micro-batch size for a uniform plan).
    """

    stages: tuple[Stage, ...]
    layer_strategies: tuple[LayerStrategy, ...]  # one per layer, in layer order
    global_batch: int  # samples per optimizer step, over the whole cluster
    micro_batch: int  # samples per micro-batch per data-parallel replica
    num_microbatches: int  # gradient accumulation steps / pipeline micro-batches
    schedule: Schedule = Schedule.ONE_F_ONE_B
    precision: Precision = Precision.BF16_MIXED
    optimizer: str = "adamw"
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B)
    # How the executor steps the optimizer (OPTIMIZER_IMPLEMENTATIONS); None: the default
    # rule for the device it runs on (`optimizer_implementation`; plans written before
    # the field). The planner records it; the cost models price it.
    optimizer_impl: str | None = None
    # The executor clips the gradients by their global norm before each step
    # (`apply(max_grad_norm=)`); the cost models price the clip's reads and writes.
    clip_grad_norm: bool = False
    # Embedding tables placed model parallel (recommendation models); None: the tables,
    # if any, are ordinary layers. With tables the dense layers run data parallel over
    # every rank (tp = 1, one stage), as TorchRec's hybrid plan does.
    embeddings: EmbeddingPlan | None = None

    def __post_init__(self) -> None:
        if not self.stages:
            raise PlannerError("a plan needs at least one stage")
        for name in ("global_batch", "micro_batch", "num_microbatches", "virtual_stages"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlannerError(f"{name} must be an integer >= 1, got {value!r}")
        if self.optimizer not in KNOWN_OPTIMIZERS:
            raise PlannerError(f"unknown optimizer {self.optimizer!r}; "
                               f"use one of {', '.join(KNOWN_OPTIMIZERS)}")
        if self.optimizer_impl not in (None, *OPTIMIZER_IMPLEMENTATIONS):
            raise PlannerError(f"unknown optimizer_impl {self.optimizer_impl!r}; use one of "
                               f"{', '.join(OPTIMIZER_IMPLEMENTATIONS)}")
        expected = 0
        for i, stage in enumerate(self.stages):
            if stage.first_layer != expected:
                raise PlannerError(f"stage {i} starts at layer {stage.first_layer}, "
                                   f"expected {expected}: stages must be contiguous")
            expected = stage.last_layer + 1
        if expected != len(self.layer_strategies):
            raise PlannerError(f"stages cover {expected} layers but the plan has "
                               f"{len(self.layer_strategies)} layer strategies")
        if len({stage.devices for stage in self.stages}) != 1:
            counts = ", ".join(str(stage.devices) for stage in self.stages)
            raise PlannerError(f"pipeline stages must have equal device counts (got {counts}) "
                               "so that stage boundaries pair ranks one to one")
        for i, stage in enumerate(self.stages):
            for j in range(stage.first_layer, stage.last_layer + 1):
                s = self.layer_strategies[j]
                if s.devices != stage.devices:
                    raise PlannerError(f"layer {j}: tp={s.tp} x dp={s.dp} = {s.devices} but "
                                       f"stage {i} has {stage.devices} devices")
                if self.global_batch % (self.num_microbatches * s.dp):
                    raise PlannerError(
                        f"layer {j}: global batch {self.global_batch} does not split into "
                        f"{self.num_microbatches} micro-batches x dp {s.dp}; use a global batch "
                        f"that is a multiple of {self.num_microbatches * s.dp}")
        max_dp = max(s.dp for s in self.layer_strategies)
        if self.micro_batch * self.num_microbatches * max_dp != self.global_batch:
            raise PlannerError(
                f"micro_batch {self.micro_batch} x num_microbatches {self.num_microbatches} x "
                f"dp {max_dp} != global batch {self.global_batch}")
        if len(self.stages) % self.virtual_stages:
            raise PlannerError(f"{len(self.stages)} stages do not split into "
                               f"{self.virtual_stages} virtual stages per pipeline rank")
        if self.schedule is not Schedule.INTERLEAVED and self.virtual_stages != 1:
            raise PlannerError(f"virtual_stages={self.virtual_stages} needs the interleaved schedule")
        if self.embeddings is not None:
            self._check_embeddings()

    def _check_embeddings(self) -> None:
        """Sharded tables exchange every rank's ids by all-to-all on one batch split: the
        dense part must be one stage, data parallel over every rank."""
        if len(self.stages) != 1:
            raise PlannerError(f"a plan with sharded tables runs in one stage, got "
                               f"{len(self.stages)}: plan the dense part without pipeline "
                               "stages")
        for j, s in enumerate(self.layer_strategies):
            if s.tp != 1:
                raise PlannerError(f"layer {j}: tp={s.tp} but a plan with sharded tables runs "
                                   "its dense layers data parallel (tp=1)")
        if self.precision is Precision.FP16_MIXED:
            raise PlannerError("a plan with sharded tables cannot use fp16-mixed (its sparse "
                               "gradients are not loss-scaled): use bf16-mixed or fp32")
        self.embeddings.shards(self.world_size)  # every placement runs on these ranks

    def layer_micro_batch(self, layer_index: int) -> int:
        """Samples per micro-batch per data-parallel replica of one layer."""
        dp = self.layer_strategies[layer_index].dp
        return self.global_batch // (self.num_microbatches * dp)

    @property
    def pp(self) -> int:
        """Pipeline ranks (a rank holds `virtual_stages` stages under interleaving)."""
        return len(self.stages) // self.virtual_stages

    @property
    def world_size(self) -> int:
        return self.pp * self.stages[0].devices

    def stage_ranks(self, stage_index: int) -> tuple[int, ...]:
        """Global ranks of a stage: pipeline rank (stage % pp) times the stage's devices."""
        devices = self.stages[stage_index].devices
        first = (stage_index % self.pp) * devices
        return tuple(range(first, first + devices))

    def stage_of(self, layer_index: int) -> int:
        for i, stage in enumerate(self.stages):
            if stage.first_layer <= layer_index <= stage.last_layer:
                return i
        raise IndexError(f"layer {layer_index} is in no stage")

    def __str__(self) -> str:
        kinds = sorted({str(s) for s in self.layer_strategies})
        tables = f", {len(self.embeddings.tables)} placed tables" if self.embeddings else ""
        return (f"plan(pp={self.pp}, stages={len(self.stages)}, mb={self.micro_batch}x"
                f"{self.num_microbatches}, {self.schedule}, {'/'.join(kinds)}{tables})")


def uniform_plan(num_layers: int, *, tp: int = 1, dp: int = 1, pp: int = 1, zero: int = 0,
                 checkpoint: Checkpoint = Checkpoint.NONE, sequence_parallel: bool = False,
                 micro_batch: int = 1, global_batch: int | None = None,
                 schedule: Schedule = Schedule.ONE_F_ONE_B,
                 precision: Precision = Precision.BF16_MIXED, optimizer: str = "adamw",
                 virtual_stages: int = 1, stage_boundaries: tuple[int, ...] | None = None,
                 optimizer_impl: str | None = None) -> ParallelPlan:
    """One strategy for every layer; layers split into pp * virtual_stages even stages
    unless `stage_boundaries` (first layer of each stage after the first) is given."""
    num_stages = pp * virtual_stages
    if num_stages > num_layers:
        raise PlannerError(f"{num_stages} pipeline stages need at least that many layers; "
                           f"the model has {num_layers}")
    if stage_boundaries is None:
        stage_boundaries = tuple(round(num_layers * k / num_stages) for k in range(1, num_stages))
    starts = (0, *stage_boundaries)
    ends = (*(b - 1 for b in stage_boundaries), num_layers - 1)
    stages = tuple(Stage(a, b, tp * dp) for a, b in zip(starts, ends))
    strategy = LayerStrategy(tp=tp, dp=dp, dp_mode=DPMode.from_stage(zero),
                             sequence_parallel=sequence_parallel, checkpoint=checkpoint)
    if global_batch is None:
        global_batch = micro_batch * dp * max(pp, 1)
    per_replica = global_batch // dp if dp else 0
    if global_batch % dp or per_replica % micro_batch:
        raise PlannerError(f"global batch {global_batch} is not divisible by dp {dp} x "
                           f"micro-batch {micro_batch}; pick a global batch that is a "
                           f"multiple of {dp * micro_batch}")
    return ParallelPlan(stages=stages, layer_strategies=(strategy,) * num_layers,
                        global_batch=global_batch, micro_batch=micro_batch,
                        num_microbatches=per_replica // micro_batch, schedule=schedule,
                        precision=precision, optimizer=optimizer, virtual_stages=virtual_stages,
                        optimizer_impl=optimizer_impl)


# --------------------------------------------------------------------------- mesh layout


@dataclass(frozen=True, slots=True)
class LayerGroups:
    """Process groups of one layer: TP groups are consecutive ranks (TP innermost)."""

    tp_groups: tuple[tuple[int, ...], ...]
    dp_groups: tuple[tuple[int, ...], ...]


def layer_groups(plan: ParallelPlan, layer_index: int) -> LayerGroups:
    stage = plan.stage_of(layer_index)
    ranks = plan.stage_ranks(stage)
    tp = plan.layer_strategies[layer_index].tp
    tp_groups = tuple(ranks[i:i + tp] for i in range(0, len(ranks), tp))
    dp_groups = tuple(ranks[j::tp] for j in range(tp))
    return LayerGroups(tp_groups, dp_groups)


def pipeline_groups(plan: ParallelPlan) -> tuple[tuple[int, ...], ...]:
    """Ranks that exchange activations: the i-th rank of every pipeline rank's stage."""
    devices = plan.stages[0].devices
    return tuple(tuple(p * devices + i for p in range(plan.pp)) for i in range(devices))


# ------------------------------------------------------------------------ the JSON file


# Hex digits of a per-layer digest: 32 bits tell a plan's layers apart; plans carry one each.
LAYER_DIGEST_HEX = 8


def layer_digest(layer) -> str:
    """What pins a plan to one layer: its name, module class, parameters (names, count,
    bytes in the IR dtype, largest tensor, tied copies) and TP structure (split modules,
    head counts). Not its ops, FLOPs or saved bytes: those change with the loss function
    and the attention backend, which a plan does not depend on."""
    key = (layer.name, layer.kind, layer.param_names, layer.params, layer.param_bytes,
           layer.max_param_numel, layer.tied_param_names, layer.tp_divisors,
           tuple((c.module, c.style.value, c.params) + ((c.fused,) if c.fused else ())
                 for c in layer.tp_candidates))
    return hashlib.sha256(repr(key).encode()).hexdigest()[:LAYER_DIGEST_HEX]


@dataclass(frozen=True)
class PlanDocument:
    """A plan file: the plan plus what it was made for and what it predicts.

    `cluster`, `predicted` and `search` stay plain JSON objects here: `ir` does not know
    the cost models. `layer_names` pins the plan to the model's layers by name.
    """

    plan: ParallelPlan
    model_name: str
    fingerprint: str
    layer_names: tuple[str, ...]
    cluster: dict
    predicted: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)
    # The shape the model's layer IR was measured with (to rebuild the same graph).
    graph_micro_batch: int = 1
    graph_dtype: str = "bfloat16"
    seq_len: int | None = None
    # The MODEL argument that rebuilds the model (`planner validate`/`estimate --plan`),
    # kept as data; None for a Python model given to auto_parallel.
    model_spec: str | None = None
    # Per layer: `layer_digest` and parameter count, to name the first layer
    # a model differs in (empty in plans written before they were recorded).
    layer_digests: tuple[str, ...] = ()
    layer_params: tuple[int, ...] = ()

    def check_model(self, graph) -> None:
        """Raise unless the plan was made for this layer graph (by fingerprint), naming
        the first layer (or the shape) that differs."""
        if graph.fingerprint != self.fingerprint:
            raise PlannerError(
                f"plan was made for {self.model_name} (fingerprint {self.fingerprint}) but "
                f"this model, {graph.model} (fingerprint {graph.fingerprint}), "
                f"{self.model_difference(graph) or self._unnamed_difference()}")
        if self.layer_names != tuple(l.name for l in graph.layers):
            # Same model, but the file's layer names were edited: the plan would be
            # applied to layers it does not name.
            raise PlannerError(
                f"plan for {self.model_name} names its layers differently from the model: "
                f"it {self.model_difference(graph)}; the file was edited: re-plan")

    def _unnamed_difference(self) -> str:
        if not self.layer_digests:
            return ("differs in layers or shapes that this plan cannot name (it records no "
                    "per-layer digests): re-plan")
        return ("matches the plan layer by layer at the same shape, so the plan's fingerprint "
                "is from another planner version or was edited: re-plan")

    def model_difference(self, graph) -> str | None:
        """How `graph` differs from the model the plan was made for, first layer first;
        None where its layers and traced shape agree with what the plan records."""
        mine, theirs = self.layer_names, tuple(l.name for l in graph.layers)
        for i in range(max(len(mine), len(theirs))):
            if i >= len(theirs):
                return (f"ends after {len(theirs)} layers; the plan has {len(mine)} (layer {i} "
                        f"is {mine[i]!r})")
            if i >= len(mine):
                return (f"has {len(theirs)} layers, the plan {len(mine)}: layer {i} "
                        f"{theirs[i]!r} is not in the plan")
            layer = graph.layers[i]
            if mine[i] != theirs[i]:
                return f"differs first at layer {i}: {theirs[i]!r} here, {mine[i]!r} in the plan"
            if self.layer_params and self.layer_params[i] != layer.params:
                return (f"differs first at layer {i} ({theirs[i]}, {layer.kind}): "
                        f"{layer.params:,} parameters here, {self.layer_params[i]:,} in the plan")
            if self.layer_digests and self.layer_digests[i] != layer_digest(layer):
                return (f"differs first at layer {i} ({theirs[i]}, {layer.kind}): same "
                        "parameter count but other parameter names, shapes or dtypes, tied "
                        "weights or head counts")
        here = (graph.micro_batch, graph.seq_len, graph.dtype)
        made = (self.graph_micro_batch, self.seq_len, self.graph_dtype)
        if here != made:
            return ("has the plan's layers but was traced at micro-batch {}, sequence {}, {} "
                    "and the plan at micro-batch {}, sequence {}, {}: give an example batch "
                    "of that shape (and precision)".format(*here, *made))
        return None

    def check_world_size(self, world_size: int) -> None:
        if world_size != self.plan.world_size:
            raise PlannerError(f"plan needs {self.plan.world_size} processes but the job has "
                               f"{world_size}: launch with --nproc-per-node/--nnodes to match, "
                               "or re-plan for this world size")


def model_identity(graph) -> dict:
    """PlanDocument fields that pin a plan to `graph`'s layers (see `check_model`)."""
    return {"fingerprint": graph.fingerprint, "layer_names": tuple(l.name for l in graph.layers),
            "layer_digests": tuple(layer_digest(l) for l in graph.layers),
            "layer_params": tuple(l.params for l in graph.layers),
            "graph_micro_batch": graph.micro_batch, "graph_dtype": graph.dtype,
            "seq_len": graph.seq_len}


def plan_to_dict(doc: PlanDocument) -> dict:
    plan = doc.plan
    layers = []
    for i, (name, s) in enumerate(zip(doc.layer_names, plan.layer_strategies)):
        groups = layer_groups(plan, i)
        identity = ({"params": doc.layer_params[i], "digest": doc.layer_digests[i]}
                    if doc.layer_digests else {})
        layers.append({"index": i, "name": name, **identity, "stage": plan.stage_of(i), "tp": s.tp,
                       "dp": s.dp, "dp_mode": s.dp_mode.value,
                       "sequence_parallel": s.sequence_parallel,
                       "checkpoint": s.checkpoint.value, "offload": s.offload,
                       "tp_groups": [list(g) for g in groups.tp_groups],
                       "dp_groups": [list(g) for g in groups.dp_groups]})
    return {
        "schema": PLAN_SCHEMA,
        "model": {"name": doc.model_name, "spec": doc.model_spec, "fingerprint": doc.fingerprint,
                  "num_layers": len(doc.layer_names), "graph_micro_batch": doc.graph_micro_batch,
                  "graph_dtype": doc.graph_dtype, "seq_len": doc.seq_len},
        "cluster": doc.cluster,
        "world_size": plan.world_size,
        "global_batch": plan.global_batch,
        "micro_batch": plan.micro_batch,
        "num_microbatches": plan.num_microbatches,
        "schedule": plan.schedule.value,
        "precision": plan.precision.value,
        "optimizer": plan.optimizer,
        **({"optimizer_impl": plan.optimizer_impl} if plan.optimizer_impl is not None else {}),
        **({"clip_grad_norm": True} if plan.clip_grad_norm else {}),
        "virtual_stages": plan.virtual_stages,
        "stages": [{"stage": i, "first_layer": st.first_layer, "last_layer": st.last_layer,
                    "first_layer_name": doc.layer_names[st.first_layer],
                    "last_layer_name": doc.layer_names[st.last_layer],
                    "devices": st.devices, "ranks": list(plan.stage_ranks(i))}
                   for i, st in enumerate(plan.stages)],
        "pipeline_groups": [list(g) for g in pipeline_groups(plan)],
        "layers": layers,
        "predicted": doc.predicted,
        "search": doc.search,
        **({"embedding_tables": embeddings_to_dict(plan.embeddings, plan.world_size)}
           if plan.embeddings is not None else {}),
    }


def embeddings_to_dict(embeddings: EmbeddingPlan, world_size: int) -> dict:
    """The plan file's "embedding_tables": per table its shape, sharding, ranks and (for
    reviewers; the reader checks them) every shard's rows and columns."""
    shards = embeddings.shards(world_size)
    tables = []
    for placed in embeddings.tables:
        t, p = placed.table, placed.placement
        tables.append({
            "table": t.name, "rows": t.rows, "dim": t.dim, "dtype": t.dtype.value,
            "dtype_bytes": t.dtype_bytes,
            "pooling": t.pooling, "ids_per_sample": t.ids_per_sample,
            "hot_row_fraction": t.hot_row_fraction, "sharding": p.sharding.value,
            "ranks": list(p.ranks),
            "shards": [{"rank": s.rank, "rows": [s.row_start, s.row_stop],
                        "columns": [s.col_start, s.col_stop]} for s in shards[t.name]]})
    return {"sparse_optimizer": embeddings.sparse_optimizer, "node_size": embeddings.node_size,
            "tables": tables}


def plan_to_json(doc: PlanDocument) -> str:
    return json.dumps(plan_to_dict(doc), indent=2)


def save_plan(doc: PlanDocument, path: str | os.PathLike) -> None:
    """Write atomically (temp file + rename, keeping an old file's mode): a failure never
    leaves a half-written plan or touches the previous one."""
    write_text_atomic(path, plan_to_json(doc) + "\n", "plan")


def plan_from_dict(data: object, source: str = "<plan>") -> PlanDocument:
    """Validate a plan JSON object and build the PlanDocument (see ir/plan_reader.py)."""
    from ir.plan_reader import plan_from_dict as read

    return read(data, source)


def load_plan(path: str | os.PathLike) -> PlanDocument:
    """Read and validate a plan file (JSON only: plans are data, never code)."""
    from ir.plan_reader import load_plan as read

    return read(path)
