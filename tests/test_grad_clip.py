"""`max_grad_norm` equals torch.nn.utils.clip_grad_norm_ on one device, whatever the plan
shards (`executors.grad_clip`).

The multi-rank entries run in test_exec_plans' 2-rank process group (`GROUP_ENTRIES`:
no group of their own). Each trains STEPS SGD steps (momentum: the update is linear in
the clipped gradient, so a wrong coefficient moves every parameter; the offloaded run
AdamW, whose fused CPU step the executor gives offloaded shards and which torch has
only for Adam(W) on DTensors) with MAX_NORM far
below the reference's norm at every step, and must match the single-process reference
— the same model, seed and batches, `clip_grad_norm_(model.parameters(), MAX_NORM)` —
in each step's loss, reported norm and the final parameters:

    zero3          FSDP2 shards (Shard over dp); embedding and head tied in one stage
    offload        the same, every other layer's shards and gradients on the host (AdamW)
    tp             TP DTensors beside replicated LayerNorm weights; the tied pair split
    pp             two stages, the tied embedding and head on different ranks
    pp-interleaved two stages per rank (a ModuleList), the tied pair on one rank each
    zero1          ZeRO-1's flat shards (fp32: the gradients are the shards' own)
    zero1-bf16     ZeRO-1's 16-bit gradients: the coefficient goes into the fp32 copy
    hf-auto        Hugging Face GPT-2 through `planner.auto_parallel` (ZeRO-2)

fp16 loss scaling (unscale, then clip; a skipped step unclipped) runs in
tests/test_exec_fp16.py's pp2 x dp2 ZeRO-1 group.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import pytest
import torch
import torch.distributed as dist

from executors import apply, full_state_dict
from executors.grad_clip import check_max_grad_norm
from ir.errors import PlannerError
from ir.plan import uniform_plan
from ir.strategy import Precision, Schedule
from ir.trace import model_output_tensor

from test_exec_plans import (GLOBAL_BATCH, GPT, GROUP_ENTRIES, HF_GPT2, assert_params_match,
                             batches_of, build_model, graph_of, optimizer_kwargs)
from test_exec_plans import results_for as plans_results_for

MAX_NORM = 0.05  # the reference's norms are ~1-3 (asserted below): every step clips
LR = 0.5  # SGD: a clipped update (norm LR x MAX_NORM) moves the parameters visibly
MOMENTUM = 0.9
LOSS_RTOL = 1e-5
NORM_RTOL = 1e-5
BF16_RTOL = 5e-2  # bf16 compute: ~8 significant bits per product, summed (seen: 3e-4
# in the norms, 1.4e-3 in the losses, under 2e-2 in the updates)
BF16_ROUNDING = 2.0 ** -8  # bf16's unit roundoff: 8 significant bits
ATOL = 1e-6  # a gradient that is 0 (attention key biases) updates by noise alone
PREFIX = "clip:"

PLANS = {  # name -> (model, uniform_plan keywords)
    "zero3": (GPT, dict(dp=2, zero=3, micro_batch=2)),
    "offload": (GPT, dict(dp=2, zero=3, micro_batch=2)),
    "tp": (GPT, dict(tp=2)),
    "pp": (GPT, dict(pp=2, micro_batch=2, schedule=Schedule.GPIPE)),
    "pp-interleaved": (GPT, dict(pp=2, virtual_stages=2, micro_batch=2,
                                 schedule=Schedule.INTERLEAVED)),
    "zero1": (GPT, dict(dp=2, zero=1)),
    "zero1-bf16": (GPT, dict(dp=2, zero=1, precision=Precision.BF16_MIXED)),
    "hf-auto": (HF_GPT2, dict(dp=2, zero=2)),
}


def plan_optimizer(name: str) -> str:
    """The entry's optimizer: SGD with momentum; AdamW for the offloaded run."""
    return "adamw" if name == "offload" else "sgd-momentum"


def optimizer_of(optimizer: str) -> tuple[type[torch.optim.Optimizer], dict]:
    if optimizer == "adamw":
        return torch.optim.AdamW, optimizer_kwargs()  # test_exec_plans' settings
    return torch.optim.SGD, {"lr": LR, "momentum": MOMENTUM}


