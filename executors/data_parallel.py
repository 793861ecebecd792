"""Data parallelism of one layer on its 1-D data-parallel submesh, by `DPMode`.

    ZERO3      fully_shard(reshard_after_forward=True): parameters, gradients and
               optimizer states sharded; parameters all-gathered in forward and again in
               backward.
    ZERO2      fully_shard(reshard_after_forward=False): the same shards, but parameters
               stay gathered from forward to backward (one all-gather per step).
    ZERO1      replicate(): parameters and gradients replicated, gradients all-reduced;
               fp32 master weights and optimizer moments sharded evenly over a flat
               buffer (`executors.zero1`, the Megatron distributed optimizer's layout):
               each rank updates its shard and the group all-gathers the parameters.
               Under mixed precision (dp > 1) the parameters are stored in 16 bits
               (`cast_to_working_dtype`, before `replicate`), so the layer holds
               2 + 2 bytes per parameter plus 12/dp of optimizer state.
    REPLICATE  replicate(): DDP — gradients all-reduced.

`replicate` is the FSDP2-based composable `replicate` (torch.distributed._composable.
replicate_with_fsdp), so every layer — whatever its mode — is one FSDP2 unit with its own
mesh and its own gradient reduction right after its backward; modes mix freely across
layers. The stage module is then wrapped as the root unit (it owns no parameters itself),
which gives one lazy initialisation and lets `torch.distributed.pipelining` switch
gradient sync off for all but the last micro-batch.

Gradients are SUMMED over the data-parallel group (divide factor 1): the executor seeds
backward with loss / (last layer's dp × micro-batches), so every layer — whatever its own
dp — ends with the gradient of the mean loss over the global batch. Reductions use only
ReduceOp.SUM (gloo has neither AVG nor PREMUL_SUM).

Mixed precision (`Precision.BF16_MIXED`): MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32) on every unit: bf16 compute and all-gathers, fp32 gradient reduction,
fp32 sharded parameters and optimizer states. Under mixed precision a layer with dp=1 is
wrapped too (on a 1-rank mesh) so that it computes in bf16 like the rest.

On gloo (host memory), for a meta-built model (`lean_host`: one too big to build whole),
a ZeRO-2/3 unit all-gathers and reduce-scatters with the ring collectives of
`executors.host_collectives`, in FSDP2's own buffers and without backward prefetch:
gloo's collectives and FSDP2's CUDA-stream bookkeeping otherwise hold extra full-size
copies of a unit (measured there), which a 1.3B GPT's step could not afford; there
each embedding table is a unit of its own, reduced in its gradient's storage and not
gathered in backward (an embedding's backward reads only the ids); `ir.lean_host`
defines these units, and `cost_models.memory` prices them from the same definition. Other
ZeRO-2/3 units on gloo reduce in place in FSDP2's own buffer and hand gloo only aliases
emptied after each wait (`ir.gloo_collectives`, which the DP-unit probe installs too:
gloo's worker thread drops its tensors late, and its reduce-scatter clone had stayed alive
into the next unit's backward on some runs); the rest keep FSDP2's own collectives. The
cost model's time and memory figures describe both.

CPU offload (`LayerStrategy.offload`, ZERO3 only): fully_shard(offload_policy=
CPUOffloadPolicy()) keeps the unit's fp32 shards and their gradients in host memory, so
the optimizer steps them on the CPU; FSDP2 copies a shard to the device before each
all-gather (then casts it to param_dtype) and the reduced gradient shard back after the
reduce-scatter. Parameters may sit on the device when wrapped: FSDP2 moves the shard.

BatchNorm in a layer with dp > 1 normalises with the statistics of the whole global
micro-batch across the layer's data-parallel group, as on one device; in a checkpointed
layer it updates its running statistics once, not again when recomputed
(`executors.sync_batchnorm`).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

from executors.host_collectives import use_host_collectives
from executors.sync_batchnorm import prepare_batch_norms
from executors.zero1 import attach_master, cast_to_working_dtype
from ir.gloo_collectives import on_gloo, sum_reduction, use_gloo_collectives
from ir.lean_host import lean_units, takes_lean_path
from ir.precision_policy import mp_policy
from ir.strategy import DPMode, LayerStrategy, Precision, runs_as_dp_unit


def offload_policy(strategy: LayerStrategy) -> OffloadPolicy:
    """FSDP2's CPUOffloadPolicy for an offloaded (ZeRO-Offload) layer: its fp32 shards,
    gradients and hence optimizer states live on the CPU, copied to the device for each
    all-gather; pinned host memory (asynchronous copies) only where CUDA exists."""
    if not strategy.offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())


def needs_dp_unit(module: nn.Module, strategy: LayerStrategy, precision: Precision) -> bool:
    """`ir.strategy.runs_as_dp_unit` for this module (the cost models ask the same)."""
    return runs_as_dp_unit(any(True for _ in module.parameters()), strategy, precision)


def apply_dp(module: nn.Module, strategy: LayerStrategy, mesh: DeviceMesh,
             precision: Precision, lean_host: bool = False) -> FSDPModule | None:
    """Make `module` (one layer) a data-parallel unit on the 1-D mesh `mesh`; its
    BatchNorms normalise over the whole micro-batch of the mesh (`sync_batchnorm`; after
    `apply_ac`, which a BatchNorm layer's new forward is checkpointed with again)."""
    prepare_batch_norms(module, mesh.get_group() if strategy.dp > 1 else None,
                        strategy.checkpoint)
    if not needs_dp_unit(module, strategy, precision):
        return None
    policy = mp_policy(precision)
    zero1_16bit = (strategy.dp_mode is DPMode.ZERO1 and strategy.dp > 1
                   and precision is not Precision.FP32)
    if zero1_16bit:  # the fp32 master shard goes to the optimizer, the weights to 16 bits
        cast_to_working_dtype(module, mesh.get_group(), policy.param_dtype)
    if strategy.dp_mode in (DPMode.ZERO2, DPMode.ZERO3):
        lean = takes_lean_path(lean_host, strategy) and on_gloo(mesh)  # `ir.lean_host`
        shard = dict(mesh=mesh, mp_policy=policy, offload_policy=offload_policy(strategy),
                     reshard_after_forward=strategy.dp_mode is DPMode.ZERO3)
        # each embedding table its own unit of one parameter: its gradient is reduced in
        # place (`executors.host_collectives`); the layer's unit takes the rest
        tables = lean_units(module) if lean else []
        for table in tables:
            table_unit = fully_shard(table, **shard)
            use_host_collectives(table_unit)
            sum_reduction(table_unit, mesh)
        unit = fully_shard(module, **shard)
        if lean:
            use_host_collectives(unit)
        elif on_gloo(mesh):  # no full-size reduce-scatter clone (`ir.gloo_collectives`)
            use_gloo_collectives(unit)
    else:
        unit = replicate(module, mesh=mesh, mp_policy=policy)
    if zero1_16bit:
        attach_master(module)
    sum_reduction(unit, mesh)
    return unit


def apply_dp_root(stage_module: nn.Module, mesh: DeviceMesh, precision: Precision) -> None:
    """Wrap the stage module as the root unit (after every layer that needs one is a unit).
    It owns no parameters: those of layers without a unit (dp=1) stay plain."""
    managed = {id(p) for m in stage_module.modules() if isinstance(m, FSDPModule)
               for p in m.parameters()}
    ignored = {p for p in stage_module.parameters() if id(p) not in managed}
    unit = fully_shard(stage_module, mesh=mesh, mp_policy=mp_policy(precision),
                       reshard_after_forward=False, ignored_params=ignored)
    sum_reduction(unit, mesh)


def offloaded_params(modules: list[nn.Module]) -> frozenset[int]:
    """Ids of the parameters that offloaded units hold on the host (their FSDP2 sharded
    parameters): the optimizer steps them with its fused CPU kernel (`executors.optimizer`)."""
    ids = set()
    for module in modules:
        for m in module.modules():
            if isinstance(m, FSDPModule):
                for group in _param_groups(m._get_fsdp_state()):
                    ids.update(id(fp.sharded_param) for fp in group.fsdp_params
                               if fp.offload_to_cpu)
    return frozenset(ids)


def _param_groups(state) -> list:
    """An FSDP2 state's parameter groups: a list from torch 2.12 on; torch 2.11 (what the
    lent GPU machines run) holds one group or None under the singular name."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return groups
    group = state._fsdp_param_group
    return [group] if group is not None else []


def set_gradient_sync(stage_module: nn.Module, enabled: bool) -> None:
    """Gradient accumulation without communication on all but the last micro-batch."""
    if isinstance(stage_module, FSDPModule):
        stage_module.set_requires_gradient_sync(enabled)
