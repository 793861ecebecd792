"""One pipeline rank's training step walked pass by pass: the live bytes and their peak.

`cost_models.memory` turns a plan into per-layer figures (`LayerMemory`) grouped into
model chunks (`ChunkMemory`); `walk_rank` replays the rank's passes
(`pipeline_ops.rank_ops`) and keeps a running total of what is alive (what each term
holds: `cost_models.memory`'s docstring). The totals are kept as the walk goes, so
reading the live bytes costs the same however many layers a rank holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cost_models.activations import LayerActivations
from cost_models.model_states import FP32_BYTES, OPTIMIZER_MOMENTS, ModelStates
from cost_models.pipeline_ops import PassOp

# StageMemory rounds each of its five parts: peak_bytes is within 2.5 bytes of the sum.
PARTS_ROUNDING_BYTES = 3
# PyTorch's single-tensor Adam (the CPU default) makes two parameter-sized temporaries
# (sqrt(v), then / bias correction) for one tensor at a time; the foreach path (GPU
# default) makes one moment-sized temporary for all tensors at once.
ADAM_SINGLE_TENSOR_TEMPORARIES = 2
ADAM_FOREACH_TEMPORARIES = 1
# executors.tied.TiedGradients.sync: `sum(full gradients)` holds the running sum and the
# new one while adding the next full gradient.
TIED_SUM_TEMPORARIES = 2



@dataclass(frozen=True, slots=True)
class LayerMemory:
    """Everything the step walk needs from one layer (one rank, one micro-batch)."""

    states: ModelStates  # held all step: stored weights, stored gradients, moments
    activations: LayerActivations
    gather_unit_bytes: float  # ZeRO-3: the working copy, gathered for each use (else 0)
    unsharded_grad_bytes: float  # a DP unit's gradient before its reduction (else 0)
    largest_tensor_params: float  # elements of its largest local tensor (Adam temporaries)
    fp32_moment_bytes: float  # one fp32 copy of the rank's moment-sharded parameters
    working_param_bytes: float = 0.0  # a DP unit's gathered copy (0: no unit)
    reduce_bytes: float = 0.0  # a DP unit's reduce-scatter input; unreduced accumulation
    tied_grad_bytes: float = 0.0  # full gradient of its tied copies (TiedGradients.sync)
    zero1_share_bytes: float = 0.0  # ZeRO-1: its all-gather's send and receive buffers
    zero1_master_grad_bytes: float = 0.0  # ZeRO-1: fp32 gradient shard during the step
    reshard_after_forward: bool = False  # ZeRO-3 frees the working copy after forward
    # Moment bytes of each DP rank where they differ; `states` holds the most loaded
    # one's. Empty: every rank of the group holds `states.optimizer` (ZeRO-1's flat
    # shards are even, `model_states.moment_shares`).
    moment_shares: tuple[float, ...] = ()
    host_bytes: float = 0.0  # offloaded model states, in host memory (cost_models.offload)

    @property
    def has_unit(self) -> bool:
        return self.working_param_bytes > 0



@dataclass(frozen=True, slots=True)
class ChunkMemory:
    """One model chunk (pipeline stage) on a rank: its layers in order, plus what the
    runtime holds around them."""

    layers: tuple[LayerMemory, ...]
    held_output_bytes: float = 0.0  # per micro-batch, from its forward to its backward
    persistent_bytes: float = 0.0  # allocated once: pipeline receive buffers


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Peak memory of one pipeline rank and its parts at that peak (bytes)."""

    stage: int  # pipeline rank
    params: int
    grads: int
    optimizer: int
    activations: int
    buffers: int
    overhead: int
    peak_bytes: int
    phase: str  # when the peak happens: "forward", "backward", "reduce" or "optimizer"
    microbatches_in_flight: float
    # Peak of each device of the pipeline rank (TP innermost, then DP), where they differ:
    # ZeRO-1 gives whole tensors' moments to each owner. `peak_bytes` is the largest.
    device_peak_bytes: tuple[int, ...] = ()
    host_bytes: int = 0  # offloaded model states per rank, in host memory (not in peak_bytes)

    def breakdown(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "buffers": self.buffers,
                "overhead": self.overhead}

    def to_json(self) -> dict:
        out = {"stage": self.stage, "peak_bytes": self.peak_bytes,
               "breakdown": self.breakdown(), "phase": self.phase,
               "microbatches_in_flight": self.microbatches_in_flight}
        if self.device_peak_bytes:
            out["device_peak_bytes"] = list(self.device_peak_bytes)
        out["host_bytes"] = self.host_bytes
        return out


