"""Which optimizer step the executor runs is the plan's `optimizer_impl` (or, for a plan
without one, one rule: `ir.plan.optimizer_implementation`), read by the executor's param
groups and priced by the memory walk's step temporaries and the step's stream.

On an H100 torch's default foreach AdamW took 45 ms of kernels for 1.24B parameters where
the estimate priced the fused kernel's 7 x 4 bytes per element (12.5 ms): the executor now
steps Adam/AdamW fused on GPUs, and the fused kernel holds no temporaries."""

import dataclasses
import json

import pytest
import torch
from torch import nn

from cost_models.step_temporaries import optimizer_step_temp_bytes
from executors.optimizer import param_groups, step_implementation
from ir.errors import PlannerError
from ir.plan import optimizer_implementation, requested_implementation
from ir.step_groups import StepGroup
from ir.strategy import Precision
from planner.search_space import SearchOptions


def test_adam_steps_fused_on_accelerators_and_torch_defaults_elsewhere():
    assert optimizer_implementation("adamw", "cuda") == "fused"
    assert optimizer_implementation("adam", "cuda") == "fused"
    assert optimizer_implementation("sgd-momentum", "cuda") == "foreach"
    assert optimizer_implementation("adamw", "cpu") == "single"


def test_param_groups_run_the_chosen_implementation():
    on_cpu = [nn.Parameter(torch.zeros(4)) for _ in range(2)]
    assert param_groups(on_cpu, frozenset(), torch.optim.AdamW, "single") == [
        {"params": on_cpu, "foreach": False}]
    on_device = [nn.Parameter(torch.zeros(4, device="meta")) for _ in range(2)]
    assert param_groups(on_device, frozenset(), torch.optim.AdamW, "fused") == [
        {"params": on_device, "fused": True}]
    assert param_groups(on_device, frozenset(), torch.optim.AdamW, "foreach") == [
        {"params": on_device, "foreach": True}]
    # an offloaded parameter steps with the fused CPU kernel whatever the rest run
    groups = param_groups(on_device, frozenset({id(on_device[1])}), torch.optim.AdamW, "foreach")
    assert groups == [{"params": [on_device[0]], "foreach": True},
                      {"params": [on_device[1]], "fused": True}]


@pytest.mark.parametrize("optimizer_cls,kwargs,host", [
    (torch.optim.AdamW, {}, "fused"), (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, "foreach"),
    (torch.optim.SGD, {"lr": 0.1}, "foreach")])
