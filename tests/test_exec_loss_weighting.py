"""Micro-batch loss weights: parallel training equals single-device training when the
micro-batches count different numbers of targets (`executors.runtime.loss_weight`).

Cross-entropy averages over the targets != -100 of its own micro-batch, so dividing each
micro-batch's loss by (dp x micro-batches) is wrong as soon as they count differently —
BERT's MLM labels ignore ~85% of positions at random. Each entry trains bert-tiny (zoo,
dropout 0) or gpt-tiny with ignored targets under a 2-rank plan for STEPS AdamW steps
(fp32), and must match the single-process run on the same global batches: every loss and
the final parameters. All entries run in ONE spawned 2-rank group.

The "ignored" batches hold, at step 1, a micro-batch whose targets are ALL -100 (rows 6-7:
dp rank 1's last micro-batch, the one that syncs gradients, under dp=2 with 2
micro-batches; the last of 4 micro-batches under pp=2 or tp=2), and at step 2 a global
batch with no counted target at all: single-device training reports a nan loss and takes
an AdamW step on zero gradients, and so must the plan.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from executors import apply, full_state_dict
from executors.runtime import IGNORE_INDEX, loss_weight
from ir.layer import LayerGraph
from ir.plan import ParallelPlan, uniform_plan
from ir.strategy import Precision, Schedule
from planner.models import load_layer_graph, load_model

from dist_utils import spawn, train_one_device

pytestmark = [pytest.mark.multiprocess]

BERT = "bert:layers=2,hidden=64,heads=4,ffn=256,vocab=128,seq=32,dropout=0"  # bert-tiny
GPT = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=16,dropout=0"
SEQ = {BERT: 32, GPT: 16}
GLOBAL_BATCH = 8
STEPS = 3
SEED = 1234
# as in test_exec_plans: AdamW's eps=1e-4 bounds how much reassociation noise in a tiny
# gradient can move a parameter; losses and parameter norms match within RTOL, every
# element within ATOL (5e-4 of one lr-sized update)
OPTIMIZER_KWARGS = {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}
RTOL = 1e-5
ATOL = 5e-6
IGNORED_ROWS = slice(6, 8)  # dp rank 1's last micro-batch (dp=2, 2 micro-batches)


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    batches: str  # "plain": the zoo's labels; "ignored": see the module docstring
    plan: dict  # uniform_plan keywords


CASES = [
    Case("bert-ddp2", BERT, "plain", dict(dp=2, micro_batch=2)),
    Case("bert-pp2", BERT, "plain", dict(pp=2, micro_batch=2, schedule=Schedule.ONE_F_ONE_B)),
    Case("bert-ddp2-ignored", BERT, "ignored", dict(dp=2, micro_batch=2)),
    Case("bert-pp2-ignored", BERT, "ignored", dict(pp=2, micro_batch=2, schedule=Schedule.GPIPE)),
    # gpt's head splits its vocabulary over tp=2: logits stay a DTensor (loss parallel)
    Case("gpt-tp2-loss-parallel-ignored", GPT, "ignored", dict(tp=2, micro_batch=2)),
]


# ----------------------------------------------------------------------------- data


def build_model(spec: str) -> tuple[nn.Module, object]:
    loaded = load_model(spec, micro_batch=1, seq_len=SEQ[spec], device="cpu", seed=SEED)
    return loaded.module, loaded.loss_fn


@functools.lru_cache(maxsize=None)
def graph_of(spec: str) -> LayerGraph:
    return load_layer_graph(spec, micro_batch=2, seq_len=SEQ[spec], dtype=torch.float32)


def plan_of(case: Case) -> ParallelPlan:
    return uniform_plan(len(graph_of(case.model).layers), global_batch=GLOBAL_BATCH,
                        precision=Precision.FP32, **case.plan)


@functools.lru_cache(maxsize=None)
def batches_of(spec: str, kind: str) -> list:
    out = []
    for step in range(STEPS):
        loaded = load_model(spec, micro_batch=GLOBAL_BATCH, seq_len=SEQ[spec], device="cpu",
                            seed=1000 + step)
        target = loaded.target.clone()
        if spec == GPT:  # next-token labels: ignore ~30% of positions, like padding
            drop = torch.rand(target.shape, generator=torch.Generator().manual_seed(step)) < 0.3
            target[drop] = IGNORE_INDEX
        if kind == "ignored" and step == 1:
            target[IGNORED_ROWS] = IGNORE_INDEX
        if kind == "ignored" and step == 2:
            target[:] = IGNORE_INDEX
        out.append((loaded.inputs, target))
    return out


@functools.lru_cache(maxsize=None)
def reference(spec: str, kind: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single-process training on the global batches: losses and final parameters."""
    model, loss_fn = build_model(spec)
    return train_one_device(model, loss_fn, batches_of(spec, kind), OPTIMIZER_KWARGS)


