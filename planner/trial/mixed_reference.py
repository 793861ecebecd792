"""The reference of a mixed-precision plan: one process under the plan's precision policy.

A bf16 plan's loss is computed in bf16, so against the fp32 reference only a loose bound
(`reference.BF16_LOSS_RTOL`) tells rounding from a wrong plan. Run under the SAME policy
the executor gives every layer (`ir.precision_policy.mp_policy`: parameters cast to the
compute dtype at each unit, a unit's floating inputs cast to it, gradients reduced in
fp32, fp32 master weights stepped), one process rounds where the plan's ranks round, and
what is left between the two is what distribution legitimately reorders (the batch split
over ranks, the reduction order): `grad_check.BF16_GRAD_NORM_RTOL`, measured.

The units are the executor's (`ir.strategy.runs_as_dp_unit`, one FSDP2 unit per layer
that holds parameters; the model as the root unit, so its floating inputs are cast as
the executor's root casts them), on a one-rank mesh: FSDP2 applies the policy itself,
the executor's own code is not run. Sharded tables stay out of units, as in the plan.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ir.errors import PlannerError
from ir.strategy import LayerStrategy, Precision, runs_as_dp_unit


@dataclass(frozen=True, slots=True)
class MixedPrecision:
    """A plan's precision and its layers (module name, strategy), tables left out."""

    precision: Precision
    layers: tuple[tuple[str, LayerStrategy], ...]

    @classmethod
    def of(cls, plan, graph) -> MixedPrecision | None:
        """The policy a bf16 plan runs under; None for fp32 (the fp32 reference is the
        plan's own precision) and fp16 (its loss scaling skips steps: not reproduced here,
        so fp16 keeps the fp32 reference)."""
        if plan.precision is not Precision.BF16_MIXED:
            return None
        tables = {p.table.name for p in plan.embeddings.tables} if plan.embeddings else set()
        return cls(plan.precision, tuple((layer.name, s) for layer, s in
                                         zip(graph.layers, plan.layer_strategies)
                                         if layer.name not in tables))

    @contextlib.contextmanager
    def applied(self, module: nn.Module):
        """Make `module` the plan's units under the policy, on a one-rank mesh (a one-rank
        gloo group is made when none exists and destroyed on the way out)."""
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        from ir.precision_policy import mp_policy

        device_type = next(module.parameters()).device.type
        owned = not dist.is_initialized()
        if owned:
            dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                    store=dist.HashStore(), rank=0, world_size=1)
        try:
            if dist.get_world_size() != 1:
                raise PlannerError(f"the mixed-precision reference runs in one process, but "
                                   f"this one is rank {dist.get_rank()} of "
                                   f"{dist.get_world_size()}: run `planner validate` outside "
                                   "torchrun")
            mesh = DeviceMesh(device_type, torch.arange(1))
            policy = mp_policy(self.precision)
            for layers in _tie_groups([module.get_submodule(name) for name, strategy
                                       in self.layers if runs_as_dp_unit(
                                           _holds_params(module.get_submodule(name)),
                                           strategy, self.precision)]):
                fully_shard(layers if len(layers) > 1 else layers[0], mesh=mesh,
                            mp_policy=policy, reshard_after_forward=False)
            if not isinstance(module, FSDPModule):  # the root unit: casts the model inputs
                managed = {id(p) for m in module.modules() if isinstance(m, FSDPModule)
                           for p in m.parameters()}
                fully_shard(module, mesh=mesh, mp_policy=policy, reshard_after_forward=False,
                            ignored_params={p for p in module.parameters()
                                            if id(p) not in managed})
            yield module
        finally:
            if owned:
                dist.destroy_process_group()


def _holds_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _tie_groups(layers: list[nn.Module]) -> list[list[nn.Module]]:
    """The layers in units: layers sharing a parameter (tied embedding and head) in one
    unit, as FSDP2 asks. The executor unties them instead (each its own bf16 copy, the
    fp32 gradients summed); here the two bf16 gradients add before the fp32 cast: one
    more bf16 rounding of that sum, inside the measured BF16_GRAD_NORM_RTOL."""
    groups: list[tuple[set[int], list[nn.Module]]] = []
    for layer in layers:
        ids = {id(p) for p in layer.parameters()}
        joined = [g for g in groups if g[0] & ids]
        merged = (ids.union(*(g[0] for g in joined)),
                  [m for g in joined for m in g[1]] + [layer])
        groups = [g for g in groups if not any(g is j for j in joined)] + [merged]
    return [modules for _, modules in groups]
