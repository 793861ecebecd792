"""CPU offload (ZeRO-Offload) of one ZeRO-3 layer: PCIe copies, host optimizer step, host memory.

The data flow is ZeRO-Offload's (Ren et al. 2021, sec. 3-4): fp32 parameters,
gradients and optimizer states live in host memory, the optimizer steps on the CPU,
16-bit parameters reach the device for compute and gradients come back over PCIe. The
executor runs it with FSDP2's `CPUOffloadPolicy` on a `fully_shard` (ZeRO-3) unit, which
fixes the byte counts (torch 2.13, torch/distributed/fsdp/_fully_shard):

  H2D   `FSDPParam.all_gather_inputs`: the rank's sharded parameter, in its stored dtype
        (fp32), is copied to the device before EVERY all-gather, and cast to the compute
        dtype there: once in forward and again in backward (ZeRO-3 reshards after
        forward), per micro-batch.
  D2H   `foreach_reduce`: the reduced gradient shard (reduce_dtype: fp32) is copied to
        the host after the reduce-scatter, once per iteration (gradients accumulate
        unreduced on the device until the last micro-batch).
  step  the optimizer updates the host shard: Adam reads param, grad, m, v and writes
        param, m, v (7 x 4 bytes per element), memory-bound on the host memory bus,
        which the node's ranks share (they step at the same time). That is the paper's
        vectorized CPU Adam (sec. 5.1) and torch's `AdamW(fused=True)` on CPU; torch's
        default single-tensor CPU AdamW is not memory-bound: measured here (torch 2.13,
        one thread, 2^24 fp32 elements) 130-165 ms per step against 16 ms fused, so a run
        with the default optimizer steps offloaded layers several times slower than priced.

Overlap assumption: the H2D copy of a unit precedes its all-gather (the gather needs
it) and runs on FSDP2's all-gather stream with pinned memory, so it joins the unit's
data-parallel traffic, which hides behind compute as any DP traffic does
(cost_models.estimate.overlap_efficiency); likewise the D2H copy after the reduce-scatter.
The host optimizer step is not overlapped (FSDP2 steps after backward; ZeRO-Offload's
delayed parameter update is not used), so it adds to the iteration.

Host memory is its own wall: per rank the fp32 shard, its fp32 gradient and the
moments; per node the sum over its ranks must fit `ClusterSpec.host_memory_bytes`.
"""

from __future__ import annotations

from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import Layer
from ir.strategy import LayerStrategy

from cost_models.common import GB
from cost_models.model_states import FP32_BYTES, ModelStates, held_local_params

# H2D copies per micro-batch of a ZeRO-3 unit: one before the forward all-gather, one
# before the backward all-gather (FSDP2 reshard_after_forward=True).
H2D_COPIES_PER_MICROBATCH = 2
# Bytes per element the host optimizer step streams, as `ir.plan.host_step_implementation`
# steps it. Fused Adam reads param, grad, m, v and writes param, m, v. SGD steps foreach
# (torch/optim/sgd.py `_multi_tensor_sgd`): with momentum buf.mul_ (2 streams),
# buf.add_(grad) (3), param.add_(buf) (3); without, param.add_(grad) (3).
HOST_STEP_BYTES_PER_ELEMENT = {"adamw": 7 * 4, "adam": 7 * 4, "sgd-momentum": 8 * 4,
                               "sgd": 3 * 4}


def offloadable(strategy: LayerStrategy, cluster: ClusterSpec) -> bool:
    """Offload is offered for ZeRO-3 layers on a cluster whose spec gives the host side."""
    return strategy.dp_mode.stage == 3 and cluster.offload_known


def _check_priceable(cluster: ClusterSpec) -> None:
    if not cluster.offload_known:
        raise PlannerError(f"cluster {cluster.name} gives no pcie_gbps, host_memory_bytes and "
                           "host_memory_gbps: an offloaded layer cannot be priced; add them to "
                           "the spec or re-plan without offload")


def shard_params(layer: Layer, strategy: LayerStrategy) -> float:
    """Parameters in this rank's FSDP2 shard of the layer (tied copies included)."""
    return held_local_params(layer, strategy) / strategy.dp


def h2d_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec) -> float:
    """One host-to-device copy of the fp32 shard (before one all-gather); 0 unless offloaded."""
    if not strategy.offload:
        return 0.0
    _check_priceable(cluster)
    # Ren et al. 2021 sec. 3-4 data flow, FSDP2's fp32 shard copy: bytes / PCIe bandwidth.
    return shard_params(layer, strategy) * FP32_BYTES / (cluster.pcie_gbps * GB)


def d2h_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec) -> float:
    """One device-to-host copy of the reduced fp32 gradient shard; 0 unless offloaded."""
    if not strategy.offload:
        return 0.0
    _check_priceable(cluster)
    # Ren et al. 2021 sec. 4.2 (each rank offloads its gradient partition): bytes / PCIe bandwidth.
    return shard_params(layer, strategy) * FP32_BYTES / (cluster.pcie_gbps * GB)


def host_step_seconds(layer: Layer, strategy: LayerStrategy, cluster: ClusterSpec,
                      optimizer: str) -> float:
    """The CPU optimizer step over the rank's shard: bytes it streams over the host memory
    bus, which the node's devices_per_node ranks share; 0 unless offloaded."""
    if not strategy.offload:
        return 0.0
    _check_priceable(cluster)
    per_rank_bytes_per_s = cluster.host_memory_gbps * GB / cluster.devices_per_node
    # Ren et al. 2021 sec. 5.1 (CPU Adam is memory-bound): streamed bytes / shared bandwidth.
    return shard_params(layer, strategy) * HOST_STEP_BYTES_PER_ELEMENT[optimizer] \
        / per_rank_bytes_per_s


def split_states(states: ModelStates, strategy: LayerStrategy) -> tuple[ModelStates, ModelStates]:
    """(device, host) model states of a layer: an offloaded layer holds its stored fp32
    shard, gradient shard and moments in host memory and none of them on the device
    (the gathered working copy and unreduced gradients stay device transients)."""
    if not strategy.offload:
        return states, ModelStates(0.0, 0.0, 0.0)
    return ModelStates(0.0, 0.0, 0.0), states


def host_wall_problem(host_bytes_per_rank: float, cluster: ClusterSpec) -> str:
    """'' when the node's ranks' host bytes fit its host memory, else the shortfall."""
    node_bytes = host_bytes_per_rank * cluster.devices_per_node
    if node_bytes <= cluster.host_memory_bytes:
        return ""
    return (f"host memory: offloaded states need {node_bytes / 2**30:.1f} GiB per node of "
            f"{cluster.host_memory_bytes / 2**30:.1f} GiB")