def test_offloaded_dtensor_shards_step_with_a_kernel_dtensor_runs(optimizer_cls, kwargs, host):
    """FSDP2's offloaded shards are DTensors, and torch 2.13 shards only Adam's and AdamW's
    fused kernels: `SGD(fused=True)` on one raised NotImplementedError (no sharding
    strategy for aten._fused_sgd_) at the first step. The host group steps fused where
    DTensor runs it, else foreach; two real steps on a 1-rank mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", torch.arange(1))
        param = nn.Parameter(distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)]))
        groups = param_groups([param], frozenset({id(param)}), optimizer_cls, "single")
        assert groups == [{"params": [param], host: True}]
        opt = optimizer_cls(groups, **kwargs)
        for _ in range(2):
            param.grad = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
            opt.step()
    finally:
        if owned:
            dist.destroy_process_group()


def test_the_executor_runs_the_plans_implementation_or_refuses_in_one_line():
    adamw = torch.optim.AdamW
    # a plan without the field (older files): the default rule, the caller's kwargs win
    assert step_implementation(adamw, {}, None, "cuda") == ("fused", {})
    assert step_implementation(adamw, {"lr": 1.0}, None, "cpu") == ("single", {"lr": 1.0})
    assert step_implementation(adamw, {"foreach": True}, None, "cuda") == ("foreach", {})
    assert step_implementation(torch.optim.NAdam, {}, None, "cuda")[0] == "foreach"
    assert step_implementation(torch.optim.SGD, {}, None, "cuda")[0] == "foreach"
    # a recorded one runs as recorded; a kwarg that agrees is dropped (the groups carry it)
    assert step_implementation(adamw, {"foreach": True, "lr": 1.0}, "foreach", "cuda") == (
        "foreach", {"lr": 1.0})
    assert step_implementation(adamw, {}, "foreach", "cuda") == ("foreach", {})
    with pytest.raises(PlannerError, match="ask torch for the fused step but the plan was "
                                           "priced for optimizer_impl 'foreach'") as err:
        step_implementation(adamw, {"fused": True}, "foreach", "cuda")
    assert "\n" not in str(err.value)
    with pytest.raises(PlannerError, match="torch.optim.nadam.NAdam has no fused step"):
        step_implementation(torch.optim.NAdam, {}, "fused", "cuda")


def test_requested_implementation_follows_torchs_defaults():
    assert requested_implementation({}, "cuda") is None
    assert requested_implementation({"fused": True}, "cpu") == "fused"
    assert requested_implementation({"foreach": False}, "cuda") == "single"
    assert requested_implementation({"fused": False}, "cuda") == "foreach"
    assert requested_implementation({"fused": False}, "cpu") == "single"


class _Layer:  # the fields optimizer_step_temp_bytes reads
    fp32_moment_bytes = 400.0
    step_tensor_params = (10.0,)
    step_group = StepGroup.ANY  # one group with its neighbours


def test_fused_step_holds_no_temporaries():
    layers = [_Layer(), _Layer()]
    assert optimizer_step_temp_bytes(layers, "adamw", "fused") == 0.0
    assert optimizer_step_temp_bytes(layers, "adamw", "foreach") == 800.0  # one moment
    # one at a time: 2 x a tensor + the one stepped before it
    assert optimizer_step_temp_bytes(layers, "adamw", "single") == (2 * 10 + 10) * 4


def _layer_memory(numels, group):
    from cost_models.memory_walk import LayerMemory
    from cost_models.model_states import ModelStates
    return LayerMemory(states=ModelStates(0, 0, 0), activations=None, gather_unit_bytes=0,
                       unsharded_grad_bytes=0, step_tensor_params=tuple(numels),
                       fp32_moment_bytes=4.0 * sum(numels), step_group=group)


@pytest.mark.parametrize("implementation", ["foreach", "fused"])
def test_step_temporaries_peak_per_param_group_as_torch_frees_them(implementation):
    """torch's foreach Adam holds one moment-sized temporary per param group (its
    `adam()` call), freed before the next group: live tensor bytes of real AdamW steps
    over the executor's groups (plain | DTensor | plain, then a group of two dtypes,
    both of whose lists' temporaries are live at once). The old walk summed all groups."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from cost_models.step_temporaries import optimizer_step_temp_bytes
    from tests.step_memory import measured_step_temp_bytes

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", torch.arange(1))
        layers = [([3000, 1000], StepGroup.PLAIN), ([2000], StepGroup.DTENSOR),
                  ([500], StepGroup.PLAIN)]  # groups of 16000, 8000 and 2000 bytes
        params = [[nn.Parameter(torch.randn(n)) for n in numels] for numels, _ in layers]
        params[1] = [nn.Parameter(distribute_tensor(p.data, mesh, [Replicate()]))
                     for p in params[1]]
        flat = [p for ps in params for p in ps]
        groups = param_groups(flat, frozenset(), torch.optim.AdamW, implementation)
        assert len(groups) == 3
        mixed = [nn.Parameter(torch.randn(1500)), nn.Parameter(torch.randn(4000).bfloat16())]
        opts = [torch.optim.AdamW(groups), torch.optim.AdamW(
            param_groups(mixed, frozenset(), torch.optim.AdamW, implementation))]
        measured = []
        for opt, ps in zip(opts, (flat, mixed)):
            measured.append(measured_step_temp_bytes(opt, ps))
    finally:
        if owned:
            dist.destroy_process_group()
    priced = optimizer_step_temp_bytes(
        [_layer_memory(numels, group) for numels, group in layers], "adamw", implementation)
    assert measured[0] == pytest.approx(priced, abs=64)
    assert priced == (16000 if implementation == "foreach" else 0)
    assert measured[1] == pytest.approx(1500 * 4 + 4000 * 2 if implementation == "foreach"
                                        else 0, abs=64)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_single_tensor_step_holds_the_previous_tensors_denom(amsgrad):
    """torch's single-tensor AdamW makes sqrt(v) and its quotient for tensor i while tensor
    i-1's `denom` is still bound: live tensor bytes of a real step over the executor's
    groups (plain | DTensor: `denom` goes between them). The old rule priced 2 x the
    largest tensor (16000 bytes) where 1000 then 2000 elements hold 20000."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from tests.step_memory import measured_step_temp_bytes

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", torch.arange(1))
        layers = [([300, 1000], StepGroup.PLAIN), ([2000, 100], StepGroup.PLAIN),
                  ([1900], StepGroup.DTENSOR)]  # 2 x 1900 after 100: DTensor group alone
        params = [[nn.Parameter(torch.randn(n)) for n in numels] for numels, _ in layers]
        params[2] = [nn.Parameter(distribute_tensor(p.data, mesh, [Replicate()]))
                     for p in params[2]]
        flat = [p for ps in params for p in ps]
        opt = torch.optim.AdamW(param_groups(flat, frozenset(), torch.optim.AdamW, "single"),
                                amsgrad=amsgrad)
        measured = measured_step_temp_bytes(opt, flat)
    finally:
        if owned:
            dist.destroy_process_group()
    priced = optimizer_step_temp_bytes(
        [_layer_memory(numels, group) for numels, group in layers], "adamw", "single")
    assert priced == (2 * 2000 + 1000) * 4
    assert measured == pytest.approx(priced, abs=64)


def test_ir_records_each_parameters_size_in_step_order():
    """The IR's per-layer tensor sizes are the model's parameters() order, the order the
    executor's optimizer steps them (a tied copy included in its layer)."""
    from planner.models import load_model
    from tests.layer_graphs import layer_graph

    graph = layer_graph("gpt-tiny", 1, None)
    module = load_model("gpt-tiny", device="meta").module
    steps = [n for l in graph.layers for n in l.param_numels if not l.tied_params]
    assert steps == [p.numel() for p in module.parameters()][:len(steps)]
    for layer in graph.layers:
        assert max(layer.param_numels) == layer.max_param_numel
        assert sum(layer.param_numels) == layer.params + layer.tied_params


