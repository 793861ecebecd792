"""The bytes an FSDP2 unit copies (`cost_models.dp_copies`) against torch.profiler on the
executor's units (gloo, bf16-mixed, llama-like blocks of 9 tensors, world 1 and 2).

Hand derivation (torch 2.13 FSDP2; P local parameters of a unit in n tensors, W = dp,
c = 2 bytes bf16, r = 4 bytes fp32 reduce dtype):
  replicate (the world-1 path, any dp), per forward: n casts fp32 -> bf16, (4 + c) P in
  all, and n copies into the unsharded parameters, 2c P: 10 P bytes. Per reduction:
  _chunk_cat bf16 -> fp32, (c + r) P; `input / divide_factor` (the executor sets 1.0):
  2r P; copy into the reduce output: 2r P. 22 P bytes; the all-reduce is in place.
  ZeRO-3 at W = 2, per unshard (forward, and again in backward): the cast into a flat
  shard (4 + c) P / W, its copy into the all-gather input 2c P / W, the copy out of the
  gathered buffer 2c P: 9 P bytes per unshard at W = 2. Per reduction only _chunk_cat,
  (c + r) P = 6 P (the reduce-scatter writes the sharded gradient itself).
Counted here: every copy_, _chunk_cat and div (outermost only, not their inner copy_)
inside a unit's FSDP:: record_function regions, less the forward inputs' cast
(`FSDP::cast_forward_inputs`, activations), bytes = elements x (read + written dtype).
On gloo the executor's ZeRO-2/3 units reduce-scatter with `ir.gloo_collectives
.GlooReduceScatter`: an all-reduce in place, then this rank's chunk copied out, 2r P / W
bytes counted here that NCCL's reduce-scatter does not make (the collective: `comm`).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import dataclasses

import torch
from torch import nn

from cost_models.dp_copies import UnitCopies, unit_copies
from ir.strategy import DPMode, LayerStrategy, Precision
from tests.dist_utils import spawn

DIM = 64
COUNTED = ("aten::copy_", "aten::_chunk_cat", "aten::div")
COLLECTIVES = ("c10d::", "gloo:", "record_param_comms")


class _Block(nn.Module):
    """A llama block's tensors (two norms, q k v o, gate up down), no attention math."""

    def __init__(self) -> None:
        super().__init__()
        self.n1, self.n2 = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))
        self.g, self.u = (nn.Linear(DIM, 4 * DIM, bias=False) for _ in range(2))
        self.d = nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x):
        h = self.n1(x)
        x = x + self.o(self.q(h) + self.k(h) * self.v(h))
        h = self.n2(x)
        return x + self.d(self.g(h) * self.u(h))


def _event_bytes(e) -> float:
    size = {"float": 4, "c10::BFloat16": 2, "double": 8}
    if e.name == "aten::_chunk_cat":  # TensorList inputs unrecorded: bf16 gradients in
        out = e.input_shapes[3]
        return torch.Size(out).numel() * (2 + size[e.input_dtypes[3]])
    numel = torch.Size(e.input_shapes[0]).numel()
    if e.name == "aten::copy_":
        return numel * (size[e.input_dtypes[0]] + size[e.input_dtypes[1]])
    return numel * 2 * size[e.input_dtypes[0]]  # div by a scalar: read, write