# ----------------------------------------------------------------------------- ranks


def run_cases(rank: int, world_size: int, payload: list[tuple]) -> dict:
    """On every rank: apply and train each entry; rank 0 returns losses and parameters."""
    results = {}
    for name, spec, plan, graph, batches in payload:
        model, loss_fn = build_model(spec)
        pm = apply(model, plan, graph, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                   optimizer_kwargs=OPTIMIZER_KWARGS)
        losses = [pm.train_step(inputs, target) for inputs, target in batches]
        state = full_state_dict(pm)
        results[name] = {"losses": losses, "loss_parallel": pm.loss_parallel,
                         "state": state if rank == 0 else None}
    return results


@functools.lru_cache(maxsize=None)
def results() -> dict:
    payload = [(c.name, c.model, plan_of(c), graph_of(c.model), batches_of(c.model, c.batches))
               for c in CASES]
    return spawn(run_cases, 2, payload, timeout_s=200)[0]


# ----------------------------------------------------------------------------- tests


def test_loss_weight_counts_targets_that_are_not_ignored():
    assert int(loss_weight(torch.tensor([[3, -100, 5], [-100, -100, 0]]))) == 3
    assert int(loss_weight(torch.full((2, 4), IGNORE_INDEX))) == 0
    assert int(loss_weight(torch.zeros(2, 5))) == 10  # regression targets: every element
    assert int(loss_weight(torch.ones(3, dtype=torch.bool))) == 3


def test_bert_labels_count_differently_per_micro_batch():
    """The defect needs micro-batches that count different numbers of targets."""
    _, target = batches_of(BERT, "plain")[0]
    counts = {int(loss_weight(rows)) for rows in target.chunk(4)}
    assert len(counts) > 1, counts


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_weighted_plan_matches_single_device(case: Case):
    got = results()[case.name]
    ref_losses, ref_state = reference(case.model, case.batches)
    if case.model == GPT:
        assert got["loss_parallel"], "the tp=2 head should keep its logits vocab-split"
    if case.batches == "ignored":  # step 2 counts no target: nan, as on one device
        assert math.isnan(ref_losses[2]) and math.isnan(got["losses"][2]), got["losses"]
    torch.testing.assert_close(torch.tensor(got["losses"], dtype=torch.float64),
                               torch.tensor(ref_losses, dtype=torch.float64),
                               rtol=RTOL, atol=0.0, equal_nan=True,
                               msg=lambda m: f"losses: {m}")
    for name, expected in ref_state.items():
        assert name in got["state"], f"{name} missing from the executed model"
        value = got["state"][name]
        assert value.shape == expected.shape, name
        error = value.double() - expected.double()
        bound = RTOL * expected.double().norm() + ATOL
        assert error.norm() <= bound, f"{name}: error norm {error.norm():.2e} > {bound:.2e}"
        assert error.abs().max() <= ATOL, f"{name}: an element is off by {error.abs().max():.2e}"
