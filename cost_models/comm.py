"""Communication time: alpha-beta collectives, group placement, and per-layer TP/DP/PP traffic.

Collectives (Thakur et al. 2005; Patarasuk & Yuan 2009; REFERENCES.md), S bytes, n ranks,
alpha per step, B bytes/s per rank:
  ring all-reduce        2(n-1)*alpha + 2(n-1)/n * S/B
  tree all-reduce        2*log2(n)*alpha + 2*S/B          (pipelined double binary tree)
  all-gather / reduce-scatter / all-to-all   (n-1)*alpha + (n-1)/n * S/B
  broadcast              ceil(log2 n) * (alpha + S/B)     (binomial tree)
  send/recv              alpha + S/B
All-reduce takes the cheaper of ring and tree for the size, as NCCL's tuner does.
S is the full (unsharded) tensor for all-gather and reduce-scatter.

Placement: ranks are numbered TP innermost, then DP, then PP (Megatron-LM's default
order), so a TP group is `tp` consecutive ranks (stride 1), a DP group has stride `tp`,
and pipeline neighbours are one stage's device count apart. A group spans nodes when
size * stride > devices_per_node; then each node contributes k = devices_per_node /
stride members (at least 1), each with its own NIC, and NCCL runs k rings in parallel:
bandwidth min(intra, k * inter). Measured fits from `planner profile-cluster` replace a
scope's alpha and bandwidth; a fit measured with groups of the same size wins (a pair of
ranks inside a busy node is not an eighth of an 8-rank ring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ir.cluster import ClusterSpec
from ir.layer import Layer, TPStyle
from ir.legality import sequence_parallel_applies
from ir.strategy import Checkpoint, DPMode, LayerStrategy
from ir.tp_recompute import TP_REDUCING_STYLES  # Megatron's g (Shoeybi et al. 2019, sec. 3)

from cost_models.activations import grad_input_bytes, sp_gathered_modules
from cost_models.common import GB, StepConfig
from cost_models.layer_memo import layout_view, per_layer
from cost_models.dp_copies import dp_copy_step_seconds
from cost_models.model_states import BytesPerParam, has_dp_unit, tp_local_params
from cost_models.offload import d2h_seconds, h2d_seconds

# torch's loss_parallel cross-entropy: all-reduces of the per-token max, the sum of
# exponentials and the target logit (torch.distributed.tensor.parallel.loss_parallel).
LOSS_PARALLEL_ALL_REDUCES = 3
# The collective that reduces a DP unit's gradients, by mode. FSDP2 issues it in the
# unit's post-backward without async_op (torch 2.13 `_fsdp_collectives.foreach_reduce`:
# `dist.all_reduce` for replicate, `reduce_scatter_comm(..., async_op=False)` for
# fully_shard; `executors.host_collectives`' ring is synchronous too). On GPUs it runs on
# FSDP2's reduce stream; on CPU processes, which have no streams, the backward blocks on
# every call (`dp_comm_s`).
GRADIENT_SYNC = {DPMode.REPLICATE: "all_reduce", DPMode.ZERO1: "all_reduce",
                 DPMode.ZERO2: "reduce_scatter", DPMode.ZERO3: "reduce_scatter"}


@dataclass(frozen=True, slots=True)
class Link:
    """What a group of ranks sees: per-step latency and per-rank bus bandwidth."""

    alpha_s: float
    bytes_per_s: float
    spans_nodes: bool


def group_link(cluster: ClusterSpec, size: int, stride: int,
               collective: str = "all_reduce") -> Link:
    """Latency and bandwidth of a group of `size` ranks `stride` apart (see module doc)."""
    spans = size > 1 and size * stride > cluster.devices_per_node
    scope = "inter_node" if spans else "intra_node"
    fit = cluster.calibration.collective_fit(collective, scope, size)
    if fit is not None:
        return Link(fit.alpha_s, fit.bytes_per_s, spans)
    if not spans:
        return Link(cluster.intra_node_latency_s, cluster.intra_node_gbps * GB, False)
    per_node = max(1, min(size, cluster.devices_per_node // stride))
    bandwidth = min(cluster.intra_node_gbps, per_node * cluster.inter_node_gbps) * GB
    return Link(cluster.inter_node_latency_s, bandwidth, True)


# ---- collectives ------------------------------------------------------------------------


def ring_all_reduce_s(nbytes, n, link: Link):
    """Ring all-reduce: 2(n-1)*alpha + 2(n-1)/n * S/B (Patarasuk & Yuan 2009)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * link.alpha_s + 2 * (n - 1) / n * nbytes / link.bytes_per_s


