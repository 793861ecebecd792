"""A model built on the meta device (`executors.meta_init`) trains exactly like the same
model built on CPU from the same seed, under every plan shape of test_exec_plans.

Three tiers: the record's replay equals a CPU build for the zoo and for Hugging Face
configs (one process, no group); refusals (a plain meta build, a bad `init`); then
spawned gloo groups: each plan shape of `test_exec_plans.CASES` runs from a meta build
and must match that table's single-device CPU reference over META_STEPS steps (losses
and final parameters, RTOL 1e-5), plus init="empty" leaves parameters unset but computes
buffers.
"""

from __future__ import annotations

import functools

import pytest
import torch

from executors import apply, full_state_dict, meta_init
from executors.materialize import capture
from executors.meta_record import record_of
from ir.errors import PlannerError
from ir.plan import uniform_plan
from ir.strategy import Precision
from planner.models import load_model

from dist_utils import spawn, train_one_device, zero_dropout
from test_exec_plans import (CASES, GPT, GROUP_ENTRIES, HF_GPT2, HF_LLAMA, LLAMA, SEED, SEQ,
                             Case, assert_matches_reference, batches_of, build_model,
                             graph_of, optimizer_kwargs, uniform)
from test_exec_plans import results_for as plans_results_for

# One case per plan shape of test_exec_plans (its searched "planned-*" entries mix these
# same shapes), each run meta-built inside test_exec_plans' process group of its world
# size (`GROUP_ENTRIES`): one group start per world size serves both files.
SHAPES = {
    2: ["ddp-accum", "zero1-accum", "zero2", "zero3", "tp", "tp-sp", "pp-gpipe", "pp-1f1b",
        "pp-interleaved", "hf-gpt2-zero3", "hf-llama-tp-sp"],
    4: ["dp-tp", "dp-pp", "tp-pp", "dp-pp-interleaved-zero3", "mixed-zero-ckpt", "mixed-tp",
        "hf-llama-dp-tp"],
    8: ["mixed-tp-pp"],
}
# Steps each meta-built run trains. A meta build differs from a CPU build only in the
# values `apply` materializes (parameters, buffers, ties); the first step's loss reads
# every one of them and the parameters after it move each by AdamW's first update from
# its own initial value, so a wrong or unregistered value fails at step 1. Later steps
# run the executor on the same plan as the CPU-built twin in test_exec_plans, which
# trains test_exec_plans.STEPS steps in the same process group (these used to as well).
# Limit: AdamW's first update is near lr x sign(grad), so a meta-only error in a gradient's
# SCALE would barely show after one step; the CPU-built twins cover the shared gradient path.
META_STEPS = 1
REPLAYED = [GPT, LLAMA, "t5-tiny", "cnn-small", "hf:tests/data/hf/gpt2/config.json",
            HF_LLAMA, "hf:tests/data/hf/vit/config.json"]


def build_meta(spec: str):
    """The model of `test_exec_plans.build_model`, built on meta under a record."""
    with meta_init():
        loaded = load_model(spec, micro_batch=1, seq_len=SEQ.get(spec, 32), device="cpu",
                            seed=SEED)
    return zero_dropout(loaded.module), loaded.loss_fn


def meta_batches(spec: str) -> list:
    return batches_of(spec)[:META_STEPS]