def test_layers_step_in_the_groups_the_executor_makes():
    """ZeRO-1's flat shards step after every other group; a TP'd block with plain norms
    counts in the groups on both its sides; an offloaded layer splits the runs."""
    from cost_models.step_temporaries import step_group
    from ir.strategy import DPMode, LayerStrategy
    from tests.layer_graphs import layer_graph

    embed, block = layer_graph("gpt-tiny", 1, None).layers[:2]
    assert step_group(block, LayerStrategy(), Precision.FP32) == StepGroup.PLAIN
    assert step_group(block, LayerStrategy(), Precision.BF16_MIXED) == StepGroup.DTENSOR
    assert step_group(block, LayerStrategy(tp=2), Precision.FP32) == StepGroup.ANY
    assert step_group(block, LayerStrategy(dp=2, dp_mode=DPMode.ZERO1),
                      Precision.FP32) == StepGroup.FLAT
    assert step_group(block, LayerStrategy(dp=2, dp_mode=DPMode.ZERO3, offload=True),
                      Precision.FP32) == StepGroup.HOST
    flat, plain, dtensor = (_layer_memory([n], g) for n, g in (
        (100, StepGroup.FLAT), (10, StepGroup.PLAIN), (1, StepGroup.DTENSOR)))
    either, host = _layer_memory([1000], StepGroup.ANY), _layer_memory([0], StepGroup.HOST)
    temp = lambda *ls: optimizer_step_temp_bytes(ls, "adamw", "foreach") / 4  # noqa: E731
    # both flat layers last, joining the plain run before them (plain tensors alike)
    assert temp(flat, plain, flat) == 210
    assert temp(flat, dtensor, flat) == 200
    assert temp(plain, either, dtensor) == 1010  # either side may hold the TP'd block
    assert temp(dtensor, either, dtensor) == 1002
    assert temp(plain, host, plain) == 10