def _copied_bytes(rank: int, world: int, mode: DPMode) -> dict:
    """Per unit: bytes its FSDP regions copied in one step, unshard and reduce apart."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ProfilerActivity, profile

    from executors.data_parallel import apply_dp, apply_dp_root

    torch.manual_seed(0)
    model = nn.Sequential(_Block(), _Block())
    mesh = init_device_mesh("cpu", (world,))
    for block in model:
        apply_dp(block, LayerStrategy(dp=world, dp_mode=mode), mesh, Precision.BF16_MIXED)
    apply_dp_root(model, mesh, Precision.BF16_MIXED)
    x = torch.randn(2, 8, DIM)

    def step():
        model(x).float().sum().backward()
        for p in model.parameters():
            p.grad = None

    step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    out: dict = {}
    for e in prof.events():
        if e.name not in COUNTED:
            continue
        chain, p = [], e.cpu_parent
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        regions = [a for a in chain if a.startswith("FSDP::")]
        if (not regions or "cast_forward_inputs" in regions[0] or any(a in COUNTED for a in chain)
                or any(a.startswith(COLLECTIVES) for a in chain)):
            continue
        unit = regions[0].split("(")[-1].split(")")[0]
        phase = "reduce" if "post_backward" in regions[0] else "unshard"
        out[(unit, phase)] = out.get((unit, phase), 0.0) + _event_bytes(e)
    return out


def _expected(world: int, mode: DPMode) -> UnitCopies:
    block = _Block()
    names = tuple(n for n, _ in block.named_parameters())
    layer = SimpleNamespace(param_names=names, param_tensors=len(names),
                            tied_param_names=(), params=sum(p.numel() for p in block.parameters()),
                            tied_params=0, tp_params=0, tied_tp_params=0)
    copies = unit_copies(layer, LayerStrategy(dp=world, dp_mode=mode), Precision.BF16_MIXED)
    assert copies is not None
    return copies


@pytest.mark.parametrize("world, mode", [(1, DPMode.REPLICATE), (2, DPMode.REPLICATE),
                                         (2, DPMode.ZERO3), (2, DPMode.ZERO2)])
def test_the_formula_counts_the_bytes_fsdp2_copies_per_unit(world, mode):
    measured = spawn(_copied_bytes, world, mode, timeout_s=240)[0]
    copies = _expected(world, mode)
    gathers = 2 if copies.gathers_in_backward else 1
    p = copies.chunk_cat_bytes / (2 + 4)
    gloo_chunk = 2 * 4 * p / world if mode in (DPMode.ZERO2, DPMode.ZERO3) else 0.0
    for unit in ("0", "1"):
        assert measured[(unit, "unshard")] == pytest.approx(
            gathers * (copies.unshard_per_tensor_bytes + copies.unshard_flat_bytes), rel=0.01)
        assert measured[(unit, "reduce")] == pytest.approx(
            copies.chunk_cat_bytes + copies.reduce_copy_bytes + copies.reduce_divide_bytes
            + gloo_chunk, rel=0.01)


def _config(pipelined: bool = False):
    from cost_models.common import StepConfig

    return StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="bfloat16",
                      pipelined=pipelined)


def _big_layer():  # a llama3.2-1b block's tensors: 60.8M parameters in 9
    return SimpleNamespace(param_names=tuple(f"w{i}" for i in range(9)), tied_param_names=(),
                           param_tensors=9,
                           params=60_817_408, tied_params=0, tp_params=0, tied_tp_params=0)


def test_a_gpu_unit_pays_its_bytes_at_about_the_memory_bandwidth_and_a_cpu_one_its_figure():
    from cost_models.clusters import get_cluster
    from cost_models.dp_copies import dp_copy_pass_seconds, dp_copy_step_seconds

    gpu, layer = get_cluster("h100-80g"), _big_layer()
    s = LayerStrategy(dp=1)
    forward_s, backward_s = dp_copy_pass_seconds(layer, s, gpu, _config())
    step_s = dp_copy_step_seconds(layer, s, gpu, _config())
    copies = unit_copies(layer, s, Precision.BF16_MIXED)
    hbm = gpu.hbm_gbps * 1e9
    assert copies.unshard_per_tensor_bytes / hbm < forward_s < 2 * copies.unshard_per_tensor_bytes / hbm
    reduce_bytes = copies.chunk_cat_bytes + copies.reduce_copy_bytes + copies.reduce_divide_bytes
    assert reduce_bytes / hbm < step_s < 2 * reduce_bytes / hbm
    assert backward_s == 0.0  # a replicate unit stays unsharded through its backward
    cpu = get_cluster("local")
    assert cpu.host_bound
    assert dp_copy_pass_seconds(layer, s, cpu, _config()) == (0.0, 0.0)
    assert dp_copy_step_seconds(layer, s, cpu, _config()) == 0.0  # no DP-unit figures


def test_pipelined_units_unshard_once_a_step_and_zero3_once_a_micro_batch():
    from cost_models.clusters import get_cluster
    from cost_models.dp_copies import dp_copy_pass_seconds, dp_copy_step_seconds

    gpu, layer = get_cluster("h100-80g"), _big_layer()
    plain, piped = _config(), _config(pipelined=True)
    for mode in (DPMode.REPLICATE, DPMode.ZERO2):
        s = LayerStrategy(dp=2, dp_mode=mode)
        unshard_s = dp_copy_pass_seconds(layer, s, gpu, plain)[0]
        assert unshard_s > 0 and dp_copy_pass_seconds(layer, s, gpu, piped) == (0.0, 0.0)
        assert dp_copy_step_seconds(layer, s, gpu, piped) == pytest.approx(
            dp_copy_step_seconds(layer, s, gpu, plain) + unshard_s)
    z3 = LayerStrategy(dp=2, dp_mode=DPMode.ZERO3)
    forward_s, backward_s = dp_copy_pass_seconds(layer, z3, gpu, plain)
    assert forward_s == backward_s > 0
    assert dp_copy_pass_seconds(layer, z3, gpu, piped) == (0.0, backward_s)


def test_a_full_recompute_reruns_the_forward_not_the_units_copies(monkeypatch):
    import cost_models.compute as compute
    from cost_models.clusters import get_cluster
    from ir.strategy import Checkpoint
    from planner.models import load_layer_graph

    graph = load_layer_graph("llama3.2-1b", 1, 1024, torch.bfloat16)
    # no host figures: the block's forward is the device's, where the copies show
    from cost_models.checkpoint_probes import CHECKPOINT_FIELDS

    gpu = get_cluster("h100-80g")
    gpu = dataclasses.replace(gpu, op_overhead_s=0.0, kernel_calibration=dataclasses.replace(
        gpu.kernel_calibration, **dict.fromkeys(CHECKPOINT_FIELDS, 0.0)))
    layer = graph.layers[1]
    s = LayerStrategy(dp=1, checkpoint=Checkpoint.FULL)
    with_copies = compute.layer_compute(layer, s, gpu, _config())
    monkeypatch.setattr(compute, "dp_copy_pass_seconds", lambda *args: (0.0, 0.0))
    without = compute.layer_compute(layer, s, gpu, _config())
    assert with_copies.forward_s > without.forward_s
    assert with_copies.recompute_s == pytest.approx(without.recompute_s)
