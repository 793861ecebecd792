"""A per-layer, additive lower bound on one rank's walked peak, for the search's program.

When a rank finishes the forward that brings its in-flight micro-batches to k (1F1B and
GPipe: the last warm-up forward, k = `pipeline.microbatches_in_flight`; no pipeline:
each forward, k = 1), the walk (`memory_walk.walk_rank`) holds at least

    sum_j (P_j + O_j)     stored weights and moments, all step
  + sum_j W_j             the working copies of DP units that do not reshard after forward
  + k sum_j K_j           kept activations of the k micro-batches
  + sum_j G_j             gradients, where an earlier backward made them: 1F1B with more
                          micro-batches than ranks (its steady state repeats that forward
                          after the first backward), accumulation without a pipeline

  + the pipeline's receive buffers, held all step (`PipelineBuffersFloor`)

so peak - overhead >= sum_j (state_j + k x kept_j) + buffers with state = P + O + W
(+ G), the form the dynamic program adds up (the buffers come off the rank's budget). A
plan this bound rejects cannot fit by the walk; a plan it admits is walked before it is
returned (`planner.search._solve_fitting`). What it leaves out (the cached stage outputs,
every backward transient, the optimizer step) only makes it lower.

Without a pipeline the walk often peaks in the last micro-batch's backward instead, when
layer j runs its backward: the layers before j still hold what the forward left
(`walk_floor_row`, k = 1), the layers behind j hold their stored gradients instead of
their activations and working copies (`backward_floor_row`'s `after`), and layer j holds
its backward's transients (its `during`); the final layer adds the model's output, held
all backward (`memory_walk.model_output_bytes`). That sum is a floor at point j
(`planner.point_floor`), one more lower bound on the same walk.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ir.layer import Layer
from ir.legality import sequence_parallel_applies
from ir.strategy import Checkpoint, LayerStrategy, Schedule

from cost_models.common import StepConfig
from cost_models.memory_walk import LayerMemory


def forward_after_backward(schedule: Schedule, pp: int, num_microbatches: int) -> bool:
    """Whether some forward ends with an earlier backward's gradients held (module
    docstring): 1F1B's steady state (more micro-batches than ranks), or accumulation
    without a pipeline. GPipe runs every forward first."""
    if pp == 1:
        return num_microbatches > 1
    return schedule is Schedule.ONE_F_ONE_B and num_microbatches > pp


def walk_floor_row(layer: Layer, strategy: LayerStrategy, config: StepConfig,
                   mem: LayerMemory, grads_held: bool) -> tuple[float, float]:
    """(state, kept) bytes of one layer such that, on any rank holding it with k
    micro-batches in flight, sum(state + k x kept) is at most the walk's peak less the
    overhead. `grads_held`: `forward_after_backward`."""
    # The walk's kept bytes may be smaller by the layer's kept input, which an earlier
    # layer on the rank may already keep (memory.shared_boundary_saves,
    # shared_checkpoint_inputs, a receive buffer): count only what no sharing removes.
    kept_input = layer.input_bytes if strategy.checkpoint is Checkpoint.FULL \
        else layer.saved_input_bytes
    split = strategy.tp if sequence_parallel_applies(layer, strategy) else 1
    kept = max(0.0, mem.activations.kept_bytes - kept_input * config.activation_scale / split)
    copy = mem.working_param_bytes if mem.has_unit and not mem.reshard_after_forward else 0.0
    return mem.states.params + _moments(mem) + copy + _held_grads(mem, grads_held), kept


def _moments(mem: LayerMemory) -> float:
    """ZeRO-1's uneven moment shares: the most loaded device holds at least the mean."""
    return (sum(mem.moment_shares) / len(mem.moment_shares) if mem.moment_shares
            else mem.states.optimizer)


def _held_grads(mem: LayerMemory, grads_held: bool) -> float:
    """Gradients an earlier backward left: a unit keeps its own unreduced until the
    step's last backward."""
    return (mem.reduce_bytes if mem.has_unit else mem.states.grads) if grads_held else 0.0


def backward_floor_row(layer: Layer, strategy: LayerStrategy, config: StepConfig,
                       mem: LayerMemory, grads_held: bool) -> tuple[float, float]:
    """(after, during) bytes of one layer on a rank without a pipeline, in the step's last
    micro-batch (module docstring): once its backward is done (its unit reduced and
    resharded, `memory_walk._backward`), and the least of it the walk holds at one look
    of that backward or of its unit's reduction (`memory_walk._reduce_unit`)."""
    _, kept = walk_floor_row(layer, strategy, config, mem, grads_held)
    base = mem.states.params + _moments(mem)
    held = _held_grads(mem, grads_held)
    a = mem.activations
    if mem.has_unit:  # gathered again for backward where it resharded after forward
        gather = mem.working_param_bytes if mem.backward_gather_bytes is None \
            else mem.backward_gather_bytes
        copy = gather if mem.reshard_after_forward else max(gather, mem.working_param_bytes)
        new_grad = mem.unsharded_grad_bytes
    else:
        copy, new_grad = 0.0, mem.states.grads
    if a.backward_grad_share < 1:  # measured: its peak, then its end (kept freed)
        look = max(kept + a.backward_grad_share * new_grad + a.recompute_bytes
                   + a.grad_flow_bytes, new_grad + a.end_flow_bytes)
    else:
        look = kept + new_grad + a.recompute_bytes + a.grad_flow_bytes
    during = base + copy + held + look
    if mem.has_unit:  # its reduction: copy-in with the unreduced gradient, then its shard
        copy_in = mem.reduce_bytes if mem.reduce_input_bytes is None else mem.reduce_input_bytes
        reduce = (base + max(held or mem.unsharded_grad_bytes,
                             mem.states.grads + mem.reduce_divide_bytes) + copy_in
                  + mem.reduce_scratch_bytes + a.reduce_flow_bytes)
        during = max(during, reduce)
    return base + mem.states.grads, during


@dataclass(frozen=True)
class PipelineBuffersFloor:
    """buffers(a, final): bytes of the pipeline buffers (`memory._pipeline_buffers`: a
    receive buffer per micro-batch for the activation entering a stage and for the
    gradient of the one leaving it, allocated once) that any rank whose stage starts at
    layer a holds, at least: `crossing` (bytes after each layer at the graph's batch)
    at `scale`, the least factor any layout of the candidate scales them by; the stage's
    send at the least crossing of the cuts from a on (none for the last stage)."""

    crossing: list[float]
    cut_points: list[int]
    num_microbatches: int
    scale: float

    def __call__(self, a: int, final: bool) -> float:
        received = self.crossing[a - 1] if a > 0 else 0.0
        sent = 0.0 if final else self._least_cut_from[a]
        return self.num_microbatches * self.scale * (received + sent)

    @functools.cached_property
    def _least_cut_from(self) -> list[float]:
        """Per layer a, the least crossing of the cuts at or after a (0.0: none)."""
        out, least = [0.0] * len(self.crossing), math.inf
        cuts = set(self.cut_points)
        for j in range(len(self.crossing) - 1, -1, -1):
            least = min(least, self.crossing[j]) if j in cuts else least
            out[j] = 0.0 if least == math.inf else least
        return out

    @property
    def least_rank_bytes(self) -> float:
        """The least any rank holds: the first stage's send or a later one's receive."""
        return min([self(0, False)] + [self(c + 1, True) for c in self.cut_points])
