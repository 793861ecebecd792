"""Device bytes an FSDP2 unit's own copies move, their seconds on a GPU, and how they
split a CPU unit's measured per-parameter figure between micro-batch and step.

Every layer the executor makes a DP unit (`ir.strategy.runs_as_dp_unit`: dp > 1, or any
dp under mixed precision) copies its parameters and gradients around its compute. Read
off torch's FSDP2 (torch 2.13 `_fsdp_param_group.py` `unshard` / `wait_for_unshard` /
`post_backward`, `_fsdp_collectives.py` `foreach_all_gather` / `_copy_out` /
`foreach_reduce`). A unit of P local (TP) parameters in n tensors, W = its dp, c the
compute dtype's bytes (2 mixed, 4 fp32), r the reduce dtype's (4: fp32 in both):

  unshard, WORLD-1 path (replicate units at any dp: their mesh shards nothing; none at
  dp 1 is anything but replicate): per tensor the cast of the fp32 parameter to the
  compute dtype (`all_gather_inputs`, mixed only: (4 + c) P) and its copy into the
  unsharded parameter (`tensor.copy_`: 2c P); no all-gather.
  unshard, W > 1 (ZeRO-2/3): the cast into one flat shard (`_foreach_copy_`, mixed only:
  (4 + c) P / W), its copy into the all-gather's input (`all_gather_copy_in`: 2c P / W),
  the all-gather (priced by `comm.dp_comm_s`), the copy out into the unsharded
  parameters (`split_with_sizes_copy`: 2c P).
  How often: without a pipeline (the executor's own loop) once per micro-batch's forward
  (after each backward the unit reshards: reshard_after_backward), again in backward
  under ZeRO-3 (reshard_after_forward). Under torch.distributed.pipelining (pp > 1,
  `StepConfig.pipelined`) a stage's units stay unsharded from backward to backward
  (`_PipelineStageBase.backward_maybe_with_nosync`: set_reshard_after_backward(False)
  until its REDUCE_GRAD): replicate and ZeRO-2 units unshard once a step, ZeRO-3 units
  once per micro-batch (each forward reshards; a backward gathers, and the next forward
  finds the unit unsharded: 1F1B's steady state; GPipe gathers in its m forwards and its
  first backward instead), priced in the backward.

  gradient reduction, once a step (the micro-batches before accumulate unreduced):
  `_chunk_cat` of the compute-dtype gradients into the fp32 reduce-scatter input
  ((c + r) P; where the unit accumulated into an fp32 sum it reads that, (r - c) P more,
  which `cost_models.grad_accumulation` prices); then on the world-1 path (replicate) `reduce_output.copy_(input /
  divide_factor)`: the executor sets the factor (1.0, `gloo_collectives.sum_reduction`), so
  a division (2r P) and a copy (2r P); the all-reduce in place (`comm`). At W > 1 the
  reduce-scatter writes the sharded gradient itself (no copy; `comm` prices it).

Each copy is a memory-bound kernel priced at the kit's copy rate for its bytes (the
division at its elementwise "add" rate: `kernel_time.streaming_seconds`); per-tensor
copies at the unit's mean tensor size. On CPU processes the unit's measured host
figures (`compute.dp_unit_seconds`) stand instead, as profile-cluster measured them on
the executor's own units, these copies in their per-parameter part (`DpOverhead
.per_param_s`, from the probe's wide unit), split by the bytes above into what recurs
per micro-batch and what runs once a step (`cpu_param_copy_shares`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.layer import Layer
from ir.strategy import DPMode, LayerStrategy, Precision

from cost_models.common import StepConfig, host_figure_share
from cost_models.kernel_time import streaming_seconds
from cost_models.model_states import FP32_BYTES, has_dp_unit, held_local_params

REDUCE_BYTES = FP32_BYTES  # `ir.precision_policy.mp_policy`: reduce_dtype float32 (fp32: itself)


@dataclass(frozen=True, slots=True)
class UnitCopies:
    """Bytes of one unit's copies: per unshard (per tensor and flat) and per reduction."""

    tensors: int
    unshard_per_tensor_bytes: float  # copies made tensor by tensor, all tensors together
    unshard_flat_bytes: float  # copies made on the unit's flat buffer
    chunk_cat_bytes: float  # the gradients into the reduce input, cast to the reduce dtype
    reduce_copy_bytes: float  # the world-1 path's copy into the reduce output
    reduce_divide_bytes: float  # the world-1 path's division by the divide factor
    gathers_in_backward: bool  # ZeRO-3: unsharded again for backward


def unit_copies(layer: Layer, strategy: LayerStrategy, precision: Precision) -> UnitCopies | None:
    """The unit's copy bytes (module docstring), None where the layer is no unit."""
    if not layer.param_tensors or not has_dp_unit(layer, strategy, precision):
        return None
    return _copy_bytes(layer, strategy, precision)