def tree_all_reduce_s(nbytes, n, link: Link):
    """Double binary tree all-reduce: 2*log2(n)*alpha + 2*S/B (NCCL 2.4, pipelined)."""
    if n <= 1:
        return 0.0
    return 2 * math.log2(n) * link.alpha_s + 2 * nbytes / link.bytes_per_s


def all_reduce_s(nbytes, n, link: Link):
    """The cheaper of ring and tree for this size, as NCCL's tuner picks."""
    return min(ring_all_reduce_s(nbytes, n, link), tree_all_reduce_s(nbytes, n, link))


def all_gather_s(nbytes, n, link: Link):
    """All-gather of an S-byte result: (n-1)*alpha + (n-1)/n * S/B (ring)."""
    if n <= 1:
        return 0.0
    return (n - 1) * link.alpha_s + (n - 1) / n * nbytes / link.bytes_per_s


def reduce_scatter_s(nbytes, n, link: Link):
    """Reduce-scatter of an S-byte input: (n-1)*alpha + (n-1)/n * S/B (ring)."""
    return all_gather_s(nbytes, n, link)


def all_to_all_s(nbytes, n, link: Link):
    """All-to-all of S bytes per rank: (n-1)*alpha + (n-1)/n * S/B (pairwise exchange)."""
    return all_gather_s(nbytes, n, link)


def send_recv_s(nbytes, link: Link):
    """Point-to-point: alpha + S/B."""
    return link.alpha_s + nbytes / link.bytes_per_s


def broadcast_s(nbytes, n, link: Link):
    """Binomial-tree broadcast: ceil(log2 n) * (alpha + S/B) (Thakur et al. 2005, sec. 4.1)."""
    if n <= 1:
        return 0.0
    return math.ceil(math.log2(n)) * send_recv_s(nbytes, link)


# `collective_s` answers kept by (cluster, collective, bytes, ranks, stride): a search asks
# some 500 distinct questions ~50,000 times (issue 19's profile). An entry holds its
# (frozen) cluster, so the cluster's id cannot be reused while the entry lives; past this
# many entries the cache starts again.
COLLECTIVE_CACHE_ENTRIES = 1 << 16
_collective_cache: dict[tuple, tuple[ClusterSpec, float]] = {}


def collective_s(collective: str, nbytes, n: int, cluster: ClusterSpec, stride: int = 1):
    """Time of a named collective over a group placed with `stride` (fits respected)."""
    key = (id(cluster), collective, nbytes, n, stride)
    try:
        hit = _collective_cache.get(key)
    except TypeError:  # an unhashable size (an array): not kept
        return _collective_s(collective, nbytes, n, cluster, stride)
    if hit is not None and hit[0] is cluster:
        return hit[1]
    seconds = _collective_s(collective, nbytes, n, cluster, stride)
    if len(_collective_cache) >= COLLECTIVE_CACHE_ENTRIES:
        _collective_cache.clear()
    _collective_cache[key] = (cluster, seconds)
    return seconds


def _collective_s(collective: str, nbytes, n: int, cluster: ClusterSpec, stride: int):
    link = group_link(cluster, n, stride, collective)
    if collective == "broadcast":
        return broadcast_s(nbytes, n, link)
    if collective == "all_reduce":
        if cluster.calibration.collective_fit("all_reduce", "inter_node" if link.spans_nodes
                                              else "intra_node", n) is not None:
            return ring_all_reduce_s(nbytes, n, link)  # the fit was made in ring form
        return all_reduce_s(nbytes, n, link)
    if collective == "send_recv":
        return send_recv_s(nbytes, link) if n > 1 else 0.0
    return {"all_gather": all_gather_s, "reduce_scatter": reduce_scatter_s,
            "all_to_all": all_to_all_s}[collective](nbytes, n, link)


