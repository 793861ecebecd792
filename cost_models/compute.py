"""Compute time of one layer for one micro-batch: kernel sum, analytic roofline or a profile.

Kernels (a traced layer): the layer's recorded ATen kernels (`ir.kernel_records`) priced
one by one and summed (`cost_models.kernel_time`): on a device kernels run in turn, so
memory-bound kernels (norms, softmax, dropout, activations, adds) add to the matmuls'
time. Dropout-mask draws add elements x `random_element_s` (a CPU thread's per-element
cost of `bernoulli_`, measured; 0 on GPUs, where they are memory-bound like the rest).

Analytic (a layer without records, `cost_models.synthetic`): time = max(FLOPs / (peak x
efficiency(GEMM size)), bytes moved / memory bandwidth), the roofline of Williams et al.
2009 with a GEMM-size-dependent efficiency. The "GEMM size" of a layer is the edge n of
the square matmul with the same arithmetic intensity: a bf16 n^3 product does 2n^3 FLOPs
on 3n^2 elements, so n = 3 * e * (FLOPs / bytes) / 2 for e-byte elements. Efficiency
saturates as n / (n + n_half) up to the device's best measured fraction of peak
(`cost_models.gemm_efficiency`).

Host overhead: every dispatched ATen op costs the framework `op_overhead_s` on the host
in forward (Python modules dispatch it; where the device kit measured it in parts, views,
other ops and module calls apiece: `cost_models.host_dispatch`) and `ClusterSpec.backward_host_op_s` in backward
(autograd's C++ engine dispatches it: `backward_op_overhead_s`, measured apart by
`cost_models.host_probes.host_op_seconds_by_pass`; specs without it fall back to
`op_overhead_s`; where the kit measured it in parts, views, other ops, autograd nodes and
the per-call excess of the ops that have one apiece: `host_dispatch.backward_host_seconds`), plus
`dtensor_op_overhead_s` per op the TP executor runs on DTensors (`dtensor_op_seconds`).
On CPU processes this adds to the op's work; on GPUs kernels queue asynchronously, so a pass
takes max(device time, host time) (`with_host`: the "overhead-bound" regime of small
layers), and a run of passes between host syncs max of their sums (`LayerCompute`'s parts,
`estimate.gpu_runs_s`). CPU processes sharing fewer cores stretch by `ClusterSpec.host_share`.

Optimizer step: the host seconds per local parameter tensor profile-cluster measured for
this optimizer on plain or DTensor parameters (else `OPTIMIZER_OPS_PER_TENSOR` ops of
torch's single-tensor loop at the per-op overhead) plus the bytes it streams.

Measured (`cost_models.compute_profile`): `planner profile MODEL --out profile.json` times
each unique layer on a device; a profile whose device matches the cluster's overrides the
analytic figure (scaled linearly to the micro-batch). Either way tensor parallelism divides the TP-able share
and checkpointing adds recomputation:
  full      one more forward in backward (Chen et al. 2016; Korthikanti et al. 2022)
  selective the recorded forward kernels the policy does not keep, again
            (`ir.checkpoint_policy`; Korthikanti et al. 2022 §5); a layer without records:
            the attention core again, 4*b*s^2*h FLOPs (Narayanan et al. 2021, eq. 2 term)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.layer import Layer
from ir.legality import sequence_parallel_applies
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Precision

from cost_models.checkpoint_probes import checkpoint_extra_seconds, rerun_ops
from cost_models.checkpoint_probes import probed as checkpoint_probed
from cost_models.common import GB, StepConfig, dtype_bytes, host_figure_share
from cost_models.compute_profile import ComputeProfile
from cost_models.dp_copies import cpu_param_copy_shares, dp_copy_pass_seconds
from cost_models.gemm_efficiency import (SQUARE_GEMM_EDGE_PER_INTENSITY, device_kind,  # noqa: F401
                                         gemm_efficiency)
from cost_models.host_dispatch import backward_host_seconds, forward_host_seconds, host_op_seconds
from cost_models.kernel_time import layer_kernel_seconds
from cost_models.model_states import has_dp_unit, held_local_params
from cost_models.op_cold_code import layer_cold_code_seconds
from cost_models.cold_kernel import recent_code_credit_seconds
from cost_models.offload import host_step_seconds
from cost_models.layer_memo import layout_view
from cost_models.tp_host import (dtensor_op_seconds, selective_tp_forward_seconds,
                                 selective_tp_seconds, tp_module_seconds, vocab_edge_seconds)

# Backward reads and writes about twice what forward does (activation and weight grads).
BACKWARD_BYTES_FACTOR = 2.0
# FLOPs of attention's two batched matmuls per layer forward: 4*b*s^2*h (Narayanan et al. 2021).
ATTENTION_CORE_FLOPS_COEFF = 4


# ATen ops one optimizer step dispatches per parameter tensor, steady state, counted on
# torch 2.13's single-tensor implementations with a dispatch-mode counter (step + zero_grad).
OPTIMIZER_OPS_PER_TENSOR = {"adamw": 10, "adam": 9, "sgd": 2, "sgd-momentum": 3}
# Host ops' worth per tensor of a fused/foreach step (its `_init_group` Python): 31-67 us a tensor
# on the H100 machine at 33 us an op (bench_gpu_step.py, llama3.2-1b and gpt3-1.3b, 2026-11-25).
LIST_STEP_HOST_OPS_PER_TENSOR = 1
ADAM_STEP_BYTES_PER_ELEMENT = 7 * 4  # per fp32 element, fused: reads p, g, m, v; writes p, m, v
SGD_STEP_BYTES_PER_ELEMENT = 4 * 4  # reads param, grad, buffer; writes param (or buffer)
# Foreach Adam, in words counted in torch 2.13's _multi_tensor_adam: AdamW's decay 2, lerp_ m 3,
# mul_ v 2, addcmul_ v,g,g 4, sqrt v to a temporary 2, div_, add_ on it 4, addcdiv_ p,m,tmp 4 = 21
FOREACH_ADAM_STEP_BYTES_PER_ELEMENT = {"adamw": 21 * 4, "adam": 19 * 4}  # H100: 101 B (45 ms)
# executors.zero1.FlatShardGroup: per piece, its gradient into the step (a copy under mixed
# precision, a view in fp32) and its update into the all-gather's send shard; per
# parameter tensor, its copy out of the gathered flat buffer.
ZERO1_COPY_OPS_PER_PIECE = 2
ZERO1_COPY_OPS_PER_TENSOR = 1
# executors.grad_clip (plan.clip_grad_norm): passes over each local gradient, memory-bound
# like torch's foreach clip_grad_norm_: the norm reads it once (_foreach_norm), the scale
# reads and writes it (_foreach_mul_); ZeRO-1's 16-bit gradients are only read (their
# coefficient rides on the step's fp32 copy). Its per-tensor Python (to_local, the copies
# count, list appends) gathers lists as a foreach step does: measured 3.1 us a plain and
# 5.4 us a DTensor gradient on the 2-core CPU (1 thread, load 3.3, 2026-11-26), within the
# local kit's 11 us an op: one op's worth a tensor. The once-a-step scalar all-reduce is
# not priced (one latency per step, outside the per-layer terms).
CLIP_NORM_PASSES = 1
CLIP_SCALE_PASSES = 2
CLIP_HOST_OPS_PER_TENSOR = 1


@dataclass(frozen=True, slots=True)
class LayerCompute:
    """Seconds for ONE micro-batch on one rank."""

    forward_s: float
    backward_s: float
    recompute_s: float  # forward work redone during backward (checkpointing), else 0
    optimizer_s: float = 0.0  # the layer's share of the optimizer step: once per ITERATION
    # On GPUs the passes' device and host seconds apiece, recompute in the backward's (the
    # host queues kernels ahead: a run of passes between host syncs costs `with_host` of
    # their sums, `estimate.stage_time`; the figures above compose each pass alone, an
    # upper bound the search adds up); 0 on CPU processes, whose host and device add up
    forward_device_s: float = 0.0
    forward_host_s: float = 0.0
    backward_device_s: float = 0.0
    backward_host_s: float = 0.0
    optimizer_device_s: float = 0.0
    optimizer_host_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s


def roofline_seconds(flops, nbytes, element_bytes, peak_flops, hbm_bytes_per_s, device,
                     max_efficiency):
    """max(compute-bound, memory-bound) time (Williams et al. 2009), efficiency by GEMM size."""
    intensity = flops / max(nbytes, 1.0)
    dim = SQUARE_GEMM_EDGE_PER_INTENSITY * element_bytes * intensity  # equivalent GEMM edge
    efficiency = gemm_efficiency(dim, device, max_efficiency)
    compute_s = flops / (peak_flops * max(efficiency, 1e-6))
    memory_s = nbytes / hbm_bytes_per_s
    return max(compute_s, memory_s)


def tp_compute_fraction(layer: Layer, strategy: LayerStrategy) -> float:
    """Share of the layer's work one TP rank does.

    Megatron TP splits every matmul of a TP-able module, attention by heads included; we
    take the TP-able share of the work as the TP-able share of the parameters. With
    sequence parallelism the rest (norms, dropout) is split over the sequence as well.
    """
    tp = strategy.tp
    if sequence_parallel_applies(layer, strategy):
        return 1.0 / tp
    if tp == 1 or not layer.tp_candidates:
        return 1.0  # a layer without TP-able modules runs replicated in its TP group
    share = layer.tp_params / layer.params if layer.params else 1.0
    return 1.0 - share + share / tp


def hidden_size(layer: Layer, config: StepConfig) -> float:
    """h from the boundary tensor: output_bytes = b * s * h * element bytes (one tensor)."""
    if not config.seq_len:
        return 0.0
    return layer.output_bytes / (config.graph_micro_batch * config.seq_len
                                 * dtype_bytes(config.graph_dtype))



def with_host(device_s: float, host_s: float, cluster: ClusterSpec) -> float:
    """CPU processes do both in turn (and share cores); GPUs overlap them."""
    if cluster.host_bound:
        return (device_s + host_s) * cluster.host_share
    return max(device_s, host_s)


def dp_unit_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                    config: StepConfig) -> float:
    """Host time of the layer's data-parallel unit per micro-batch: the executor wraps a
    layer with parameters in one when dp > 1 or under mixed precision. A unit costs a
    fixed amount, an amount per parameter tensor and one per parameter on this rank (its
    copies; the parameters counted as `dp_copies.unit_copies` counts them): profile-
    cluster fits all three (`host_overhead_fit.dp_unit_overhead`). Of the per-parameter
    part only the copies that recur per micro-batch; the reduction's run once a step
    (`dp_copies.dp_copy_step_seconds`)."""
    tensors = layer.param_tensors
    if not tensors or not has_dp_unit(layer, strategy, config.precision):
        return 0.0
    params = held_local_params(layer, strategy)
    overhead = cluster.calibration.dp_overhead(strategy.dp_mode, strategy.dp)
    if overhead.per_param_s and cluster.host_bound:
        params *= cpu_param_copy_shares(layer, strategy, config)[0]
    return overhead.seconds(tensors, params)


def layer_compute(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                  config: StepConfig, profile: ComputeProfile | None = None) -> LayerCompute:
    """Forward, backward and recompute seconds of one layer for one micro-batch."""
    share = tp_compute_fraction(layer, strategy)
    measured = profile.lookup(layer) if profile is not None else None
    # The layer's ops run on plain tensors: the TP executor hands its modules' outputs on
    # as local tensors (`executors.tensor_parallel.layer_tp_plan`), so only the modules'
    # own DTensor work (`tp_module_seconds`) and the ops of modules it gives a DTensor
    # style of their own (SP's norms: `dtensor_op_seconds`) pay DTensor's dispatch.
    # (Charging every op of an SP layer priced llama-tiny's 4 SP blocks 41 ms of DTensor
    # dispatch on 2 ranks where the whole step outside its collectives took 44 ms.)
    op_s = host_op_seconds(cluster)
    backward_op_s = host_op_seconds(cluster, backward=True)
    if measured is not None:  # a measured layer already paid the plain per-op overhead
        scale = config.micro_batch / measured.micro_batch * share
        op_s -= cluster.op_overhead_s
        backward_op_s -= cluster.backward_host_op_s
        forward_s = measured.forward_seconds * scale
        backward_s = measured.backward_seconds * scale
    else:
        forward_s, backward_s = _analytic_seconds(layer, cluster, config, share)
    random_s = random_draw_seconds(layer, strategy, cluster, config) if measured is None else 0.0
    forward_s += random_s
    # The TP host figures read the strategy's layout and checkpoint alone: memoised by
    # `layer_memo.layout_view`, shared across DP degrees and modes.
    view = layout_view(strategy)
    # DP-unit figures are the calling thread's CPU time outside the unit's collectives
    # (dp_unit_probe.dp_unit_seconds), as TP-module figures are (those stretched inside):
    # CPU processes sharing fewer cores stretch them by the core share too.
    tp_half_s = tp_module_seconds(layer, view, cluster) / 2  # half in each pass
    edge_forward_s, edge_backward_s, loss_forward_s = vocab_edge_seconds(layer, view,
                                                                         cluster)
    unit_share = host_figure_share(cluster)
    dtensor_forward_s, dtensor_backward_s = dtensor_op_seconds(layer, view, cluster)
    unit_s = dp_unit_seconds(layer, strategy, cluster, config) * unit_share / 2 + tp_half_s
    forward_host_s = (layer.ops_fwd * op_s if measured is not None
                      else forward_host_seconds(layer, cluster))
    backward_host_s = (layer.ops_bwd * backward_op_s if measured is not None
                       else backward_host_seconds(layer, cluster))
    # The checkpoint's own host machinery (hooks, SAC's dispatch modes), where the kit
    # probed it (checkpoint_probes.checkpoint_host_seconds); else (0, 0)
    hooks_forward_s, hooks_recompute_s = checkpoint_extra_seconds(
        layer, strategy.checkpoint, cluster.kernel_calibration, config)
    # the unit's own parameter copies on the device (cost_models.dp_copies; 0 on CPUs)
    copy_forward_s, copy_backward_s = dp_copy_pass_seconds(layer, strategy, cluster, config)
    forward_device_s = forward_s
    # A full recompute reruns the forward right after the layer after's backward, not the
    # layers before's forwards: without their cold-code credit (cost_models.cold_kernel).
    # A profiled layer keeps its measured forward: timed after warm neighbours, it holds
    # a warm advantage the profile does not split out (a known underprice of the rerun)
    recompute_device_s = forward_s + (recent_code_credit_seconds(layer, cluster, config, share)[0]
                                      if measured is None else 0.0)
    # The recompute stops at the forward's last save (early stop): the ops from there on
    # are not rerun, priced at the forward's mean host seconds per op (checkpoint_probes)
    rerun_host_s = (forward_host_s * rerun_ops(layer) / layer.ops_fwd if layer.ops_fwd
                    else forward_host_s)
    forward_host_all_s = forward_host_s + hooks_forward_s + dtensor_forward_s
    # a full recompute reruns the forward inside the unit, not the unit's copies
    rerun_forward_s = (with_host(recompute_device_s, forward_host_all_s, cluster) + unit_s
                       + edge_forward_s)
    forward_s = with_host(forward_s + copy_forward_s, forward_host_all_s,
                          cluster) + unit_s + edge_forward_s
    # (device, host) of each pass; the host's own figures with the unit's and the edges'
    forward_parts = [forward_device_s + copy_forward_s,
                     forward_host_all_s + unit_s + edge_forward_s]
    backward_parts = (backward_s + copy_backward_s,
                      backward_host_s + dtensor_backward_s + unit_s + edge_backward_s)
    backward_s = with_host(backward_s + copy_backward_s, backward_host_s + dtensor_backward_s,
                           cluster) + unit_s + edge_backward_s
    edge_recompute_s = edge_forward_s - loss_forward_s  # the embedding's, not the loss's
    if strategy.checkpoint is Checkpoint.FULL and checkpoint_probed(cluster.kernel_calibration):
        # the layer's forward again inside the recompute hook; the TP modules' hooks run
        # again with it, the DP unit's (outside the checkpointed forward) do not; so do
        # the SP norms' DTensor ops
        recompute_s = with_host(recompute_device_s, rerun_host_s + hooks_recompute_s
                                + dtensor_forward_s, cluster) + tp_half_s + edge_recompute_s
        recompute_parts = (recompute_device_s, rerun_host_s + hooks_recompute_s
                           + dtensor_forward_s + tp_half_s + edge_recompute_s)
    elif strategy.checkpoint is Checkpoint.FULL:
        recompute_s = rerun_forward_s - loss_forward_s
        recompute_parts = (recompute_device_s,
                           forward_host_all_s + unit_s + edge_forward_s - loss_forward_s)
    elif strategy.checkpoint is Checkpoint.SELECTIVE and layer.kernels is not None:
        recompute_s, *recompute_parts = _selective_recompute_seconds(
            layer, cluster, config, share, op_s, measured, random_s, rerun_host_s,
            hooks_recompute_s)
        # SAC reruns the forward's Python and dispatch above its cached ATen ops: the SP
        # norms' DTensor ops, the TP modules' DTensor work (where the spec probed it) and
        # the vocab-parallel embedding's forward
        # (the whole block's figure has a forward share: SAC's caching mode on its ops)
        sac_s = selective_tp_seconds(layer, view, cluster)
        sac_forward_s = min(selective_tp_forward_seconds(layer, view, cluster), sac_s)
        forward_s += sac_forward_s
        forward_parts[1] += sac_forward_s
        recompute_s += with_host(0.0, dtensor_forward_s, cluster) + edge_recompute_s \
            + sac_s - sac_forward_s
        recompute_parts[1] += dtensor_forward_s + edge_recompute_s + sac_s - sac_forward_s
    elif strategy.checkpoint is Checkpoint.SELECTIVE and layer.saved_attention_bytes:
        recompute_s = _attention_recompute_seconds(layer, cluster, config, share)
        recompute_parts = (recompute_s, 0.0)
    else:
        recompute_s, recompute_parts = 0.0, (0.0, 0.0)
    optimizer_s, *optimizer_parts = _optimizer_step(layer, strategy, cluster, config)
    if cluster.host_bound:  # CPU processes: no parts (`LayerCompute`)
        return LayerCompute(forward_s, backward_s, recompute_s, optimizer_s)
    return LayerCompute(forward_s, backward_s, recompute_s, optimizer_s, *forward_parts,
                        backward_parts[0] + recompute_parts[0],
                        backward_parts[1] + recompute_parts[1], *optimizer_parts)


def optimizer_step_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                           config: StepConfig) -> float:
    """One optimizer step over the layer's parameters on one rank (`_optimizer_step`)."""
    return _optimizer_step(layer, strategy, cluster, config)[0]


