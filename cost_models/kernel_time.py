"""Kernel-level compute time: a layer's seconds as the sum of the kernels it runs.

On a GPU kernels run one after another, so a layer norm, a softmax over the s x s scores
or a dropout ADDS to the matmuls' time instead of hiding under it. The time of one layer
pass (forward, backward, or the kernels a checkpointing mode recomputes) is

    sum over kernel records r of  r.count * max(t_roofline(r), launch floor)
    t_roofline(gemm)      = max(FLOPs / (peak x GEMM efficiency(m, n, k, dtype)), bytes / bandwidth)
    t(conv)               = FLOPs / measured rate of the nearest measured convolution, per
                            pass (forward; backward's grad_input and grad_weight apart);
                            without a table the roofline of its implicit GEMM, once
                            per pass the record computes (a weight-only backward: one)
    t_roofline(attention) = FLOPs / measured SDPA rate of the backend dispatch picks
    t_roofline(memory)    = bytes / bandwidth of that kind of memory-bound kernel at its size
                            (+ its inner loops x measured seconds per loop and per 2-D
                            loop call: copy/add/sum, `cost_models.kernel_loops`;
                            + rows beyond the table's x measured seconds per row:
                            softmax, layer norm)
    embedding forward     = measured seconds per call + indices x measured seconds per
                            index (+ the bytes of rows wider than probed)
    embedding backward    = table fill (a copy) + indices x measured seconds per index
                            + the rows' bytes (a scatter-add costs per index, not per byte)
    embedding bag         = measured seconds per call + indices x measured seconds per
                            index (+ the backward's table fill, + rows wider than probed)

(Williams et al. 2009 roofline per kernel). GEMM efficiency by shape: the nearest measured
GEMM of the cluster's kernel calibration, else the analytic saturation fit
(`cost_models.gemm_efficiency`), times the measured cost of the record's operand layout
(a Linear's addmm, a weight gradient: `cost_models.gemm_layouts`). Memory-bound
bandwidth: the calibration's measured points for that kernel kind (copy, add, gelu, sum,
softmax, layer_norm and batch_norm and their backwards; `broadcast_scalar` for a record
marked `unvectorized`), interpolated in log(bytes), else the spec's `hbm_gbps` times the
share of it that kind reached on a measured H100 (a softmax streams at ~40% of the
datasheet bandwidth). Fused attention:
the calibration's "default" backend (what torch's dispatcher chose on that device, with no
backend forced), nearest
measured shape, its FLOP rate (forward 4*b*s^2*h over forward seconds, backward 2.5x that
over backward seconds: Dao 2023); without a table, a roofline at the GEMM efficiency of
one head's (s x d) @ (d x s) product, a causal mask halving the work.

Scaling from the IR's measurement: FLOPs and activation bytes grow with the micro-batch
(`StepConfig.batch_scale`, `activation_scale`), weight bytes only with the dtype. A
GEMM's token dimension grows with the micro-batch: the batch of a batched matmul, else the
m (or, for weight gradients, the k) that is a multiple of the IR's tokens. Tensor
parallelism: each kernel's FLOPs and bytes times the layer's TP share
(`compute.tp_compute_fraction`, passed in as `share`), the GEMM's n (attention's heads)
likewise; launches are not divided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.kernel_calibration import KernelCalibration, SdpaPoint
from ir.kernel_recorder import EMBEDDING_BAG_OPS
from ir.kernel_records import (CONV_GRAD_BIAS, CONV_GRAD_INPUT, CONV_GRAD_WEIGHT, KernelKind,
                               KernelRecord, KernelRecords, conv_implicit_gemm)
from ir.op_count import RANDOM_OPS
from ir.strategy import Checkpoint

from cost_models.common import GB, StepConfig
from cost_models.device_grids import ROW_ELEMENTS
from cost_models.cold_kernel import cold_kernel_seconds
from cost_models.fresh_output import fresh_output_seconds
from cost_models.math_kernels import math_kind
from cost_models.gemm_efficiency import gemm_shape_efficiency
from cost_models.gemm_layouts import layout_of
from cost_models.id_memo import IdMemo
from cost_models.kernel_loops import SHORT_RUN_KINDS, loop_seconds, measured, memory_gbps
from cost_models.embedding_kernels import (embedding_backward_seconds, embedding_bag_seconds,
                                          embedding_forward_seconds, embedding_probed)

# Device seconds per kernel when the cluster carries no calibration: a GPU replays tiny
# kernels from a CUDA graph at 1.22 us each (profile-device on an H100, 2026-11-24,
# cost_models/calibration/h100-80g.json `launch_device_s`). CPUs: 0, their per-op host
# cost is `ClusterSpec.op_overhead_s`, which compute.py adds.
DEFAULT_GPU_KERNEL_FLOOR_S = 1.22e-6
# FlashAttention skips the blocks above the diagonal under a causal mask: half the work
# (Dao 2023, FlashAttention-2 §3.1.1).
CAUSAL_WORK_FRACTION = 0.5
# Dao 2023 (FlashAttention-2) §4: backward FLOPs are 2.5x the forward's.
ATTENTION_BACKWARD_FLOPS_RATIO = 2.5
# Ops that only draw random numbers: where the spec measured a draw's per-element price
# (`random_element_s`, compute.random_draw_seconds) it replaces their streaming price.
# native_dropout also scales and writes its output and mask: it streams as well.
DRAW_ONLY_OPS = RANDOM_OPS - {"native_dropout"}
# Share of the spec's memory bandwidth each memory-bound kernel kind reaches on large
# tensors, for GPUs whose spec carries no measured table: profile-device on an H100 80GB
# (cost_models/calibration/h100-80g.json, 512 MiB points over the datasheet 3350 GB/s):
# streaming kernels come close to the datasheet, row-wise softmax and layer norm do not.
# Batch norm was not measured there: layer norm's share (the nearest measured kind, a
# normalisation that reads its input twice).
GPU_MEMORY_KERNEL_BANDWIDTH_FRACTION = {
    "copy": 2990 / 3350, "add": 3046 / 3350, "gelu": 2857 / 3350, "sum": 2948 / 3350,
    "softmax": 1276 / 3350, "layer_norm": 2038 / 3350, "batch_norm": 2038 / 3350,
    "batch_norm_backward": 2038 / 3350}
# The SDPA backend whose measured times price a fused attention: torch's own choice.
DISPATCHED_SDPA_BACKEND = "default"
# Memory-bound kernel kinds the calibration measures, by the ATen ops they stand for
# (ops not listed are elementwise ops that stream: "add"). "gelu" stands for elementwise
# math that costs per element beyond its bytes; relu, threshold_backward, neg, abs and a
# square stream like add and copy (one thread here, 256 KiB, 2026-11-24: 108-180 GB/s
# against gelu 30, silu 36, rsqrt 36, sigmoid 37; add 152, copy 187). Training batch norm
# is its own kind: on this CPU it ran at 6.3 GB/s where layer norm ran at 20 (both 256 KiB).
MEMORY_KERNEL_OF_OP = {
    **dict.fromkeys(("_softmax", "_log_softmax", "_safe_softmax"), "softmax"),
    "_softmax_backward_data": "softmax_backward",
    "_log_softmax_backward_data": "log_softmax_backward",  # an exp per element: its own kind
    **dict.fromkeys(("masked_fill", "masked_fill_", "where"), "masked_fill"),
    "native_layer_norm_backward": "layer_norm_backward",
    **dict.fromkeys(("native_layer_norm", "_fused_rms_norm",
                     "_fused_rms_norm_backward", "native_group_norm",
                     "native_group_norm_backward", "_native_batch_norm_legit_no_training"),
                    "layer_norm"),
    **dict.fromkeys(("native_batch_norm", "_native_batch_norm_legit"), "batch_norm"),
    "native_batch_norm_backward": "batch_norm_backward",
    "native_dropout": "dropout",  # a CPU's div_ and mul beside its draw (memory_probes)
    **dict.fromkeys(("sum", "mean", "amax", "amin", "max", "min", "var_mean", "norm",
                     "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward"), "sum"),
    **dict.fromkeys(("gelu", "gelu_backward", "silu", "silu_backward", "tanh",
                     "tanh_backward", "sigmoid", "sigmoid_backward", "exp", "log", "rsqrt",
                     "sqrt", "sin", "cos"), "gelu"),
    **dict.fromkeys(("_to_copy", "copy_", "clone", "cat", "stack", "embedding",
                     "embedding_dense_backward", "index", "index_select", "gather",
                     "scatter", "scatter_add", "index_put_", "_index_put_impl_", "fill_",
                     "zero_", "zeros", "ones", "ones_like", "zeros_like", "full",
                     "full_like", "new_zeros", "arange"), "copy"),
}

# Kinds a calibration may lack (specs measured before they were probed, GPU presets): the
# kind that priced those ops before, which is what the time model falls back to.
MEMORY_KERNEL_STAND_IN = {"softmax_backward": "softmax", "masked_fill": "add",
                          "log_softmax_backward": "softmax_backward",
                          "layer_norm_backward": "layer_norm", "dropout": "add"}
# Row-wise forward kernels that pay per row beyond their bytes (a softmax's max, sum and
# normalise passes, a layer norm's statistics, per row): the calibration's measured
# seconds per row (`memory_probes.probe_row_seconds`) x the record's rows
# (`ir.kernel_recorder.row_loops`, kept in `inner_loops`) beyond those the bandwidth
# table's own rows of `device_grids.ROW_ELEMENTS` already paid (`extra_rows`). 0 where
# not measured.
ROW_COST_FIELD = {**dict.fromkeys(("_softmax", "_log_softmax", "_safe_softmax"),
                                  "softmax_row_s"),
                  "native_layer_norm": "layer_norm_row_s"}


def extra_rows(r: KernelRecord, rows: float) -> float:
    """Rows of a row-wise record beyond the bandwidth table's: the probe's seconds per
    row is the slope from rows of ROW_ELEMENTS to short ones (`probe_row_seconds`), and
    the table's points ran the same bytes in rows of ROW_ELEMENTS, so a record in rows of
    `width` pays rows x (1 - width / ROW_ELEMENTS) of them (none at 4096-wide rows: the
    table holds their per-row share; here a softmax over 32 x 4096 fp32 was priced 53.9
    us with 0.3 of row term on top, 54.0 measured, 2026-11-25). Rows wider than
    ROW_ELEMENTS: 0 (the probe's line runs from ROW_ELEMENTS down, not up)."""
    width = math.prod(r.shape) / max(1, r.inner_loops)
    return rows * max(0.0, 1.0 - width / ROW_ELEMENTS)
@dataclass(frozen=True, slots=True)
class KernelSeconds:
    """Seconds of one pass over some kernels, by kernel class. `launch_s` is what the
    launch floor adds above the kernels' roofline times."""

    gemm_s: float = 0.0
    attention_s: float = 0.0
    memory_s: float = 0.0
    launch_s: float = 0.0
    kernels: int = 0  # kernel launches (views excluded)
    ops: int = 0  # ATen ops dispatched (views included): the host's work
    conv_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.conv_s + self.attention_s + self.memory_s + self.launch_s


@dataclass(frozen=True, slots=True)
class LayerKernelSeconds:
    """One micro-batch of a layer on one rank: forward, backward, and what selective
    checkpointing recomputes (full checkpointing recomputes `forward`)."""

    forward: KernelSeconds
    backward: KernelSeconds
    selective_recompute: KernelSeconds


def launch_floor_s(cluster: ClusterSpec) -> float:
    """Least device seconds one kernel takes."""
    cal = cluster.kernel_calibration
    if cal is not None and cal.launch_device_s > 0:
        return cal.launch_device_s
    return 0.0 if cluster.host_bound else DEFAULT_GPU_KERNEL_FLOOR_S


def nearest_sdpa(cal: KernelCalibration | None, batch_heads: int, q_len: int, kv_len: int,
                 head_dim: int, dtype: str, causal: bool) -> SdpaPoint | None:
    """The measured SDPA point of the dispatched backend (else flash) in `dtype` nearest
    in (batch x heads, q_len, kv_len, head_dim) by log distance, same causality first."""
    if cal is None:
        return None
    for backend in (DISPATCHED_SDPA_BACKEND, "flash_attention"):
        points = [p for p in cal.sdpa if p.backend == backend and p.dtype == dtype]
        points = [p for p in points if p.causal == causal] or points
        if points:
            def distance(p: SdpaPoint) -> float:
                return sum(math.log2(a / b) ** 2 for a, b in (
                    (batch_heads, p.batch * p.heads), (q_len, p.seq_len), (kv_len, p.seq_len),
                    (head_dim, p.head_dim)))
            return min(points, key=distance)
    return None


def _token_scaled_gemm(shape: tuple[int, ...], scale: float, tokens: int,
                       share: float, weight_output: bool = False) -> tuple[int, int, int]:
    """(m, n, k) of one product after the micro-batch change and the TP split.
    `weight_output`: the record's output is a weight gradient (`KernelRecord.weight_output`,
    what the recorder saw it read): its k grows, whatever its dims."""
    batch, m, n, k = shape
    grow = lambda d: max(1, round(d * scale))  # noqa: E731
    # A batched matmul (attention's batch x heads; TP splits the heads) is priced as one
    # product of batch * m rows: cuBLAS's strided-batched GEMM runs the products side by side.
    if batch > 1:
        return grow(m * max(1, round(batch * scale * share))), n, k
    # Records without the mark (built by hand): the IR's token count itself first
    # (nn.Linear flattens (b, s) into m), then a multiple.
    if weight_output or (m != tokens and (k == tokens or (m % tokens and not k % tokens))):
        k = grow(k)  # weight gradient: x^T @ dy sums over the tokens
    else:
        m = grow(m)
    return m, max(1, round(n * share)), k


def _gemm_bytes(recorded: tuple[int, ...], m: int, n: int, k: int, config: StepConfig,
                share: float) -> float:
    """Bytes one scaled GEMM moves in the compute dtype: each operand read once, the
    output written once; a batched product (attention's bmm) per batch entry."""
    batch = recorded[0]
    element = config.precision.compute_bytes
    if batch > 1:  # `_token_scaled_gemm` folded the batch into m: unfold it
        entries = max(1, round(batch * config.batch_scale * share))
        per_m = max(1, round(m / entries))
        return entries * (per_m * k + k * n + per_m * n) * element
    return (m * k + k * n + m * n) * element


def recorded_bytes(r: KernelRecord, config: StepConfig) -> float:
    """Bytes one call of a record moves at the step's dtype and micro-batch."""
    return r.weight_bytes * config.dtype_scale + r.activation_bytes * config.activation_scale


def kernel_call_seconds(r: KernelRecord, cluster: ClusterSpec, config: StepConfig,
                        share: float, backward: bool) -> float:
    """Roofline seconds of ONE call of a record's kernel (no launch floor)."""
    dtype = config.precision.compute_dtype
    flops = r.flops * config.batch_scale * share
    nbytes = recorded_bytes(r, config) * share
    hbm = cluster.hbm_gbps * GB
    cal = cluster.kernel_calibration
    if r.kind is KernelKind.GEMM:
        tokens = config.graph_micro_batch * (config.seq_len or 1)
        m, n, k = _token_scaled_gemm(r.shape, config.batch_scale, tokens, share,
                                     r.weight_output)
        efficiency = gemm_shape_efficiency(cluster, m, n, k, dtype)
        # Bytes of the scaled product (reads m x k, k x n, writes m x n), not the recorded
        # ones scaled: a weight gradient's output is weight-sized whatever the batch.
        nbytes = _gemm_bytes(r.shape, m, n, k, config, share)
        layout = layout_of(r, backward)  # a Linear's layout costs more than the plain table's
        factor = cal.gemm_layout_factor(m, n, k, dtype, layout, cal.host_excess_s(
            r.op)) if cal and layout else 1.0  # less what the host model charges per call
        # Williams et al. 2009: max(compute-bound, memory-bound)
        return max(flops * factor / (cluster.peak_flops(dtype) * efficiency), nbytes / hbm)
    if r.kind is KernelKind.CONV:
        return _conv_seconds(r, cluster, config, share)
    if r.kind is KernelKind.ATTENTION:
        batch, heads, q_len, kv_len, head_dim = r.shape
        batch_heads = max(1, round(batch * config.batch_scale * heads * share))
        point = nearest_sdpa(cal, batch_heads, q_len, kv_len, head_dim, dtype, r.causal)
        if point is not None:
            # Dao 2023: 4*b*h*s^2*d forward FLOPs, 2.5x backward, at the measured seconds
            point_flops = 4 * point.batch * point.heads * point.seq_len ** 2 * point.head_dim
            rate = (ATTENTION_BACKWARD_FLOPS_RATIO * point_flops / point.backward_s if backward
                    else point_flops / point.forward_s)
            return flops / rate
        work = flops * (CAUSAL_WORK_FRACTION if r.causal else 1.0)
        efficiency = gemm_shape_efficiency(cluster, q_len, kv_len, head_dim, dtype)
        # Williams et al. 2009 roofline at one head's (s x d) @ (d x s) GEMM efficiency
        return max(work / (cluster.peak_flops(dtype) * efficiency), nbytes / hbm)
    if r.kind is KernelKind.MEMORY:
        op = r.op.split("::")[-1]
        if op == "embedding" and cal is not None and cal.embedding_call_s > 0:
            return embedding_forward_seconds(r, cluster, config, share)
        if op == "embedding_dense_backward" and embedding_probed(cal):
            return embedding_backward_seconds(r, cluster, config, share)
        if op in EMBEDDING_BAG_OPS and cal is not None and cal.embedding_bag_call_s > 0:
            return embedding_bag_seconds(r, cluster, config, share, backward)
        kind = memory_kind(r, cal)
        loops = r.inner_loops * share * config.batch_scale  # rows or loops grow alike
        return streaming_seconds(cluster, kind, dtype, nbytes) + (
            loop_seconds(r, cal, dtype, nbytes, loops)
            if kind in SHORT_RUN_KINDS and r.inner_loops > 1 else 0.0) + (
            extra_rows(r, loops) * getattr(cal, ROW_COST_FIELD[op])
            if op in ROW_COST_FIELD and cal else 0.0)
    return 0.0  # views: no kernel


def _conv_seconds(r: KernelRecord, cluster: ClusterSpec, config: StepConfig,
                  share: float) -> float:
    """A convolution (forward, or the backward's requested gradients) after the
    micro-batch change and the TP split (of its output channels). Each of grad_input and
    grad_weight is one implicit GEMM of the forward's (m, n, k) (im2col: Chellapilla et
    al. 2006; cuDNN, Chetlur et al. 2014): as many FLOPs and operand bytes as the forward,
    so a weight-only backward (a first conv fed the data) costs one, not two. Each such
    GEMM: measured, the forward FLOPs at the rate of that pass of the nearest measured
    conv (`KernelCalibration.nearest_conv`; equally near points averaged geometrically,
    the log-space midpoint); else the roofline of the implicit GEMM at its (m, n, k)'s
    GEMM efficiency. grad_bias is a sum over the output gradient."""
    groups, batch, c_in, c_out, positions, area, grads = r.shape
    dtype = config.precision.compute_dtype
    batch = max(1, round(batch * config.batch_scale))
    c_out = max(1, round(c_out * share))
    forward_flops = 2 * groups * batch * positions * c_out * c_in * area  # 2 x MACs
    passes = ("forward_s",) if r.op.split("::")[-1] == "convolution" else tuple(
        field for bit, field in ((CONV_GRAD_INPUT, "input_backward_s"),
                                 (CONV_GRAD_WEIGHT, "weight_backward_s")) if grads & bit)
    cal = cluster.kernel_calibration
    points = [] if cal is None else cal.nearest_conv(batch, c_in, c_out, positions, area, dtype)
    if points:
        def seconds(field: str) -> float:  # forward FLOPs at the points' geometric-mean rate
            rates = [p.flops / getattr(p, field) for p in points]
            return forward_flops / math.exp(sum(map(math.log, rates)) / len(rates))
        total_s = sum(map(seconds, passes))
    else:
        _, m, n, k = conv_implicit_gemm((groups, batch, c_in, c_out, positions, area, grads))
        efficiency = gemm_shape_efficiency(cluster, m, n, k, dtype)
        nbytes = groups * (m * k + k * n + m * n) * config.precision.compute_bytes
        # Williams et al. 2009: max(compute-bound, memory-bound), per implicit GEMM
        total_s = len(passes) * max(forward_flops / (cluster.peak_flops(dtype) * efficiency),
                                    nbytes / (cluster.hbm_gbps * GB))
    if grads & CONV_GRAD_BIAS:  # reads the output gradient once, writes c_out sums
        grad_out_bytes = groups * batch * c_out * positions * config.precision.compute_bytes
        total_s += streaming_seconds(cluster, "sum", dtype, grad_out_bytes)
    return total_s


def memory_kind(r: KernelRecord, cal: KernelCalibration | None) -> str:
    """The calibration kind that prices a memory record: its op's kind, or a stand-in for
    a kind the calibration lacks."""
    if r.unvectorized and measured(cal, "broadcast_scalar"):
        return "broadcast_scalar"  # ATen's CPU loop runs it element by element
    kind = math_kind(r, cal) or MEMORY_KERNEL_OF_OP.get(r.op.split("::")[-1], "add")  # seqkern2
    while kind in MEMORY_KERNEL_STAND_IN and not measured(cal, kind):
        kind = MEMORY_KERNEL_STAND_IN[kind]
    return kind


def streaming_seconds(cluster: ClusterSpec, kernel: str, dtype: str, nbytes: float) -> float:
    """`nbytes` through a memory-bound kernel of this kind at its measured bandwidth."""
    # a CPU spec's hbm_gbps is itself measured; a GPU preset's is the datasheet's
    # (kinds without a share here are only asked for where measured: `memory_kind`)
    default_gbps = cluster.hbm_gbps * (
        1.0 if cluster.host_bound else GPU_MEMORY_KERNEL_BANDWIDTH_FRACTION.get(kernel, 1.0))
    return nbytes / (memory_gbps(cluster.kernel_calibration, kernel, dtype, nbytes,
                                 default_gbps) * GB)


def pass_seconds(records: tuple[KernelRecord, ...], cluster: ClusterSpec, config: StepConfig,
                 share: float, backward: bool) -> KernelSeconds:
    """Sum over kernels of count x max(roofline, launch floor), by kernel class, + each
    distinct memory op's cold-code seconds once (`cost_models.cold_kernel`). Pure draws
    are left to `compute.random_draw_seconds` where the spec measured them."""
    floor = launch_floor_s(cluster)
    sums = {KernelKind.GEMM: 0.0, KernelKind.CONV: 0.0, KernelKind.ATTENTION: 0.0,
            KernelKind.MEMORY: 0.0}
    launch = 0.0
    kernels = ops = 0
    for r in records:
        ops += r.count
        if r.kind is KernelKind.VIEW:
            continue
        kernels += r.count
        if cluster.random_element_s > 0 and r.op.split("::")[-1] in DRAW_ONLY_OPS:
            continue
        call_s = (kernel_call_seconds(r, cluster, config, share, backward)  # + fresh output
                  + fresh_output_seconds(r, cluster.kernel_calibration, config, share, backward))
        sums[r.kind] += r.count * call_s
        launch += r.count * max(0.0, floor - call_s)
    sums[KernelKind.MEMORY] += cold_kernel_seconds(  # each distinct op's code, out of L2
        cold_code_records(records, cluster), cluster, config, share)
    return KernelSeconds(sums[KernelKind.GEMM], sums[KernelKind.ATTENTION],
                         sums[KernelKind.MEMORY], launch, kernels, ops, sums[KernelKind.CONV])


def cold_code_records(records, cluster: ClusterSpec) -> list[KernelRecord]:
    """The records whose cold code `pass_seconds` prices: all but pure draws where the spec
    prices them apart (`compute.random_draw_seconds`)."""
    drawn = DRAW_ONLY_OPS if cluster.random_element_s > 0 else ()
    return [r for r in records if r.op.split("::")[-1] not in drawn]


# Results per (records, cluster, step shape, TP share): the search prices the same layer
# under many strategies.
_MEMO = IdMemo(max_entries=4096)


def layer_kernel_seconds(kernels: KernelRecords, cluster: ClusterSpec, config: StepConfig,
                         share: float = 1.0) -> LayerKernelSeconds:
    """Forward, backward and selective-recompute kernel seconds of one layer (memoised)."""
    key = (id(kernels), id(cluster), config.micro_batch, config.graph_micro_batch,
           config.graph_dtype, config.precision, config.seq_len, share)
    return _MEMO.get(key, (kernels, cluster), _layer_kernel_seconds, kernels, cluster, config,
                     share)


def _layer_kernel_seconds(kernels: KernelRecords, cluster: ClusterSpec, config: StepConfig,
                          share: float) -> LayerKernelSeconds:
    return LayerKernelSeconds(
        pass_seconds(kernels.forward, cluster, config, share, backward=False),
        pass_seconds(kernels.backward, cluster, config, share, backward=True),
        pass_seconds(kernels.recomputed(Checkpoint.SELECTIVE), cluster, config, share,
                     backward=False))
