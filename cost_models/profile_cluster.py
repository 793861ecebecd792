"""Measure this machine's collectives and matmuls and write a cluster spec from them.

`profile_cluster(nproc, backend)` starts `nproc` processes (forks of the preloaded server,
`ir.launch`; a free localhost port). Every rank runs `_worker`, which times, in order:
  1. the collectives over message sizes from 1 KiB up to `max_bytes` (x4 per step), once
     over all N processes and once per smaller power-of-two group size g with every
     group of g running at once (`cost_models.collective_probes.sweep`);
  2. on CPU processes, the framework's host costs (`cost_models.host_probes`; the
     optimizer step's: `cost_models.step_probes`; a
     tensor-parallel module's DTensor work apart from its collectives, and a sequence-
     parallel module group's: `cost_models.tp_probes`) and the
     wait of a blocking call whose peers compute between calls
     (`collective_probes.blocking_seconds`, at two message sizes), and the same for
     what TP's collectives take beyond it as DTensor issues them (`dtensor_extra_seconds`).
Rank 0 hands the readings back; this process measures matmul FLOP/s and copy bandwidth
here (`cost_models.cuda_probes` on GPUs), fits the alpha-beta model the comm model
uses to every collective and group size (`cost_models.collective_fit`: a fit records its
group size, `measured_ranks`, and the comm model takes the one that matches; no fit may
beat the copy bandwidth, `ir.cluster.collective_ceiling_bytes_per_s`), and takes the
probes' own traffic out of the host figures (`cost_models.host_overhead_fit`). Sweeps
that do not determine a fit are re-measured (those collectives alone, FIT_RETRIES times);
then profile-cluster fails with the fit's one-line reason, never writes a clamped value. All
processes run on this host, so the fits are intra-node; the spec reuses them for
inter-node until a multi-node profile exists. The result is a spec `planner estimate
--cluster spec.json` accepts.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
import tempfile
from typing import Any

from ir.calibration_tables import (COLLECTIVES, LOSS_EDGE_FIELDS, SELECTIVE_FIELDS,
                                   SP_BLOCK_SELECTIVE_FIELDS,
                                   VOCAB_EDGE_FIELDS, BlockingWait, CalibrationTables,
                                   CollectiveFit, TpModuleOverhead)
from ir.cluster import ClusterSpec, collective_ceiling_bytes_per_s
from ir.errors import PlannerError
from ir.kernel_calibration import KernelCalibration
from ir.launch import free_port, start_ranks

from cost_models.checkpoint_probes import checkpoint_host_seconds
from cost_models.clusters import (GPU_RUNTIME_OVERHEAD_BYTES, LOCAL_RUNTIME_OVERHEAD_BYTES,
                                  host_cores, measure_copy_gbps, measure_matmul_flops,
                                  total_memory_bytes)
from cost_models.collective_fit import (DEFAULT_MAX_BYTES, DEFAULT_MIN_BYTES, SIZE_FACTOR,
                                        fit_collectives, message_sizes, smaller_group_sizes)
from cost_models.collective_probes import blocking_seconds, dtensor_extra_seconds, sweep
from cost_models.cuda_probes import cuda_copy_gbps, cuda_matmul_flops, cuda_op_overhead_s
from cost_models.dp_unit_probe import dp_unit_seconds
from cost_models.host_overhead_fit import blocking_wait, dp_unit_overhead
from cost_models.host_probes import (autograd_call_s, dtensor_op_overhead_s,
                                     host_op_seconds_by_pass)
from cost_models.item_probes import probe_random_element_s
from cost_models.pipeline_probes import pipeline_action_host_s
from cost_models.step_loop_probes import step_loop_fields
from cost_models.step_probes import optimizer_tensor_seconds
from cost_models.block_probes import sp_block_selective_seconds
from cost_models.tp_probes import selective_seconds, sp_group_seconds, tp_module_seconds
from cost_models.vocab_probes import loss_parallel_seconds, vocab_embedding_seconds

PROCESS_GROUP_TIMEOUT_S = 120
PORT_ATTEMPTS = 3  # fresh localhost ports to try if one is taken between probe and bind
# Re-measurements of the probes whose readings did not determine a fit (a busy spell of a
# shared machine passes; a second failure is reported, not written as a clamped value).
FIT_RETRIES = 1


def profile_cluster(nproc: int, backend: str = "gloo", max_bytes: int = DEFAULT_MAX_BYTES,
                    min_bytes: int = DEFAULT_MIN_BYTES, name: str = "local-profiled"
                    ) -> tuple[ClusterSpec, dict]:
    """Measure and fit; returns the spec and the raw table {(collective, group size):
    [(bytes, s), ...]}."""
    sizes = message_sizes(min_bytes, max_bytes)
    if len(sizes) < 2:
        raise PlannerError(f"need at least two message sizes to fit alpha and beta; "
                           f"raise --max-bytes above {min_bytes * SIZE_FACTOR}")
    device, memory, flops, copy_gbps, overhead = _device_info(backend, nproc)
    measured = measure_collectives(nproc, backend, sizes)
    by_size = {nproc: measured, **{g: measured[f"group{g}"] for g in smaller_group_sizes(nproc)}}
    fits = fit_with_retries(nproc, backend, sizes, by_size,
                            collective_ceiling_bytes_per_s(copy_gbps))
    by_group = {(f.collective, f.measured_ranks): f for f in fits}
    host_tables = {}
    if backend == "gloo":
        per_pass = host_op_seconds_by_pass("cpu")  # forward and backward per-op, apart
        host = dict(op_overhead_s=per_pass.forward_s, backward_op_overhead_s=per_pass.backward_s,
                    random_element_s=probe_random_element_s("cpu"),
                    dtensor_op_overhead_s=float(measured.get("dtensor_op_overhead_s", 0.0)),
                    host_cores=host_cores(),
                    # the checkpoint machinery's host seconds (alone: empty tables price as none)
                    kernel_calibration=KernelCalibration(
                        measured_on=f"planner profile-cluster, {platform.node() or 'this host'}",
                        autograd_call_host_s=autograd_call_s("cpu"),  # backward figures net of it
                        pipeline_action_host_s=pipeline_action_host_s("cpu"),
                        **step_loop_fields("cpu"),  # the loop's all-reduce, the optimizer's entry
                        **checkpoint_host_seconds("cpu").calibration_fields()))
        waits = blocking_wait(measured["blocking_seconds"], by_group)
        host_tables = dict(
            dp_overheads=dp_unit_overhead(measured["dp_unit_seconds"]),
            tp_modules=tuple(TpModuleOverhead(size, seconds) for size, seconds
                             in sorted(measured["tp_module_seconds"].items())),
            sp_groups=tuple(TpModuleOverhead(size, seconds, "sp_group_overhead_s")
                            for size, seconds in sorted(measured["sp_group_seconds"].items())),
            vocab_embeddings=_by_pass_rows(measured["vocab_embedding_seconds"],
                                           VOCAB_EDGE_FIELDS),
            loss_parallels=_by_pass_rows(measured["loss_parallel_seconds"], LOSS_EDGE_FIELDS),
            tp_selectives=_by_pass_rows(measured["selective_seconds"], SELECTIVE_FIELDS),
            sp_block_selectives=_by_pass_rows(measured["sp_block_selective_seconds"],
                                              SP_BLOCK_SELECTIVE_FIELDS),
            blocking_waits=waits, optimizer_steps=measured["optimizer_tensor_seconds"],
            tp_blocking_waits=blocking_wait(dtensor_form_seconds(measured), by_group))
    else:
        host = dict(op_overhead_s=cuda_op_overhead_s())
    # All processes run on this host: the inter-node fits copy the intra-node ones.
    tables = CalibrationTables(collective_fits=tuple(fits) + tuple(
        CollectiveFit(f.collective, "inter_node", f.alpha_s, f.bytes_per_s, f.measured_ranks)
        for f in fits), **host_tables,
        host_figures_clock="thread_cpu")  # step_probes and _added_step_s read thread CPU
    node = by_group["all_reduce", nproc]
    spec = ClusterSpec(
        name=name, device=device, num_nodes=1, devices_per_node=nproc,
        device_memory_bytes=memory, peak_flops_by_dtype=flops, hbm_gbps=copy_gbps,
        intra_node_gbps=node.bytes_per_s / 1e9, inter_node_gbps=node.bytes_per_s / 1e9,
        intra_node_latency_s=node.alpha_s, inter_node_latency_s=node.alpha_s,
        runtime_overhead_bytes=overhead, matmul_efficiency=1.0, **host, calibration=tables,
        notes=(f"measured by planner profile-cluster --nproc {nproc} --backend {backend} on "
               f"{platform.node() or 'this host'} ({platform.machine()}, {os.cpu_count()} "
               f"CPUs), sizes {sizes[0]}..{sizes[-1]} bytes; inter-node figures copy the "
               "intra-node fits (single host)"))
    raw = {(c, size): list(zip(sizes, table[c])) for size, table in by_size.items()
           for c in COLLECTIVES if c in table}
    return spec, raw


def _by_pass_rows(by_size: dict[int, tuple[float, float]], fields: tuple[str, str]
                  ) -> tuple[TpModuleOverhead, ...]:
    """{group size: (two figures)} as a calibration table's rows, a row per figure."""
    return tuple(TpModuleOverhead(size, seconds, field) for size, pair in sorted(by_size.items())
                 for field, seconds in zip(fields, pair))


