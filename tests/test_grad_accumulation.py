"""A step's gradient accumulation (`cost_models.grad_accumulation`) against torch.profiler
on the executor's own units, and its GPU price in the estimate and the search.

Hand derivation (torch 2.13; P parameters of a unit in n tensors, c = 2 bytes bf16,
r = 4 bytes fp32 reduce dtype, m micro-batches, sync off until the last):
  bf16-mixed FSDP2 unit: after micro-batch 1's backward `to_accumulated_grad_if_needed`
  casts each gradient to fp32: (c + r) P = 6 P. Micro-batches 2..m each add the new
  bf16 gradient into the fp32 sum (`accumulate_unsharded_grad_if_needed`, add_): read
  r + c, write r: 10 P each. At m = 3: 6 P + 2 x 10 P = 26 P counted below; the last
  reduction's _chunk_cat reads the fp32 sum instead of bf16, (r - c) P = 2 P more (its
  TensorList inputs are not recorded, so that part is read off the source).
  fp32, no unit: AccumulateGrad adds micro-batches 2..m into .grad: read 4 + 4, write 4:
  12 P each; 24 P at m = 3.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cost_models.grad_accumulation import accumulation_bytes
from ir.strategy import DPMode, LayerStrategy, Precision
from tests.dist_utils import spawn

DIM = 32
MICROBATCHES = 3
SIZE = {"float": 4, "c10::BFloat16": 2}


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))


def _layer(module: nn.Module):
    params = list(module.parameters())
    return SimpleNamespace(param_names=tuple(str(i) for i in range(len(params))),
                           tied_param_names=(), param_tensors=len(params),
                           params=sum(p.numel() for p in params), tied_params=0, tp_params=0,
                           tied_tp_params=0)


def _accumulated_bytes(events) -> float:
    """Bytes of the accumulation kernels: casts under FSDP's post-backward, adds there or
    under AccumulateGrad (outermost only)."""
    total = 0.0
    for e in events:
        chain, p = [], e.cpu_parent
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        if any(a.startswith("aten::") for a in chain):
            continue  # an inner op of one counted already
        post_backward = any(a.startswith("FSDP::post_backward") for a in chain)
        accumulate = any("AccumulateGrad" in a for a in chain)
        numel = torch.Size(e.input_shapes[0]).numel() if e.input_shapes else 0
        if e.name == "aten::to" and post_backward:  # the upcast: read bf16, write fp32
            total += numel * (SIZE[e.input_dtypes[0]] + 4)
        elif e.name in ("aten::add_", "aten::add") and (post_backward or accumulate):
            total += numel * (SIZE[e.input_dtypes[0]] * 2 + SIZE[e.input_dtypes[1]])
    return total


def _unit_step_bytes(rank: int, world: int, precision: Precision) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ProfilerActivity, profile

    from executors.data_parallel import apply_dp, apply_dp_root, set_gradient_sync

    model = _model()
    mesh = init_device_mesh("cpu", (world,))
    strategy = LayerStrategy(dp=world, dp_mode=DPMode.REPLICATE)
    for layer in (model[0], model[2]):
        apply_dp(layer, strategy, mesh, precision)
    apply_dp_root(model, mesh, precision)
    x = torch.randn(4, DIM)

    def step():
        for m in range(MICROBATCHES):
            set_gradient_sync(model, m == MICROBATCHES - 1)
            model(x).float().sum().backward()
        for p in model.parameters():
            p.grad = None

    step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    return _accumulated_bytes(prof.events())


def _expected(precision: Precision) -> float:
    model, total = _model(), 0.0
    for layer in (model[0], model[2]):
        moved = accumulation_bytes(_layer(layer), LayerStrategy(dp=1), precision, MICROBATCHES)
        total += moved.upcast_bytes + moved.add_bytes
    return total


def test_a_bf16_unit_accumulates_the_bytes_fsdp2_moves():
    measured = spawn(_unit_step_bytes, 1, Precision.BF16_MIXED, timeout_s=240)[0]
    params = sum(p.numel() for p in _model().parameters())
    assert _expected(Precision.BF16_MIXED) == pytest.approx(26 * params)  # docstring
    assert measured == pytest.approx(_expected(Precision.BF16_MIXED), rel=0.01)


def test_fp32_layers_accumulate_through_autograd():
    from torch.profiler import ProfilerActivity, profile

    model, x = _model(), torch.randn(4, DIM)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(MICROBATCHES):
            model(x).sum().backward()
    params = sum(p.numel() for p in model.parameters())
    assert _expected(Precision.FP32) == pytest.approx(24 * params)  # docstring
    assert _accumulated_bytes(prof.events()) == pytest.approx(_expected(Precision.FP32), rel=0.01)


def test_one_micro_batch_accumulates_nothing_and_tp_halves_the_sharded_part():
    """At m = 1 nothing accumulates, except a mixed-precision unit under torch pipelining,
    whose every backward runs with sync off (`backward_maybe_with_nosync`): the cast to
    fp32 (6 P) and its read by the reduction (2 P more), no add."""
    layer = SimpleNamespace(param_tensors=2, params=1000, tied_params=0, tp_params=800,
                            tied_tp_params=0)
    assert accumulation_bytes(layer, LayerStrategy(), Precision.BF16_MIXED, 1) is None
    piped = accumulation_bytes(layer, LayerStrategy(), Precision.BF16_MIXED, 1, pipelined=True)
    assert (piped.upcast_bytes, piped.sum_read_bytes, piped.add_bytes) == (6000, 2000, 0)
    assert accumulation_bytes(layer, LayerStrategy(), Precision.FP32, 1, pipelined=True) is None
    assert accumulation_bytes(layer, LayerStrategy(), Precision.BF16_MIXED, 3,
                              pipelined=True) == accumulation_bytes(
        layer, LayerStrategy(), Precision.BF16_MIXED, 3)
    whole = accumulation_bytes(layer, LayerStrategy(), Precision.FP32, 2)
    split = accumulation_bytes(layer, LayerStrategy(tp=2), Precision.FP32, 2)
    assert whole.add_bytes == 12 * 1000 and split.add_bytes == 12 * (200 + 800 / 2)


def test_a_gpu_unit_pays_its_bytes_at_about_the_memory_bandwidth():
    """A llama3.2-1b block's ZeRO-2 unit under bf16 at m = 8: 2 r P + 7 (2r + c) P bytes."""
    from cost_models.clusters import get_cluster
    from cost_models.common import StepConfig
    from cost_models.grad_accumulation import accumulation_step_seconds

    gpu = get_cluster("h100-80g")
    layer = SimpleNamespace(param_names=tuple(f"w{i}" for i in range(9)),
                            tied_param_names=(), param_tensors=9, params=60_817_408,
                            tied_params=0, tp_params=0, tied_tp_params=0)
    config = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="bfloat16")
    s = LayerStrategy(dp=8, dp_mode=DPMode.ZERO2)
    step_s = accumulation_step_seconds(layer, s, gpu, config, 8)
    hbm = gpu.hbm_gbps * 1e9
    moved = (2 * 4 + 7 * 10) * layer.params
    assert moved / hbm < step_s < 2 * moved / hbm
    assert accumulation_step_seconds(layer, s, gpu, config, 1) == 0.0
    # CPU processes: step_host.grad_accumulation_s prices it from the kit's host figures
    assert accumulation_step_seconds(layer, s, get_cluster("local"), config, 8) == 0.0


