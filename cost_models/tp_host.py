"""Host seconds tensor parallelism adds to a layer beyond its plain ops, per micro-batch:
DTensor dispatch of the ops it runs on DTensors, the TP modules' own DTensor work, SAC's
rerun of it, and the vocabulary-parallel ends. Each is a figure the device kit measured
(`cost_models.tp_probes`, `block_probes`, `vocab_probes`, `host_probes`); `compute.layer_compute`
adds them to the layer's host time.
"""

from __future__ import annotations

from ir.cluster import ClusterSpec
from ir.dtensor_ops import in_split_parent
from ir.layer import Layer, TPStyle
from ir.legality import sequence_parallel_applies
from ir.strategy import Checkpoint, LayerStrategy

from cost_models.block_probes import SP_BLOCK_GROUPS, SP_BLOCK_MODULES
from cost_models.layer_memo import per_layer

def dtensor_op_counts(layer: Layer, strategy: LayerStrategy) -> tuple[int, int]:
    """(forward, backward) ATen ops the TP executor runs on DTensors outside the layer's TP
    modules: those of each module owning parameters outside the TP candidates
    (`Layer.replicated_module_ops`, counted on meta: `ir.dtensor_ops`) that gets a DTensor
    style: every one under sequence parallelism, else those inside a split attention /
    MLP (`ir.dtensor_ops.in_split_parent`), as `executors.tensor_parallel.layer_tp_plan`
    assigns them. A layer traced before the count has none recorded: (0, 0)."""
    if strategy.tp == 1 or not layer.tp_candidates:
        return 0, 0
    sp = sequence_parallel_applies(layer, strategy)
    colwise = [c.module for c in layer.tp_candidates if c.style is TPStyle.COLWISE]
    rows = [(fwd, bwd) for path, fwd, bwd in layer.replicated_module_ops
            if sp or in_split_parent(colwise, path)]
    return sum(fwd for fwd, _ in rows), sum(bwd for _, bwd in rows)


@per_layer
def dtensor_op_seconds(layer: Layer, strategy: LayerStrategy,
                       cluster: ClusterSpec) -> tuple[float, float]:
    """(forward, backward) host seconds the DTensor ops of `dtensor_op_counts` add: each
    op x `dtensor_op_overhead_s` (`host_probes.dtensor_op_overhead_s`: the extra per op
    of a block on DTensors over plain tensors), unstretched (callers add it to a host
    term, which `with_host` stretches)."""
    forward_ops, backward_ops = dtensor_op_counts(layer, strategy)
    return (forward_ops * cluster.dtensor_op_overhead_s,
            backward_ops * cluster.dtensor_op_overhead_s)


@per_layer
def tp_module_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec) -> float:
    """Host time DTensor adds to the layer's tensor-parallel modules per micro-batch: the
    per-module figure measured in groups of this TP degree (`cost_models.tp_probes`: CPU
    time on the calling thread, collectives left to `comm.tp_comm_s`), stretched like the
    per-op figures where CPU processes share cores (`ClusterSpec.host_share`). Under
    sequence parallelism each row-parallel module closes a group (its parent's input
    gathered along the sequence, its output reduce-scattered: `executors.tensor_parallel`)
    priced at the spec's SP group figure (`tp_probes.sp_group_seconds`, a column- and a
    row-parallel module), the group's other column-parallel modules (k, v beside q) at
    the TP figure; a spec without the SP figure prices every module at the TP one. A
    vocab-parallel embedding prices at its own figure where the spec has one
    (`vocab_edge_seconds`), else as a TP module."""
    if strategy.tp == 1:
        return 0.0
    tables = cluster.calibration
    group_s = tables.sp_group_seconds(strategy.tp)
    with_vocab = tables.vocab_embedding_seconds(strategy.tp) is None  # else priced apart
    groups, modules = _groups_and_modules(layer, strategy, group_s is not None, with_vocab)
    seconds = groups * (group_s or 0.0) + modules * tables.tp_module_seconds(strategy.tp)
    return seconds * cluster.host_share if cluster.host_bound else seconds


