"""Weights shared by several layers (a tied embedding and LM head), Megatron style.

Layers are parallelised independently (their own TP, DP mode, pipeline stage), so a
parameter used by two layers cannot stay one tensor. `untie` gives every layer after
the first its own copy (same values); after backward, `TiedGradients.sync` sets every
copy's gradient to the SUM over copies — what autograd gives the single shared tensor —
so the copies receive identical updates and stay equal. Uses inside one layer stay tied.

A copy's gradient may be sharded any way (TP shard, FSDP shard, both); the sum is taken
on full tensors: `full_tensor()` inside the holding stage, then an all-reduce between the
pipeline ranks that hold copies (one small group per position in the stage, like
Megatron's embedding group), then each copy keeps its own shard of the sum.

A name outside every layer may alias a layer's parameter (T5's and BART's `shared.weight`
is the Parameter of `encoder.embed_tokens.weight`, of `decoder.embed_tokens.weight` and of
`lm_head.weight`; forward never reads it through `shared`). Such an ALIAS stays a name of
the owner's parameter: `point_aliases` re-registers it on the final (TP / FSDP) parameter
of the first layer holding the weight, so the model has no stale extra tensor, the
optimizer one state per copy, and checkpoints and `full_state_dict` the usual names
(`named_parameters` lists the alias, first registered, in place of the owner's name).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate

from ir.layer import LayerGraph


@dataclass(frozen=True, slots=True)
class TieGroup:
    """One shared parameter: the layers using it and the parameter names in each."""

    layers: tuple[int, ...]  # ascending; layers[0] keeps the original tensor
    names: tuple[tuple[str, ...], ...]  # per layer, the fully qualified names it uses
    aliases: tuple[str, ...] = ()  # names of the tensor outside every layer


def owning_layer(fqn: str, graph: LayerGraph) -> int | None:
    """The layer whose module path is the longest prefix of parameter name `fqn`."""
    best, best_len = None, -1
    for layer in graph.layers:
        name = layer.name
        if (name == "" or fqn == name or fqn.startswith(name + ".")) and len(name) > best_len:
            best, best_len = layer.index, len(name)
    return best


def find_tie_groups(model: nn.Module, graph: LayerGraph) -> list[TieGroup]:
    by_tensor: dict[int, list[str]] = {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), []).append(fqn)
    groups = []
    for names in by_tensor.values():
        per_layer: dict[int, list[str]] = {}
        aliases = []
        for fqn in names:
            layer = owning_layer(fqn, graph)
            if layer is None:
                aliases.append(fqn)
            else:
                per_layer.setdefault(layer, []).append(fqn)
        if per_layer and (len(per_layer) > 1 or aliases):
            layers = tuple(sorted(per_layer))
            groups.append(TieGroup(layers, tuple(tuple(per_layer[j]) for j in layers),
                                   tuple(aliases)))
    return groups


def alias_problem(model: nn.Module, graph: LayerGraph) -> str | None:
    """Why a parameter name outside every layer cannot run, or None. Such a name is fine
    when it aliases a tensor some layer holds and no layer reads the tensor through it
    (the layer IR then names the layer's own path, `ir.measure`)."""
    held = {id(p) for fqn, p in model.named_parameters(remove_duplicate=False)
            if owning_layer(fqn, graph) is not None}
    read = {name: layer.name for layer in graph.layers
            for name in layer.param_names + layer.tied_param_names}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        if owning_layer(fqn, graph) is not None:
            continue
        if id(param) not in held:
            return (f"parameter {fqn} belongs to no layer of the layer IR, so no strategy "
                    "says how to run it; re-trace the model")
        if fqn in read:
            return (f"layer {read[fqn]} reads parameter {fqn} from outside its module, so "
                    "its strategy cannot shard it; register the weight inside that layer's "
                    "module")
    return None


def _set_param(model: nn.Module, fqn: str, param: nn.Parameter) -> None:
    path, _, attr = fqn.rpartition(".")
    setattr(model.get_submodule(path) if path else model, attr, param)


def untie(model: nn.Module, groups: list[TieGroup]) -> None:
    """Give each layer after the first its own copy of every shared parameter."""
    for group in groups:
        original = model.get_parameter(group.names[0][0])
        for names in group.names[1:]:
            copy = nn.Parameter(original.detach().clone(), requires_grad=original.requires_grad)
            for fqn in names:
                _set_param(model, fqn, copy)


def point_aliases(groups: list[TieGroup], modules_by_layer: dict[int, nn.Module]) -> None:
    """Re-register every alias on the final parameter of the first layer of this rank's
    stage module that holds the weight (a stage without one drops the alias), once TP and
    FSDP have replaced the layers' parameters."""
    for group in groups:
        stage_modules = {id(m): m for m in modules_by_layer.values()}.values()
        for stage_module in stage_modules:
            local = [names for j, names in zip(group.layers, group.names)
                     if modules_by_layer.get(j) is stage_module]
            target = stage_module.get_parameter(local[0][0]) if local else None
            for fqn in group.aliases:
                path, _, attr = fqn.rpartition(".")
                try:
                    holder = stage_module.get_submodule(path) if path else stage_module
                except AttributeError:  # pruned from this pipeline stage
                    continue
                holder.register_parameter(attr, target)


def _full_grad(param: torch.Tensor) -> torch.Tensor:
    grad = param.grad
    if grad is None:
        return torch.zeros(param.shape, dtype=param.dtype, device=local_device(param))
    return grad.full_tensor() if isinstance(grad, DTensor) else grad


def _one_layout(params: list[torch.Tensor]) -> bool:
    """Every copy's gradient is a DTensor sharded the same way on the same mesh: the
    sum of the copies is the sum of the local shards."""
    grads = [p.grad for p in params]
    if not all(isinstance(g, DTensor) for g in grads):
        return False
    first = grads[0]
    return all(g.device_mesh == first.device_mesh and g.placements == first.placements
               and g.shape == first.shape and not any(pl.is_partial() for pl in g.placements)
               for g in grads)


def local_device(t: torch.Tensor) -> torch.device:
    return t.to_local().device if isinstance(t, DTensor) else t.device


def _write_grad(param: torch.Tensor, total: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    grad = param.grad
    if isinstance(grad, DTensor):
        mesh = grad.device_mesh
        full = DTensor.from_local(total, mesh, [Replicate()] * mesh.ndim, run_check=False)
        part = full.redistribute(mesh, grad.placements).to_local()
        with torch.no_grad():
            grad.to_local().copy_(part)
    else:
        grad.copy_(total)


class TiedGradients:
    """Sums the gradients of tied copies. Built on every rank in the same order."""

    def __init__(self, groups: list[TieGroup], layer_stage: list[int], pp: int,
                 stage_devices: int, modules_by_layer: dict[int, nn.Module]):
        """layer_stage[j]: stage of layer j; modules_by_layer: this rank's stage module
        holding each of its layers."""
        self.rank = dist.get_rank()
        # (this rank's uses of a shared weight, the cross-stage group or None, its copies)
        self._groups: list[tuple[list[tuple[nn.Module, tuple[str, ...]]], object, int]] = []
        local = self.rank % stage_devices
        point_aliases(groups, modules_by_layer)  # the layers' parameters are final now
        for group in groups:
            if len(group.layers) == 1:  # an alias only: nothing to sum
                continue
            holders = sorted({layer_stage[j] % pp for j in group.layers})
            cross = None
            if len(holders) > 1:  # one group per position in the stage; all ranks create all
                for position in range(stage_devices):
                    ranks = [p * stage_devices + position for p in holders]
                    pg = dist.new_group(ranks)
                    if position == local and self.rank in ranks:
                        cross = pg
            mine = [(modules_by_layer[j], names) for j, names in zip(group.layers, group.names)
                    if j in modules_by_layer]
            self._groups.append((mine, cross, len(group.layers)))

    def copies(self) -> dict[int, int]:
        """id of each of this rank's tied parameters -> how many tied copies hold its
        summed gradient after `sync` (one per layer using the weight)."""
        return {id(module.get_parameter(names[0])): count
                for uses, _, count in self._groups for module, names in uses}

    @torch.no_grad()
    def sync(self) -> None:
        for uses, cross, _ in self._groups:
            if not uses:
                continue
            params = [module.get_parameter(names[0]) for module, names in uses]
            if cross is None and _one_layout(params):  # sum the local shards: no gather
                shards = [p.grad.to_local() for p in params]
                total = sum(shards)
                for shard in shards:
                    shard.copy_(total)
                continue
            total = sum(_full_grad(p) for p in params)
            if cross is not None:
                dist.all_reduce(total, group=cross)
            for p in params:
                _write_grad(p, total)