def dtensor_form_seconds(measured: dict) -> dict[int, dict[str, list[tuple[int, float]]]]:
    """Per group size, TP's collectives as DTensor issues them: the plain call's blocking
    reading plus what the DTensor form took beyond it (`dtensor_extra_seconds`, signed:
    clamping each extra at 0 biased it up); a sum below 0 reads as no wait."""
    return {size: {name: [(nbytes, max(seconds + extra, 0.0)) for (nbytes, seconds), (_, extra)
                          in zip(measured["blocking_seconds"][size][name], rows)]
                   for name, rows in by_name.items()}
            for size, by_name in measured["dtensor_extra_seconds"].items()}


def fit_with_retries(nproc: int, backend: str, sizes: list[int],
                     by_size: dict[int, dict[str, list[float]]],
                     ceiling_bytes_per_s: float) -> list[CollectiveFit]:
    """`fit_collectives`, re-measuring the sweep (collectives only) for the collectives
    whose readings did not determine a fit, up to FIT_RETRIES times; `by_size` takes the
    fresh readings. The first fit still undetermined raises its CollectiveFitError."""
    fits, failures = fit_collectives(by_size, sizes, ceiling_bytes_per_s)
    for _ in range(FIT_RETRIES):
        if not failures:
            break
        print(f"... {failures[0]} ({len(failures)} fit(s)); re-measuring", file=sys.stderr)
        fresh = measure_collectives(nproc, backend, sizes, probes="collectives")
        fresh_by_size = {nproc: fresh, **{g: fresh[f"group{g}"]
                                          for g in smaller_group_sizes(nproc)}}
        again = {}
        for failure in failures:
            by_size[failure.n][failure.collective] = fresh_by_size[failure.n][failure.collective]
            again.setdefault(failure.n, {})[failure.collective] = by_size[failure.n][
                failure.collective]
        refits, failures = fit_collectives(again, sizes, ceiling_bytes_per_s)
        fits += refits
    if failures:
        raise failures[0]
    order = {c: k for k, c in enumerate(COLLECTIVES)}  # the whole node's first
    return sorted(fits, key=lambda f: (-f.measured_ranks, order[f.collective]))


