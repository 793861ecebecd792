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

from cost_models.activations import LayerActivations, logits_bytes
from cost_models.model_states import ModelStates
from cost_models.pipeline_ops import PassOp
from cost_models.step_temporaries import optimizer_step_temp_bytes
from ir.layer import Layer, TPStyle
from ir.step_groups import StepGroup
from ir.strategy import LayerStrategy

# StageMemory rounds each of its five parts: peak_bytes is within 2.5 bytes of the sum.
PARTS_ROUNDING_BYTES = 3
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
    step_tensor_params: tuple[float, ...]  # elements of each local tensor it steps, in order
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
    # The lean host path (`ir.lean_host`); the defaults are FSDP2's own path.
    backward_gather_bytes: float | None = None  # gathered for backward (None: working)
    backward_prefetch: bool = True  # FSDP2 prefetches the next unit in backward
    reduce_input_bytes: float | None = None  # reduce-scatter's copy-in (None: reduce_bytes)
    retains_reduce_input: bool = True  # kept until the next unit's reduction
    reduce_scratch_bytes: float = 0.0  # the ring's receive buffer while it reduces
    # FSDP2 on a one-rank group: `input / gradient_divide_factor`, copied to the output
    # (torch 2.13 foreach_reduce; the executor sets the factor, `sum_reduction`)
    reduce_divide_bytes: float = 0.0
    step_group: StepGroup = StepGroup.ANY  # its param group's (`step_temporaries.step_group`)

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


def model_output_bytes(head: Layer, strategy: LayerStrategy, config) -> float:
    """Bytes of the model's output a final chunk holds per micro-batch
    (`ChunkMemory.held_output_bytes`): the logits, vocabulary-split under loss-parallel
    TP (0 for a layer that is no vocabulary head)."""
    split = strategy.tp if strategy.tp > 1 and any(
        c.style is TPStyle.HEAD for c in head.tp_candidates) else 1
    return logits_bytes(head, config) / split


# ---- one rank's step ---------------------------------------------------------------------


class OverLimit(Exception):
    """The walk saw more live bytes than the caller's `stop_above_bytes`."""


class _Walk:
    """The running sums of live bytes on one rank, and their maximum with the breakdown.

    Live bytes by key, each with its running sum, so a look costs O(1), not O(keys):
    copies (chunk, layer) -> gathered bytes; grads (chunk, layer) -> stored or
    accumulated gradients; acts (chunk, micro-batch) -> kept activations, with
    `in_flight` the number of entries above zero; held (chunk, micro-batch) -> output.
    The hot loops of `walk_rank` read these into local variables for one pass and write
    them back; the arithmetic is `look`'s, in the same order."""

    __slots__ = ("weights", "moments", "persistent", "copies", "copies_total", "grads",
                 "grads_total", "acts", "acts_total", "in_flight", "held", "held_total",
                 "retained_reduce", "best", "best_total", "limit")

    def __init__(self, chunks: Sequence[ChunkMemory], overhead_bytes: int,
                 limit_bytes: float = math.inf):
        layers = [l for c in chunks for l in c.layers]
        self.weights = sum(l.states.params for l in layers)
        self.moments = sum(l.states.optimizer for l in layers)
        self.persistent = sum(c.persistent_bytes for c in chunks)
        self.copies: dict[tuple[int, int], float] = {}
        self.copies_total = 0.0
        self.grads: dict[tuple[int, int], float] = {}
        self.grads_total = 0.0
        self.acts: dict[tuple[int, int], float] = {}
        self.acts_total = 0.0
        self.in_flight = 0
        self.held: dict[tuple[int, int], float] = {}
        self.held_total = 0.0
        self.retained_reduce = 0.0  # FSDP2's retained reduce-scatter input
        self.best: tuple | None = None
        self.best_total = -math.inf
        self.limit = limit_bytes  # live bytes (overhead excluded) beyond which to stop

    def look(self, phase: str, *, grads: float = 0.0, buffers: float = 0.0) -> None:
        """Record the live total now, with extra transient grads / buffers."""
        p0 = self.weights + self.copies_total
        p1 = self.grads_total + grads
        p3 = self.acts_total + self.held_total
        p4 = self.persistent + self.retained_reduce + buffers
        total = p0 + p1 + self.moments + p3 + p4
        if total > self.best_total:
            self._record(total, phase, (p0, p1, self.moments, p3, p4), self.in_flight)

    def _record(self, total: float, phase: str, parts: tuple, in_flight: int) -> None:
        self.best_total = total
        self.best = (total, phase, parts, in_flight)
        if total > self.limit:
            raise OverLimit

    def set_grad(self, key: tuple[int, int], nbytes: float) -> None:
        self.grads_total += nbytes - self.grads.get(key, 0.0)
        self.grads[key] = nbytes

    def pop_grad(self, key: tuple[int, int]) -> float:
        nbytes = self.grads.pop(key, 0.0)
        self.grads_total -= nbytes
        return nbytes

    def pop_copy(self, key: tuple[int, int]) -> float:
        nbytes = self.copies.pop(key, 0.0)
        self.copies_total -= nbytes
        return nbytes

    def pop_held(self, key: tuple[int, int]) -> None:
        self.held_total -= self.held.pop(key, 0.0)

    def pop_acts(self, key: tuple[int, int]) -> None:
        nbytes = self.acts.pop(key, 0.0)
        self.acts_total -= nbytes
        self.in_flight -= nbytes > 0


