"""Executed plans equal single-device training, step by step (gloo, 1-8 ranks).

An integration table (torchtitan style): each entry names a plan, its world size and a
model. All entries of one world size run in ONE spawned process group, one after the
other (spawning is the expensive part on 2 cores). Every entry trains STEPS AdamW steps
on the same global batches as a single-process reference run of the same model from the
same seed, in fp32, and must match each step's loss and the final parameters within
RTOL (relative) — plus ATOL for values that are ~0.

Models: the zoo's gpt-tiny and llama-tiny (dropout 0), Hugging Face GPT-2 (DDP/ZeRO; its
fused Conv1D TP is in tests/test_exec_tp.py) and Hugging Face Llama (TP, SP).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import nn

from executors import apply, full_state_dict
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.plan import ParallelPlan, uniform_plan
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Precision, Schedule, Stage
from planner.models import load_layer_graph, load_model

from dist_utils import spawn, train_one_device, zero_dropout

pytestmark = [pytest.mark.multiprocess]

GPT = "gpt:layers=4,hidden=64,heads=4,vocab=128,seq=32,dropout=0"  # gpt-tiny, dropout 0
LLAMA = "llama:layers=4,hidden=64,heads=8,kv_heads=4,ffn=160,vocab=128,seq=32"  # llama-tiny
HF_GPT2 = "hf:tests/data/hf/gpt2/config.json"
HF_LLAMA = "hf:tests/data/hf/llama/config.json"
SEQ = {GPT: 32, LLAMA: 32, HF_GPT2: 32, HF_LLAMA: 32}

GLOBAL_BATCH = 8
STEPS = 3
SEED = 1234
LR = 1e-2  # large enough that three steps move every parameter visibly
# AdamW's first update is lr * g / (|g| + eps): with torch's eps=1e-8 a 1e-10 change in a
# 1e-9 gradient (summation order: micro-batches, TP partial sums, DP reductions) moves a
# parameter by 1e-4, so no parallel run could match to 1e-5. eps=1e-4 keeps updates
# normalised for every gradient above it and bounds that amplification by lr / eps.
# What remains is reassociation noise, so a parameter matches when the whole tensor is
# within RTOL in norm (||got - ref|| <= RTOL ||ref|| + ATOL: ATOL covers tensors whose
# true gradient is 0, like attention key biases, and hold only noise) and no element is
# off by more than ATOL (5e-4 of one update of size lr). Losses match within RTOL.
EPS = 1e-4
RTOL = 1e-5
ATOL = 5e-6


# ----------------------------------------------------------------------------- models




def build_model(spec: str):
    loaded = load_model(spec, micro_batch=1, seq_len=SEQ[spec], device="cpu", seed=SEED)
    return zero_dropout(loaded.module), loaded.loss_fn


@functools.lru_cache(maxsize=None)
def graph_of(spec: str) -> LayerGraph:
    return load_layer_graph(spec, micro_batch=2, seq_len=SEQ[spec], dtype=torch.float32)


@functools.lru_cache(maxsize=None)
def batches_of(spec: str) -> list:
    out = []
    for step in range(STEPS):
        loaded = load_model(spec, micro_batch=GLOBAL_BATCH, seq_len=SEQ[spec], device="cpu",
                            seed=1000 + step)
        out.append((loaded.inputs, loaded.target))
    return out


def optimizer_kwargs() -> dict:
    return {"lr": LR, "weight_decay": 0.1, "eps": EPS}


@functools.lru_cache(maxsize=None)
def reference(spec: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-process training on the global batches: losses and final parameters."""
    model, loss_fn = build_model(spec)
    return train_one_device(model, loss_fn, batches_of(spec), optimizer_kwargs())


# ----------------------------------------------------------------------------- plans


def per_layer_plan(stages: tuple[Stage, ...], strategies: tuple[LayerStrategy, ...],
                   num_microbatches: int = 1, schedule: Schedule = Schedule.ONE_F_ONE_B,
                   virtual_stages: int = 1) -> ParallelPlan:
    """A plan with per-layer strategies (layers of one stage may differ in dp)."""
    dp = max(s.dp for s in strategies)
    return ParallelPlan(stages=stages, layer_strategies=strategies, global_batch=GLOBAL_BATCH,
                        micro_batch=GLOBAL_BATCH // (num_microbatches * dp),
                        num_microbatches=num_microbatches, schedule=schedule,
                        precision=Precision.FP32, optimizer="adamw",
                        virtual_stages=virtual_stages)


def uniform(**kw) -> Callable[[LayerGraph], ParallelPlan]:
    def make(graph: LayerGraph) -> ParallelPlan:
        return uniform_plan(len(graph.layers), global_batch=GLOBAL_BATCH,
                            precision=Precision.FP32, **kw)
    return make