def _optimizer_step(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                    config: StepConfig) -> tuple[float, float, float]:
    """(seconds, device seconds, host seconds) of one optimizer step over the layer's
    parameters on one rank: host time per tensor plus the bytes the update streams.
    ZeRO-2/3 step every tensor's shard; ZeRO-1 steps this rank's pieces of a flat buffer
    (1/dp of the elements; a piece per tensor it touches, at most tensors/dp + 1; plain
    tensors, `executors.zero1`), then copies the gathered parameters out (read and
    written in the compute dtype). Offloaded: all of it the host's."""
    tensors = layer.param_tensors  # tied copies step too
    if tensors == 0:
        return 0.0, 0.0, 0.0
    local_params = held_local_params(layer, strategy)
    if strategy.dp_mode is not DPMode.REPLICATE:
        local_params /= strategy.dp
    on_dtensors = strategy.dp > 1 or strategy.tp > 1 or config.precision is not Precision.FP32
    copy_ops, copy_bytes = 0, 0.0
    if strategy.dp_mode is DPMode.ZERO1 and strategy.dp > 1:
        whole = tensors
        tensors = min(whole, math.ceil(whole / strategy.dp) + 1)  # pieces
        on_dtensors = False
        copy_ops = ZERO1_COPY_OPS_PER_PIECE * tensors + ZERO1_COPY_OPS_PER_TENSOR * whole
        copy_bytes = 2 * local_params * strategy.dp * config.precision.compute_bytes
    # the plan's implementation; single-tensor Adam on a GPU launches the same per-op
    # kernels as foreach, a tensor at a time (torch 2.13 _single_tensor_adam: 21 words)
    per_op = config.step_implementation == "foreach" or (
        config.step_implementation == "single" and not cluster.host_bound)
    per_element = FOREACH_ADAM_STEP_BYTES_PER_ELEMENT.get(config.optimizer) if per_op else None
    per_element = per_element or (ADAM_STEP_BYTES_PER_ELEMENT if config.optimizer.startswith(
        "adam") else SGD_STEP_BYTES_PER_ELEMENT)
    stream_s = (local_params * per_element + copy_bytes) / (cluster.hbm_gbps * GB)
    copy_s = copy_ops * host_op_seconds(cluster)
    clip_bytes, clip_host_s = _clip_cost(layer, strategy, cluster, config, local_params)
    if not strategy.offload:
        stream_s += clip_bytes / (cluster.hbm_gbps * GB)
        copy_s += clip_host_s
    per_tensor_s = cluster.calibration.optimizer_seconds_per_tensor(config.optimizer, on_dtensors)
    if (per_tensor_s is None and not strategy.offload and not cluster.host_bound
            and config.step_implementation != "single"):
        # GPUs step whole tensor lists: a dispatch counter sees 4 ops a step whatever the
        # tensor count (torch 2.13, fused AdamW); the Python that gathers the lists costs
        # about one op's host per tensor (H100 machine: 31-67 us a tensor at 33 us an op)
        host_s = tensors * LIST_STEP_HOST_OPS_PER_TENSOR * host_op_seconds(cluster, on_dtensors)
        return with_host(stream_s, host_s + copy_s, cluster), stream_s, host_s + copy_s
    ops = OPTIMIZER_OPS_PER_TENSOR[config.optimizer] * tensors
    # The measured figure is the stepping thread's CPU (step_probes.optimizer_tensor_seconds):
    # CPU processes sharing fewer cores stretch it by the core share, as per-op figures.
    stepped_s = (tensors * per_tensor_s * host_figure_share(cluster)
                 if per_tensor_s is not None else None)
    if strategy.offload:  # stepped by the host CPU: its streaming and its dispatch add up
        dispatch_s = stepped_s if stepped_s is not None \
            else ops * host_op_seconds(cluster, on_dtensors)
        host_s = host_step_seconds(layer, strategy, cluster, config.optimizer) + dispatch_s
        # its gradients are the host's: streamed over the node's shared memory bus too
        host_s += clip_host_s + clip_bytes / (cluster.host_memory_gbps * GB
                                              / cluster.devices_per_node)
        return host_s, 0.0, host_s
    if stepped_s is not None:
        return with_host(stream_s, copy_s, cluster) + stepped_s, stream_s, copy_s + stepped_s
    host_s = ops * host_op_seconds(cluster, on_dtensors) + copy_s
    return with_host(stream_s, host_s, cluster), stream_s, host_s