def walk_rank(chunks: Sequence[ChunkMemory], ops: Sequence[PassOp], *, stage: int,
              num_microbatches: int, pipelined: bool, overhead_bytes: int, optimizer: str,
              implementation: str, stop_above_bytes: float = math.inf) -> StageMemory:
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
    # per chunk and layer, what a forward reads: (copy key, gathered bytes or 0, kept, reshard)
    forwards = [[((ci, li), l.working_param_bytes if l.has_unit else 0.0,
                  l.activations.kept_bytes, l.reshard_after_forward)
                 for li, l in enumerate(c.layers)] for ci, c in enumerate(chunks)]
    backwards = [_backward_plan(c, ci) for ci, c in enumerate(chunks)]
    w.look("optimizer")  # between steps: nothing but the held states
    for forward, ci, microbatch in ops:  # PassOp fields
        key = (ci, microbatch)
        if forward:
            _forward(w, forwards[ci], key, chunks[ci].held_output_bytes)
            if not pipelined:  # the runtime's `output` now names this micro-batch's output
                w.pop_held((ci, microbatch - 1))
            continue
        _backward(w, backwards[ci], key, reduce=not pipelined and microbatch == last,
                  pipelined=pipelined)
        if pipelined:  # the stage's cached output goes with its backward
            w.pop_held(key)
        w.pop_acts(key)
        if pipelined and microbatch == last:
            _reduce_chunk(w, chunks[ci], ci)
    if not pipelined:
        w.held.clear()  # the runtime's `output` goes with the forward-backward call
        w.held_total = 0.0
    w.retained_reduce = 0.0  # released by FSDP2's root post-backward callback
    # After backward: the tied gradient sum, then the optimizer step.
    layers = [l for c in chunks for l in c.layers]
    tied = TIED_SUM_TEMPORARIES * max((l.tied_grad_bytes for l in layers), default=0.0)
    w.look("optimizer", buffers=tied)
    step = optimizer_step_temp_bytes(layers, optimizer, implementation)
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