@functools.lru_cache(maxsize=None)
def reference(spec: str, max_norm: float | None = MAX_NORM,
              optimizer: str = "sgd-momentum") -> dict:
    """One process, plain torch: each step's loss and pre-clip norm, the final parameters."""
    model, loss_fn = build_model(spec)
    cls, kwargs = optimizer_of(optimizer)
    opt = cls(model.parameters(), **kwargs)
    losses, norms = [], []
    for inputs, target in batches_of(spec):
        opt.zero_grad()
        loss = loss_fn(model_output_tensor(model(**inputs)), target)
        loss.backward()
        if max_norm is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms,
            "state": {n: p.detach().clone() for n, p in model.named_parameters()}}


def plan_of(name: str):
    spec, keywords = PLANS[name]
    keywords = {"precision": Precision.FP32, **keywords}
    plan = uniform_plan(len(graph_of(spec).layers), global_batch=GLOBAL_BATCH,
                        optimizer=plan_optimizer(name), **keywords)
    if name == "offload":  # ZeRO-Offload (CPUOffloadPolicy) on the odd layers
        plan = dataclasses.replace(plan, layer_strategies=tuple(
            dataclasses.replace(s, offload=j % 2 == 1)
            for j, s in enumerate(plan.layer_strategies)))
    return plan


def run_clipped(name: str) -> dict:
    """On every rank: apply (or auto_parallel) with max_grad_norm and train."""
    spec, _ = PLANS[name]
    model, loss_fn = build_model(spec)
    # priced as clipping, as it runs (else `apply` warns)
    plan, batches = dataclasses.replace(plan_of(name), clip_grad_norm=True), batches_of(spec)
    cls, settings = optimizer_of(plan_optimizer(name))
    kwargs = dict(loss_fn=loss_fn, optimizer=cls, optimizer_kwargs=settings,
                  max_grad_norm=MAX_NORM)
    if name == "hf-auto":
        from planner import auto_parallel

        inputs, target = batches[0]
        rows = plan.micro_batch
        auto = auto_parallel(model, ({k: v[:rows] for k, v in inputs.items()}, target[:rows]),
                             plan=plan, **kwargs)
        pm = auto.parallel
    else:
        pm = apply(model, plan, graph_of(spec), **kwargs)
    losses, norms = [], []
    for inputs, target in batches:
        losses.append(pm.train_step(inputs, target))
        norms.append(pm.last_grad_norm)
    state = full_state_dict(pm)
    return {"losses": losses, "norms": norms, "state": state if dist.get_rank() == 0 else None}


def clip_entries() -> list[tuple]:
    return [(PREFIX + name, run_clipped, name) for name in PLANS]


GROUP_ENTRIES.setdefault(2, []).append(clip_entries)


def results_for(name: str) -> dict:
    return plans_results_for(2)[PREFIX + name]


@pytest.mark.multiprocess
@pytest.mark.timeout(540)
@pytest.mark.parametrize("name", list(PLANS))
def test_clipped_plan_matches_clip_grad_norm_on_one_device(name):
    spec, _ = PLANS[name]
    ref = reference(spec, MAX_NORM, plan_optimizer(name))
    assert min(ref["norms"]) > 4 * MAX_NORM  # every step clips, by a wide margin
    got = results_for(name)
    bf16 = PLANS[name][1].get("precision") is Precision.BF16_MIXED
    rtol = BF16_RTOL if bf16 else LOSS_RTOL
    torch.testing.assert_close(torch.tensor(got["losses"], dtype=torch.float64),
                               torch.tensor(ref["losses"], dtype=torch.float64),
                               rtol=rtol, atol=0.0)
    torch.testing.assert_close(torch.tensor(got["norms"], dtype=torch.float64),
                               torch.tensor(ref["norms"], dtype=torch.float64),
                               rtol=BF16_RTOL if bf16 else NORM_RTOL, atol=0.0)
    if bf16:  # the weights come back as their 16-bit working copies: rounded by up to
        # BF16_ROUNDING of their size, beyond which each update must match (the zero-
        # initialised biases show it: an unclipped update misses them by 100x the bound)
        initial = dict(build_model(spec)[0].named_parameters())
        for pname, expected in ref["state"].items():
            update = (expected - initial[pname].detach()).norm()
            error = (got["state"][pname].float() - expected).norm()
            bound = BF16_ROUNDING * expected.norm() + BF16_RTOL * update + ATOL
            assert error <= bound, f"{pname}: error {error:.2e} > {bound:.2e}"
        return
    for pname, expected in ref["state"].items():
        assert_params_match(pname, got["state"][pname], expected)