@pytest.fixture(scope="module")
def llama_tiny():
    from planner.models import load_layer_graph

    return load_layer_graph("llama-tiny", micro_batch=1, dtype=torch.float32)


@pytest.mark.parametrize("world", [1, 2])
def test_the_estimate_and_the_search_both_charge_it(llama_tiny, monkeypatch, world):
    """A device-bound GPU step (no host cost) of m = 8 grows by exactly the layers'
    accumulation, at dp 2 under ZeRO-2 too (the kernels hide no DP traffic: the search's
    rows expose it behind the passes alone); each search row by its share per micro-batch."""
    import dataclasses

    import cost_models.estimate as estimate_module
    import planner.layer_tables as layer_tables
    from cost_models.clusters import get_cluster
    from cost_models.common import layer_configs
    from cost_models.grad_accumulation import accumulation_step_seconds
    from ir.plan import uniform_plan
    from planner.search_space import SearchOptions, outer_candidates

    graph, batch = llama_tiny, 8 * world
    gpu = dataclasses.replace(get_cluster("h100-80g"), devices_per_node=world,
                              op_overhead_s=0.0, backward_op_overhead_s=0.0)
    plan = uniform_plan(len(graph.layers), dp=world, zero=2 if world > 1 else 0,
                        micro_batch=1, global_batch=batch)
    configs = layer_configs(graph, plan, gpu.device)
    owed_s = sum(accumulation_step_seconds(layer, s, gpu, c, 8)
                 for layer, s, c in zip(graph.layers, plan.layer_strategies, configs))
    assert owed_s > 0
    options = SearchOptions()
    cand = next(c for c in outer_candidates(graph, world, batch, options)
                if (c.pp, c.num_microbatches) == (1, 8))
    with_est = estimate_module.estimate(graph, plan, gpu)
    rows_with = layer_tables.price_layers(graph, gpu, cand, options, batch, None, {},
                                          prune=False)[0]
    for module in (estimate_module, layer_tables):
        monkeypatch.setattr(module, "accumulation_step_seconds", lambda *args: 0.0)
    without_est = estimate_module.estimate(graph, plan, gpu)
    rows_without = layer_tables.price_layers(graph, gpu, cand, options, batch, None, {},
                                             prune=False)[0]
    assert with_est.iteration_seconds - without_est.iteration_seconds == pytest.approx(
        owed_s, rel=1e-6)
    assert with_est.time.dp_comm == pytest.approx(without_est.time.dp_comm, rel=1e-12)
    if world > 1:
        assert with_est.time.dp_comm > 0  # there was DP traffic to hide
    config = layer_tables.step_config(graph, options, gpu, 1)
    for layer, a, b in zip(graph.layers, rows_with, rows_without):
        for s, t_with, t_without in zip(a.strategies, a.time_s, b.time_s):
            assert t_with - t_without == pytest.approx(
                accumulation_step_seconds(layer, s, gpu, config, 8) / 8, rel=1e-6, abs=1e-15)