def _clip_cost(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
               config: StepConfig, local_params: float) -> tuple[float, float]:
    """(bytes streamed, host seconds) of the gradient clip over the layer's local
    gradients (CLIP_* above); (0, 0) when the plan does not clip. `local_params`: the
    elements the optimizer steps on this rank (ZeRO-1: its 1/dp pieces)."""
    if not config.clip_grad_norm:
        return 0.0, 0.0
    zero1 = strategy.dp_mode is DPMode.ZERO1 and strategy.dp > 1
    elements = local_params * strategy.dp if zero1 else local_params  # ZeRO-1: replicated
    if zero1 and config.precision is not Precision.FP32:  # 16-bit, read for the norm only
        nbytes = elements * config.precision.compute_bytes * CLIP_NORM_PASSES
    else:  # fp32 gradients (FSDP2 keeps them in the parameters' fp32)
        nbytes = elements * 4 * (CLIP_NORM_PASSES + CLIP_SCALE_PASSES)
    return nbytes, clip_host_seconds(layer.param_tensors, cluster)


def clip_host_seconds(tensors: float, cluster: ClusterSpec) -> float:
    """Host seconds of the clip's per-tensor Python over `tensors` gradients (CLIP_* above):
    the dense layers' and the embedding tables' (`cost_models.embedding`) one rule."""
    return tensors * CLIP_HOST_OPS_PER_TENSOR * host_op_seconds(cluster)