def test_reference_without_clipping_differs():
    """The clipped reference is not the unclipped one: a run that skipped the clip fails."""
    clipped, plain = reference(GPT), reference(GPT, None)
    moved = [(clipped["state"][n] - plain["state"][n]).norm() / plain["state"][n].norm()
             for n in plain["state"]]
    assert max(moved) > 100 * 1e-5


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "1", True, [1.0]])
def test_max_grad_norm_must_be_positive_finite(value):
    with pytest.raises(PlannerError, match=r"^max_grad_norm=.* is not a positive finite number"):
        check_max_grad_norm(value)
    assert check_max_grad_norm(2) == 2.0 and check_max_grad_norm(None) is None


def test_apply_refuses_a_bad_max_grad_norm_before_anything_runs():
    model, loss_fn = build_model(GPT)
    with pytest.raises(PlannerError, match=r"^max_grad_norm=-1"):
        apply(model, plan_of("tp"), graph_of(GPT), loss_fn=loss_fn, max_grad_norm=-1)


@pytest.mark.parametrize("priced,given", [(False, 1.0), (True, None)])
def test_a_run_that_clips_otherwise_than_priced_warns_naming_both(priced, given):
    """The plan records what was priced, `max_grad_norm` decides what runs (torchtitan's
    split of a job's settings); a mismatch is one warning before anything runs."""
    model, loss_fn = build_model(GPT)
    plan = dataclasses.replace(plan_of("tp"), clip_grad_norm=priced)
    with pytest.warns(UserWarning, match=rf"^the plan was priced with clip_grad_norm={priced} "
                                         rf"but runs with max_grad_norm={given}:"), \
            pytest.raises(PlannerError, match="initialised process group"):
        apply(model, plan, graph_of(GPT), loss_fn=loss_fn, max_grad_norm=given)


def test_a_plan_with_sharded_tables_may_clip():
    """Sharded tables clip with the rest (`executors.grad_clip`, tables): the plan holds
    both and apply goes past them (to its process-group check)."""
    from ir.embedding_tables import (EmbeddingPlan, EmbeddingTable, PlacedTable,
                                     TablePlacement, TableSharding)

    table = EmbeddingTable("tables.0", 10, 8, "float32", "sum", 3)
    placed = PlacedTable(table, TablePlacement("tables.0", TableSharding.ROW_RANGE, (0, 1)))
    plan = dataclasses.replace(plan_of("zero1"), embeddings=EmbeddingPlan((placed,)),
                               clip_grad_norm=True)
    model, loss_fn = build_model(GPT)
    with pytest.raises(PlannerError, match="initialised process group"):
        apply(model, plan, graph_of(GPT), loss_fn=loss_fn, max_grad_norm=1.0)


def test_table_clip_prices_its_rows_reads_and_writes_in_search_and_estimate():
    """A clipping step reads each shard's coalesced gradient (the rows the optimizer
    steps) for the norm and reads and writes it for the scale (cost_models.compute's
    CLIP_* passes), on sharded and replicated tables; the placement search and the
    estimate price it from one config (`planner.table_hybrid.table_config`).

    By hand, b's rows on rank 1: 16 ids over 1000 rows touch 1000 (1 - 0.999^16) = 15.88
    rows of 64 x 4 bytes, streamed 3 times (one read for the norm, a read and a write for
    the scale): 15.88 x 768 B / (2000 GB/s x 0.8955 achieved) = 6.81 ns."""
    from cost_models.compute import CLIP_NORM_PASSES, CLIP_SCALE_PASSES
    from cost_models.embedding import EmbeddingConfig, hbm_bytes_per_s, unique_rows
    from cost_models.clusters import get_cluster
    from planner.table_hybrid import table_config
    from tests.test_table_clip import clip_extra_update_s

    cluster = get_cluster("a100-80g", nodes=1, gpus_per_node=2)
    row_s = 64 * 4 * (CLIP_NORM_PASSES + CLIP_SCALE_PASSES) / hbm_bytes_per_s(cluster)
    touched = unique_rows(16, 1000)  # the global batch's 8 x 2 ids: a's rows, and b's
    extra = clip_extra_update_s(cluster)  # per rank: rank 0 holds a, both step b's rows
    assert extra == pytest.approx([2 * touched * row_s, touched * row_s])
    assert extra[1] == pytest.approx(6.81e-9, rel=1e-3)
    plan = dataclasses.replace(plan_of("zero1"), clip_grad_norm=True)
    assert table_config(plan, "sgd") == EmbeddingConfig(plan.global_batch, "sgd", True)


