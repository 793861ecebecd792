"""Which optimizer step the executor runs is one rule (`ir.plan.optimizer_implementation`),
read by the executor's param groups and by the memory walk's step temporaries.

On an H100 torch's default foreach AdamW took 45 ms of kernels for 1.24B parameters where
the estimate priced the fused kernel's 7 x 4 bytes per element (12.5 ms): the executor now
steps Adam/AdamW fused on GPUs, and the fused kernel holds no temporaries."""

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
