"""ZeRO-1 as the Megatron distributed optimizer (`executors.zero1`): the flat layout, the
paper's model-state bytes in the cost model, and on 2 gloo ranks: any element-wise torch
optimizer equals one device, mixed precision keeps 16-bit weights with fp32 master
shards that checkpoints carry bit-identically, and the measured per-rank peak meets the
prediction."""

from __future__ import annotations

import functools
import math
import os
import tempfile

import pytest
import torch

from executors.zero1 import flat_range_boxes, rank_pieces, shard_numel

MEMORY_TARGET = 0.05  # issue 15: measured per-rank memory within 5% of the prediction
PAPER_TARGET = 0.03  # issue 15: model states within 3% of 4Ψ + 12Ψ/Nd


# ---- the flat layout -------------------------------------------------------------------------

@pytest.mark.parametrize("numels, dp", [([7, 12, 1, 30], 3), ([7, 12, 1, 30], 4), ([5], 8),
                                        ([64, 64, 4096, 64], 2)])
def test_pieces_split_the_flat_buffer_evenly_and_exactly(numels, dp):
    size = shard_numel(numels, dp)
    seen = [torch.zeros(n, dtype=torch.int64) for n in numels]
    for rank in range(dp):
        pieces = rank_pieces(numels, dp, rank)
        assert sum(x.numel for x in pieces) <= size  # every rank at most S = ceil(Ψ/dp)
        offset = 0
        for x in pieces:  # laid end to end in the rank's shard, in parameter order
            assert x.offset == offset
            offset += x.numel
            seen[x.index][x.lo:x.hi] += 1
    assert all(bool((s == 1).all()) for s in seen)  # every element on exactly one rank
    loads = [sum(x.numel for x in rank_pieces(numels, dp, r)) for r in range(dp)]
    assert max(loads) - min(loads) <= size and max(loads) == min(size, sum(numels))


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (4, 1, 3)])
def test_flat_ranges_are_rectangles_in_order(shape):
    full = torch.arange(math.prod(shape)).view(shape)
    flat = full.reshape(-1)
    for lo in range(flat.numel()):
        for hi in range(lo + 1, flat.numel() + 1):
            at = lo
            for offsets, sizes, first in flat_range_boxes(shape, lo, hi):
                assert first == at
                box = full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
                assert torch.equal(box.reshape(-1), flat[first:first + box.numel()])
                at += box.numel()
            assert at == hi


def test_all_gather_runs_on_torch_without_all_gather_single(monkeypatch):
    """torch 2.11 (the lent GPU machines') has no `dist.all_gather_single`: the shards
    are gathered through its older name `all_gather_into_tensor` (a one-rank gloo group)."""
    import torch.distributed as dist

    from executors.zero1 import FlatShardGroup

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        monkeypatch.delattr(dist, "all_gather_single", raising=False)
        params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5))]
        group = FlatShardGroup(params, dist.group.WORLD)
        with torch.no_grad():
            for t in group.opt_params:
                t.fill_(2.0)
        group.all_gather_params()
        assert all(bool((p == 2.0).all()) for p in params)
    finally:
        if owned:
            dist.destroy_process_group()


# ---- the cost model: Rajbhandari et al.'s bytes ---------------------------------------------

@functools.lru_cache(maxsize=None)
def _paper_graph():
    from planner.models import load_layer_graph
    return load_layer_graph("gpt:layers=36,hidden=4096,heads=32", micro_batch=1)


@functools.lru_cache(maxsize=None)
def _paper_case(precision):
    from cost_models.clusters import get_cluster
    from cost_models.common import layer_configs
    from cost_models.memory import layer_memory, plan_memory
    from cost_models.model_states import ModelStates
    from ir.plan import uniform_plan

    graph = _paper_graph()
    cluster = get_cluster("a100-80g").with_nodes(8)
    plan = uniform_plan(len(graph.layers), dp=64, zero=1, global_batch=64,
                        precision=precision)
    configs = layer_configs(graph, plan, cluster.device)
    held = sum((layer_memory(l, s, c).states for l, s, c in
                zip(graph.layers, plan.layer_strategies, configs)), ModelStates(0, 0, 0))
    return graph.num_params, held, plan_memory(graph, plan, cluster).stages[0]


