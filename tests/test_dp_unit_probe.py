"""The data-parallel unit probe reads the calling thread's CPU time outside the unit's
collectives (`cost_models.dp_unit_probe._added_step_s`), and the compute model stretches
that CPU figure by the core share (`compute.layer_compute`), as it does per-op figures.

The probe's test runs on two gloo ranks a "wrapped" stack that costs a known amount of
host work (a busy loop of SPIN_S of CPU), a known amount of sleep (wall time, no CPU: a
peer's wait), a collective whose call busy-loops CALL_SPIN_S (CPU inside the call,
which `comm.blocking_s` prices whole) and the in-place reduce-scatter, which busy-loops
CALL_SPIN_S and calls that collective (a counted call inside a counted one): the probe
must read SPIN_S, neither the sleep nor the calls' CPU, nor the inner call's twice."""

from __future__ import annotations

import time

import pytest
import torch

from tests.dist_utils import spawn

SPIN_S = 2e-3  # host work the wrapped stack adds per forward+backward
CALL_SPIN_S = 6e-3  # CPU spent inside its collective call
SLEEP_S = 20e-3  # wall time without CPU (a wait on peers)


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _Wrapped(torch.nn.Module):
    """A linear layer plus SPIN_S of host work, SLEEP_S asleep, an all-reduce and the
    in-place reduce-scatter (looked up at call time, as `GlooReduceScatter` does)."""

    def __init__(self, plain: torch.nn.Module):
        super().__init__()
        self.plain = plain

    def forward(self, x):
        import torch.distributed as dist

        from ir import gloo_collectives

        _spin(SPIN_S)
        time.sleep(SLEEP_S)
        dist.all_reduce(torch.ones(1))
        gloo_collectives.reduce_scatter_in_place(None, None, None)
        return self.plain(x)


def _probe_worker(rank: int, world_size: int, payload) -> float:
    import torch.distributed as dist

    from cost_models.dp_unit_probe import _added_step_s
    from ir import gloo_collectives

    plain_all_reduce = dist.all_reduce
    plain_reduce_scatter = gloo_collectives.reduce_scatter_in_place

    def spinning_all_reduce(tensor, *args, **kwargs):  # CPU inside the call
        _spin(CALL_SPIN_S)
        return plain_all_reduce(tensor, *args, **kwargs)

    def spinning_reduce_scatter(output, flat_input, group):  # CPU, then a collective
        _spin(CALL_SPIN_S)
        dist.all_reduce(torch.ones(1))

    dist.all_reduce = spinning_all_reduce
    gloo_collectives.reduce_scatter_in_place = spinning_reduce_scatter
    try:
        plain = torch.nn.Linear(8, 8)
        return _added_step_s(plain, _Wrapped(plain), torch.randn(2, 8))
    finally:
        dist.all_reduce = plain_all_reduce
        gloo_collectives.reduce_scatter_in_place = plain_reduce_scatter


def test_the_probe_reads_host_cpu_outside_the_collectives_not_waits():
    """Each rank reads SPIN_S (2 ms): not + the 20 ms asleep (the wall clock's reading),
    not + the 18 ms of CPU inside the calls, and not - 6 ms (the all-reduce inside the
    reduce-scatter taken out twice); the probe puts both back when done. The band is
    one-sided: the spin is exact in thread CPU, and what a busy machine adds to a thread's CPU (a VM's stolen time, cold caches) only adds (CI,
    2026-11-25: 2.98 ms), so above SPIN_S it only has to stay clear of the call's CPU."""
    added = spawn(_probe_worker, 2, None, timeout_s=120)
    for seconds in added:
        assert SPIN_S - 0.5e-3 <= seconds < SPIN_S + CALL_SPIN_S / 2, seconds