def mixed_zero(graph: LayerGraph) -> ParallelPlan:
    """dp=4, every layer its own ZeRO stage and checkpointing; 2 accumulated micro-batches."""
    modes = [DPMode.ZERO3, DPMode.ZERO1, DPMode.ZERO2, DPMode.ZERO3, DPMode.REPLICATE,
             DPMode.ZERO2, DPMode.ZERO1]
    ckpt = [Checkpoint.NONE, Checkpoint.FULL, Checkpoint.SELECTIVE, Checkpoint.NONE,
            Checkpoint.FULL, Checkpoint.NONE, Checkpoint.NONE]
    strategies = tuple(LayerStrategy(dp=4, dp_mode=modes[j % 7], checkpoint=ckpt[j % 7])
                       for j in range(len(graph.layers)))
    return per_layer_plan((Stage(0, len(graph.layers) - 1, 4),), strategies, num_microbatches=2)


def mixed_tp(graph: LayerGraph) -> ParallelPlan:
    """4 ranks; TP degree, ZeRO stage and checkpointing differ per layer:
    embed tp1·dp4·z3, blocks tp4 / tp2+sp·z2·ckpt / tp2·z1 / tp1·dp4, norm tp2, head tp4."""
    n = len(graph.layers)
    blocks = [LayerStrategy(tp=4, dp=1),
              LayerStrategy(tp=2, dp=2, dp_mode=DPMode.ZERO2, sequence_parallel=True,
                            checkpoint=Checkpoint.FULL),
              LayerStrategy(tp=2, dp=2, dp_mode=DPMode.ZERO1, checkpoint=Checkpoint.SELECTIVE),
              LayerStrategy(tp=1, dp=4, dp_mode=DPMode.ZERO3)]
    strategies = ((LayerStrategy(tp=1, dp=4, dp_mode=DPMode.ZERO3),) + tuple(blocks[: n - 3])
                  + (LayerStrategy(tp=2, dp=2), LayerStrategy(tp=4, dp=1)))
    return per_layer_plan((Stage(0, n - 1, 4),), strategies)


def mixed_tp_pp(graph: LayerGraph) -> ParallelPlan:
    """8 ranks, pp=2 of 4 devices: stage 0 tp1·z3 then tp2+sp, stage 1 tp4 then tp2·z2."""
    n = len(graph.layers)
    half = n // 2
    first = [LayerStrategy(tp=1, dp=4, dp_mode=DPMode.ZERO3)] + [
        LayerStrategy(tp=2, dp=2, sequence_parallel=True, checkpoint=Checkpoint.FULL)] * (half - 1)
    second = [LayerStrategy(tp=4, dp=1)] * (n - half - 1) + [
        LayerStrategy(tp=2, dp=2, dp_mode=DPMode.ZERO2)]
    return per_layer_plan((Stage(0, half - 1, 4), Stage(half, n - 1, 4)),
                          tuple(first + second), num_microbatches=2)


def planned(world: int, index: int = 0, **pins) -> Callable[[LayerGraph], ParallelPlan]:
    """The index-th distinct plan `planner.search` picks for the local cluster of `world`
    processes (fp32), optionally with pins (tp=2, pp=2, ...)."""
    def make(graph: LayerGraph) -> ParallelPlan:
        from cost_models.clusters import get_cluster
        from planner.search import search
        from planner.search_space import SearchOptions

        options = SearchOptions(precision=Precision.FP32, top_k=index + 1, **pins)
        result = search(graph, get_cluster("local", gpus_per_node=world), GLOBAL_BATCH, options)
        distinct = list(dict.fromkeys(c.plan for c in result.candidates))
        assert len(distinct) > index, f"search found {len(distinct)} plans, wanted #{index}"
        return distinct[index]
    return make


@dataclass(frozen=True)
class Case:
    name: str
    world: int
    model: str
    plan: Callable[[LayerGraph], ParallelPlan]