@pytest.mark.parametrize("precision, paper", [
    ("fp16-mixed", lambda psi, n: 4 * psi + 12 * psi / n),  # ZeRO P_os, K = 12
    ("bf16-mixed", lambda psi, n: 4 * psi + 12 * psi / n),
    ("fp32", lambda psi, n: 8 * psi + 8 * psi / n),  # fp32 weights are the master copy
])
def test_zero1_model_states_are_the_papers(precision, paper):
    from ir.strategy import Precision

    psi, held, peak = _paper_case(Precision(precision))
    want = paper(psi, 64)
    assert abs(held.total / want - 1) < 1e-3  # held all step: exactly (to the padding)
    # what `planner estimate` reports at the peak (params + grads + optimizer columns)
    assert abs((peak.params + peak.grads + peak.optimizer) / want - 1) < PAPER_TARGET


# ---- 2 gloo ranks ----------------------------------------------------------------------------

GPT = "gpt:layers=4,hidden=64,heads=4,vocab=128,seq=32,dropout=0"
SEED, STEPS, GLOBAL_BATCH = 1234, 3, 8
OPTIMIZERS = {"sgd-momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "adam": (torch.optim.Adam, {"lr": 1e-2, "eps": 1e-4})}


def _model(spec: str = GPT, dropout: bool = False):
    from planner.models import load_model
    from dist_utils import zero_dropout

    loaded = load_model(spec, micro_batch=1, device="cpu", seed=SEED)
    module = loaded.module if dropout else zero_dropout(loaded.module)
    return module, loaded.loss_fn, loaded.inputs


def _batches(spec: str = GPT, n: int = STEPS) -> list:
    from planner.models import load_model

    return [(b.inputs, b.target) for b in (load_model(spec, micro_batch=GLOBAL_BATCH,
                                                      device="cpu", seed=1000 + k)
                                           for k in range(n))]


def _plan(graph, **kw):
    from ir.plan import uniform_plan
    return uniform_plan(len(graph.layers), global_batch=GLOBAL_BATCH, dp=2, micro_batch=4, **kw)


def _graph(spec: str, dtype: torch.dtype, micro_batch: int = 4):
    from planner.models import load_layer_graph
    return load_layer_graph(spec, micro_batch=micro_batch, dtype=dtype)


def worker(rank: int, world_size: int, folder: str) -> dict:
    from cost_models.clusters import get_cluster
    from cost_models.memory import plan_memory
    from cost_models.memory_tracker import LiveTensorTracker
    from executors import apply, full_state_dict
    from executors.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from ir.strategy import Precision

    out: dict = {}
    batches = _batches()
    graph32 = _graph(GPT, torch.float32)
    # any element-wise torch optimizer, fp32: equal to one device
    for name, (cls, kwargs) in OPTIMIZERS.items():
        model, loss_fn, _ = _model()
        pm = apply(model, _plan(graph32, zero=1, precision=Precision.FP32), graph32,
                   loss_fn=loss_fn, optimizer=cls, optimizer_kwargs=kwargs)
        losses = [pm.train_step(i, t) for i, t in batches]
        states = sum(s.numel() for t in pm.optimizer.inner.state.values()
                     for s in t.values() if s.dim())
        out[name] = {"losses": losses, "state": full_state_dict(pm), "state_numel": states,
                     "numel": sum(p.numel() for p in pm.module.parameters())}  # tied: untied
    # mixed precision: 16-bit weights, fp32 master shards; resume is bit-identical and a
    # ZeRO-3 plan (fp32 weights) loads the masters
    bf16, graph16 = Precision.BF16_MIXED, _graph(GPT, torch.bfloat16)
    kwargs = {"lr": 1e-2, "eps": 1e-4}

    def run(zero):
        model, loss_fn, _ = _model()
        return apply(model, _plan(graph16, zero=zero, precision=bf16), graph16,
                     loss_fn=loss_fn, optimizer_kwargs=kwargs)

    pm = run(1)
    dtypes = sorted({str(p.dtype) for p in pm.module.parameters()})
    first = [pm.train_step(i, t) for i, t in batches[:2]]
    save_checkpoint(pm, folder)
    after = [pm.train_step(i, t) for i, t in batches[2:]]
    resumed = run(1)
    load_checkpoint(resumed, latest_checkpoint(folder))
    loaded_params = full_state_dict(resumed)
    zero3 = run(3)
    load_checkpoint(zero3, latest_checkpoint(folder))
    out["bf16"] = {"dtypes": dtypes, "losses": first + after,
                   "resumed": [resumed.train_step(i, t) for i, t in batches[2:]],
                   "zero1_params": loaded_params, "zero3_params": full_state_dict(zero3)}
    del pm, resumed, zero3
    # per-rank memory of one step against the prediction (as `planner validate` measures,
    # dropout masks included)
    spec = "gpt-tiny"
    graph = _graph(spec, torch.bfloat16)
    plan = _plan(graph, zero=1, precision=bf16)
    data = _batches(spec, 2)
    with LiveTensorTracker() as mem:
        model, loss_fn, inputs = _model(spec, dropout=True)
        pm = apply(model, plan, graph, loss_fn=loss_fn, optimizer_kwargs=kwargs,
                   example_inputs=inputs)
        pm.train_step(*data[0])
        mem.reset_peak()
        pm.train_step(*data[1])
    stage = plan_memory(graph, plan, get_cluster("local", gpus_per_node=2)).stages[0]
    out["memory"] = {"measured": mem.peak_bytes,
                     "predicted": stage.peak_bytes - stage.overhead}
    return out


@pytest.fixture(scope="module")
def ranks():
    from dist_utils import spawn

    with tempfile.TemporaryDirectory() as folder:
        return spawn(worker, 2, os.path.join(folder, "ckpt"), timeout_s=240)


def _one_device(cls, kwargs) -> tuple[list[float], dict]:
    from ir.trace import model_output_tensor

    model, loss_fn, _ = _model()
    opt = cls(model.parameters(), **kwargs)
    losses = []
    for inputs, target in _batches():
        opt.zero_grad()
        loss = loss_fn(model_output_tensor(model(**inputs)), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_any_elementwise_optimizer_equals_one_device(ranks, name):
    ref_losses, ref_state = _one_device(*OPTIMIZERS[name])
    got = ranks[0][name]
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref_losses),
                               rtol=1e-5, atol=0)
    for n, want in ref_state.items():
        torch.testing.assert_close(got["state"][n], want, rtol=1e-5, atol=5e-6, msg=n)
    # the moments are split evenly: the two ranks together hold one copy
    moments = {"sgd-momentum": 1, "adam": 2}[name]
    assert [r[name]["state_numel"] for r in ranks] == [moments * got["numel"] // 2] * 2


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_mixed_precision_keeps_16bit_weights_and_resumes_bit_identically(ranks):
    got = ranks[0]["bf16"]
    assert got["dtypes"] == ["torch.bfloat16"]  # the 2Ψ weights (the fp32 ones: the shard)
    ref, _ = _one_device(torch.optim.AdamW, {"lr": 1e-2, "eps": 1e-4})
    for a, b in zip(got["losses"], ref):
        assert abs(a - b) < 0.02 * abs(b)  # bf16 compute against fp32
    assert got["resumed"] == got["losses"][2:]  # bit-identical
    for name, master in got["zero3_params"].items():  # ZeRO-3 loaded the fp32 masters...
        assert master.dtype == torch.float32
        assert torch.equal(master.to(torch.bfloat16), got["zero1_params"][name]), name
    masters = torch.cat([p.reshape(-1) for p in got["zero3_params"].values()])
    assert not torch.equal(masters, masters.to(torch.bfloat16).float())  # ...not 16-bit copies


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_measured_per_rank_memory_meets_the_prediction(ranks):
    for r in ranks:
        error = (r["memory"]["predicted"] - r["memory"]["measured"]) / r["memory"]["measured"]
        assert abs(error) <= MEMORY_TARGET, r["memory"]
