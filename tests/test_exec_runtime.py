"""Spawned gloo checks of the executor's parts: activation re-layouts (forward values and
gradients between every pair of layouts of a 4-rank stage), bf16 mixed precision, and
rejections that every rank reaches before any collective."""

from __future__ import annotations

import itertools

import pytest
import torch

from executors import apply
from executors.data import local_rows
from executors.layout import Layout, relayout
from executors.mesh import Meshes, ParallelDims
from ir.errors import PlannerError
from ir.plan import uniform_plan
from ir.strategy import Precision
from ir.trace import model_output_tensor
from planner.models import load_layer_graph, load_model
from planner.trial.reference import BF16_LOSS_RTOL

from dist_utils import spawn

pytestmark = [pytest.mark.multiprocess]

GPT = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=16,dropout=0"
LAYOUTS = [Layout(4, 1), Layout(2, 2), Layout(1, 4), Layout(2, 2, True), Layout(1, 4, True)]
B, T, H = 8, 8, 3  # a global micro-batch of activations


def local_part(x: torch.Tensor, layout: Layout, local_index: int) -> torch.Tensor:
    """The rows (and sequence chunk) of global `x` a rank holds in `layout`."""
    dp_index, tp_index = divmod(local_index, layout.tp)
    part = x.index_select(0, local_rows(x.shape[0], 1, layout.dp, dp_index))
    return part.chunk(layout.tp, dim=1)[tp_index] if layout.seq_sharded else part


def relayout_worker(rank: int, world_size: int, _) -> list[str]:
    meshes = Meshes(ParallelDims(world_size, 1, world_size, (1, 2, 4)), "cpu")
    gen = torch.Generator().manual_seed(0)
    x_global = torch.randn(B, T, H, generator=gen)
    w_global = torch.randn(B, T, H, generator=gen)  # d(sum(x * w))/dx = w
    failures = []
    for src, dst in itertools.product(LAYOUTS, LAYOUTS):
        x = local_part(x_global, src, rank).clone().requires_grad_(True)
        y = relayout(x, src, dst, meshes)
        if not torch.equal(y, local_part(x_global, dst, rank)):
            failures.append(f"forward {src} -> {dst}")
        # a consumer in `dst` gets the gradient of the global loss for the rows it holds
        y.backward(local_part(w_global, dst, rank))
        if not torch.allclose(x.grad, local_part(w_global, src, rank)):
            failures.append(f"backward {src} -> {dst}")
    return failures


@pytest.mark.timeout(120)
def test_relayouts_are_exact_and_autograd_correct():
    results = spawn(relayout_worker, 4, timeout_s=100)
    assert results == [[]] * 4, results


def bf16_worker(rank: int, world_size: int, batches) -> dict:
    loaded = load_model(GPT, micro_batch=1, device="cpu", seed=0)
    graph = load_layer_graph(GPT, micro_batch=1, dtype=torch.bfloat16)
    out = {}
    bf16 = Precision.BF16_MIXED
    for name, kw in {"fp32": dict(precision=Precision.FP32, dp=2),
                     "bf16-zero3": dict(precision=bf16, dp=2, zero=3),
                     "bf16-tp": dict(precision=bf16, tp=2),
                     "bf16-pp": dict(precision=bf16, pp=2, micro_batch=2)}.items():
        model = load_model(GPT, micro_batch=1, device="cpu", seed=0).module
        plan = uniform_plan(len(graph.layers), global_batch=4, **kw)
        pm = apply(model, plan, graph, loss_fn=loaded.loss_fn,
                   optimizer_kwargs={"lr": 1e-3})
        losses = [pm.train_step(inputs, target) for inputs, target in batches]
        dtypes = {str(p.dtype) for _, m in pm.stage_modules for p in m.parameters()}
        out[name] = {"losses": losses, "param_dtypes": sorted(dtypes)}
    return out