def _copy_bytes(layer: Layer, strategy: LayerStrategy, precision: Precision) -> UnitCopies:
    """`unit_copies` of the layer as if it ran as a unit under `precision`."""
    tensors = layer.param_tensors
    p = held_local_params(layer, strategy)
    c, r = precision.compute_bytes, REDUCE_BYTES
    cast = (FP32_BYTES + c) * p if precision is not Precision.FP32 else 0.0
    sharded = not reduces_on_one_rank(strategy)
    if sharded:
        per_tensor, flat = 2 * c * p, (cast + 2 * c * p) / strategy.dp
        reduce_copy = divide = 0.0
    else:
        per_tensor, flat = cast + 2 * c * p, 0.0
        reduce_copy = divide = 2 * r * p
    return UnitCopies(tensors, per_tensor, flat, (c + r) * p, reduce_copy, divide,
                      sharded and strategy.dp_mode is DPMode.ZERO3)


def reduces_on_one_rank(strategy: LayerStrategy) -> bool:
    """Whether the unit takes foreach_reduce's world-1 path (module docstring): replicate
    and ZeRO-1 units (their mesh shards nothing) and any unit at dp 1."""
    return not (strategy.dp_mode in (DPMode.ZERO2, DPMode.ZERO3) and strategy.dp > 1)


def dp_copy_pass_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                         config: StepConfig) -> tuple[float, float]:
    """(forward_s, backward_s) of the unit's unshard copies per micro-batch on a GPU (module
    docstring, how often); zeros on CPU processes and where the layer is no unit."""
    copies = _priced(layer, strategy, cluster, config)
    if copies is None or (config.pipelined and not copies.gathers_in_backward):
        return 0.0, 0.0
    unshard_s = _unshard_s(copies, cluster, config)
    if config.pipelined:
        return 0.0, unshard_s
    return unshard_s, unshard_s if copies.gathers_in_backward else 0.0


def dp_copy_step_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                         config: StepConfig) -> float:
    """Seconds of the unit's copies once per iteration: its gradient reduction's, and in a
    pipeline a replicate or ZeRO-2 unit's one unshard. On CPU processes their share of
    the unit's fitted per-parameter figure (`cpu_param_copy_shares`)."""
    if cluster.host_bound:
        per_param_s = cluster.calibration.dp_overhead(strategy.dp_mode, strategy.dp).per_param_s
        if not per_param_s:
            return 0.0
        params = held_local_params(layer, strategy)
        _, per_step_share = cpu_param_copy_shares(layer, strategy, config)
        return params * per_step_share * per_param_s * host_figure_share(cluster)
    copies = _priced(layer, strategy, cluster, config)
    if copies is None:
        return 0.0
    dtype = config.precision.compute_dtype
    reduce_s = (_copy_s(cluster, dtype, copies.chunk_cat_bytes)
                + _copy_s(cluster, dtype, copies.reduce_copy_bytes)
                + _copy_s(cluster, dtype, copies.reduce_divide_bytes, kind="add"))
    if config.pipelined and not copies.gathers_in_backward:
        return reduce_s + _unshard_s(copies, cluster, config)
    return reduce_s


def cpu_param_copy_shares(layer: Layer, strategy: LayerStrategy,
                          config: StepConfig) -> tuple[float, float]:
    """(per micro-batch, once a step) shares of a CPU unit's per-parameter figure
    (`DpOverhead.per_param_s`): profile-cluster timed it on one unpipelined fp32
    micro-batch that reduced its gradients (`dp_unit_probe`), so it holds one unshard's
    copies (two under ZeRO-3) and the reduction's; under `config` each recurs as the
    module docstring says (how often), at its bytes over the probe's. (1, 0) on a unit
    of no parameters; (0, 0) where the layer is no unit."""
    copies = unit_copies(layer, strategy, config.precision)
    if copies is None:
        return 0.0, 0.0
    probe = _copy_bytes(layer, strategy, Precision.FP32)
    unshard, reduce = _unshard_bytes(copies), _reduce_bytes(copies)
    timed = _unshard_bytes(probe) * (2 if probe.gathers_in_backward else 1) + _reduce_bytes(probe)
    if not timed:
        return 1.0, 0.0
    if config.pipelined:
        per_microbatch, per_step = ((unshard, reduce) if copies.gathers_in_backward
                                    else (0.0, reduce + unshard))
    else:
        per_microbatch, per_step = unshard * (2 if copies.gathers_in_backward else 1), reduce
    return per_microbatch / timed, per_step / timed


def _unshard_bytes(copies: UnitCopies) -> float:
    return copies.unshard_per_tensor_bytes + copies.unshard_flat_bytes


def _reduce_bytes(copies: UnitCopies) -> float:
    return copies.chunk_cat_bytes + copies.reduce_copy_bytes + copies.reduce_divide_bytes


def _priced(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
            config: StepConfig) -> UnitCopies | None:
    return None if cluster.host_bound else unit_copies(layer, strategy, config.precision)


def _unshard_s(copies: UnitCopies, cluster: ClusterSpec, config: StepConfig) -> float:
    dtype = config.precision.compute_dtype
    return (_copy_s(cluster, dtype, copies.unshard_per_tensor_bytes, copies.tensors)
            + _copy_s(cluster, dtype, copies.unshard_flat_bytes))


def _copy_s(cluster: ClusterSpec, dtype: str, nbytes: float, calls: int = 1,
            kind: str = "copy") -> float:
    """`calls` equal memory-bound kernels moving `nbytes` in all."""
    return calls * streaming_seconds(cluster, kind, dtype, nbytes / calls) if nbytes else 0.0
