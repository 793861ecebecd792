"""Which optimizer step the executor runs is one rule (`ir.plan.optimizer_implementation`),
read by the executor's param groups and by the memory walk's step temporaries.

On an H100 torch's default foreach AdamW took 45 ms of kernels for 1.24B parameters where
the estimate priced the fused kernel's 7 x 4 bytes per element (12.5 ms): the executor now
steps Adam/AdamW fused on GPUs, and the fused kernel holds no temporaries."""

import dataclasses

import pytest
import torch
from torch import nn

from cost_models.memory_walk import optimizer_step_temp_bytes
from executors.optimizer import param_groups
from ir.plan import optimizer_implementation


def test_adam_steps_fused_on_accelerators_and_torch_defaults_elsewhere():
    assert optimizer_implementation("adamw", "cuda") == "fused"
    assert optimizer_implementation("adam", "cuda") == "fused"
    assert optimizer_implementation("sgd-momentum", "cuda") == "foreach"
    assert optimizer_implementation("adamw", "cpu") == "single"


def test_param_groups_fuse_accelerator_parameters_only():
    on_cpu = [nn.Parameter(torch.zeros(4)) for _ in range(2)]
    assert param_groups(on_cpu, frozenset(), torch.optim.AdamW, {}) is on_cpu
    on_device = [nn.Parameter(torch.zeros(4, device="meta")) for _ in range(2)]
    groups = param_groups(on_device, frozenset(), torch.optim.AdamW, {})
    assert groups == [{"params": on_device, "fused": True}]
    # the caller's own choice wins; SGD keeps torch's default
    assert param_groups(on_device, frozenset(), torch.optim.AdamW, {"foreach": True}) \
        is on_device
    assert param_groups(on_device, frozenset(), torch.optim.SGD, {"lr": 0.1}) is on_device


class _Layer:  # the two fields optimizer_step_temp_bytes reads
    fp32_moment_bytes = 400.0
    largest_tensor_params = 10.0


def test_fused_step_holds_no_temporaries():
    layers = [_Layer(), _Layer()]
    assert optimizer_step_temp_bytes(layers, "adamw", "fused") == 0.0
    assert optimizer_step_temp_bytes(layers, "adamw", "foreach") == 800.0  # one moment
    assert optimizer_step_temp_bytes(layers, "adamw", "single") == 2 * 10 * 4  # 2 x largest


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
    from planner.models import load_layer_graph

    gpu = get_cluster("h100-80g")
    assert gpu.op_overhead_s > 0
    block = load_layer_graph("gpt-tiny", 1, None).layers[1]
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
        groups = param_groups(params, frozenset(), torch.optim.AdamW, {"fused": True})
        assert [g["params"] for g in groups] == [[sharded], plain]
        opt = torch.optim.AdamW(groups, fused=True)
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()  # one group of each kind: no mixed list
    finally:
        if owned:
            dist.destroy_process_group()