def blocking_s(collective: str, nbytes, n: int, cluster: ClusterSpec, stride: int = 1,
               dtensor: bool = False):
    """A call the rank waits on before it can go on (TP collectives, pipeline
    send/recv, ZeRO-1's all-gathers, CPU gradient syncs): the collective plus the wait
    profile-cluster measured for it at this message size on CPU processes that compute
    between calls (`BlockingWait`'s line in bytes; 0 on GPUs and unmeasured specs).
    `dtensor`: the call as DTensor issues it (a TP collective: funcol collective then
    `wait_tensor`), which pays the wait measured in that form where the spec has one."""
    if n <= 1:
        return 0.0
    tables = cluster.calibration
    wait = tables.tp_blocking_wait_seconds if dtensor else tables.blocking_wait_seconds
    return collective_s(collective, nbytes, n, cluster, stride) + wait(collective, n, nbytes)


# ---- per-layer traffic --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LayerComm:
    """Seconds of communication one layer causes on one rank."""

    tp_forward_s: float  # per micro-batch, blocking
    tp_backward_s: float  # per micro-batch, blocking (recomputed forward's share included)
    dp_forward_s: float  # per micro-batch: ZeRO-3 parameter all-gather before forward
    dp_backward_s: float  # per micro-batch: ZeRO-3 re-gather
    dp_step_s: float  # once per iteration: gradient all-reduce / reduce-scatter, ZeRO-2 gather
    tp_step_s: float = 0.0  # once per iteration, blocking: SP's partial gradients (sp_grad_sync_s)
    # once per iteration, not overlapped: ZeRO-1 parameter all-gathers after the optimizer
    # step, and a DP unit's gradient-reduction copies (`dp_copies`: by bytes on a GPU, the
    # unit's per-parameter figure's once-a-step share on CPU processes)
    dp_after_step_s: float = 0.0


def tp_comm_s(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
              config: StepConfig) -> tuple[float, float]:
    """`_tp_comm_s`, which reads the strategy's TP degree, SP and checkpoint mode alone
    (`layer_memo.layout_view`)."""
    return _tp_comm_s(layer, layout_view(strategy), cluster, config)


@per_layer
def _tp_comm_s(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
               config: StepConfig) -> tuple[float, float]:
    """TP collectives of one layer as the executor issues them (DTensor, torchtitan-style
    plans). Forward: one all-reduce per row-parallel (or vocab) module (Shoeybi et al.
    2019). Backward: one all-reduce per column-parallel module's input gradient (none for
    an input that is the model's data: `input_grad_reductions`): DTensor reduces q, k and
    v (gate and up) separately where Megatron fuses them into the block's one. With
    sequence parallelism each forward all-reduce becomes an all-gather plus a
    reduce-scatter; backward all-gathers each reduce-scattered output's gradient and
    reduce-scatters each gathered input's gradient, where it has one
    (`sp_input_grad_reductions`; Korthikanti et al. 2022, sec. 4.2.2). A full recompute
    issues again the gathers and the reductions the forward saved something after (early
    stop: `ir.tp_recompute`). Each pays the wait measured in DTensor's form
    (`blocking_s(..., dtensor=True)`). Returns (forward_s, backward_s) for one
    micro-batch."""
    tp = strategy.tp
    if tp == 1 or not layer.tp_candidates:
        return 0.0, 0.0
    reducing = sum(1 for c in layer.tp_candidates if c.style in TP_REDUCING_STYLES)
    colwise = input_grad_reductions(layer, TPStyle.COLWISE)
    heads = sum(1 for c in layer.tp_candidates if c.style is TPStyle.HEAD)
    activation = layer.output_bytes * config.activation_scale  # b*s*h in the compute dtype
    if sequence_parallel_applies(layer, strategy):
        ag = blocking_s("all_gather", activation, tp, cluster, dtensor=True)
        rs = blocking_s("reduce_scatter", activation, tp, cluster, dtensor=True)
        forward = reducing * (ag + rs)
        # backward: each reduce-scatter's all-gather, and the reduce-scatter of each
        # gathered input's gradient where it has one (`sp_input_grad_reductions`)
        backward = reducing * ag + sp_input_grad_reductions(layer) * rs
    else:
        ar = blocking_s("all_reduce", activation, tp, cluster, dtensor=True)
        forward = reducing * ar
        backward = colwise * ar
    # A vocabulary-parallel head reduces its input's gradient in backward; its loss-parallel
    # cross-entropy all-reduces per-token scalars in forward (latency-bound: no bytes).
    forward += heads * LOSS_PARALLEL_ALL_REDUCES * blocking_s("all_reduce", 0, tp, cluster,
                                                              dtensor=True)
    # Only the inputs that get a gradient: the hidden states, not the integer labels.
    backward += input_grad_reductions(layer, TPStyle.HEAD) * blocking_s(
        "all_reduce", grad_input_bytes(layer) * config.activation_scale, tp, cluster,
        dtensor=True)
    if strategy.checkpoint is Checkpoint.FULL:  # the recompute's own (ir.tp_recompute)
        again = layer.rowwise_before_last_save_fwd
        if again is None:  # not counted (an untraced layer): every forward one again
            backward += forward
        elif sequence_parallel_applies(layer, strategy):
            backward += reducing * ag + again * rs
        else:
            backward += again * ar
    return forward, backward