@functools.lru_cache(maxsize=None)
def meta_reference(spec: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """`test_exec_plans.reference` over META_STEPS steps: losses and final parameters."""
    model, loss_fn = build_model(spec)
    return train_one_device(model, loss_fn, meta_batches(spec), optimizer_kwargs())


def _named(model) -> dict:
    return dict(list(model.named_parameters(remove_duplicate=False))
                + list(model.named_buffers(remove_duplicate=False)))


# ----------------------------------------------------------------------------- one process


@pytest.mark.parametrize("spec", REPLAYED)
def test_replay_equals_cpu_build(spec: str):
    """Every parameter and buffer, replayed from the record, is bit-equal to a CPU build
    (torch default init, custom init passes, HF post_init, trunc_normal_, RoPE buffers),
    and the generator ends where the CPU build leaves it."""
    cpu = load_model(spec, micro_batch=1, seq_len=32, device="cpu", seed=SEED).module
    after_cpu = torch.rand(4)
    with meta_init() as record:
        meta = load_model(spec, micro_batch=1, seq_len=32, device="cpu", seed=SEED).module
    assert torch.equal(torch.rand(4), after_cpu), "the meta build left the generator elsewhere"
    assert record_of(meta) is record
    want = _named(cpu)
    for name, t in _named(meta).items():
        got = record.replay([record.ref(t)])[0] if t.is_meta else t
        assert torch.equal(got, want[name]), f"{spec}: {name} differs from the CPU build"


def test_plain_meta_build_is_refused():
    """Without a record there are no values: apply's capture says how to build instead."""
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(PlannerError, match="meta_init"):
        capture(model, "model")
    assert capture(model, "empty").values["0.weight"] is None  # a loader fills it
    with pytest.raises(PlannerError, match="init must be"):
        capture(model, "zeros")
    with pytest.raises(PlannerError, match="meta device"):
        capture(torch.nn.Linear(2, 2), "empty")


def test_build_outside_the_record_is_refused():
    with torch.device("meta"):
        shared = torch.nn.Linear(4, 4)
    with meta_init():
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
        model.add_module("1", shared)
    with pytest.raises(PlannerError, match="1.weight"):
        capture(model, "model")


# ----------------------------------------------------------------------------- ranks


def run_empty(spec: str, plan, graph) -> dict:
    """init='empty': buffers computed from the record, parameters left for a loader."""
    model, loss_fn = build_meta(spec)
    pm = apply(model, plan, graph, loss_fn=loss_fn, optimizer_kwargs=optimizer_kwargs(),
               init="empty")
    return {"buffers": {n: b.clone() for n, b in pm.module.named_buffers()},
            "params": sorted(n for n, _ in pm.module.named_parameters())}


def run_auto_parallel(spec: str, plan, batches) -> dict:
    """`planner.auto_parallel` on a meta model: traces it on meta, then `apply`."""
    from planner import auto_parallel

    model, loss_fn = build_meta(spec)
    inputs, target = batches[0]
    rows = plan.micro_batch
    pm = auto_parallel(model, ({k: v[:rows] for k, v in inputs.items()}, target[:rows]),
                       loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                       optimizer_kwargs=optimizer_kwargs(), plan=plan)
    losses = [pm.train_step(batch) for batch in batches]
    return {"losses": losses, "state": full_state_dict(pm.parallel)}


def empty_case() -> tuple:
    """ZeRO-3 over 2 ranks of a Hugging Face Llama (it has RoPE buffers)."""
    graph = graph_of(HF_LLAMA)
    return HF_LLAMA, uniform_plan(len(graph.layers), global_batch=8,
                                  precision=Precision.FP32, dp=2, zero=3), graph


# GPT-2's fused c_attn split by TP: stored rank-major (`executors.fused`), built in
# model order; materialize must reorder (test_exec_plans runs GPT-2 without TP)
FUSED = Case("hf-gpt2-tp-fused", 2, HF_GPT2, uniform(tp=2))
SHAPE_CASES = [c for c in CASES if c.name in SHAPES.get(c.world, ())] + [FUSED]
META = "meta:"  # the prefix of this file's entries in test_exec_plans' results


def meta_entries(world: int) -> list[tuple]:
    """`run_cases` entries for `world` ranks: each shape built by `build_meta`, and on 2
    ranks init='empty' and `auto_parallel` taking a meta model."""
    entries = [(META + c.name, c.model, c.plan(graph_of(c.model)), graph_of(c.model),
                meta_batches(c.model), build_meta) for c in SHAPE_CASES if c.world == world]
    if world == 2:
        auto = (GPT, uniform_plan(len(graph_of(GPT).layers), global_batch=8, dp=2, zero=3,
                                  precision=Precision.FP32), meta_batches(GPT))
        entries += [(META + "init-empty", run_empty, *empty_case()),
                    (META + "auto-parallel", run_auto_parallel, *auto)]
    return entries


for _world in SHAPES:
    GROUP_ENTRIES.setdefault(_world, []).append(functools.partial(meta_entries, _world))


def results_for(world: int) -> dict:
    return {name[len(META):]: got for name, got in plans_results_for(world).items()
            if name.startswith(META)}


@pytest.mark.multiprocess
@pytest.mark.timeout(540)
@pytest.mark.parametrize("case", SHAPE_CASES, ids=[f"{c.world}r-{c.name}" for c in SHAPE_CASES])
def test_meta_built_plan_matches_cpu_single_device(case):
    assert_matches_reference(results_for(case.world)[case.name], *meta_reference(case.model))


@pytest.mark.multiprocess
@pytest.mark.timeout(540)
def test_auto_parallel_takes_a_meta_model():
    assert_matches_reference(results_for(2)["auto-parallel"], *meta_reference(GPT))


@pytest.mark.multiprocess
@pytest.mark.timeout(540)
def test_init_empty_computes_buffers():
    got = results_for(2)["init-empty"]
    cpu = load_model(HF_LLAMA, micro_batch=1, seq_len=32, device="cpu", seed=SEED).module
    want = dict(cpu.named_buffers())
    assert got["buffers"], "a Hugging Face Llama has RoPE buffers to compute"
    for name, value in got["buffers"].items():
        assert torch.equal(value, want[name]), f"buffer {name} not recomputed"
    assert got["params"] == sorted(n for n, _ in cpu.named_parameters())


# ------------------------------------------------- host collectives (issue 15's step peak)

HOST_BUFFER_NUMEL = 16 << 20  # 64 MiB of fp32: far above glibc's mmap threshold and noise


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        line = next(l for l in fh if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def _peak_above_start(run) -> int:
    """How far the resident set rises above its start while `run()` runs (VmHWM reset)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS
    start = _status_bytes("VmRSS")
    run()
    return _status_bytes("VmHWM") - start


def host_collective_peaks(rank: int, world_size: int, _payload) -> dict:
    """Peak bytes above the inputs and outputs: gloo's own reduce-scatter and all-gather
    against `executors.host_collectives`' rings, on the same buffers; and the values."""
    import torch.distributed as dist
    from executors.host_collectives import RingAllGather, RingReduceScatter
    from executors.host_memory import keep_freed_memory_off_heap

    keep_freed_memory_off_heap()
    group, n = dist.group.WORLD, HOST_BUFFER_NUMEL
    out = {}
    for name in ("gloo", "ring"):
        grads = torch.full((n,), float(rank + 1))  # touched: resident before the reset
        shard = torch.zeros(n // world_size)
        if name == "gloo":
            peak = _peak_above_start(lambda: dist.reduce_scatter_tensor(shard, grads))
        else:
            peak = _peak_above_start(lambda: RingReduceScatter()(shard, grads, group))
        out[f"{name}-rs"] = peak
        out[f"{name}-rs-value"] = shard.unique().tolist()
        out[f"{name}-rs-input-bytes"] = grads.untyped_storage().nbytes()
        grads = shard = None
        gathered = torch.zeros(n)
        mine = gathered.view(world_size, -1)[rank]
        mine.fill_(float(rank))
        if name == "gloo":
            peak = _peak_above_start(lambda: dist.all_gather_into_tensor(gathered, mine.clone()))
        else:
            peak = _peak_above_start(lambda: RingAllGather()(gathered, mine, group).wait())
        out[f"{name}-ag"] = peak
        out[f"{name}-ag-ok"] = torch.equal(
            gathered.view(world_size, -1),
            torch.arange(world_size, dtype=torch.float32)[:, None].expand(world_size, n // world_size))
        gathered = mine = None
    out.update(embedding_backward_peaks(rank, world_size))
    return out


TABLE_ROWS, TABLE_DIM = 8192, 4096  # 128 MiB of fp32, like HOST_BUFFER_NUMEL far above noise


def embedding_backward_peaks(rank: int, world_size: int) -> dict:
    """One ZeRO-3 embedding unit (not the root: it reshards after forward, as in a
    model) with FSDP2's own collectives and with `use_host_collectives`: each backward's
    peak above its start and the reduced gradient shard."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from executors.host_collectives import use_host_collectives

    mesh = init_device_mesh("cpu", (world_size,))
    ids = torch.randint(0, TABLE_ROWS, (4, 64), generator=torch.Generator().manual_seed(rank))
    out = {}
    for name in ("fsdp", "lean"):
        model = nn.Sequential(nn.Embedding(TABLE_ROWS, TABLE_DIM))
        for unit in (fully_shard(model[0], mesh=mesh), fully_shard(model, mesh=mesh)):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
        if name == "lean":
            use_host_collectives(model[0])
        loss = model(ids).sum()  # gradient rows: how often each id occurs, exact in fp32
        out[f"{name}-embedding"] = _peak_above_start(loss.backward)
        out[f"{name}-embedding-grad"] = model[0].weight.grad.to_local().clone()
        model = loss = None
    return out


HOST_WORLD = 4


@functools.lru_cache(maxsize=None)
def host_results() -> list:
    return spawn(host_collective_peaks, HOST_WORLD, timeout_s=240)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_host_collectives_hold_no_full_size_copy():
    """gloo's reduce-scatter and all-gather stage a whole-buffer copy (measured: one full
    buffer above inputs and outputs); the rings hold at most one chunk, give the same
    sums and gathers, and the reduce-scatter frees FSDP2's scratch input."""
    world = HOST_WORLD
    buffer_bytes = HOST_BUFFER_NUMEL * 4
    for r in host_results():
        assert r["gloo-rs"] > 0.8 * buffer_bytes, r  # the copy the rings avoid is real
        assert r["gloo-ag"] > 0.8 * buffer_bytes, r
        assert r["ring-rs"] < 0.5 * buffer_bytes, r  # one received chunk (1/4) + noise
        assert r["ring-ag"] < 0.25 * buffer_bytes, r  # in place
        total = float(sum(range(1, world + 1)))
        assert r["gloo-rs-value"] == r["ring-rs-value"] == [total], r
        assert r["ring-rs-input-bytes"] == 0 and r["gloo-rs-input-bytes"] == buffer_bytes, r
        assert r["gloo-ag-ok"] and r["ring-ag-ok"], r


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_host_embedding_unit_reduces_in_its_gradient():
    """An embedding unit's backward under FSDP2's own collectives holds the gathered
    table, its gradient and the reduce-scatter's copy of it (measured: over 1.9 tables);
    with the host collectives only the gradient, reduced in place, and the shard it
    leaves (+ one ring piece), and the reduced shard is the same."""
    table_bytes = TABLE_ROWS * TABLE_DIM * 4
    for r in host_results():
        assert r["fsdp-embedding"] > 1.9 * table_bytes, r["fsdp-embedding"]
        assert r["lean-embedding"] < 1.5 * table_bytes, r["lean-embedding"]
        assert torch.equal(r["fsdp-embedding-grad"], r["lean-embedding-grad"])
        assert r["lean-embedding-grad"].abs().sum() > 0
