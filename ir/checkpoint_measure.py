"""What a checkpointed layer holds, measured by running it checkpointed on meta tensors.

    >>> measure_checkpointing(measurer, 3, colwise, rowwise)   # doctest: +SKIP
    {'selective_kept_bytes': ..., ..., 'full_backward_bytes': ...}

The executor checkpoints a layer with non-reentrant `torch.utils.checkpoint.checkpoint`
(`executors.checkpointing`); SELECTIVE adds torch's selective-checkpoint context with
`ir.checkpoint_policy.selective_policy`. Here the layer's nodes run the same way, once
per mode, on stand-in meta tensors inside a `LiveTensorTracker(meta=True)`, so the
figures are what torch keeps, not a model of it:

  kept        live bytes after the forward, the layer's outputs excepted (their next
              reader holds them): under SELECTIVE the checkpoint's inputs and the cached
              outputs of the ops the policy saves; under FULL the inputs alone.
  backward    the most bytes live during the layer's backward above what was live when
              it started: the recomputed forward's tensors, the gradients made inside the
              layer and the gradient of its inputs. Parameter gradients are left out
              from birth (the memory walk holds them as the layer's new gradient); the
              share of them made by the peak is kept (the peak comes early, right after
              the recomputation, before most exist).

Kept bytes are recorded by where they were made (`PHASE_OF_REGION_STATE`), as tensor
parallelism treats them differently. The figures are `LayerMeasurement` fields
(`ir.measure` adds them to each unique layer's record).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from ir.checkpoint_policy import selective_policy
from ir.memory_tracker import LiveTensorTracker
from ir.saved_tensors import TPRegion, storage_key, tensor_leaves
from ir.stand_in import meta_factory

# Where a kept tensor was made, for what tensor parallelism does to it (TPRegion's
# states): inside a column-parallel module or between it and the next row-parallel one
# (split t ways), by a row-parallel module (its partial sums: whole), elsewhere (whole;
# sequence parallelism splits it).
SHARDED, ROWWISE, REPLICATED = "tp_sharded", "rowwise", "replicated"
PHASE_OF_REGION_STATE = {"open_after": SHARDED, "open": SHARDED, "close_after": ROWWISE,
                         "closed": REPLICATED}


def measure_checkpointing(measurer, index: int, colwise=(), rowwise=()) -> dict[str, int]:
    """`LayerMeasurement` figures of layer `index` of a `GraphMeasurer` run checkpointed,
    SELECTIVE then FULL, on meta."""
    kept, selective_backward, selective_share = _run(measurer, index, colwise, rowwise,
                                                     selective=True)
    _, full_backward, full_share = _run(measurer, index, colwise, rowwise, selective=False)
    return {"selective_kept_bytes": sum(kept.values()),
            "selective_kept_tp_sharded_bytes": kept[SHARDED],
            "selective_kept_rowwise_bytes": kept[ROWWISE],
            "selective_backward_bytes": selective_backward,
            "selective_backward_grad_share": selective_share,
            "full_backward_bytes": full_backward, "full_backward_grad_share": full_share}


def _run(measurer, index: int, colwise, rowwise, *,
         selective: bool) -> tuple[dict[str, int], int, float]:
    """Bytes kept after the forward by where they were made, the peak of the backward
    above its start, and the share of its parameter gradients made by then, of one
    checkpointed run."""
    info = measurer.infos[index]
    # Fresh leaves: gradients of earlier measurements on the shared state stay out.
    state = {k: v.detach().requires_grad_(v.requires_grad) if isinstance(v, torch.Tensor) else v
             for k, v in measurer.layer_state(index).items()}
    runner = measurer.start_run(index, state, meta_factory)
    base_env = dict(runner.env)
    region = TPRegion(colwise, rowwise)
    tracker = LiveTensorTracker(record=True, meta=True)

    outputs = list(info.outputs) or [info.nodes.nodes[-1]]
    last_use = {a: n for n in info.nodes.nodes for a in n.all_input_nodes}

    def layer_forward(*values):
        runner.env = dict(base_env)
        runner.env.update(zip(info.inputs, values))
        try:
            for n in info.nodes.nodes:
                region.enter(info.module_paths[n])
                tracker.set_phase(PHASE_OF_REGION_STATE[region.state])
                runner.env[n] = runner.run_node(n)
                for a in n.all_input_nodes:  # a module's forward drops a value after its last use
                    if last_use[a] is n and a not in outputs and a in runner.env:
                        del runner.env[a]
            return tuple(runner.env[o] for o in outputs)
        finally:  # also when torch stops a recomputation early (an exception)
            runner.env = {}

    context_fn = (functools.partial(create_selective_checkpoint_contexts, selective_policy)
                  if selective else None)
    kwargs = {"context_fn": context_fn} if context_fn is not None else {}
    grads = _GradsBeforePeak(tracker)
    hooks = [p.register_post_accumulate_grad_hook(grads.land)
             for p in state.values() if isinstance(p, torch.Tensor) and p.requires_grad]
    try:
        with tracker:
            tracker.track(t for v in (*state.values(), *base_env.values())
                          for t in tensor_leaves(v))  # made before: not the layer's
            outs = checkpoint(layer_forward, *[base_env[a] for a in info.inputs],
                              use_reentrant=False, preserve_rng_state=False, **kwargs)
            tracker.set_phase(None)
            out_keys = {storage_key(t) for t in tensor_leaves(outs)}
            kept = [s for s in tracker.live_now()
                    if s.made_by != "track" and s.key not in out_keys]
            by_phase = {p: sum(s.nbytes for s in kept if s.phase == p)
                        for p in (SHARDED, ROWWISE, REPLICATED)}
            roots = [t for t in tensor_leaves(outs) if t.requires_grad and t.grad_fn is not None]
            seeds = [torch.ones_like(t) for t in roots]
            start = tracker.clock
            if roots:
                torch.autograd.backward(roots, seeds)
            backward, peak_clock = _backward_peak(tracker, start, grads)
    finally:
        for h in hooks:
            h.remove()
    return by_phase, backward, grads.share_by(peak_clock)


class _GradsBeforePeak:
    """Parameter gradients as they land in `.grad` (storage key, tracker clock, bytes)."""

    def __init__(self, tracker: LiveTensorTracker):
        self.tracker = tracker
        self.landed: list[tuple[int, int, int]] = []

    def land(self, param: torch.Tensor) -> None:
        if param.grad is not None:
            self.landed.append((storage_key(param.grad), self.tracker.clock,
                                param.grad.numel() * param.grad.element_size()))

    def is_grad(self, birth: int, death: int | None, key: int) -> bool:
        """Whether this lifetime is a storage that landed as a parameter's gradient."""
        return any(k == key and birth <= at and (death is None or death > at)
                   for k, at, _ in self.landed)

    def share_by(self, clock: int) -> float:
        """Of the gradients made, the share landed by `clock` (1 when none)."""
        total = sum(n for _, _, n in self.landed)
        return sum(n for _, at, n in self.landed if at <= clock) / total if total else 1.0


def _backward_peak(tracker: LiveTensorTracker, start: int, grads: _GradsBeforePeak
                   ) -> tuple[int, int]:
    """(most bytes live above those live at clock `start`, the clock it happened at),
    parameter gradients left out from birth: the weight gradients' own temporaries do
    not grow with the micro-batch, the walk holds them as the layer's new gradient."""
    deltas: dict[int, int] = {}
    for birth, death, s in tracker.lifetimes():
        if (death is not None and death <= start) or grads.is_grad(birth, death, s.key):
            continue
        if birth > start:
            deltas[birth] = deltas.get(birth, 0) + s.nbytes
        if death is not None:
            deltas[death] = deltas.get(death, 0) - s.nbytes
    live = peak = 0
    at = start
    for clock in sorted(deltas):
        live += deltas[clock]
        if live > peak:
            peak, at = live, clock
    return peak, at