def optimizer_step_temp_bytes(layers: Sequence[LayerMemory], optimizer: str,
                              foreach: bool) -> float:
    """Temporaries of one optimizer step (PyTorch's Adam/AdamW implementations)."""
    if OPTIMIZER_MOMENTS.get(optimizer, 0) < 2:
        return 0.0  # SGD (with or without momentum, no weight decay) updates in place
    if foreach:
        return ADAM_FOREACH_TEMPORARIES * sum(l.fp32_moment_bytes for l in layers)
    biggest = max((l.largest_tensor_params for l in layers), default=0.0)
    return ADAM_SINGLE_TENSOR_TEMPORARIES * biggest * FP32_BYTES


# ---- one rank's step ---------------------------------------------------------------------


class _Live:
    """Live bytes by key with their running sum, so a look costs O(1), not O(keys)."""

    __slots__ = ("bytes", "total")

    def __init__(self) -> None:
        self.bytes: dict[tuple[int, int], float] = {}
        self.total = 0.0

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self.bytes

    def set(self, key: tuple[int, int], nbytes: float) -> None:
        self.total += nbytes - self.bytes.get(key, 0.0)
        self.bytes[key] = nbytes

    def add(self, key: tuple[int, int], nbytes: float) -> None:
        self.bytes[key] += nbytes
        self.total += nbytes

    def pop(self, key: tuple[int, int]) -> float:
        nbytes = self.bytes.pop(key, 0.0)
        self.total -= nbytes
        return nbytes

    def clear(self) -> None:
        self.bytes.clear()
        self.total = 0.0


class _Kept(_Live):
    """Kept activations per (chunk, micro-batch), also counting the entries above zero
    (the micro-batches in flight) as they change."""

    __slots__ = ("in_flight",)

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0

    def set(self, key: tuple[int, int], nbytes: float) -> None:
        self.in_flight += (nbytes > 0) - (self.bytes.get(key, 0.0) > 0)
        super().set(key, nbytes)

    def add(self, key: tuple[int, int], nbytes: float) -> None:
        old = self.bytes[key]
        self.bytes[key] = new = old + nbytes
        self.total += nbytes
        self.in_flight += (new > 0) - (old > 0)

    def pop(self, key: tuple[int, int]) -> float:
        nbytes = super().pop(key)
        self.in_flight -= nbytes > 0
        return nbytes


class OverLimit(Exception):
    """The walk saw more live bytes than the caller's `stop_above_bytes`."""


class _Walk:
    """The running sum of live bytes on one rank, and its maximum with the breakdown."""

    def __init__(self, chunks: Sequence[ChunkMemory], overhead_bytes: int,
                 limit_bytes: float = math.inf):
        layers = [l for c in chunks for l in c.layers]
        self.weights = sum(l.states.params for l in layers)
        self.moments = sum(l.states.optimizer for l in layers)
        self.persistent = sum(c.persistent_bytes for c in chunks)
        self.overhead = overhead_bytes
        self.copies = _Live()  # (chunk, layer) -> gathered bytes
        self.grads = _Live()  # (chunk, layer) -> stored or accumulated gradients
        self.acts = _Kept()  # (chunk, micro-batch) -> kept
        self.held = _Live()  # (chunk, micro-batch) -> output
        self.retained_reduce = 0.0  # FSDP2's retained reduce-scatter input
        self.best: tuple | None = None
        self.best_total = -math.inf
        self.limit = limit_bytes  # live bytes (overhead excluded) beyond which to stop

    def look(self, phase: str, *, grads: float = 0.0, weights: float = 0.0,
             buffers: float = 0.0) -> None:
        """Record the live total now, with extra transient grads / weights / buffers."""
        p0 = self.weights + self.copies.total + weights
        p1 = self.grads.total + grads
        p3 = self.acts.total + self.held.total
        p4 = self.persistent + self.retained_reduce + buffers
        total = p0 + p1 + self.moments + p3 + p4
        if total > self.best_total:
            self.best_total = total
            self.best = (total, phase, (p0, p1, self.moments, p3, p4), self.acts.in_flight)
            if total > self.limit:
                raise OverLimit