def test_planning_a_table_model_with_clipping_prices_the_clip(tmp_path, capsys):
    """`planner plan dlrm-small --clip-grad-norm` plans its tables with the clip: the
    plan says it clips, the placement search's step is the plan's predicted step, and
    `estimate_hybrid` (planner estimate / validate) prices the tables' and the step's
    clip terms as the search did (the layers' compute is measured per graph load: not
    compared), above the same plan unclipped."""
    from cost_models.clusters import get_cluster
    from ir.plan import load_plan
    from planner.cli import main
    from planner.models import load_layer_graph
    from planner.table_hybrid import estimate_hybrid

    out = tmp_path / "plan.json"
    assert main(["plan", "dlrm-small", "--cluster", "local", "--gpus-per-node", "2",
                 "--global-batch", "8", "--clip-grad-norm", "--out", str(out)]) == 0
    doc = load_plan(out)
    assert doc.plan.clip_grad_norm and doc.plan.embeddings is not None
    assert doc.search["tables"]["step_s"] == pytest.approx(doc.predicted["iteration_seconds"])
    graph = load_layer_graph("dlrm-small", doc.plan.micro_batch, None)
    cluster = get_cluster("local", gpus_per_node=2)
    again = estimate_hybrid(graph, doc.plan, cluster)["time"]
    unclipped = estimate_hybrid(graph, dataclasses.replace(doc.plan, clip_grad_norm=False),
                                cluster)["time"]
    for term in ("embedding", "optimizer"):  # the tables' rows; the dense clip, all-reduce
        assert again[term] == pytest.approx(doc.predicted["time"][term]), term
        assert again[term] > unclipped[term], term


@pytest.mark.parametrize("cluster_name", ["h100-80g", "local"])
def test_clipping_prices_one_blocking_scalar_all_reduce_a_step(cluster_name):
    """The clip's norm is one fp32 scalar all-reduced over every rank before the scale
    (`cost_models.step_host.clip_all_reduce_s`): each rank's step loop pays the alpha-beta
    all-reduce of 4 bytes over the world (`cost_models.comm`), on GPUs and CPU processes."""
    from cost_models.clusters import get_cluster
    from cost_models.comm import collective_s
    from cost_models.estimate import estimate
    from planner.models import load_layer_graph

    cluster = get_cluster(cluster_name, gpus_per_node=2)
    graph = load_layer_graph("gpt-tiny", 1, None)
    plan = uniform_plan(len(graph.layers), dp=cluster.world_size,
                        global_batch=cluster.world_size, precision=Precision.FP32)
    once = collective_s("all_reduce", 4, cluster.world_size, cluster)
    assert once > 0
    plain, clipped = (estimate(graph, dataclasses.replace(plan, clip_grad_norm=c), cluster)
                      for c in (False, True))
    for a, b in zip(plain.stage_times, clipped.stage_times):
        assert b.loop_s - a.loop_s == pytest.approx(once, rel=1e-9)