@per_layer
def selective_tp_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec) -> float:
    """Host time op-level selective checkpointing adds to the layer's TP modules per
    micro-batch beyond what it adds to their plain ops: the spec's per-module and per-SP-
    group figures (`tp_probes.selective_seconds`: SAC's recompute reruns DTensor's sharding
    propagation and re-layouts above its cached ops; its forward's share read ~0, so all
    of it is the recompute's), counted as `tp_module_seconds` counts, stretched as it is;
    an SP layer prices its groups at the whole-block figure where the spec has one
    (`block_probes.sp_block_selective_seconds`: per group of a GPT-2 block, whose k and v
    modules, norms, attention core and gather hooks it holds, so only the modules beyond
    its SP_BLOCK_MODULES per SP_BLOCK_GROUPS groups add the per-module figure: a gated
    MLP's third Linear; its forward share is `selective_tp_forward_seconds`); 0 where the
    spec has no such figure (older specs, GPUs) or the layer no checkpoint."""
    figures = cluster.calibration.selective_seconds(strategy.tp)
    if (strategy.tp == 1 or figures is None
            or strategy.checkpoint is not Checkpoint.SELECTIVE):
        return 0.0
    module_s, group_s = figures
    groups, modules = _groups_and_modules(layer, strategy, True, with_vocab=False)
    block = cluster.calibration.sp_block_selective_seconds(strategy.tp)
    if groups and block is not None:
        beyond = modules + 2 * groups - groups * SP_BLOCK_MODULES // SP_BLOCK_GROUPS
        seconds = groups * block[0] + max(beyond, 0) * module_s
    else:
        seconds = groups * group_s + modules * module_s
    return seconds * cluster.host_share if cluster.host_bound else seconds


@per_layer
def selective_tp_forward_seconds(layer: Layer, strategy: LayerStrategy,
                                 cluster: ClusterSpec) -> float:
    """The forward's share of `selective_tp_seconds`: an SP layer's groups x the whole-block
    figure's forward (`block_probes`: SAC's caching mode on the block's DTensor ops),
    stretched as it is; 0 elsewhere (the Linear pairs' forward share read ~0)."""
    if strategy.tp == 1 or strategy.checkpoint is not Checkpoint.SELECTIVE:
        return 0.0
    block = cluster.calibration.sp_block_selective_seconds(strategy.tp)
    if block is None or cluster.calibration.selective_seconds(strategy.tp) is None:
        return 0.0
    groups, _ = _groups_and_modules(layer, strategy, True, with_vocab=False)
    seconds = groups * block[1]
    return seconds * cluster.host_share if cluster.host_bound else seconds


def _groups_and_modules(layer: Layer, strategy: LayerStrategy, sp_groups: bool,
                        with_vocab: bool) -> tuple[int, int]:
    """(SP module groups, TP modules outside them) of the layer: under sequence parallelism
    (and `sp_groups`) each row-parallel module closes a group of 2 (tp_probes: a column-
    and a row-parallel module); a vocab-parallel embedding counts only `with_vocab`."""
    modules = sum(1 for c in layer.tp_candidates
                  if with_vocab or c.style is not TPStyle.VOCAB)
    if not (sp_groups and sequence_parallel_applies(layer, strategy)):
        return 0, modules
    groups = sum(1 for c in layer.tp_candidates if c.style is TPStyle.ROWWISE)
    return groups, max(modules - 2 * groups, 0)


@per_layer
def vocab_edge_seconds(layer: Layer, strategy: LayerStrategy,
                       cluster: ClusterSpec) -> tuple[float, float, float]:
    """(forward, backward, loss forward) host seconds per micro-batch the vocabulary-parallel
    ends add beyond their plain ops and collectives: each vocab-parallel embedding its
    measured (forward, backward) figure, and each vocab-split head its loss-parallel
    cross-entropy's (`tp_probes`' sibling `vocab_probes`: thread CPU in groups of this TP
    degree; a head's loss runs loss-parallel, as `comm.tp_comm_s` prices its all-reduces);
    stretched like `tp_module_seconds`. The loss's forward share is returned apart too: it
    runs outside the layer's forward, so a recompute does not run it again. (0, 0, 0)
    where the spec has no such figure (older specs, GPUs)."""
    if strategy.tp == 1:
        return 0.0, 0.0, 0.0
    tables = cluster.calibration
    embedding = tables.vocab_embedding_seconds(strategy.tp) or (0.0, 0.0)
    loss = tables.loss_parallel_seconds(strategy.tp) or (0.0, 0.0)
    vocab = sum(1 for c in layer.tp_candidates if c.style is TPStyle.VOCAB)
    heads = sum(1 for c in layer.tp_candidates if c.style is TPStyle.HEAD)
    stretch = cluster.host_share if cluster.host_bound else 1.0
    # per pass: embeddings x their figure + heads x the loss's (measured per call)
    forward_s, backward_s = ((vocab * e + heads * lo) * stretch
                             for e, lo in zip(embedding, loss))
    return forward_s, backward_s, heads * loss[0] * stretch