def test_layer_compute_stretches_the_unit_by_the_core_share():
    """A replicate unit measured at 1 ms + 0.1 ms a tensor: a 2-tensor linear layer costs
    1.2 ms of host CPU, half in forward and half in backward. On 4 CPU processes sharing
    2 cores (host share 2) each pass pays 2 x 0.6 = 1.2 ms more than without DP; on 2
    processes on 2 cores 0.6 ms. A GPU preset (no host cores) is not stretched, nor an
    older spec's wall-clock figure (the sharing already inside it)."""
    import dataclasses

    from cost_models.common import StepConfig
    from cost_models.compute import layer_compute
    from ir.calibration_tables import CalibrationTables, DpOverhead
    from ir.strategy import DPMode, LayerStrategy, Precision
    from tests.cpu_specs import four_ranks_on_two_cores, linear_layer

    ms = 1e-3
    layer = linear_layer()
    units = (DpOverhead(DPMode.REPLICATE, None, 1 * ms, 0.1 * ms),)
    tables = CalibrationTables(dp_overheads=units, host_figures_clock="thread_cpu")
    spec = four_ranks_on_two_cores(tables)
    config = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="float32",
                        precision=Precision.FP32, device_type="cpu")
    dp = LayerStrategy(dp=4, dp_mode=DPMode.REPLICATE)
    alone, wrapped = (layer_compute(layer, s, spec, config) for s in (LayerStrategy(), dp))
    assert spec.host_share == 2.0
    assert wrapped.forward_s - alone.forward_s == pytest.approx(1.2 * ms)
    assert wrapped.backward_s - alone.backward_s == pytest.approx(1.2 * ms)
    wall = four_ranks_on_two_cores(CalibrationTables(dp_overheads=units))  # an older spec
    alone, wrapped = (layer_compute(layer, s, wall, config) for s in (LayerStrategy(), dp))
    assert wrapped.forward_s - alone.forward_s == pytest.approx(0.6 * ms)  # not stretched again
    pair = dataclasses.replace(spec, devices_per_node=2)
    alone, wrapped = (layer_compute(layer, s, pair, config)
                      for s in (LayerStrategy(), dataclasses.replace(dp, dp=2)))
    assert wrapped.forward_s - alone.forward_s == pytest.approx(0.6 * ms)
    gpu = dataclasses.replace(spec, device="cuda", host_cores=0)
    gpu_config = dataclasses.replace(config, device_type="cuda")
    alone, wrapped = (layer_compute(layer, s, gpu, gpu_config) for s in (LayerStrategy(), dp))
    assert wrapped.forward_s - alone.forward_s == pytest.approx(0.6 * ms)


def test_every_collective_fsdp2_calls_is_left_out_of_the_unit_figure():
    """Read from torch's own FSDP2 source (not from the probe): each `dist.<name>(` call in
    `_fsdp_collectives` must be one the probe wraps, else the CPU inside that collective
    stays in the unit figure while `comm.blocking_s` prices the call again (torch 2.13
    calls `all_gather_single` / `reduce_scatter_single`, which the probe once missed)."""
    import inspect
    import re

    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    from cost_models.dp_unit_probe import FSDP_COLLECTIVES

    called = set(re.findall(r"\bdist\.([a-z_]+)\(", inspect.getsource(_fsdp_collectives)))
    collectives = {name for name in called if name.startswith(("all_", "reduce_"))}
    assert collectives and collectives <= set(FSDP_COLLECTIVES), collectives


def test_the_probe_times_two_narrow_units_and_a_wide_one_of_as_many_tensors():
    """`host_overhead_fit.dp_unit_overhead` fits the per-unit and per-tensor line through
    two narrow units of different tensor counts, and the per-parameter part from a wide
    unit of as many tensors as one of them but hundreds of times its parameters (the
    narrow units' ~0.6K parameters hold none of a unit's copies)."""
    from cost_models.dp_unit_probe import dp_probe_stack, dp_probe_units

    sizes = []
    for blocks, width in dp_probe_units():
        unit = dp_probe_stack(None, None, blocks, width)[0]
        sizes.append((len(list(unit.parameters())), sum(p.numel() for p in unit.parameters())))
    (few, few_params), (many, many_params), (wide, wide_params) = sizes
    assert few < many and wide == few
    assert wide_params > 100 * max(few_params, many_params)


def _reduction_settings(rank: int, world_size: int, payload) -> list:
    from torch.distributed.device_mesh import init_device_mesh

    from cost_models.dp_unit_probe import dp_probe_stack
    from ir.strategy import DPMode

    mesh = init_device_mesh("cpu", (world_size,))
    return [(mode, group.gradient_divide_factor, group.force_sum_reduction_for_comms)
            for mode in (DPMode.REPLICATE, DPMode.ZERO2, DPMode.ZERO3)
            for unit in dp_probe_stack(mesh, mode, 1).modules() if hasattr(unit, "reshard")
            for group in unit._get_fsdp_state()._fsdp_param_groups]


def test_the_probe_units_reduce_as_the_executor_sets_them():
    """`executors.data_parallel.apply_dp` sums gradients (divide factor 1) and, on gloo,
    forces sum-only reductions (`ir.gloo_collectives.sum_reduction`): the probe's units
    are set the same, so it times the reduction path the executor runs."""
    settings = spawn(_reduction_settings, 2, None, timeout_s=120)[0]
    assert len(settings) == 3 * 8  # 8 units per mode (the root holds no parameter group)
    for mode, factor, force_sum in settings:
        assert factor == 1.0 and force_sum, mode