def _forward(w: _Walk, layers: list[tuple], key: tuple[int, int], held_bytes: float) -> None:
    """One chunk's forward on one micro-batch: each layer gathers its unit (ZeRO-3),
    keeps its activations, may reshard; then the chunk's output is held."""
    copies, weights, moments = w.copies, w.weights, w.moments
    copies_total, acts_total, in_flight = w.copies_total, w.acts_total, w.in_flight
    old = w.acts.get(key, 0.0)  # the key restarts at zero
    in_flight -= old > 0
    acts_total += 0.0 - old
    kept_now = 0.0
    p1 = w.grads_total  # grads, held and buffers do not change during a forward
    p4 = w.persistent + w.retained_reduce
    held_total = w.held_total
    best_total = w.best_total
    for unit_key, gathered, kept, reshard in layers:
        if gathered:  # all-gather
            copies_total += gathered - copies.get(unit_key, 0.0)
            copies[unit_key] = gathered
        new = kept_now + kept
        acts_total += kept
        in_flight += (new > 0) - (kept_now > 0)
        kept_now = new
        p0 = weights + copies_total
        p3 = acts_total + held_total
        total = p0 + p1 + moments + p3 + p4
        if total > best_total:
            best_total = total
            w._record(total, "forward", (p0, p1, moments, p3, p4), in_flight)
        if reshard:
            copies_total -= copies.pop(unit_key, 0.0)
    w.acts[key] = kept_now
    w.copies_total, w.acts_total, w.in_flight = copies_total, acts_total, in_flight
    w.held_total += held_bytes - w.held.get(key, 0.0)
    w.held[key] = held_bytes
    w.look("forward")


def _backward_plan(chunk: ChunkMemory, ci: int) -> list[tuple]:
    """Per layer in backward order, what its backward reads (see `_backward`)."""
    prior, last_unit = [], -1  # the nearest earlier DP unit in the chunk (-1: none)
    for li, l in enumerate(chunk.layers):
        prior.append(last_unit)
        if l.has_unit:
            last_unit = li
    out = []
    for li in reversed(range(len(chunk.layers))):
        l = chunk.layers[li]
        a = l.activations
        p = prior[li]
        prefetch_key = (ci, p) if (l.has_unit and l.reshard_after_forward and p >= 0
                                   and l.backward_prefetch) else None
        prefetch_bytes = _backward_gather(chunk.layers[p]) if prefetch_key else 0.0
        out.append(((ci, li), l, l.has_unit, _backward_gather(l), prefetch_key, prefetch_bytes,
                    l.unsharded_grad_bytes if l.has_unit else l.states.grads,
                    a.backward_grad_share, a.recompute_bytes, a.grad_flow_bytes, a.kept_bytes,
                    a.end_flow_bytes, a.reduce_flow_bytes))
    return out


def _backward_gather(l: LayerMemory) -> float:
    """Bytes a unit is gathered to for its backward."""
    return l.working_param_bytes if l.backward_gather_bytes is None else l.backward_gather_bytes


