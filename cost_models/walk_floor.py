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
    # ZeRO-1's uneven moment shares: the most loaded device holds at least the mean.
    moments = (sum(mem.moment_shares) / len(mem.moment_shares) if mem.moment_shares
               else mem.states.optimizer)
    copy = mem.working_param_bytes if mem.has_unit and not mem.reshard_after_forward else 0.0
    # a unit keeps its gradient unreduced until the step's last backward
    grads = (mem.reduce_bytes if mem.has_unit else mem.states.grads) if grads_held else 0.0
    return mem.states.params + moments + copy + grads, kept


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