def random_draw_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                        config: StepConfig) -> float:
    """Forward seconds drawing dropout masks: elements times the measured per-element
    figure (a CPU thread spends ~10x longer per element than on a memory-bound op, which
    the roofline misses). TP ranks draw their head shard inside the TP-sharded region and,
    under sequence parallelism, their sequence shard of the rest."""
    sharded = layer.random_tp_sharded_elements_fwd
    rest = layer.random_elements_fwd - sharded
    elements = sharded / strategy.tp + rest / (strategy.tp if sequence_parallel_applies(layer, strategy)
                                               else 1)
    return elements * config.batch_scale * cluster.random_element_s


def _analytic_seconds(layer: Layer, cluster: ClusterSpec, config: StepConfig,
                      share: float) -> tuple[float, float]:
    """Device seconds of one forward and one backward: the sum over the layer's recorded
    kernels (`cost_models.kernel_time`); a layer without records (`cost_models.synthetic`)
    takes one roofline over all its FLOPs and bytes."""
    if layer.kernels is not None:
        times = layer_kernel_seconds(layer.kernels, cluster, config, share)
        # + the cold ops' kernel code beyond the host's flat figure (cost_models.op_cold_code)
        cold_forward_s, cold_backward_s = layer_cold_code_seconds(layer, cluster,
                                                                   config.batch_scale)
        # - what the ops the work just before ran pay less of their cold code (cold_kernel)
        credit_forward_s, credit_backward_s = recent_code_credit_seconds(layer, cluster,
                                                                         config, share)
        return (times.forward.total_s + cold_forward_s - credit_forward_s,
                times.backward.total_s + cold_backward_s - credit_backward_s)
    dtype = config.precision.compute_dtype
    element = config.precision.compute_bytes
    peak = cluster.peak_flops(dtype)
    hbm = cluster.hbm_gbps * GB
    # Bytes a forward touches: weights, the input, the output and what it saves.
    act = (layer.input_bytes + layer.output_bytes + layer.saved_activation_bytes) \
        * config.activation_scale
    nbytes = (layer.params * element + act) * share
    fwd_flops = layer.flops_fwd * config.batch_scale * share
    bwd_flops = layer.flops_bwd * config.batch_scale * share
    forward_s = roofline_seconds(fwd_flops, nbytes, element, peak, hbm, cluster.device,
                                 cluster.matmul_efficiency)
    backward_s = roofline_seconds(bwd_flops, nbytes * BACKWARD_BYTES_FACTOR, element, peak,
                                  hbm, cluster.device, cluster.matmul_efficiency)
    return forward_s, backward_s