def _backward(w: _Walk, layers: list[tuple], key: tuple[int, int], *, reduce: bool,
              pipelined: bool) -> None:
    """One chunk's backward on one micro-batch, layer by layer in reverse, each followed
    by its FSDP2 post-backward (reduce or accumulate).

    A layer whose backward the IR measured (checkpointed, or plain read off the same
    run: `activations._plain_backward`) is priced at its measured peak, with the share
    of its gradient made by then, and at its end (whole gradient, kept bytes freed).
    Otherwise the IR does not say in which order its backward frees its saved tensors
    and makes its gradient, so we bound it by both at once: all its activations, its
    whole new gradient and the gradients flowing through it."""
    copies, grads, weights, moments = w.copies, w.grads, w.weights, w.moments
    acts_now = w.acts[key]
    # the running sums in locals, written back around `_reduce_unit` (as `_forward`)
    copies_total, grads_total, acts_total = w.copies_total, w.grads_total, w.acts_total
    in_flight, best_total, retained = w.in_flight, w.best_total, w.retained_reduce
    persistent, held_total = w.persistent, w.held_total  # not changed by a backward
    for (lkey, l, has_unit, gather, prefetch_key, prefetch_bytes, new_grad, share,
         recompute, grad_flow, kept, end_flow, reduce_flow) in layers:
        prefetch = 0.0
        if has_unit:
            old = copies.get(lkey, 0.0)
            if gather > old or lkey not in copies:  # ZeRO-3 gathers again (else a no-op)
                copies_total += gather - old
                copies[lkey] = gather
            if prefetch_key is not None and prefetch_key not in copies:
                prefetch = prefetch_bytes  # the next unit in backward order, prefetched
        elif lkey in grads:
            # AccumulateGrad keeps the first gradient and adds later ones from a temporary.
            grads_total += l.states.grads - grads[lkey]
            grads[lkey] = l.states.grads
        p0 = weights + copies_total
        p3 = acts_total + held_total
        if share < 1:
            # A layer whose backward was measured (checkpointed, or plain from the same
            # run: `activations._plain_backward`) peaks with the share of its gradient
            # made by then (`ir.checkpoint_measure`); it ends holding all of its gradient
            # and the gradients flowing through it, its kept activations freed.
            p1 = grads_total + new_grad * share
            p4 = persistent + retained + (recompute + grad_flow + prefetch)
            total = p0 + p1 + moments + p3 + p4
            if total > best_total:
                best_total = total
                w._record(total, "backward", (p0, p1, moments, p3, p4), in_flight)
            p1 = grads_total + new_grad
            p3 -= kept
            p4 = persistent + retained + (end_flow + prefetch)
        else:
            p1 = grads_total + new_grad
            p4 = persistent + retained + (recompute + grad_flow + prefetch)
        total = p0 + p1 + moments + p3 + p4
        if total > best_total:
            best_total = total
            w._record(total, "backward", (p0, p1, moments, p3, p4), in_flight)
        new = acts_now + -kept
        acts_total += -kept
        in_flight += (new > 0) - (acts_now > 0)
        acts_now = new
        if not has_unit:
            grads_total += l.states.grads - grads.get(lkey, 0.0)
            grads[lkey] = l.states.grads
            continue
        if not pipelined:
            copies_total -= copies.pop(lkey, 0.0)  # reshard after backward
        if not reduce:
            # kept unreduced, in the reduce dtype
            grads_total += l.reduce_bytes - grads.get(lkey, 0.0)
            grads[lkey] = l.reduce_bytes
            continue
        w.acts[key] = acts_now
        w.copies_total, w.grads_total, w.acts_total = copies_total, grads_total, acts_total
        w.in_flight = in_flight
        _reduce_unit(w, l, lkey, incoming=reduce_flow,
                     unreduced=w.pop_grad(lkey) or l.unsharded_grad_bytes)
        grads_total, best_total, retained = w.grads_total, w.best_total, w.retained_reduce
    w.acts[key] = acts_now
    w.copies_total, w.grads_total, w.acts_total = copies_total, grads_total, acts_total
    w.in_flight = in_flight


def _reduce_unit(w: _Walk, l: LayerMemory, key: tuple[int, int], incoming: float,
                 unreduced: float) -> None:
    """FSDP2 post-backward reduction of one unit (torch's `foreach_reduce`): the previous
    unit's retained input is released; the unreduced gradient is copied into the
    reduce-scatter input, then freed (the list holding it is cleared) before the output
    (the stored gradient) is made beside the input (and, on a one-rank group, the input
    divided: `reduce_divide_bytes`); the input is retained. On the lean host path
    (`ir.lean_host`: its copy-in, none when reduced in place) all exist at once."""
    w.retained_reduce = 0.0
    phase = "backward" if incoming else "reduce"
    copy_in = l.reduce_bytes if l.reduce_input_bytes is None else l.reduce_input_bytes
    if l.retains_reduce_input:  # FSDP2's own foreach_reduce (the lean path retains none)
        w.look(phase, grads=unreduced, buffers=copy_in + incoming)
        w.look(phase, grads=l.states.grads, buffers=copy_in + l.reduce_divide_bytes + incoming)
    else:
        w.look(phase, grads=unreduced + l.states.grads,
               buffers=copy_in + l.reduce_scratch_bytes + incoming)
    w.set_grad(key, l.states.grads)
    w.retained_reduce = copy_in if l.retains_reduce_input else 0.0


def _reduce_chunk(w: _Walk, chunk: ChunkMemory, index: int) -> None:
    """A pipeline chunk's reduction after its last backward, unit by unit in forward order."""
    for li, l in enumerate(chunk.layers):
        if not l.has_unit:
            continue
        key = (index, li)
        w.pop_copy(key)
        _reduce_unit(w, l, key, incoming=0.0, unreduced=w.pop_grad(key))
    w.retained_reduce = 0.0  # the stage's root post-backward callback releases it