def walk_rank(chunks: Sequence[ChunkMemory], ops: Sequence[PassOp], *, stage: int,
              num_microbatches: int, pipelined: bool, overhead_bytes: int, optimizer: str,
              foreach: bool, stop_above_bytes: float = math.inf) -> StageMemory:
    """Peak memory of one pipeline rank over one step (see the module docstring).

    `pipelined`: torch.distributed.pipelining runs the passes; FSDP2 units then keep
    their working copies and unreduced gradients until the chunk's last backward
    (PipelineStage.backward_maybe_with_nosync), then reduce (perform_reduce_grad).
    Otherwise the executor's loop reduces in the last micro-batch's backward and the
    units reshard after every backward (FSDP2's defaults).

    Raises OverLimit as soon as the peak is sure to exceed `stop_above_bytes` (callers
    that only want the smallest peak of many plans stop walking the others early); the
    margin covers the rounding of the five parts."""
    w = _Walk(chunks, overhead_bytes, stop_above_bytes - overhead_bytes + PARTS_ROUNDING_BYTES)
    last = num_microbatches - 1
    prior_units = [_prior_units(c) for c in chunks]
    # per chunk and layer, what a forward reads: (copy key, gathered bytes or 0, kept, reshard)
    forwards = [[((ci, li), l.working_param_bytes if l.has_unit else 0.0,
                  l.activations.kept_bytes, l.reshard_after_forward)
                 for li, l in enumerate(c.layers)] for ci, c in enumerate(chunks)]
    acts, copies, look = w.acts, w.copies, w.look
    look("optimizer")  # between steps: nothing but the held states
    for op in ops:
        chunk = chunks[op.chunk]
        key = (op.chunk, op.microbatch)
        if op.forward:
            acts.set(key, 0.0)
            for unit_key, gathered, kept, reshard in forwards[op.chunk]:
                if gathered:
                    copies.set(unit_key, gathered)  # all-gather
                acts.add(key, kept)
                look("forward")
                if reshard:
                    copies.pop(unit_key)
            w.held.set(key, chunk.held_output_bytes)
            w.look("forward")
            if not pipelined:  # the runtime's `output` now names this micro-batch's output
                w.held.pop((op.chunk, op.microbatch - 1))
            continue
        units_before = prior_units[op.chunk]
        for li in reversed(range(len(chunk.layers))):
            _backward_layer(w, chunk, op, li, units_before[li],
                            reduce=not pipelined and op.microbatch == last, pipelined=pipelined)
        if pipelined:  # the stage's cached output goes with its backward
            w.held.pop(key)
        w.acts.pop(key)
        if pipelined and op.microbatch == last:
            _reduce_chunk(w, chunk, op.chunk)
    if not pipelined:
        w.held.clear()  # the runtime's `output` goes with the forward-backward call
    w.retained_reduce = 0.0  # released by FSDP2's root post-backward callback
    # After backward: the tied gradient sum, then the optimizer step.
    layers = [l for c in chunks for l in c.layers]
    tied = TIED_SUM_TEMPORARIES * max((l.tied_grad_bytes for l in layers), default=0.0)
    w.look("optimizer", buffers=tied)
    step = optimizer_step_temp_bytes(layers, optimizer, foreach)
    w.look("optimizer", buffers=step + sum(l.zero1_master_grad_bytes for l in layers))
    zero1 = max((l.zero1_share_bytes for l in layers), default=0.0)  # one layer at a time
    w.look("optimizer", buffers=zero1)
    total, phase, (params, grads, opt, acts, bufs), in_flight = w.best
    parts = [round(params), round(grads), round(opt), round(acts), round(bufs)]
    return StageMemory(stage=stage, params=parts[0], grads=parts[1], optimizer=parts[2],
                       activations=parts[3], buffers=parts[4], overhead=overhead_bytes,
                       peak_bytes=sum(parts) + overhead_bytes, phase=phase,
                       microbatches_in_flight=in_flight / max(len(chunks), 1),
                       host_bytes=round(sum(l.host_bytes for c in chunks for l in c.layers)))