@per_layer
def input_grad_reductions(layer: Layer, style: TPStyle) -> int:
    """TP modules of `style` whose backward all-reduces their input's gradient: all but
    those fed only tensors that get no gradient (`Layer.gradless_tp_inputs`: the model's
    data), for which autograd never calls DTensor's from_local backward (Megatron's f)."""
    return sum(1 for c in layer.tp_candidates
               if c.style is style and c.module not in layer.gradless_tp_inputs)


@per_layer
def sp_input_grad_reductions(layer: Layer) -> int:
    """Modules whose SP-gathered input (`sp_gathered_modules`) gets a gradient, so whose
    backward reduce-scatters it: all but those whose column-parallel linears all read
    only tensors without one (`Layer.gradless_tp_inputs`), for which autograd records no
    backward of the gather (2 gloo ranks: `tests/test_tp_data_inputs.py`)."""
    return sum(1 for linears in sp_gathered_modules(layer).values()
               if not set(linears) <= set(layer.gradless_tp_inputs))


def dp_comm_s(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
              per_param: BytesPerParam) -> tuple[float, float, float, float]:
    """Data-parallel traffic of one layer as the executor issues it (volumes: ZeRO,
    Rajbhandari et al. 2019, sec. 7). Micro-batches accumulate without a gradient sync
    (`set_gradient_sync`), so gradients are reduced once per iteration, in the last
    backward:
    replicate: all-reduce gradients (2 psi);
    ZeRO-1: the same all-reduce, then after the optimizer step one all-gather of the
    updated parameters from the ranks' flat shards (`executors.zero1`; 1 psi);
    ZeRO-2: reduce-scatter gradients + all-gather parameters once per iteration (2 psi);
    ZeRO-3: all-gather parameters before every forward and again every backward, and
    reduce-scatter gradients once per iteration.
    On CPU processes the gradient sync (`GRADIENT_SYNC`) and ZeRO-2/3's parameter
    all-gathers are blocking calls (`blocking_s`: they pay the measured wait); on GPUs they
    run on FSDP2's reduce and all-gather streams.
    Returns (forward_s per micro-batch, backward_s per micro-batch, step_s per iteration,
    after_step_s per iteration, blocking)."""
    dp = strategy.dp
    if dp == 1 or layer.params + layer.tied_params == 0:  # no parameters: no DP unit, no sync
        return 0.0, 0.0, 0.0, 0.0
    local = tp_local_params(layer.params, layer.tp_params, strategy.tp)
    param_bytes = local * per_param.params
    grad_bytes = local * per_param.grads
    stride = strategy.tp
    mode = strategy.dp_mode
    price = blocking_s if cluster.host_bound else collective_s
    sync = price(GRADIENT_SYNC[mode], grad_bytes, dp, cluster, stride)
    if mode is DPMode.REPLICATE:
        return 0.0, 0.0, sync, 0.0
    if mode is DPMode.ZERO1:
        return 0.0, 0.0, sync, blocking_s("all_gather", param_bytes, dp, cluster, stride)
    # FSDP2's unshard waits on its all-gather before the unit runs (issue 17: t5-zero3x2's
    # units' `FSDP::all_gather` read 1.2-2.6 ms under torch.profiler where the fit said
    # 0.2-0.3): on CPU processes it pays the blocking call's wait, as the gradient sync does
    ag = price("all_gather", param_bytes, dp, cluster, stride)
    if mode is DPMode.ZERO2:
        return 0.0, 0.0, sync + ag, 0.0
    return ag, ag, sync, 0.0