I, G1, ONE = Schedule.INTERLEAVED, Schedule.GPIPE, Schedule.ONE_F_ONE_B
CASES = [
    Case("single-accum", 1, GPT, uniform(micro_batch=2)),
    Case("single-ckpt", 1, LLAMA, uniform(checkpoint=Checkpoint.FULL)),
    Case("ddp-accum", 2, GPT, uniform(dp=2, micro_batch=2)),
    Case("zero1-accum", 2, GPT, uniform(dp=2, zero=1, micro_batch=1)),
    Case("zero2", 2, GPT, uniform(dp=2, zero=2)),
    Case("zero3", 2, GPT, uniform(dp=2, zero=3, micro_batch=2)),
    Case("tp", 2, GPT, uniform(tp=2)),
    Case("tp-sp", 2, LLAMA, uniform(tp=2, sequence_parallel=True)),
    Case("pp-gpipe", 2, GPT, uniform(pp=2, micro_batch=2, schedule=G1)),
    Case("pp-1f1b", 2, LLAMA, uniform(pp=2, micro_batch=2, schedule=ONE)),
    Case("pp-interleaved", 2, GPT, uniform(pp=2, virtual_stages=2, micro_batch=2, schedule=I)),
    Case("hf-gpt2-ddp", 2, HF_GPT2, uniform(dp=2)),
    Case("hf-gpt2-zero3", 2, HF_GPT2, uniform(dp=2, zero=3)),
    Case("hf-llama-tp-sp", 2, HF_LLAMA, uniform(tp=2, sequence_parallel=True)),
    Case("dp-tp", 4, LLAMA, uniform(dp=2, tp=2, zero=3)),
    Case("dp-pp", 4, GPT, uniform(dp=2, pp=2, zero=2, micro_batch=2, schedule=ONE)),
    Case("tp-pp", 4, GPT, uniform(tp=2, pp=2, sequence_parallel=True, micro_batch=4)),
    Case("dp-pp-interleaved-zero3", 4, LLAMA,
         uniform(dp=2, pp=2, virtual_stages=2, zero=3, micro_batch=1, schedule=I)),
    Case("mixed-zero-ckpt", 4, GPT, mixed_zero),
    Case("mixed-tp", 4, LLAMA, mixed_tp),
    Case("hf-gpt2-zero1", 4, HF_GPT2, uniform(dp=4, zero=1)),
    Case("hf-llama-dp-tp", 4, HF_LLAMA, uniform(dp=2, tp=2, zero=2)),
    Case("dp-tp-pp", 8, GPT, uniform(dp=2, tp=2, pp=2, zero=3, micro_batch=2)),
    Case("dp-tp-pp-interleaved", 8, LLAMA,
         uniform(dp=2, tp=2, pp=2, virtual_stages=2, sequence_parallel=True, zero=1,
                 micro_batch=2, schedule=I)),
    Case("mixed-tp-pp", 8, GPT, mixed_tp_pp),
    # plans `planner plan --cluster local` picks (per-layer mixes of all of the above)
    # (the local cluster's speed is measured, so the exact plans may vary between runs)
    Case("planned-best", 2, GPT, planned(2)),
    Case("planned-2nd", 2, LLAMA, planned(2, index=1)),
    Case("planned-best", 4, GPT, planned(4)),
    Case("planned-2nd", 4, LLAMA, planned(4, index=1)),
    Case("planned-pp2", 4, GPT, planned(4, pp=2)),
    Case("planned-best", 8, LLAMA, planned(8)),
    Case("planned-2nd", 8, GPT, planned(8, index=1)),
]


# ----------------------------------------------------------------------------- ranks


def run_cases(rank: int, world_size: int, payload: list[tuple]) -> dict:
    """On every rank: apply and train each entry; rank 0 returns losses and parameters.
    An entry may end with its own model builder (a module-level function); an entry
    `(name, fn, *args)` with a callable `fn` is run as `fn(*args)` (its result kept)."""
    results = {}
    for name, spec, *rest in payload:
        if callable(spec):
            results[name] = spec(*rest)
            continue
        plan, graph, batches, *builder = rest
        model, loss_fn = (builder[0] if builder else build_model)(spec)
        try:
            pm = apply(model, plan, graph, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                       optimizer_kwargs=optimizer_kwargs())
            losses = [pm.train_step(inputs, target) for inputs, target in batches]
            state = full_state_dict(pm)
            results[name] = {"losses": losses, "state": state if rank == 0 else None}
        except PlannerError as exc:  # the same verdict on every rank: no collective hangs
            results[name] = {"error": str(exc)}
    return results


# Entries other test files run in this file's process groups, so that each world size
# starts one group for all of them (starting one is most of a case's cost on 2 cores):
# world -> functions returning `run_cases` payload entries, registered at import
# (tests/test_exec_meta.py adds the meta-built twins of these cases).
GROUP_ENTRIES: dict[int, list[Callable[[], list[tuple]]]] = {}


@functools.lru_cache(maxsize=None)
def results_for(world: int) -> dict:
    cases = [c for c in CASES if c.world == world]
    payload = [(c.name, c.model, c.plan(graph_of(c.model)), graph_of(c.model),
                batches_of(c.model)) for c in cases]
    for entries in GROUP_ENTRIES.get(world, []):
        payload += entries()
    return spawn(run_cases, world, payload, timeout_s=480)[0]


@pytest.mark.timeout(540)
@pytest.mark.parametrize("case", CASES, ids=[f"{c.world}r-{c.name}" for c in CASES])
def test_plan_matches_single_device(case: Case):
    assert_matches_reference(results_for(case.world)[case.name], *reference(case.model))


def assert_matches_reference(got: dict, ref_losses: list[float], ref_state: dict) -> None:
    """A run's losses (RTOL) and every reference parameter (`assert_params_match`)."""
    assert "error" not in got, got.get("error")
    torch.testing.assert_close(torch.tensor(got["losses"], dtype=torch.float64),
                               torch.tensor(ref_losses, dtype=torch.float64),
                               rtol=RTOL, atol=0.0, msg=lambda m: f"losses: {m}")
    for name, expected in ref_state.items():
        assert name in got["state"], f"{name} missing from the executed model"
        assert_params_match(name, got["state"][name], expected)


def assert_params_match(name: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape, f"{name}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
    error = (got.double() - expected.double())
    bound = RTOL * expected.double().norm() + ATOL
    assert error.norm() <= bound, f"{name}: error norm {error.norm():.2e} > {bound:.2e}"
    worst = error.abs().max()
    assert worst <= ATOL, f"{name}: an element is off by {worst:.2e} > {ATOL:.0e}"