@pytest.mark.parametrize("plan", [("plain", "flat", "dtensor", "flat", "plain"),
                                  ("flat", "plain", "flat"), ("plain", "dtensor", "flat"),
                                  ("dtensor", "plain", "dtensor", "flat")])
def test_walk_groups_layers_as_the_executors_param_groups(plan):
    """The executor's real param groups (ShardedOptimizer's order: every other
    parameter, then ZeRO-1's flat shards, plain tensors) against the walk's groups. The
    old walk kept flat shards apart from a plain run before them (200 for 210)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from cost_models.step_temporaries import _step_group_bytes

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", torch.arange(1))
        numels = [10 * (i + 1) for i in range(len(plan))]
        params = [nn.Parameter(distribute_tensor(torch.randn(n), mesh, [Replicate()]))
                  if kind == "dtensor" else nn.Parameter(torch.randn(n))
                  for n, kind in zip(numels, plan)]
        stepped = ([p for p, k in zip(params, plan) if k != "flat"]
                   + [p for p, k in zip(params, plan) if k == "flat"])
        groups = param_groups(stepped, frozenset(), torch.optim.AdamW, "foreach")
        executor = [sum(p.numel() for p in g["params"]) * 4.0 for g in groups]
    finally:
        if owned:
            dist.destroy_process_group()
    walk = _step_group_bytes([_layer_memory([n], StepGroup(k)) for n, k in zip(numels, plan)])
    assert [b for b in walk if b] == executor


def test_step_tensors_split_by_tp_only_where_tp_splits_them():
    """TP divides a candidate's weight (and a column-parallel bias), not a norm, a
    row-parallel bias or a layer with no candidates (`held_local_params`' rule, per
    tensor); ZeRO-3 divides every tensor. The old rule divided all by tp: cnn-small's
    2304-element convolutions priced 576 at tp=4."""
    from cost_models.model_states import held_local_params
    from cost_models.step_temporaries import step_tensor_params
    from ir.strategy import DPMode, LayerStrategy
    from tests.layer_graphs import layer_graph

    conv = layer_graph("cnn-small", 1, None).layers[1]
    assert not conv.tp_candidates
    assert step_tensor_params(conv, LayerStrategy(tp=4), 1e9) == tuple(
        float(n) for n in conv.param_numels)
    graph = layer_graph("gpt-tiny", 1, None)
    for layer in graph.layers:
        for strategy in (LayerStrategy(tp=2), LayerStrategy(tp=2, dp=2, dp_mode=DPMode.ZERO3)):
            local = step_tensor_params(layer, strategy, 1e12)
            shards = 2 if strategy.dp_mode is DPMode.ZERO3 else 1
            assert sum(local) * shards == pytest.approx(held_local_params(layer, strategy))
    block = graph.layers[1]
    tp2 = step_tensor_params(block, LayerStrategy(tp=2), 1e12)
    assert max(tp2) == max(block.param_numels) / 2  # the largest weight is split
    whole = [n for n, t in zip(block.param_numels, tp2) if t == n]
    assert whole and len(whole) < len(tp2)  # norms / row-wise biases stay whole


def test_gpu_step_prices_the_fused_kernel_not_a_dispatch_per_tensor():
    """On a GPU preset with a measured host (~19 us per op) a per-tensor dispatch price
    made gpt3-1.3b's AdamW 77 ms of host; the fused kernel's launches are a handful a step:
    the step is the stream (7 x 4 bytes per element at the copy rate) or, where longer,
    the lists' Python, about an op's host per tensor."""
    from cost_models.clusters import get_cluster
    from cost_models.common import StepConfig
    from cost_models.compute import (ADAM_STEP_BYTES_PER_ELEMENT, LIST_STEP_HOST_OPS_PER_TENSOR,
                                      optimizer_step_seconds)
    from ir.strategy import LayerStrategy
    from tests.layer_graphs import layer_graph

    gpu = get_cluster("h100-80g")
    assert gpu.op_overhead_s > 0
    block = layer_graph("gpt-tiny", 1, None).layers[1]
    config = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="float32")
    seconds = optimizer_step_seconds(block, LayerStrategy(), gpu, config)
    stream_s = block.params * ADAM_STEP_BYTES_PER_ELEMENT / (gpu.hbm_gbps * 1e9)
    host_s = len(block.param_names) * LIST_STEP_HOST_OPS_PER_TENSOR * gpu.op_overhead_s
    assert seconds == pytest.approx(max(stream_s, host_s))
    big = dataclasses.replace(block, params=block.params * 10**6)  # a billion-scale block
    assert optimizer_step_seconds(big, LayerStrategy(), gpu, config) == pytest.approx(
        stream_s * 10**6)
    # one tensor at a time (a CPU's step) pays its dispatches per tensor
    per_tensor = optimizer_step_seconds(block, LayerStrategy(), dataclasses.replace(
        gpu, device="cpu"), config)
    assert per_tensor > seconds + 10 * len(block.param_names) * gpu.op_overhead_s * 0.9


def test_a_list_mixing_dtensors_and_plain_tensors_steps_in_two_groups():
    """ZeRO-1's plain flat shards beside FSDP2's DTensors in one list made torch's
    fused/foreach kernels raise ("mixed torch.Tensor and DTensor"; review, 2026-11-25)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", torch.arange(1))
        sharded = nn.Parameter(distribute_tensor(torch.randn(4), mesh, [Replicate()]))
        plain = [nn.Parameter(torch.randn(4)) for _ in range(2)]
        params = [sharded, *plain]
        groups = param_groups(params, frozenset(), torch.optim.AdamW, "fused")
        assert [g["params"] for g in groups] == [[sharded], plain]
        opt = torch.optim.AdamW(groups)
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()  # one group of each kind: no mixed list
    finally:
        if owned:
            dist.destroy_process_group()


