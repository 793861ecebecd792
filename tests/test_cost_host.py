"""Host-side time: per-op framework overhead, DP-unit overhead, the optimizer step and
CPU processes sharing cores (cost_models.compute), and the spec fields that carry them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cost_models.clusters import get_cluster, measure_op_overhead_s
from cost_models.item_probes import probe_random_element_s
from cost_models.comm import layer_comm
from cost_models.dp_copies import dp_copy_step_seconds
from cost_models.common import StepConfig, layer_configs
from cost_models.compute import (OPTIMIZER_OPS_PER_TENSOR, ZERO1_COPY_OPS_PER_PIECE,
                                 ZERO1_COPY_OPS_PER_TENSOR, dp_unit_seconds, layer_compute,
                                 optimizer_step_seconds, random_draw_seconds,
                                 tp_module_seconds)
from cost_models.estimate import DP_OVERLAP_EFFICIENCY, estimate, overlap_efficiency
from cost_models.model_states import bytes_per_param, tp_local_params
from ir.calibration_tables import CalibrationTables, DpOverhead, OptimizerStepCost, TpModuleOverhead
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.op_count import count_ops
from ir.plan import uniform_plan
from ir.strategy import DPMode, LayerStrategy, Precision
from planner.models import load_layer_graph
from tests.cpu_specs import two_ranks_on_two_cores

US = 1e-6


def cpu_spec(tables: dict | None = None, **changes) -> ClusterSpec:
    """A 2-process CPU spec with `changes` and the calibration `tables` replaced."""
    base = two_ranks_on_two_cores(CalibrationTables(dp_overheads=tuple(
        DpOverhead(mode, None, seconds, 0.0) for mode, seconds in (
            (DPMode.REPLICATE, 1e-3), (DPMode.ZERO1, 1e-3), (DPMode.ZERO2, 2e-3),
            (DPMode.ZERO3, 3e-3)))))
    return dataclasses.replace(base, **changes).with_calibration(**(tables or {}))


@pytest.fixture(scope="module")
def graph():
    return load_layer_graph("gpt-tiny", micro_batch=2, dtype=torch.float32)


def config(graph, optimizer="adamw") -> StepConfig:
    return StepConfig(micro_batch=2, graph_micro_batch=2, graph_dtype="float32",
                      precision=Precision.FP32, optimizer=optimizer, seq_len=graph.seq_len,
                      device_type="cpu")


def test_ir_counts_ops_per_layer(graph):
    block = graph.layers[1]
    assert block.ops_fwd > 20 and block.ops_bwd > block.ops_fwd  # backward dispatches more
    assert all(a.ops_fwd == b.ops_fwd for a, b in zip(graph.layers[1:4], graph.layers[2:5]))
    linear = torch.nn.Linear(4, 4)
    assert count_ops(lambda: linear(torch.randn(2, 4))) >= 1


def test_host_overhead_adds_on_cpu_and_overlaps_on_gpu(graph):
    block, strategy = graph.layers[1], LayerStrategy()
    cfg = config(graph)
    quiet = layer_compute(block, strategy, cpu_spec(op_overhead_s=0.0), cfg)
    busy = layer_compute(block, strategy, cpu_spec(), cfg)
    assert busy.forward_s == pytest.approx(quiet.forward_s + block.ops_fwd * 5 * US)
    assert busy.backward_s == pytest.approx(quiet.backward_s + block.ops_bwd * 5 * US)
    # A GPU queues kernels: a layer takes the larger of device and host time.
    gpu = dataclasses.replace(cpu_spec(), device="H100-SXM5-80GB", host_cores=0,
                              op_overhead_s=1.0)
    assert not gpu.host_bound
    assert layer_compute(block, strategy, gpu, cfg).forward_s == pytest.approx(block.ops_fwd)


def test_processes_sharing_cores_stretch_busy_time(graph):
    block, cfg = graph.layers[1], config(graph)
    two = layer_compute(block, LayerStrategy(), cpu_spec(devices_per_node=2), cfg)
    eight = layer_compute(block, LayerStrategy(), cpu_spec(devices_per_node=8), cfg)
    assert cpu_spec(devices_per_node=8).host_share == 4.0
    assert eight.forward_s == pytest.approx(4 * two.forward_s)


def test_cpu_processes_hide_no_dp_traffic(graph):
    # Every DP call blocks the main thread on CPU processes, idle cores or not
    # (`overlap_efficiency`; tests/test_search_host.py prices one on idle cores).
    assert overlap_efficiency(cpu_spec(devices_per_node=2, host_cores=2)) == 0.0
    assert overlap_efficiency(cpu_spec(devices_per_node=8, host_cores=2)) == 0.0
    assert overlap_efficiency(cpu_spec(devices_per_node=1, host_cores=4)) == 0.0
    assert overlap_efficiency(cpu_spec(host_cores=0)) == 0.0  # core count unknown
    gpu = dataclasses.replace(cpu_spec(), device="H100-SXM5-80GB", host_cores=0)
    assert overlap_efficiency(gpu) == DP_OVERLAP_EFFICIENCY
    assert overlap_efficiency(cpu_spec(dp_overlap_efficiency=0.5)) == 0.5  # the spec's wins
    # dp2 on 2 cores: all of the DP traffic is exposed.
    plan = uniform_plan(len(graph.layers), dp=2, zero=0, global_batch=4,
                        precision=Precision.FP32)
    stage = estimate(graph, plan, cpu_spec()).stage_times[0]
    traffic = sum(layer_comm(layer, strategy, cpu_spec(), cfg,
                             bytes_per_param(Precision.FP32, "adamw")).dp_step_s
                  for layer, strategy, cfg in zip(graph.layers, plan.layer_strategies,
                                                  layer_configs(graph, plan, "cpu")))
    assert stage.dp_step_s == pytest.approx(traffic) and traffic > 0


def test_dropout_draws_are_counted_and_priced(graph):
    b, s, h, heads = 2, 32, 64, 4  # gpt-tiny at micro-batch 2
    block = graph.layers[1]
    assert block.random_tp_sharded_elements_fwd == b * heads * s * s  # attention dropout
    assert block.random_elements_fwd - block.random_tp_sharded_elements_fwd == 2 * b * s * h
    assert graph.layers[0].random_elements_fwd == b * s * h  # the embedding's dropout
    llama = load_layer_graph("llama-tiny", micro_batch=2, dtype=torch.float32)
    assert all(layer.random_elements_fwd == 0 for layer in llama.layers)  # no dropout
    per_element, cfg = 1e-8, config(graph)
    spec = cpu_spec(random_element_s=per_element)
    plain = layer_compute(block, LayerStrategy(), cpu_spec(), cfg)
    drawn = layer_compute(block, LayerStrategy(), spec, cfg)
    attention, residual = b * heads * s * s, 2 * b * s * h
    assert drawn.forward_s == pytest.approx(plain.forward_s + (attention + residual) * per_element)
    assert drawn.backward_s == plain.backward_s  # backward multiplies by the saved mask
    # TP ranks draw their head shard of the attention mask; SP shards the rest too.
    assert random_draw_seconds(block, LayerStrategy(tp=2), spec, cfg) == \
        pytest.approx((attention / 2 + residual) * per_element)
    assert random_draw_seconds(block, LayerStrategy(tp=2, sequence_parallel=True), spec,
                               cfg) == pytest.approx((attention + residual) / 2 * per_element)
    assert 0 < probe_random_element_s("cpu") < 1e-6
    assert ClusterSpec.from_json(spec.to_json()).random_element_s == per_element
    with pytest.raises(PlannerError, match="random_element_s must be a number >= 0"):
        ClusterSpec.from_dict({**spec.to_dict(), "random_element_s": -1})


def test_tensor_parallel_host_costs(graph):
    block, cfg = graph.layers[1], config(graph)
    # The layer's own ops run on plain tensors under DP and TP (the TP modules hand their
    # outputs on as local tensors; their DTensor work is priced apart): the per-op DTensor
    # extra adds nothing to its passes (the optimizer steps DTensor parameters: it does).
    for strategy in (LayerStrategy(dp=2), LayerStrategy(tp=2)):
        on, off = (layer_compute(block, strategy, cpu_spec(dtensor_op_overhead_s=extra_s), cfg)
                   for extra_s in (15 * US, 0.0))
        assert (on.forward_s, on.backward_s) == (off.forward_s, off.backward_s), strategy
    # Every TP module pays its TP degree's measured per-module overhead, half in each pass.
    spec = cpu_spec({"tp_modules": (TpModuleOverhead(2, 1e-3), TpModuleOverhead(4, 3e-3))})
    plain = layer_compute(block, LayerStrategy(tp=2), cpu_spec(), cfg)
    tp = layer_compute(block, LayerStrategy(tp=2), spec, cfg)
    modules = len(block.tp_candidates)
    assert modules == 6  # q, k, v, proj, fc1, fc2
    assert tp.forward_s - plain.forward_s == pytest.approx(modules * 1e-3 / 2)
    assert tp_module_seconds(block, LayerStrategy(tp=4), spec) == pytest.approx(modules * 3e-3)
    assert tp_module_seconds(block, LayerStrategy(), spec) == 0.0
    # Sequence parallelism runs the two LayerNorms on DTensors (forward native_layer_norm,
    # backward its backward + 2 AccumulateGrad detaches: ir.dtensor_ops) and the rest of the
    # layer on plain tensors: 2 x 1 x 15 us in forward, 2 x 3 x 15 us in backward.
    sp = layer_compute(block, LayerStrategy(tp=2, sequence_parallel=True), cpu_spec(), cfg)
    no_dtensor = layer_compute(block, LayerStrategy(tp=2, sequence_parallel=True),
                               cpu_spec(dtensor_op_overhead_s=0.0), cfg)
    assert sp.forward_s - no_dtensor.forward_s == pytest.approx(2 * 1 * 15 * US)
    assert sp.backward_s - no_dtensor.backward_s == pytest.approx(2 * 3 * 15 * US)


def test_dp_units_cost_their_mode_per_micro_batch(graph):
    block, cfg, spec = graph.layers[1], config(graph), cpu_spec()
    assert dp_unit_seconds(block, LayerStrategy(), spec, cfg) == 0.0  # not wrapped
    for mode, seconds in (("replicate", 1e-3), ("zero3", 3e-3)):
        strategy = LayerStrategy(dp=2, dp_mode=DPMode(mode))
        assert dp_unit_seconds(block, strategy, spec, cfg) == seconds
    by_size = cpu_spec({"dp_overheads": (DpOverhead(DPMode.ZERO3, None, 3e-3, 0.0),
                                         DpOverhead(DPMode.ZERO3, 2, 1e-3, 0.0))})
    assert dp_unit_seconds(block, LayerStrategy(dp=2, dp_mode=DPMode.ZERO3), by_size, cfg) \
        == 1e-3  # the plan's DP group size when measured
    assert dp_unit_seconds(block, LayerStrategy(dp=4, dp_mode=DPMode.ZERO3), by_size, cfg) \
        == 3e-3  # else the whole-node figure
    # Each parameter tensor of the unit adds its own share (the GPT block has 16).
    per_tensor = cpu_spec({"dp_overheads": (DpOverhead(DPMode.ZERO3, 2, 3e-3, 1e-4),)})
    assert len(block.param_names) == 16
    assert dp_unit_seconds(block, LayerStrategy(dp=2, dp_mode=DPMode.ZERO3), per_tensor, cfg) \
        == pytest.approx(3e-3 + 16 * 1e-4)
    assert ClusterSpec.from_json(per_tensor.to_json()) == per_tensor
    # A file whose per-tensor table has a group size the per-unit one lacks (hand-edited):
    # the missing figure is the bare mode's, as the lookup falls back.
    mixed = ClusterSpec.from_dict({**cpu_spec().to_dict(),
                                   "dp_tensor_overhead_s": {"zero3@2": 1e-4}})
    assert mixed.calibration.dp_overhead(DPMode.ZERO3, 2) == \
        DpOverhead(DPMode.ZERO3, 2, 3e-3, 1e-4)
    norm_free = dataclasses.replace(block, param_names=())
    assert dp_unit_seconds(norm_free, LayerStrategy(dp=2), spec, cfg) == 0.0


def test_dp_units_cost_their_parameters_too(graph):
    """A unit's copies of its parameters and gradients grow with its parameters
    (`DpOverhead.per_param_s`, here 7 ns): the GPT block's P = 49,984 fp32 parameters.
    The probe timed one unpipelined fp32 micro-batch, all its copies at once; by FSDP2's
    bytes (`dp_copies` docstring, fp32 c = r = 4) a replicate unit copies its parameters
    once per micro-batch (copy_, 2c P = 8P) and reduces once a step (chunk_cat (c+r) P,
    division 2r P, copy 2r P = 24P): 8/32 of the figure per micro-batch, 24/32 once a
    step. ZeRO-3 at dp 2: unshard 2c P per tensor + 2c P / 2 flat = 12P, twice a
    micro-batch (forward and backward), reduce (c+r) P = 8P: 24/32 and 8/32. In a
    pipeline a replicate unit unshards once a step: all 32/32 there. Under TP the rank's
    local share of P."""
    block, cfg = graph.layers[1], config(graph)
    per_param = 49_984 * 7e-9
    spec = cpu_spec({"dp_overheads": tuple(DpOverhead(mode, 2, 1e-3, 0.0, 7e-9)
                                           for mode in (DPMode.REPLICATE, DPMode.ZERO3))})
    assert block.params == 49_984 and spec.host_bound
    replicate, zero3 = LayerStrategy(dp=2), LayerStrategy(dp=2, dp_mode=DPMode.ZERO3)
    assert dp_unit_seconds(block, replicate, spec, cfg) == pytest.approx(1e-3 + per_param / 4)
    assert dp_copy_step_seconds(block, replicate, spec, cfg) == pytest.approx(per_param * 3 / 4)
    assert dp_unit_seconds(block, zero3, spec, cfg) == pytest.approx(1e-3 + per_param * 3 / 4)
    assert dp_copy_step_seconds(block, zero3, spec, cfg) == pytest.approx(per_param / 4)
    piped = dataclasses.replace(cfg, pipelined=True)
    assert dp_unit_seconds(block, replicate, spec, piped) == pytest.approx(1e-3)
    assert dp_copy_step_seconds(block, replicate, spec, piped) == pytest.approx(per_param)
    # the once-a-step part reaches the estimate through the layer's comm (as GPUs' copies)
    comm = layer_comm(block, replicate, spec, cfg, bytes_per_param(Precision.FP32, "adamw"))
    assert comm.dp_after_step_s == pytest.approx(per_param * 3 / 4)
    local = tp_local_params(block.params, block.tp_params, 2)
    assert dp_unit_seconds(block, LayerStrategy(dp=2, tp=2), spec, cfg) == \
        pytest.approx(1e-3 + local * 7e-9 / 4)


def test_optimizer_step_counts_tensors_and_bytes(graph):
    block, cfg = graph.layers[1], config(graph)
    spec = cpu_spec(hbm_gbps=1e9)  # streaming is free: only per-op host time remains
    tensors = len(block.param_names)
    plain = optimizer_step_seconds(block, LayerStrategy(), spec, cfg)
    assert plain == pytest.approx(OPTIMIZER_OPS_PER_TENSOR["adamw"] * tensors * 5 * US)
    fsdp = optimizer_step_seconds(block, LayerStrategy(dp=2, dp_mode=DPMode.ZERO3), spec, cfg)
    assert fsdp == pytest.approx(OPTIMIZER_OPS_PER_TENSOR["adamw"] * tensors * 20 * US)
    zero1 = optimizer_step_seconds(block, LayerStrategy(dp=2, dp_mode=DPMode.ZERO1), spec, cfg)
    # ZeRO-1 steps its pieces of the flat buffer (plain tensors: executors.zero1), then
    # copies: each piece's gradient in and update out, each tensor out of the gather
    pieces = min(tensors, -(-tensors // 2) + 1)
    copies = ZERO1_COPY_OPS_PER_PIECE * pieces + ZERO1_COPY_OPS_PER_TENSOR * tensors
    assert zero1 == pytest.approx((OPTIMIZER_OPS_PER_TENSOR["adamw"] * pieces + copies) * 5 * US)
    sgd = optimizer_step_seconds(block, LayerStrategy(), spec, config(graph, "sgd"))
    assert sgd < plain


def test_optimizer_step_takes_the_measured_per_tensor_figure(graph):
    block, cfg = graph.layers[1], config(graph)
    tensors = len(block.param_names)
    # 4 processes on 2 cores (host share 2): the measured figure is the stepping thread's
    # CPU (step_probes), stretched by 2 as the per-op fallback is.
    steps = {"optimizer_steps": (OptimizerStepCost("adamw", False, 70 * US),
                                 OptimizerStepCost("adamw", True, 300 * US))}
    spec = cpu_spec({**steps, "host_figures_clock": "thread_cpu"}, hbm_gbps=1e9,
                    devices_per_node=4)
    assert optimizer_step_seconds(block, LayerStrategy(), spec, cfg) == \
        pytest.approx(tensors * 70 * US * 2)
    old = cpu_spec(steps, hbm_gbps=1e9, devices_per_node=4)  # a wall-clock figure: as read
    assert optimizer_step_seconds(block, LayerStrategy(), old, cfg) == \
        pytest.approx(tensors * 70 * US)
    fsdp = LayerStrategy(dp=2, dp_mode=DPMode.ZERO3)
    assert optimizer_step_seconds(block, fsdp, spec, cfg) == \
        pytest.approx(tensors * 300 * US * 2)
    # An optimizer the spec did not measure falls back to ops x per-op overhead.
    assert optimizer_step_seconds(block, LayerStrategy(), spec, config(graph, "sgd")) == \
        pytest.approx(2 * OPTIMIZER_OPS_PER_TENSOR["sgd"] * tensors * 5 * US)
    assert spec.calibration.optimizer_seconds_per_tensor("sgd", on_dtensor=False) is None
    assert ClusterSpec.from_json(spec.to_json()) == spec
    with pytest.raises(PlannerError,
                       match=r"optimizer_tensor_overhead_s\[adamw\] must be a number >= 0"):
        ClusterSpec.from_dict({**spec.to_dict(), "optimizer_tensor_overhead_s": {"adamw": -1}})


def test_optimizer_ops_per_tensor_match_torch():
    for name, cls, kwargs in (("adamw", torch.optim.AdamW, {}), ("adam", torch.optim.Adam, {}),
                              ("sgd-momentum", torch.optim.SGD, {"momentum": 0.9})):
        params = [torch.nn.Parameter(torch.randn(4)) for _ in range(6)]
        opt = cls(params, lr=1e-3, **kwargs)
        for p in params:
            p.grad = torch.randn(4)
        opt.step()  # the first step creates the state

        def step():
            for p in params:
                p.grad = torch.randn(4)
            opt.step()
            opt.zero_grad(set_to_none=True)

        ops = count_ops(step) - count_ops(lambda: [torch.randn(4) for _ in params])
        assert ops / len(params) == pytest.approx(OPTIMIZER_OPS_PER_TENSOR[name], abs=1)


def test_iteration_is_the_sum_of_its_breakdown(graph):
    spec = cpu_spec()
    plan = uniform_plan(len(graph.layers), dp=2, zero=3, global_batch=4,
                        precision=Precision.FP32)
    est = estimate(graph, plan, spec)
    assert est.time.optimizer > 0
    assert est.time.total == pytest.approx(est.iteration_seconds)
    # Sequence parallelism's once-per-step gradient all-reduce counts as TP traffic.
    sp = uniform_plan(len(graph.layers), tp=2, sequence_parallel=True, global_batch=4,
                      precision=Precision.FP32)
    est = estimate(graph, sp, spec)
    assert est.stage_times[0].tp_step_s > 0
    assert est.time.total == pytest.approx(est.iteration_seconds)
    # ZeRO-1's broadcasts after the optimizer step count as DP traffic, fully exposed.
    zero1 = uniform_plan(len(graph.layers), dp=2, zero=1, global_batch=4,
                         precision=Precision.FP32)
    est = estimate(graph, zero1, spec)
    assert est.stage_times[0].dp_after_step_s > 0
    assert est.time.dp_comm >= est.stage_times[0].dp_after_step_s
    assert est.time.total == pytest.approx(est.iteration_seconds)


def test_new_spec_fields_round_trip_and_default():
    spec = cpu_spec()
    again = ClusterSpec.from_json(spec.to_json())
    assert again == spec and again.calibration.dp_overhead(DPMode.ZERO2).per_unit_s == 2e-3
    old = spec.to_dict()
    for key in ("op_overhead_s", "dtensor_op_overhead_s", "host_cores", "dp_unit_overhead_s",
                "tp_module_overhead_s"):
        del old[key]
    legacy = ClusterSpec.from_dict(old)  # specs written before these fields still load
    assert legacy.op_overhead_s == 0.0
    assert legacy.calibration.dp_overhead(DPMode.ZERO3).seconds(tensors=4) == 0.0
    with pytest.raises(PlannerError, match="host_cores must be an integer >= 0"):
        ClusterSpec.from_dict({**spec.to_dict(), "host_cores": -1})
    with pytest.raises(PlannerError, match=r"'dp_unit_overhead_s\[zero3\]' must be a number"):
        ClusterSpec.from_dict({**spec.to_dict(), "dp_unit_overhead_s": {"zero3": "slow"}})


def test_tp_module_overhead_by_group_size():
    spec = cpu_spec({"tp_modules": (TpModuleOverhead(2, 1e-3), TpModuleOverhead(8, 5e-3))},
                    devices_per_node=8)
    tables = spec.calibration
    assert tables.tp_module_seconds(2) == 1e-3 and tables.tp_module_seconds(8) == 5e-3
    assert tables.tp_module_seconds(4) == 1e-3  # nearest measured size (ties: the smaller)
    assert tables.tp_module_seconds(16) == 5e-3
    assert cpu_spec().calibration.tp_module_seconds(2) == 0.0  # not measured
    assert ClusterSpec.from_json(spec.to_json()) == spec
    assert spec.to_dict()["tp_module_overhead_s"] == {"2": 1e-3, "8": 5e-3}
    # Specs written before the per-size probe carry one number: the whole node's figure.
    legacy = ClusterSpec.from_dict({**spec.to_dict(), "tp_module_overhead_s": 2e-3})
    assert legacy.calibration.tp_modules == (TpModuleOverhead(8, 2e-3),)
    with pytest.raises(PlannerError, match="key 'two' is not a TP group size"):
        ClusterSpec.from_dict({**spec.to_dict(), "tp_module_overhead_s": {"two": 1e-3}})
    with pytest.raises(PlannerError, match=r"tp_module_overhead_s\[2\] must map"):
        TpModuleOverhead(2, -1.0)


def test_collective_fit_of_the_group_size_wins():
    from cost_models.comm import collective_s
    from ir.cluster import CollectiveFit

    node = CollectiveFit("all_reduce", "intra_node", 1e-3, 1e8, measured_ranks=8)
    pair = CollectiveFit("all_reduce", "intra_node", 1e-4, 1e9, measured_ranks=2)
    spec = cpu_spec({"collective_fits": (node, pair)}, devices_per_node=8)
    tables = spec.calibration
    assert tables.collective_fit("all_reduce", "intra_node", 2) is pair
    assert tables.collective_fit("all_reduce", "intra_node", 4) is node  # the widest group's
    assert tables.collective_fit("all_reduce", "intra_node") is node
    # A pair inside the node: 2 steps of the pair's alpha, not of the 8-rank ring's.
    assert collective_s("all_reduce", 0, 2, spec) == pytest.approx(2 * 1e-4)
    assert collective_s("all_reduce", 0, 8, spec) == pytest.approx(14 * 1e-3)


def test_local_preset_measures_one_thread_op_overhead():
    local = get_cluster("local", gpus_per_node=4)
    assert local.host_cores >= 1 and local.host_bound
    assert 0 < local.op_overhead_s == measure_op_overhead_s() < 1e-3
    assert local.host_share == max(1.0, 4 / local.host_cores)


def test_backward_ops_are_charged_the_backward_overhead(graph):
    """Hand computation: the spec charges a forward op 5 us and a backward op 2 us; 2
    processes on 2 cores do not stretch (host_share 1). So forward adds ops_fwd x 5 us
    over a spec with no host cost, backward ops_bwd x 2 us (not 5 us); under sequence
    parallelism the same, plus the 15 us DTensor extra on the ops of the two
    SequenceParallel LayerNorms only (`ir.dtensor_ops`; each backward:
    native_layer_norm_backward and its weight's and bias's AccumulateGrad detach = 3 ops):
    2 x 3 x 15 us = 90 us in backward; the other ops run on plain tensors."""
    block, strategy, cfg = graph.layers[1], LayerStrategy(), config(graph)
    quiet = layer_compute(block, strategy, cpu_spec(op_overhead_s=0.0,
                                                    backward_op_overhead_s=0.0), cfg)
    split = layer_compute(block, strategy, cpu_spec(backward_op_overhead_s=2 * US), cfg)
    assert split.forward_s == pytest.approx(quiet.forward_s + block.ops_fwd * 5 * US)
    assert split.backward_s == pytest.approx(quiet.backward_s + block.ops_bwd * 2 * US)
    # A spec without the field (written before it was measured) charges op_overhead_s.
    legacy = layer_compute(block, strategy, cpu_spec(), cfg)
    assert legacy.backward_s == pytest.approx(quiet.backward_s + block.ops_bwd * 5 * US)
    sp = LayerStrategy(tp=2, sequence_parallel=True)
    sp_quiet = layer_compute(block, sp, cpu_spec(op_overhead_s=0.0, dtensor_op_overhead_s=0.0,
                                                 backward_op_overhead_s=0.0), cfg)
    sp_split = layer_compute(block, sp, cpu_spec(backward_op_overhead_s=2 * US), cfg)
    assert sp_split.backward_s == pytest.approx(sp_quiet.backward_s + block.ops_bwd * 2 * US
                                                + 2 * 3 * 15 * US)


def test_backward_op_overhead_round_trips_and_old_specs_fall_back():
    spec = cpu_spec(backward_op_overhead_s=1.5 * US)
    data = spec.to_dict()
    assert data["backward_op_overhead_s"] == 1.5 * US
    again = ClusterSpec.from_json(spec.to_json())
    assert again == spec and again.backward_host_op_s == 1.5 * US
    old = cpu_spec()  # no backward figure: not written, read back as the fallback
    assert "backward_op_overhead_s" not in old.to_dict()
    legacy = ClusterSpec.from_dict(old.to_dict())
    assert legacy.backward_op_overhead_s is None and legacy.backward_host_op_s == 5 * US
    with pytest.raises(PlannerError, match="backward_op_overhead_s must be a number >= 0"):
        ClusterSpec.from_dict({**data, "backward_op_overhead_s": -1.0})
    with pytest.raises(PlannerError, match="backward_op_overhead_s"):
        ClusterSpec.from_dict({**data, "backward_op_overhead_s": "fast"})


def test_per_pass_host_probe_counts_ops_as_the_ir_does(cpu_host_op_probe):
    """The probe divides each pass's time by that pass's ops, counted by the same counter
    that gives Layer.ops_fwd / ops_bwd: the chain's forward ops are its blocks' ops."""
    from cost_models.clusters import OP_OVERHEAD_WIDTH, _overhead_block
    from cost_models.host_probes import HOST_OP_CHAIN_BLOCKS

    probe = cpu_host_op_probe  # one real run (conftest)
    block = _overhead_block()
    x = torch.randn(2, OP_OVERHEAD_WIDTH)
    one_block_forward_ops = count_ops(lambda: block(x))
    assert probe.forward_ops == HOST_OP_CHAIN_BLOCKS * one_block_forward_ops + 1  # + the sum
    assert probe.backward_ops > probe.forward_ops  # grads of inputs and of weights
    assert 0 < probe.forward_s < 1e-3 and 0 < probe.backward_s < 1e-3
    assert probe.spread() >= 0 and probe.spread(backward=True) >= 0
    assert probe.forward_range_s[0] <= probe.forward_s <= probe.forward_range_s[1]


def test_the_estimate_pays_a_cpu_units_reduction_share_once_a_step(graph):
    """Replicate at dp 2, fp32, only a per-parameter figure (7 ns; `dp_copies`: 1/4 of it
    per micro-batch, 3/4 once a step for fp32 replicate units): against the same spec at
    0 ns, the step at m micro-batches (micro-batch 2) costs sum(P) x 7 ns x (m/4 + 3/4)
    more, P each unit's parameters: 1x at m = 1, 1.75x at m = 4 (not 4x)."""
    def spec(per_param_s):
        return cpu_spec({"dp_overheads": (DpOverhead(DPMode.REPLICATE, None, 0.0, 0.0,
                                                     per_param_s),)})

    units = [layer for layer in graph.layers if layer.param_tensors]
    figure_s = sum(layer.params + layer.tied_params for layer in units) * 7e-9
    for m, share in ((1, 1.0), (4, 1.75)):
        plan = uniform_plan(len(graph.layers), dp=2, global_batch=2 * 2 * m, micro_batch=2,
                            precision=Precision.FP32)
        assert plan.num_microbatches == m
        extra_s = (estimate(graph, plan, spec(7e-9)).time.total
                   - estimate(graph, plan, spec(0.0)).time.total)
        assert extra_s == pytest.approx(figure_s * share, rel=1e-6)