def test_clipping_prices_a_read_for_the_norm_and_a_read_and_write_for_the_scale():
    """plan.clip_grad_norm adds the clip's gradient traffic to the layer's optimizer step
    (`cost_models.compute`): fp32 gradients 3 x 4 bytes per local element, ZeRO-1's
    16-bit replicated gradient 2 bytes (read for the norm only); nothing when not asked."""
    from cost_models.clusters import get_cluster
    from cost_models.common import StepConfig
    from cost_models.compute import optimizer_step_seconds
    from ir.strategy import DPMode, LayerStrategy
    from planner.models import load_layer_graph

    gpu = get_cluster("h100-80g")
    block = load_layer_graph("gpt-tiny", 1, None).layers[1]
    big = dataclasses.replace(block, params=block.params * 10**6)  # the stream dominates
    plain = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="float32",
                       precision=Precision.BF16_MIXED)
    clipped = dataclasses.replace(plain, clip_grad_norm=True)
    bytes_per_s = gpu.hbm_gbps * 1e9
    for strategy, nbytes in ((LayerStrategy(dp=8, dp_mode=DPMode.ZERO3), big.params / 8 * 12),
                             (LayerStrategy(dp=8, dp_mode=DPMode.ZERO1), big.params * 2),
                             (LayerStrategy(), big.params * 12)):
        extra = (optimizer_step_seconds(big, strategy, gpu, clipped)
                 - optimizer_step_seconds(big, strategy, gpu, plain))
        assert extra == pytest.approx(nbytes / bytes_per_s), strategy


def test_plan_records_clipping_and_its_prices_follow():
    from cost_models.common import StepConfig
    from ir.plan import PlanDocument, plan_from_dict, plan_to_dict

    plan = dataclasses.replace(plan_of("zero3"), clip_grad_norm=True)
    names = tuple(layer.name for layer in graph_of(GPT).layers)
    data = plan_to_dict(PlanDocument(plan, "gpt", "abc123", names, {"name": "local"}))
    assert data["clip_grad_norm"] is True
    assert plan_from_dict(data).plan == plan
    assert "clip_grad_norm" not in plan_to_dict(PlanDocument(plan_of("zero3"), "gpt", "abc123",
                                                             names, {"name": "local"}))
    assert StepConfig.from_plan(graph_of(GPT), plan).clip_grad_norm


def test_estimate_prices_the_clip_when_asked(capsys):
    """`planner estimate --clip-grad-norm`: the same plan, its optimizer step longer by
    the clip's gradient passes; refused beside --plan, which fixes it."""
    import json

    from planner.cli import main

    argv = ["estimate", "gpt-tiny", "--cluster", "h100-80g", "--dp", "8", "--zero", "3",
            "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)["time"]["optimizer"]
    assert main(argv + ["--clip-grad-norm"]) == 0
    clipped = json.loads(capsys.readouterr().out)["time"]["optimizer"]
    assert clipped > plain
    assert main(["estimate", "--plan", "x.json", "--clip-grad-norm"]) == 2
    assert "--clip-grad-norm cannot be combined with --plan" in capsys.readouterr().err


def test_search_with_clipping_plans_a_clipping_step():
    """SearchOptions.clip_grad_norm (`planner plan --clip-grad-norm`, auto_parallel's
    max_grad_norm) prices the clip in the search and records it in the plan it makes: on a
    GPU preset (no host term priced) its objective grows as its estimate does, the norm's
    all-reduce (`step_host.clip_all_reduce_s`) included."""
    from cost_models.clusters import get_cluster
    from planner.models import load_layer_graph
    from planner.search import search
    from planner.search_space import SearchOptions

    graph = load_layer_graph("gpt-tiny")
    pins = dict(uniform=True, dp=8, zero=3, tp=1, pp=1, no_checkpoint=True, micro_batch=1)
    results = [search(graph, get_cluster("h100-80g"), 8, SearchOptions(clip_grad_norm=c, **pins))
               for c in (False, True)]
    plain, clipped = (r.best for r in results)
    assert not plain.plan.clip_grad_norm and clipped.plan.clip_grad_norm
    assert clipped.estimate.time.optimizer > plain.estimate.time.optimizer
    assert clipped.objective_s - plain.objective_s == pytest.approx(
        clipped.estimate.iteration_seconds - plain.estimate.iteration_seconds, rel=1e-4)


def test_plan_file_with_a_bad_clip_grad_norm_is_refused_naming_the_key():
    from ir.plan import PlanDocument, plan_from_dict, plan_to_dict

    names = tuple(layer.name for layer in graph_of(GPT).layers)
    data = plan_to_dict(PlanDocument(plan_of("zero3"), "gpt", "abc123", names, {"name": "local"}))
    with pytest.raises(PlannerError, match=r"clip_grad_norm: expected .*'yes'"):
        plan_from_dict({**data, "clip_grad_norm": "yes"}, "plan.json")


def test_the_clip_keeps_its_norm_and_coefficient_on_the_device(monkeypatch):
    """As torch's clip_grad_norm_: no read to the host in the step (a sync per step on a
    GPU); the norm, the coefficient and a multiplier given as a tensor stay tensors.
    Held gradients count times the multiplier and are left as they are."""
    from executors.grad_clip import clip_grad_norm

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(3)]
    for p in params:
        p.grad = 10 * torch.randn_like(p)
    before = [p.grad.clone() for p in params]
    multiplier = torch.tensor(0.5)
    grads = [before[0], before[1], 0.5 * before[2]]  # params[2] is held
    want = float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])))

    def host_read(*_):
        raise AssertionError("the clip read a tensor to the host")

    with monkeypatch.context() as patch:
        for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
            patch.setattr(torch.Tensor, name, host_read)
        norm, coefficient = clip_grad_norm([(str(i), p) for i, p in enumerate(params)],
                                           lambda p: 1, 1.0, torch.device("cpu"),
                                           frozenset({id(params[2])}), multiplier)
    assert isinstance(norm, torch.Tensor) and isinstance(coefficient, torch.Tensor)
    assert float(norm) == pytest.approx(want, rel=1e-6)
    assert float(coefficient) == pytest.approx(1.0 / (want + 1e-6), rel=1e-6)
    for p, g in zip(params[:2], before):
        torch.testing.assert_close(p.grad, g * coefficient)
    assert torch.equal(params[2].grad, before[2])