def _gpu_plan_costs(optimizer_impl):
    """gpt-tiny's plan on one H100: its peak stage memory, and one billion-scale block's
    optimizer step (where the stream, not the host, sets the step)."""
    from cost_models.clusters import get_cluster
    from cost_models.common import layer_configs
    from cost_models.compute import optimizer_step_seconds
    from cost_models.memory import plan_memory
    from ir.plan import uniform_plan
    from tests.layer_graphs import layer_graph

    gpu = get_cluster("h100-80g", nodes=1, gpus_per_node=1)
    graph = layer_graph("gpt-tiny", 1, None)
    plan = uniform_plan(len(graph.layers), optimizer_impl=optimizer_impl)
    config = layer_configs(graph, plan, gpu.device)[1]
    big = dataclasses.replace(graph.layers[1], params=graph.layers[1].params * 10**6)
    step_s = optimizer_step_seconds(big, plan.layer_strategies[1], gpu, config)
    return step_s, plan_memory(graph, plan, gpu).stages[0], graph


def test_a_plan_is_priced_as_the_implementation_it_records():
    """foreach AdamW streams 21 words an element where the fused kernel streams 7, and
    holds a moment-sized temporary the fused kernel does not (review, 2026-11-25: a user's
    foreach was priced as fused)."""
    default_s, default_mem, graph = _gpu_plan_costs(None)
    fused_s, fused_mem, _ = _gpu_plan_costs("fused")
    foreach_s, foreach_mem, _ = _gpu_plan_costs("foreach")
    assert (default_s, default_mem) == (fused_s, fused_mem)  # the rule: fused on GPUs
    assert foreach_s == pytest.approx(3 * fused_s, rel=0.01)  # 21 words against 7
    single_s, _, _ = _gpu_plan_costs("single")  # the same per-op kernels, a tensor at a time
    assert single_s == pytest.approx(foreach_s, rel=0.01)
    moment_bytes = 4 * sum(l.params + l.tied_params for l in graph.layers)
    extra = foreach_mem.peak_bytes - fused_mem.peak_bytes
    assert foreach_mem.phase == "optimizer" and 0 < extra <= moment_bytes


