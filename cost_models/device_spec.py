"""A cluster spec from one device's measured tables (`profile_device.measure`).

CPU: one process per core of this machine, its host figures from the per-pass probes
(`host_probes.host_op_seconds_by_pass`: the median of its rounds, their range recorded)
and the local gloo links. GPU: the datasheet preset of the device by its exact name
(`clusters.preset_for_device`; peaks from the datasheet, `matmul_efficiency` = best
measured bf16 / peak), else the best measured rates and `clusters.FALLBACK_GPU_PRESET`'s
links, said so in one line; the host's per-op figure read HOST_PROBE_PASSES times.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.kernel_calibration import KernelCalibration

from cost_models import clusters
from cost_models.checkpoint_probes import checkpoint_host_seconds
from cost_models.cold_backward_probes import cold_backward_calibration
from cost_models.cold_entry_probes import cold_entry_calibration
from cost_models.host_probes import HOST_OP_ROUNDS, autograd_call_s, host_op_seconds_by_pass
from cost_models.item_probes import probe_random_element_s
from cost_models.pipeline_probes import pipeline_action_host_s
from cost_models.profile_device import HBM_MIN_MOVED_BYTES
from cost_models.scalar_operand_probes import scalar_operand_seconds
from cost_models.sequence_probes import in_sequence_chains, in_sequence_cost
from cost_models.step_loop_probes import step_loop_fields
from cost_models.tied_sync import TIED_SUM_FIELDS, probe_tied_sum

# Passes of the GPU host's per-op probe (each `clusters.OP_OVERHEAD_ROUNDS` rounds): a
# pass is ~2 s there (200 runs x ~25 ops x 20-35 us a round).
HOST_PROBE_PASSES = 3


def spec_from_calibration(device: str, cal: KernelCalibration, name: str,
                          progress=None) -> ClusterSpec:
    """A cluster spec for this device with the measured tables and figures in it; a GPU
    no preset describes is said so in one line (`progress`, else stderr) and in its notes."""
    import torch

    streams = [p for p in cal.memory_kernels if p.kernel in ("copy", "add")
               and p.nbytes >= HBM_MIN_MOVED_BYTES[device]]
    if not streams:
        raise PlannerError(f"profile-device: no copy moved {HBM_MIN_MOVED_BYTES[device]} bytes "
                           "or more; the memory bandwidth needs one")
    hbm_gbps = max(p.gbps for p in streams)
    best = {}
    for p in cal.gemm:
        best[p.dtype] = max(best.get(p.dtype, 0.0), p.flop_per_s)
    if device == "cpu":
        # Forward and backward per op, apart, and what forward ops pay in sequence
        host = host_op_seconds_by_pass("cpu")
        sequence = in_sequence_cost(in_sequence_chains("cpu"))
        cold = cold_entry_calibration("cpu")  # after the block, a small layer, the same code
        cold_bwd = cold_backward_calibration("cpu")  # after a Linear's, a block's backward
        tied_sum = probe_tied_sum()  # executors.tied's gradient sum, once a step
        scalar = scalar_operand_seconds("cpu")  # a forward op given a Python number
        return ClusterSpec(
            name=name, device="cpu", num_nodes=1, devices_per_node=1,
            device_memory_bytes=clusters.total_memory_bytes(),
            peak_flops_by_dtype=tuple(sorted(best.items())), hbm_gbps=hbm_gbps,
            intra_node_gbps=clusters.LOCAL_GLOO_GBPS, inter_node_gbps=clusters.LOCAL_GLOO_GBPS,
            intra_node_latency_s=clusters.LOCAL_GLOO_LATENCY_S,
            inter_node_latency_s=clusters.LOCAL_GLOO_LATENCY_S,
            runtime_overhead_bytes=clusters.LOCAL_RUNTIME_OVERHEAD_BYTES, matmul_efficiency=1.0,
            op_overhead_s=host.forward_s, backward_op_overhead_s=host.backward_s,  # median rounds
            dtensor_op_overhead_s=clusters.LOCAL_DTENSOR_OP_OVERHEAD_S,
            random_element_s=probe_random_element_s("cpu"),
            host_cores=clusters.host_cores(),
            kernel_calibration=dataclasses.replace(
                cal, **host.calibration_fields(), **sequence.calibration_fields(),
                op_overhead_min_s=host.forward_range_s[0],
                op_overhead_max_s=host.forward_range_s[1],
                **cold,
                **cold_bwd, **scalar.calibration_fields(),
                autograd_call_host_s=autograd_call_s("cpu"), **step_loop_fields("cpu"),
                pipeline_action_host_s=pipeline_action_host_s("cpu"),
                **dict(zip(TIED_SUM_FIELDS, tied_sum)),
                **checkpoint_host_seconds("cpu").calibration_fields()),
            notes=f"planner profile-device --device cpu: {cal.measured_on}; per-op host fwd "
                  f"{host.forward_s * 1e6:.2f} us ({host.forward_range_s[0] * 1e6:.2f}-"
                  f"{host.forward_range_s[1] * 1e6:.2f} over {HOST_OP_ROUNDS} rounds; "
                  f"{host.function_op_s * 1e6:.2f} per function op, {host.view_op_s * 1e6:.2f} "
                  f"per view, {host.module_call_s * 1e6:.2f} per module call), bwd "
                  f"{host.backward_s * 1e6:.2f} us ({host.spread(backward=True):.0%} spread; "
                  f"{host.backward_nonview_op_s * 1e6:.2f} per op, "
                  f"{host.backward_view_op_s * 1e6:.2f} per view, {host.backward_node_s * 1e6:.2f} "
                  f"per autograd node, + per-op excess; in sequence "
                  f"{sequence.low_op_s * 1e9:.0f} ns per op per distinct op up to "
                  f"{sequence.knee_distinct_ops:.0f}, {sequence.op_s * 1e9:.0f} beyond; cold start "
                  f"{cold['cold_entry_host_s'] * 1e6:.2f} us per layer ({cold['cold_entry_after_backward_host_s'] * 1e6:.2f} after a "
                  f"backward) + {cold['cold_op_host_s'] * 1e6:.2f} per cold op; backward "
                  f"{cold_bwd['cold_backward_op_host_s'] * 1e6:.2f} per cold op, "
                  f"{cold_bwd['cold_backward_inner_op_host_s'] * 1e6:.2f} "
                  f"per cold inner op of a composite); peak FLOP/s = best "
                  "measured GEMM per dtype; links and DTensor overhead guessed (run "
                  "`planner profile-cluster` to measure them)")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    preset = clusters.preset_for_device(props.name)
    fallback = (f"no preset for {props.name!r}: peak FLOP/s = best measured, links from "
                f"{clusters.FALLBACK_GPU_PRESET}'s")
    if preset is None:
        (progress or (lambda m: print(m, file=sys.stderr)))(fallback)
    base = clusters.get_cluster(preset or clusters.FALLBACK_GPU_PRESET)
    if preset is not None:  # datasheet peaks; efficiency = best measured / peak
        peak = base.peak_flops_by_dtype
        reference = "bfloat16" if "bfloat16" in best else next(iter(best))
        efficiency = min(1.0, best[reference] / base.peak_flops(reference))
    else:
        peak, efficiency = tuple(sorted(best.items())), 1.0
    # The host's per-op figure, HOST_PROBE_PASSES passes of the probe on fresh tensors: the
    # median of every round, and their range (lent H100 machines read 19.4, 25.4 and 33.2
    # us an op on three loans: review of 2026-11-25)
    rounds = [r for _ in range(HOST_PROBE_PASSES) for r in clusters.host_op_rounds_s("cuda")]
    op_overhead_s = statistics.median(rounds)
    sac = checkpoint_host_seconds("cuda").calibration_fields()  # the checkpoint's host machinery
    # ... and per kind, as on CPU (views, ops, module calls, autograd nodes: what
    # `host_dispatch` prices a layer's passes at; the per-op figure stays the rest's)
    host = host_op_seconds_by_pass("cuda")
    return dataclasses.replace(
        base, name=name, device=props.name, devices_per_node=torch.cuda.device_count(),
        device_memory_bytes=props.total_memory, peak_flops_by_dtype=peak, hbm_gbps=hbm_gbps,
        matmul_efficiency=efficiency, op_overhead_s=op_overhead_s,
        kernel_calibration=dataclasses.replace(cal, **sac, **host.calibration_fields(),
                                               op_overhead_min_s=min(rounds),
                                               op_overhead_max_s=max(rounds)),
        notes=(f"planner profile-device --device cuda: {cal.measured_on}; peak FLOP/s "
               + (f"from the {preset} datasheet preset" if preset
                  else f"= best measured ({fallback})")
               + f"; host {op_overhead_s * 1e6:.2f} us an op (median of {len(rounds)} rounds, "
               f"{min(rounds) * 1e6:.2f}-{max(rounds) * 1e6:.2f}; {host_kinds(host)}); links "
               f"not measured (the "
               f"{base.name} preset's: run `planner profile-cluster`)"))


def host_kinds(host) -> str:
    """A GPU spec's per-kind host figures in one phrase (`host_probes.HostOpCost`)."""
    return (f"per view {host.view_nograd_op_s * 1e6:.2f} us, per op "
            f"{host.function_nograd_op_s * 1e6:.2f}, per module call "
            f"{host.module_call_s * 1e6:.2f}, per forward node {host.forward_node_s * 1e6:.2f}; "
            f"backward per op {host.backward_nonview_op_s * 1e6:.2f}, per node "
            f"{host.backward_node_s * 1e6:.2f}")