def test_loss_scaling_and_the_clip_leave_the_optimizers_multiplied_gradients_scaled(
        one_rank_group):
    """One rule (`executors.optimizer.multiplied_params`), as `runtime.train_step` hands it
    to both: a ZeRO-1 group's 16-bit gradients (its fp32 master, `zero1.attach_master`)
    the step reads times its multiplier, so neither the unscale nor the clip writes them;
    the rest are unscaled, then clipped. A plain torch optimizer multiplies none."""
    from executors.grad_clip import clip_grad_norm
    from executors.loss_scaling import LossScaler
    from executors.optimizer import ShardedOptimizer, multiplied_params
    from executors.zero1 import MASTER_ATTR

    half = torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))
    full = torch.nn.Parameter(torch.zeros(2))
    setattr(half, MASTER_ATTR, torch.zeros(2))  # as attach_master leaves a ZeRO-1 group
    optimizer = ShardedOptimizer([half, full], [([half], dist.group.WORLD)], torch.optim.SGD,
                                 {"lr": 0.1})
    multiplied = multiplied_params(optimizer)
    assert multiplied == {id(half)}
    assert multiplied_params(torch.optim.SGD([full], lr=0.1)) == frozenset()
    scaler = LossScaler()
    half.grad = torch.full((2,), 4.0, dtype=torch.float16)
    full.grad = torch.full((2,), 4.0 * scaler.scale_value)
    assert scaler.unscale_and_check([half, full], torch.device("cpu"), multiplied)
    assert half.grad.tolist() == [4.0, 4.0]  # the optimizer multiplies it
    assert full.grad.tolist() == [4.0, 4.0]  # unscaled
    clip_grad_norm([("half", half), ("full", full)], lambda p: 1, 1.0, torch.device("cpu"),
                   multiplied, 1.0 / scaler.scale_value)
    assert half.grad.tolist() == [4.0, 4.0]  # the step applies the coefficient
    assert full.grad.tolist()[0] < 4.0  # clipped here


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_a_partial_gradient_is_refused_at_the_clip_naming_it(one_rank_group):
    """A Partial gradient holds unreduced sums: counting it as replicated (`stage_copies`)
    would take the norm of a piece. The clip refuses it in one line naming the parameter."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial

    from executors.grad_clip import clip_grad_norm

    mesh = init_device_mesh("cpu", (1,))
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = DTensor.from_local(torch.ones(2), mesh, [Partial()])
    with pytest.raises(PlannerError, match=r"^blocks\.0\.w's gradient is Partial") as error:
        clip_grad_norm([("blocks.0.w", p)], lambda p: 1, 1.0, torch.device("cpu"))
    assert "\n" not in str(error.value)