def test_plan_file_records_the_implementation_and_old_files_load():
    from ir.plan import PlanDocument, plan_from_dict, plan_to_dict, uniform_plan

    doc = PlanDocument(uniform_plan(2, optimizer_impl="foreach"), "m", "f", ("a", "b"),
                       {"name": "h100-80g"})
    data = json.loads(json.dumps(plan_to_dict(doc)))
    assert data["optimizer_impl"] == "foreach"
    assert plan_from_dict(data) == doc
    del data["optimizer_impl"]  # written before the field: the device's default rule
    assert plan_from_dict(data).plan.optimizer_impl is None
    data["optimizer_impl"] = "fast"
    with pytest.raises(PlannerError, match=r"optimizer_impl: 'fast' is not one of fused, "
                                           r"foreach, single"):
        plan_from_dict(data, "p.json")
    with pytest.raises(PlannerError, match="unknown optimizer_impl"):
        uniform_plan(2, optimizer_impl="fast")


def test_a_searched_plan_records_what_the_executor_runs():
    from cost_models.clusters import get_cluster
    from tests.layer_graphs import layer_graph
    from planner.plan_report import plan_document
    from planner.search import search
    from planner.search_space import SearchOptions

    graph = layer_graph("gpt-tiny", 1, None)
    for cluster, options, want in (
            ("h100-80g", SearchOptions(), "fused"),
            ("h100-80g", SearchOptions(optimizer_impl="foreach"), "foreach"),
            ("local", SearchOptions(), "single")):
        spec = get_cluster(cluster, nodes=1, gpus_per_node=1)
        result = search(graph, spec, 2, dataclasses.replace(options, no_pp=True, tp=1),
                        with_baselines=False)
        assert plan_document(graph, spec, result.best, result.stats).plan.optimizer_impl == want


def test_auto_parallel_prices_a_class_as_torch_steps_it_or_refuses_it():
    """NAdam has no fused step: it was priced as fused AdamW while torch ran foreach."""
    from planner.api import _optimizer_choice

    gpu = "NVIDIA H100 80GB HBM3"
    assert _optimizer_choice(torch.optim.NAdam, None, gpu) == {
        "optimizer": "adamw", "optimizer_impl": "foreach"}
    assert _optimizer_choice(torch.optim.AdamW, None, gpu)["optimizer_impl"] == "fused"
    assert _optimizer_choice(torch.optim.AdamW, {"foreach": True}, gpu)["optimizer_impl"] \
        == "foreach"
    assert _optimizer_choice(torch.optim.AdamW, None, "cpu")["optimizer_impl"] == "single"
    assert _optimizer_choice(torch.optim.SGD, {"momentum": 0.9}, gpu) == {
        "optimizer": "sgd-momentum", "optimizer_impl": "foreach"}
    assert _optimizer_choice(torch.optim.Adagrad, None, gpu)["optimizer"] == "sgd-momentum"

    class Lion(torch.optim.Optimizer):  # states the planner does not know
        pass

    with pytest.raises(PlannerError, match="cannot price the optimizer .*Lion: it prices"):
        _optimizer_choice(Lion, None, gpu)


def test_auto_parallel_takes_the_callers_options_for_a_class_it_cannot_price():
    """Options given name the states to price: a class without a planner twin still plans."""
    from planner.api import _search_options

    class Lion(torch.optim.Optimizer):
        pass

    gpu = "NVIDIA H100 80GB HBM3"
    opts = _search_options(SearchOptions(optimizer="adamw"), Lion, None, gpu, Precision.BF16_MIXED)
    assert (opts.optimizer, opts.optimizer_impl) == ("adamw", "foreach")  # torch's default
    opts = _search_options(SearchOptions(optimizer="adamw"), torch.optim.AdamW, None, gpu,
                           Precision.BF16_MIXED)
    assert opts.optimizer_impl == "fused"
    given = SearchOptions(optimizer="sgd", optimizer_impl="single")
    assert _search_options(given, Lion, None, gpu, Precision.BF16_MIXED) is given
    with pytest.raises(PlannerError, match="cannot price the optimizer"):
        _search_options(None, Lion, None, gpu, Precision.BF16_MIXED)


def test_a_subclass_taking_kwargs_steps_fused():
    class Tuned(torch.optim.AdamW):
        def __init__(self, params, **kwargs):
            super().__init__(params, **kwargs)

    assert step_implementation(Tuned, {}, "fused", "cuda")[0] == "fused"
    assert step_implementation(Tuned, {}, None, "cuda")[0] == "fused"
