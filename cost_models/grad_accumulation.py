"""Bytes and GPU seconds of a step's gradient accumulation.

With m > 1 micro-batches the executor's own loop turns gradient sync off until the last
one (`executors.data_parallel.set_gradient_sync`), so each backward after the first adds
its gradients into the ones before. torch.distributed.pipelining turns it off for every
backward, the last included (`_PipelineStageBase.backward_maybe_with_nosync`), and
reduces in its REDUCE_GRAD action (`perform_reduce_grad` runs FSDP2's post-backward): a
pipelined unit takes the accumulation path even at m = 1. Two paths, read off torch 2.13:

- autograd's AccumulateGrad: a parameter whose gradient already has the reduce dtype
  (fp32 training, DP unit or not: FSDP2's `FSDPParam.to_accumulated_grad_if_needed`
  returns early) gets `grad += new` from the second micro-batch on, reading both
  operands and writing one: 3 x 4 bytes per parameter, m - 1 times a step.
- FSDP2 under mixed precision (compute dtype of c bytes, reduce dtype r = 4): after the
  first micro-batch's backward `to_accumulated_grad_if_needed` casts the unsharded
  gradient to fp32 ((c + r) P); each later one `accumulate_unsharded_grad_if_needed`
  adds the new gradient into that sum ((2r + c) P, m - 1 times); the last micro-batch's
  reduction then reads the fp32 sum where a step of one micro-batch reads the c-byte
  gradient (`dp_copies` prices the latter's `_chunk_cat`: (r - c) P more). In all
  2 r P + (m - 1)(2r + c) P, at any m under a pipeline.

P is what the rank holds of the layer's gradient while it accumulates: its TP-local
parameters, whole over DP (the unsharded gradient; `model_states.held_local_params`).

On a GPU each is a memory-bound kernel per parameter tensor, priced at the kit's rate
for its kind (`kernel_time.streaming_seconds`); Megatron-LM's fused weight-gradient
accumulation into fp32 main grads (`gradient_accumulation_fusion`) would hide them, but
the executor runs FSDP2, which does not. On CPU processes `step_host.grad_accumulation_s`
prices the adds with the kit's measured host figure per tensor as well (0 here).
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.layer import Layer
from ir.strategy import LayerStrategy, Precision

from cost_models.common import StepConfig
from cost_models.dp_copies import REDUCE_BYTES
from cost_models.kernel_time import streaming_seconds
from cost_models.model_states import has_dp_unit, held_local_params

# An in-place add (`grad += new`, AccumulateGrad) reads both operands and writes one.
ACCUMULATE_BYTES_PER_GRAD_BYTE = 3


@dataclass(frozen=True, slots=True)
class AccumulationBytes:
    """One step's accumulation traffic on the rank for one layer (module docstring)."""

    tensors: int
    upcast_bytes: float  # FSDP2: the first micro-batch's gradient cast to fp32
    sum_read_bytes: float  # FSDP2: the last reduction reads the fp32 sum, not c bytes
    add_bytes: float  # the m - 1 adds, all together


def accumulation_bytes(layer: Layer, strategy: LayerStrategy, precision: Precision,
                       num_microbatches: int, pipelined: bool = False
                       ) -> AccumulationBytes | None:
    """The layer's accumulation bytes in one step of `num_microbatches` (`pipelined`:
    under torch.distributed.pipelining); None where it accumulates nothing."""
    tensors = layer.param_tensors
    fp32_sum = precision.compute_bytes < REDUCE_BYTES and has_dp_unit(layer, strategy,
                                                                      precision)
    if not tensors or (num_microbatches == 1 and not (pipelined and fp32_sum)):
        return None
    p = held_local_params(layer, strategy)
    c, r, later = precision.compute_bytes, REDUCE_BYTES, num_microbatches - 1
    if fp32_sum:  # FSDP2's fp32 sum
        return AccumulationBytes(tensors, (c + r) * p, (r - c) * p, later * (2 * r + c) * p)
    return AccumulationBytes(tensors, 0.0, 0.0, later * ACCUMULATE_BYTES_PER_GRAD_BYTE * c * p)


def accumulation_step_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                              config: StepConfig, num_microbatches: int) -> float:
    """GPU seconds of the layer's accumulation kernels in one step on the rank; 0 on CPU
    processes (module docstring) and where it accumulates nothing."""
    if cluster.host_bound:
        return 0.0
    moved = accumulation_bytes(layer, strategy, config.precision, num_microbatches,
                               config.pipelined)
    if moved is None:
        return 0.0
    calls = moved.tensors * (num_microbatches - 1)  # one add per tensor per later backward
    add_s = (calls * streaming_seconds(cluster, "add", "float32", moved.add_bytes / calls)
             if calls else 0.0)
    # the cast is a copy per tensor; the fp32 read rides in the reduction's one _chunk_cat
    cast_s = (moved.tensors * streaming_seconds(cluster, "copy", "float32",
                                                moved.upcast_bytes / moved.tensors)
              + streaming_seconds(cluster, "copy", "float32", moved.sum_read_bytes)
              if moved.upcast_bytes else 0.0)
    return add_s + cast_s