def _selective_recompute_seconds(layer: Layer, cluster: ClusterSpec, config: StepConfig,
                                 share: float, op_s: float, measured, random_s: float,
                                 rerun_host_s: float,
                                 hooks_s: float) -> tuple[float, float, float]:
    """(seconds, device seconds, host seconds) of a selective recompute: it reruns the
    forward kernels whose outputs the policy does not keep (`KernelRecords.recomputed`,
    `ir.checkpoint_policy`): their kernel seconds and the dropout masks drawn again. On
    the host, where the kit probed the checkpoint's machinery (`checkpoint_probes`), the
    layer's Python forward runs again up to its last save (early stop) and every op
    dispatches through SAC's cached mode (a kept op returns its stored output instead of
    its kernel): the rerun ops' forward host seconds (`rerun_host_s`) plus the
    machinery's (`hooks_s`, `checkpoint_extra_seconds`); else the recomputed ops x
    `op_s`. A measured layer scales its measured forward by the recomputed kernels' share
    of the forward's kernel seconds (plus `hooks_s`)."""
    times = layer_kernel_seconds(layer.kernels, cluster, config, share)
    again = times.selective_recompute
    probed = checkpoint_probed(cluster.kernel_calibration)
    if measured is not None:
        scale = config.micro_batch / measured.micro_batch * share
        whole = times.forward.total_s
        kernels_s = measured.forward_seconds * scale * (again.total_s / whole if whole else 0.0)
        hooks_s = hooks_s if probed else 0.0
        return (kernels_s + (with_host(0.0, hooks_s, cluster) if probed else 0.0), kernels_s,
                hooks_s)
    host_s = rerun_host_s + hooks_s if probed else again.ops * op_s
    device_s = again.total_s + random_s
    return with_host(device_s, host_s, cluster), device_s, host_s


def _attention_recompute_seconds(layer: Layer, cluster: ClusterSpec, config: StepConfig,
                                 share: float) -> float:
    """Selective recompute redoes QK^T, softmax, dropout and attention x V."""
    s = config.seq_len or 0
    flops = ATTENTION_CORE_FLOPS_COEFF * config.micro_batch * s * s * \
        hidden_size(layer, config) * share
    nbytes = layer.saved_attention_bytes * config.activation_scale * share
    return roofline_seconds(flops, nbytes, config.precision.compute_bytes,
                            cluster.peak_flops(config.precision.compute_dtype),
                            cluster.hbm_gbps * GB, cluster.device, cluster.matmul_efficiency)