@pytest.mark.timeout(120)
def test_bf16_mixed_precision_trains_with_fp32_master_weights():
    batches = []
    for step in range(2):
        loaded = load_model(GPT, micro_batch=4, device="cpu", seed=10 + step)
        batches.append((loaded.inputs, loaded.target))
    result = spawn(bf16_worker, 2, batches, timeout_s=100)[0]
    reference = result["fp32"]["losses"]
    for name in ("bf16-zero3", "bf16-tp", "bf16-pp"):
        got = result[name]
        assert got["param_dtypes"] == ["torch.float32"], name  # sharded master weights stay fp32
        for a, b in zip(got["losses"], reference):
            assert abs(a - b) < BF16_LOSS_RTOL * abs(b), f"{name}: bf16 loss {a} vs fp32 {b}"


def reject_worker(rank: int, world_size: int, _) -> str:
    loaded = load_model(GPT, micro_batch=1, device="cpu", seed=0)
    graph = load_layer_graph(GPT, micro_batch=1, dtype=torch.float32)
    plan = uniform_plan(len(graph.layers), tp=4, global_batch=4, precision=Precision.FP32)
    try:
        apply(loaded.module, plan, graph, loss_fn=loaded.loss_fn)
    except PlannerError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.timeout(60)
def test_every_rank_rejects_a_plan_for_another_world_size():
    messages = spawn(reject_worker, 2, timeout_s=50)
    assert len(set(messages)) == 1 and "launch 4 processes" in messages[0], messages


def partial_grads_worker(rank: int, world_size: int, _) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    from executors.tensor_parallel import reduce_partial_grads

    mesh = init_device_mesh("cpu", (world_size,))
    scale = float(rank + 1)  # rank r's partial sum: (r + 1) x the base
    norm = torch.nn.Parameter(distribute_tensor(torch.ones(3, 4), mesh, [Replicate()]))
    norm.grad = DTensor.from_local(scale * torch.ones(3, 4), mesh, [Partial()])
    bias = torch.nn.Parameter(distribute_tensor(torch.zeros(5), mesh, [Replicate()]))
    bias.grad = DTensor.from_local(scale * torch.ones(5), mesh, [Partial("avg")])
    sharded = torch.nn.Parameter(distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)]))
    sharded.grad = DTensor.from_local(scale * torch.arange(8.0).view(4, 2), mesh, [Partial()])
    plain = torch.nn.Parameter(torch.zeros(2))
    plain.grad = torch.full((2,), scale)
    calls = []
    all_reduce = dist.all_reduce
    dist.all_reduce = lambda *a, **k: calls.append(1) or all_reduce(*a, **k)
    try:
        reduce_partial_grads([norm, bias, sharded, plain])
    finally:
        dist.all_reduce = all_reduce
    return {"placements": [str(p.grad.placements) for p in (norm, bias, sharded)],
            "norm": norm.grad.to_local(), "bias": bias.grad.to_local(),
            "sharded": sharded.grad.full_tensor(), "plain": plain.grad, "all_reduces": len(calls)}


@pytest.mark.timeout(60)
def test_partial_gradients_are_reduced_once_in_buckets():
    """SequenceParallel leaves norm-weight gradients Partial; one all-reduce per bucket
    (mesh, dtype, reduce op) gives them their parameter's placements, with sum and avg
    reductions exact, and leaves plain gradients alone."""
    for rank, got in enumerate(spawn(partial_grads_worker, 2, timeout_s=50)):
        assert got["placements"] == ["(Replicate(),)", "(Replicate(),)", "(Shard(dim=0),)"]
        assert torch.equal(got["norm"], torch.full((3, 4), 3.0))  # 1 + 2
        assert torch.equal(got["bias"], torch.full((5,), 1.5))  # (1 + 2) / 2
        assert torch.equal(got["sharded"], 3 * torch.arange(8.0).view(4, 2))
        assert torch.equal(got["plain"], torch.full((2,), rank + 1.0))
        assert got["all_reduces"] == 2  # sum bucket (norm + sharded) and avg bucket
