"""Give a meta-built model's parallelised tensors their values: each rank allocates only
what it holds and fills it one layer at a time (FSDP2 / torchtitan's meta-device idiom).

    with meta_init():                       # executors.meta_record: build + record
        torch.manual_seed(0)
        model = build()                     # every tensor on meta: no memory
    pm = apply(model, plan, graph, loss_fn=..., init="model")

`apply` calls, in its fixed order:

    capture      before untying (step 2): every parameter and buffer name, aliases
                 included, -> where its value comes from: the record's Ref, or the tensor
                 itself when the build made it real (BatchNorm's num_batches_tracked)
    materialize  after data parallelism (step 7), before anything holds parameters
                 (tied-gradient sync, optimizer): `to_empty` allocates every stage module's
                 LOCAL tensors (TP shards, FSDP shards, replicas; other stages' layers are
                 stand-ins and allocate nothing); then, per layer of the layer IR in order
                 (and last the tensors outside every layer), the record replays that
                 layer's tensors whole on CPU, each rank copies in its slice
                 (`executors.fused.load_shard`: by the DTensor's placements, with no
                 communication; a fused projection reordered rank-major first), and the
                 whole copy is freed.

Peak host memory during set-up is therefore this rank's tensors plus one layer's whole
tensors (plus whatever that layer's replay reads: usually nothing else). Every rank
replays every layer it holds a piece of; the random draws of layers it does not hold
are never replayed (the record saved each draw's generator state).

init:
    "model"  the values of a CPU build from the same seed, bit for bit (the record's
             replay; `executors.meta_record` says which builds that covers).
    "empty"  parameters stay uninitialised, for a checkpoint loader to fill; buffers are
             still computed from the record (a checkpoint holds no non-persistent
             buffers). A non-persistent buffer without a record is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn
from executors.fused import fused_parameters, load_model_order, load_shard
from executors.host_memory import release_freed_memory
from executors.meta_record import InitRecord, Ref, forget, record_of
from executors.tied import owning_layer
from ir.errors import PlannerError
from ir.layer import LayerGraph

INITS = ("model", "empty")


@dataclass
class MetaSource:
    """Where every tensor of a meta-built model gets its value (see `capture`)."""

    init: str
    record: InitRecord | None
    values: dict[str, Ref | torch.Tensor | None]  # None: left uninitialised ("empty")


def is_meta_model(model: nn.Module) -> bool:
    return any(t.is_meta for t in _tensors(model))


def _tensors(model: nn.Module) -> Iterable[torch.Tensor]:
    yield from model.parameters()
    yield from model.buffers()


def _non_persistent(model: nn.Module, fqn: str) -> bool:
    path, _, attr = fqn.rpartition(".")
    return attr in (model.get_submodule(path) if path else model)._non_persistent_buffers_set


def capture(model: nn.Module, init: str) -> MetaSource | None:
    """None for a model with no meta tensor; else every name's value source. Raises
    (naming the tensor) where a value cannot be had."""
    if init not in INITS:
        raise PlannerError(f"init must be one of {INITS}, got {init!r}")
    if not is_meta_model(model):
        if init != "model":
            raise PlannerError(f"init={init!r} applies to a model built on the meta device; "
                               "this one has real tensors")
        return None
    record = record_of(model)
    values: dict[str, Ref | torch.Tensor | None] = {}
    named = [(n, t, False) for n, t in model.named_parameters(remove_duplicate=False)]
    named += [(n, t, True) for n, t in model.named_buffers(remove_duplicate=False)]
    for fqn, t, is_buffer in named:
        if not t.is_meta:
            values[fqn] = t.detach().clone()  # made real by the build: keep its value
        elif init == "empty" and not is_buffer:
            values[fqn] = None
        elif record is not None and record.knows(t):
            values[fqn] = record.ref(t)
        elif init == "empty" and not _non_persistent(model, fqn):
            values[fqn] = None  # a persistent buffer: the checkpoint holds it
        else:
            what = "non-persistent buffer" if is_buffer else "parameter"
            raise PlannerError(
                f"{what} {fqn} is on the meta device with no recorded build to compute it "
                "from: build the model under `with executors.meta_init(): model = build()` "
                "(plain torch.device('meta') keeps no values)"
                + ("" if init == "empty" else ", or pass init='empty' and load a checkpoint"))
    return MetaSource(init, record, values)


@torch.no_grad()
def materialize(modules: list[nn.Module], source: MetaSource, graph: LayerGraph,
                device: torch.device) -> None:
    """Allocate the stage modules' local tensors on `device` and fill them one layer at a
    time (see the module docstring). `modules` are this rank's parallelised stage modules."""
    for module in modules:
        module.to_empty(device=device)
    fused = fused_parameters(modules)
    groups: dict[int | None, dict[int, tuple[str, torch.Tensor]]] = {}
    for module in modules:
        named = list(module.named_parameters(remove_duplicate=False)) + list(
            module.named_buffers(remove_duplicate=False))
        for fqn, t in named:
            if fqn not in source.values:
                raise PlannerError(f"tensor {fqn} of the parallelised model has no value "
                                   "source in the meta build (renamed while parallelising)")
            groups.setdefault(owning_layer(fqn, graph), {}).setdefault(id(t), (fqn, t))
    order = sorted((j for j in groups if j is not None)) + ([None] if None in groups else [])
    for j in order:
        items = list(groups[j].values())
        refs = list(dict.fromkeys(source.values[fqn] for fqn, _ in items
                                  if isinstance(source.values[fqn], Ref)))
        full = dict(zip(refs, source.record.replay(refs))) if refs else {}
        for fqn, t in items:
            value = source.values[fqn]
            if value is None:
                continue
            whole = full[value] if isinstance(value, Ref) else value
            if tuple(t.shape) != tuple(whole.shape):  # copy_ would broadcast silently
                raise PlannerError(f"tensor {fqn}: the parallelised model holds a "
                                   f"{list(t.shape)} tensor, the build made {list(whole.shape)}")
            if fqn in fused:  # stored rank-major (`executors.fused`), built in model order
                load_model_order(t, whole, *fused[fqn])
            else:
                load_shard(t, whole)  # this rank's slice, no communication
        full = whole = None  # one layer's whole tensors at a time
        release_freed_memory()
    if source.record is not None:
        forget(source.record)