def _prior_units(chunk: ChunkMemory) -> list[int]:
    """Per layer, the index of the nearest earlier DP unit in its chunk (-1: none)."""
    out, last = [], -1
    for li, l in enumerate(chunk.layers):
        out.append(last)
        if l.has_unit:
            last = li
    return out


def _backward_layer(w: _Walk, chunk: ChunkMemory, op: PassOp, li: int, prior_unit: int, *,
                    reduce: bool, pipelined: bool) -> None:
    """One layer's backward, then its FSDP2 post-backward (reduce or accumulate).

    Without checkpointing the IR does not say in which order a layer's backward frees
    its saved tensors and makes its gradient, so we bound it by both at once: all its
    activations, its whole new gradient and the gradients flowing through it (measured
    peaks fall between this and the start of the layer's backward). A checkpointed
    layer's backward was measured: its peak and the gradient made by then."""
    l = chunk.layers[li]
    key = (op.chunk, li)
    acts = l.activations
    prefetch = 0.0
    if l.has_unit:
        w.copies.set(key, l.working_param_bytes)  # ZeRO-3 gathers again (no-op otherwise)
        if l.reshard_after_forward:  # the next unit in backward order, prefetched
            if prior_unit >= 0 and (op.chunk, prior_unit) not in w.copies:
                prefetch = chunk.layers[prior_unit].working_param_bytes
        new_grad = l.unsharded_grad_bytes
    else:
        # AccumulateGrad keeps the first gradient and adds later ones from a temporary.
        new_grad = l.states.grads
        if key in w.grads:
            w.grads.set(key, l.states.grads)
    if acts.backward_grad_share < 1:
        # A checkpointed layer peaks right after its recomputation, with the share of
        # its gradient made by then (measured: `ir.checkpoint_measure`); it ends
        # holding all of its gradient and the gradients flowing through it.
        w.look("backward", grads=new_grad * acts.backward_grad_share,
               buffers=acts.recompute_bytes + acts.grad_flow_bytes + prefetch)
        w.look("backward", grads=new_grad, buffers=acts.grad_flow_bytes + prefetch)
    else:
        w.look("backward", grads=new_grad,
               buffers=acts.recompute_bytes + acts.grad_flow_bytes + prefetch)
    w.acts.add((op.chunk, op.microbatch), -acts.kept_bytes)
    if not l.has_unit:
        w.grads.set(key, l.states.grads)
        return
    if not pipelined:
        w.copies.pop(key)  # reshard after backward
    if not reduce:
        w.grads.set(key, l.reduce_bytes)  # kept unreduced, in the reduce dtype
        return
    _reduce_unit(w, l, key, incoming=acts.grad_flow_bytes,
                 unreduced=w.grads.pop(key) or l.unsharded_grad_bytes)


def _reduce_unit(w: _Walk, l: LayerMemory, key: tuple[int, int], incoming: float,
                 unreduced: float) -> None:
    """FSDP2 post-backward reduction of one unit: the previous unit's retained input is
    released, this unit's reduce-scatter input and output exist beside its unreduced
    gradient, then the output is the stored gradient and the input is retained."""
    w.retained_reduce = 0.0
    w.look("backward" if incoming else "reduce", grads=unreduced + l.states.grads,
           buffers=l.reduce_bytes + incoming)
    w.grads.set(key, l.states.grads)
    w.retained_reduce = l.reduce_bytes


def _reduce_chunk(w: _Walk, chunk: ChunkMemory, index: int) -> None:
    """A pipeline chunk's reduction after its last backward, unit by unit in forward order."""
    for li, l in enumerate(chunk.layers):
        if not l.has_unit:
            continue
        key = (index, li)
        w.copies.pop(key)
        _reduce_unit(w, l, key, incoming=0.0, unreduced=w.grads.pop(key))
    w.retained_reduce = 0.0  # the stage's root post-backward callback releases it