# ------------------------------------------------------------------------ the ranks


PROBES = ("all", "collectives")  # what `measure_collectives` runs
RESULTS_FILE = "rank0.pt"  # rank 0's readings, in the run's temporary folder


def measure_collectives(nproc: int, backend: str, sizes: list[int],
                        probes: str = "all") -> dict[str, Any]:
    """Rank 0's readings from `nproc` forked processes: median seconds per collective
    and size (per smaller group size under "group{g}"), and on CPU the host probes';
    `probes` "collectives" runs the sweeps alone."""
    if probes not in PROBES:
        raise PlannerError(f"probes must be one of {', '.join(PROBES)}, got {probes!r}")
    if nproc < 2:
        raise PlannerError(f"--nproc must be >= 2 to measure collectives, got {nproc}")
    if backend not in ("gloo", "nccl"):
        raise PlannerError(f"--backend must be gloo or nccl, got {backend!r}")
    import torch

    if backend == "nccl" and not torch.cuda.is_available():
        raise PlannerError("--backend nccl needs CUDA devices; none is visible here "
                           "(use --backend gloo)")
    for attempt in range(PORT_ATTEMPTS):
        # Another process may take the free port before rank 0 binds it: try a new one.
        with tempfile.TemporaryDirectory(prefix="planner-profile-") as out_dir:
            context = start_ranks(_worker, nproc, (nproc, free_port(), backend, sizes, out_dir,
                                                   probes), out_dir)
            try:
                while not context.join():
                    pass
            except Exception as exc:  # a worker failed: one line, the cause
                cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
                if "address already in use" in str(exc).lower() and attempt + 1 < PORT_ATTEMPTS:
                    continue
                raise PlannerError(f"profile-cluster: a worker process failed: {cause}") from None
            finally:  # on any way out (Ctrl-C too): no worker left running
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                    process.join()
            path = os.path.join(out_dir, RESULTS_FILE)
            if not os.path.exists(path):
                raise PlannerError("profile-cluster: rank 0 returned no measurements")
            return torch.load(path, weights_only=False)  # written by our rank 0 just now


