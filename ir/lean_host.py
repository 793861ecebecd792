"""What the lean host executor does with a data-parallel unit: one definition that
`executors.data_parallel` / `executors.host_collectives` run and `cost_models.memory`
prices (issue 15).

A meta-built model on a CPU cluster (`lean_host`: one too big to build whole) runs each
ZeRO-2/3 layer with dp > 1 on the host ring collectives (`executors.host_collectives`):

  - each nn.Embedding of the layer is an FSDP2 unit of its own (`lean_units`);
  - a unit whose backward reads none of its weights (`weightless_backward`: made only of
    embeddings) is not gathered again in backward (FSDP2 `set_unshard_in_backward`);
  - a unit of one contiguous parameter whose dim 0 splits evenly over the group
    (`reduces_in_place`) reduce-scatters in the gradient's own storage: no copy-in;
  - no backward prefetch (LEAN_BACKWARD_PREFETCH), and the ring frees its reduce-scatter
    input as it returns, so no unit's input is retained until the next reduction
    (LEAN_RETAINS_REDUCE_INPUT);
  - while it reduces, the ring receives into a scratch of at most RING_PIECE_BYTES
    (`ring_scratch_bytes`, the largest unit's: units reduce one at a time).

`lean_layer` turns one layer module into what the memory model needs (`LeanLayer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from ir.layer import Layer, TPStyle
from ir.strategy import DPMode, LayerStrategy

# The ring collectives are synchronous: a prefetched unit overlaps nothing
# (`use_host_collectives` names the unit itself as its backward prefetch).
LEAN_BACKWARD_PREFETCH = False
# RingReduceScatter lets go of its input's storage before returning (`set_`), so FSDP2's
# reference to the previous unit's reduce-scatter input holds no bytes.
LEAN_RETAINS_REDUCE_INPUT = False
# The ring's receive scratch: 16 MiB, one 2048 x 2048 fp32 weight (a 1B-class GPT's
# typical tensor), so a 0.1 GB chunk moves in 6 messages and the scratch is ~1% of a
# rank's 1.3 GiB of shards on the bench's models (`executors.host_collectives`).
RING_PIECE_BYTES = 16 * 2**20


def ring_scratch_bytes(chunk_bytes: float) -> float:
    """The ring reduce-scatter's receive buffer for a unit of `chunk_bytes` per rank, live
    beside its input and output: `received = torch.empty(min(piece, chunks.shape[1]))`
    (`executors.host_collectives.RingReduceScatter.__call__`). Its input takes no
    storage before the copy-in (`RingReduceScatter.allocate`), so none is priced."""
    return min(float(RING_PIECE_BYTES), chunk_bytes)


def runs_lean_host(meta_built: bool, device_type: str) -> bool:
    """Whether a run takes the lean host path: a model built on the meta device (one too
    big to build whole) trained on the host (`executors.apply`)."""
    return meta_built and device_type == "cpu"


def takes_lean_path(lean_host: bool, strategy: LayerStrategy) -> bool:
    """Whether a layer's unit runs the lean way: a ZeRO-2/3 unit sharded over dp > 1
    ranks of a lean host run (the executor also requires its mesh to be on gloo)."""
    return (lean_host and strategy.dp > 1
            and strategy.dp_mode in (DPMode.ZERO2, DPMode.ZERO3))


def lean_units(module: nn.Module) -> list[nn.Module]:
    """The embedding tables of a layer that become units of their own (the layer's unit
    takes the rest); the layer itself never counts as one of its tables."""
    return [m for m in module.modules() if m is not module and isinstance(m, nn.Embedding)]


def weightless_backward(module: nn.Module) -> bool:
    """Whether backward reads none of `module`'s parameters: every one belongs to an
    nn.Embedding (its gradient is built from the ids and the row count alone)."""
    owners = [m for m in module.modules() if any(True for _ in m.parameters(recurse=False))]
    return bool(owners) and all(isinstance(m, nn.Embedding) for m in owners)


def reduces_in_place(rows: Sequence[int], shards: int) -> bool:
    """Whether a unit whose parameters have these dim-0 sizes (as the unit holds them)
    reduce-scatters in its gradient's storage: one parameter, no FSDP2 padding."""
    return len(rows) == 1 and rows[0] % shards == 0


@dataclass(frozen=True, slots=True)
class LeanLayer:
    """Shares of one layer's parameters (by count) on the lean path, for the memory model."""

    backward_gather_share: float = 1.0  # in units gathered again in backward
    reduce_copy_share: float = 1.0  # in units whose reduce-scatter copies the gradients
    # A unit's gradient before its reduction, as a multiple of its local parameters: a
    # vocabulary-parallel table's local gradient is rows of a whole-vocabulary one
    # (DTensor's embedding backward), which it keeps alive until the ring frees it
    # (measured per FSDP2 hook, bench/bench_meta_build.py's tp2-zero3 note).
    unsharded_grad_scale: float = 1.0
    # The largest unit's share of the layer's parameters: units reduce one at a time, so
    # the ring's receive scratch is the largest unit's.
    largest_unit_share: float = 1.0


def lean_layer(module: nn.Module, layer: Layer, strategy: LayerStrategy) -> LeanLayer:
    """`LeanLayer` of a layer module (meta or real) under `strategy` on the lean path:
    the units `lean_units` makes of it (its tables, then the layer with the rest), as
    `executors.data_parallel.apply_dp` makes them. A parameter's dim 0 is taken as split
    by tp x dp: exact for a vocabulary-split table or head; a TP-replicated one that
    splits over dp but not over tp x dp is priced with a copy (an over-estimate)."""
    tables = lean_units(module)
    taken = {id(p) for t in tables for p in t.parameters()}
    rest = [p for p in module.parameters() if id(p) not in taken]
    units = [(True, list(t.parameters())) for t in tables]  # a table: weightless
    if rest:
        units.append((weightless_backward(module), rest))
    total = sum(p.numel() for _, ps in units for p in ps)
    if not total:
        return LeanLayer()
    shards = strategy.dp * strategy.tp
    vocab = {id(module.get_submodule(c.module)) for c in layer.tp_candidates
             if c.style is TPStyle.VOCAB and strategy.tp > 1}
    whole = sum(p.numel() for t in tables if id(t) in vocab for p in t.parameters())
    gathered = sum(p.numel() for weightless, ps in units if not weightless for p in ps)
    copied = sum(p.numel() for _, ps in units
                 if not reduces_in_place([p.shape[0] for p in ps], shards) for p in ps)
    local = total - whole + whole / strategy.tp  # the unit's local parameters
    largest = max(sum(p.numel() for p in ps) for _, ps in units)
    return LeanLayer(backward_gather_share=gathered / total,
                     reduce_copy_share=copied / total,
                     unsharded_grad_scale=total / local, largest_unit_share=largest / total)


def lean_layers(model: nn.Module, layers: Sequence[Layer],
                strategies: Sequence[LayerStrategy]) -> tuple[LeanLayer | None, ...]:
    """Per layer of the IR (its module path in `model`), its `LeanLayer` where it takes
    the lean path, else None (FSDP2's own path)."""
    return tuple(lean_layer(model.get_submodule(l.name), l, s) if takes_lean_path(True, s)
                 else None for l, s in zip(layers, strategies))