def layer_comm(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
               config: StepConfig, per_param: BytesPerParam) -> LayerComm:
    tp_f, tp_b = tp_comm_s(layer, strategy, cluster, config)
    dp_f, dp_b, dp_step, dp_after_step = dp_comm_s(layer, strategy, cluster, per_param)
    # CPU offload: H2D before each all-gather, D2H after the reduce-scatter (cost_models.offload)
    h2d, d2h = h2d_seconds(layer, strategy, cluster), d2h_seconds(layer, strategy, cluster)
    reduce_copies_s = dp_copy_step_seconds(layer, strategy, cluster, config)
    return LayerComm(tp_f, tp_b, dp_f + h2d, dp_b + h2d, dp_step + d2h,
                     sp_grad_sync_s(layer, strategy, cluster, config, per_param),
                     dp_after_step + reduce_copies_s)


@per_layer
def replicated_tensors(layer: Layer) -> int:
    """Parameter tensors outside the layer's TP modules (norm weights and biases): every
    rank of a TP group holds them whole."""
    prefix = f"{layer.name}." if layer.name else ""
    modules = tuple(f"{prefix}{c.module}." for c in layer.tp_candidates)
    return sum(1 for name in layer.param_names if not name.startswith(modules))


def sp_grad_sync_s(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                   config: StepConfig, per_param: BytesPerParam) -> float:
    """Once per iteration: under sequence parallelism each TP rank's gradient of a
    replicated parameter (a norm weight) covers its own sequence shard only, so the TP
    group all-reduces them (Korthikanti et al. 2022, sec. 4.2.2). The executor buckets
    them into one all-reduce after backward (`dist.all_reduce`: the plain wait); inside a
    DP unit each tensor's Partial gradient is redistributed on its own, a funcol
    all-reduce: DTensor's form and wait (torch.profiler, gpt-tp2-dp2-sp on 4 gloo ranks:
    16 `_c10d_functional::all_reduce` of 64 floats per step, 4 per block)."""
    tensors = replicated_tensors(layer)
    if not sequence_parallel_applies(layer, strategy) or not tensors:
        return 0.0
    grad_bytes = max(layer.params - layer.tp_params, 0) * per_param.grads
    if has_dp_unit(layer, strategy, config.precision):
        return tensors * blocking_s("all_reduce", grad_bytes / tensors, strategy.tp, cluster,
                                    dtensor=True)
    return blocking_s("all_reduce", grad_bytes, strategy.tp, cluster)


def p2p_s(nbytes: float, cluster: ClusterSpec, stage_devices: int) -> float:
    """Pipeline send of a boundary tensor to the next stage, `stage_devices` ranks away."""
    if nbytes <= 0:
        return 0.0
    return blocking_s("send_recv", nbytes, 2, cluster, stride=stage_devices)


def tp_transition_s(boundary_bytes: float, tp_from: int, tp_to: int, sp_from: bool,
                    sp_to: bool, cluster: ClusterSpec) -> float:
    """Forward re-layout of an activation between adjacent layers with different TP/SP
    layouts (Galvatron's transformation cost, Miao et al. 2022); backward costs the same.

    `boundary_bytes` is one replica's micro-batch activation. A sequence-sharded source
    is all-gathered over its TP group first. Growing TP from a to b merges the samples
    of b/a former data-parallel replicas: an all-gather over b/a ranks `a` apart.
    Shrinking TP, or entering sequence parallelism, is a local slice: free.
    """
    seconds = 0.0
    if sp_from and tp_from > 1:
        seconds += blocking_s("all_gather", boundary_bytes, tp_from, cluster)
    if tp_to > tp_from:
        merge = tp_to // tp_from
        seconds += blocking_s("all_gather", boundary_bytes * merge, merge, cluster,
                              stride=tp_from)
    return seconds