def _worker(rank: int, world: int, port: int, backend: str, sizes: list[int],
            out_dir: str, probes: str = "all") -> None:
    """One rank: the probes `probes` names, in order; rank 0 saves the readings in
    `out_dir` (RESULTS_FILE)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    results: dict[str, Any] = {}
    sweeps = probes in ("all", "collectives")
    try:
        if sweeps:
            results.update(sweep(dist, rank, world, None, sizes, device, sync))
        groups = {}  # smaller groups, every group of a size running at once
        for size in smaller_group_sizes(world):
            groups[size] = init_device_mesh(device.type, (world // size, size),
                                            mesh_dim_names=("across", "group"))["group"]
            if sweeps:
                results[f"group{size}"] = sweep(dist, rank, size, groups[size].get_group(),
                                                sizes, device, sync)
        if device.type == "cpu" and probes == "all":  # DTensor ops' overhead, rank 0 alone
            mesh = init_device_mesh("cpu", (world,))
            results["dtensor_op_overhead_s"] = \
                dtensor_op_overhead_s(device, mesh) if rank == 0 else 0.0
            dist.barrier()
            results["optimizer_tensor_seconds"] = optimizer_tensor_seconds(mesh)
            results["dp_unit_seconds"] = {world: dp_unit_seconds(mesh)}
            results["tp_module_seconds"] = {world: tp_module_seconds(mesh)}
            results["sp_group_seconds"] = {world: sp_group_seconds(mesh)}
            results["vocab_embedding_seconds"] = {world: vocab_embedding_seconds(mesh)}
            results["loss_parallel_seconds"] = {world: loss_parallel_seconds(mesh)}
            results["selective_seconds"] = {world: selective_seconds(mesh)}
            results["sp_block_selective_seconds"] = {world: sp_block_selective_seconds(mesh)}
            for size, group in groups.items():
                results["dp_unit_seconds"][size] = dp_unit_seconds(group)
                results["tp_module_seconds"][size] = tp_module_seconds(group)
                results["sp_group_seconds"][size] = sp_group_seconds(group)
                results["vocab_embedding_seconds"][size] = vocab_embedding_seconds(group)
                results["loss_parallel_seconds"][size] = loss_parallel_seconds(group)
                results["selective_seconds"][size] = selective_seconds(group)
                results["sp_block_selective_seconds"][size] = sp_block_selective_seconds(group)
            results["blocking_seconds"] = {world: blocking_seconds(dist, rank, None)}
            results["dtensor_extra_seconds"] = {world: dtensor_extra_seconds(dist, mesh)}
            for size, group in groups.items():
                results["blocking_seconds"][size] = blocking_seconds(dist, rank,
                                                                     group.get_group())
                results["dtensor_extra_seconds"][size] = dtensor_extra_seconds(dist, group)
        if rank == 0:
            torch.save(results, os.path.join(out_dir, RESULTS_FILE))
        dist.barrier()  # nobody tears down gloo while a peer still uses it
    finally:
        dist.destroy_process_group()


def _device_info(backend: str, nproc: int) -> tuple[str, int, tuple, float, int]:
    """(device name, memory per device, peak FLOP/s, memory GB/s, runtime overhead)."""
    if backend == "nccl":
        import torch

        props = torch.cuda.get_device_properties(0)
        return (props.name, int(props.total_memory), cuda_matmul_flops(),
                cuda_copy_gbps(), GPU_RUNTIME_OVERHEAD_BYTES)
    return ("cpu", total_memory_bytes() // nproc, measure_matmul_flops(),
            measure_copy_gbps(), LOCAL_RUNTIME_OVERHEAD_BYTES)
