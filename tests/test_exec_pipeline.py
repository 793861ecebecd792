"""Pipelines of real models equal single-device training, step by step (gloo, 2 and 4 ranks).

Every stage module is the whole model with the other stages' layers stood in for
(`executors.pipeline`), so Hugging Face decoder-only (Llama, GPT-2 with its tied
embedding and LM head on different stages, Mixtral MoE), encoder-only (BERT),
encoder-decoder (T5, BART) models and a plain user model run unchanged. Like
`test_exec_plans`: all entries of one world size run in ONE spawned process group; each
trains STEPS AdamW steps on the global batches of a single-process reference and must
match its losses and final parameters (fp32, rtol 1e-5).
"""

from __future__ import annotations

import functools
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ir.layer import LayerGraph
from ir.measure import build_layer_graph
from ir.plan import ParallelPlan, uniform_plan
from ir.strategy import Checkpoint, Precision, Schedule
from planner.models import load_model

from dist_utils import spawn, train_one_device, zero_dropout
from test_exec_plans import (Case, assert_matches_reference, assert_params_match,
                             optimizer_kwargs, run_cases)

pytestmark = [pytest.mark.multiprocess]

GPT = "gpt:layers=4,hidden=64,heads=4,vocab=128,seq=32,dropout=0"  # gpt-tiny, dropout 0
USER = "user"  # `UserNet` below: a plain nn.Module, not from any zoo or library
SEQ = 32
GLOBAL_BATCH = 8
STEPS = 3
SEED = 1234
USER_VOCAB, USER_HIDDEN, USER_DEPTH = 64, 32, 4  # small: the test is about the cut


def hf(arch: str) -> str:
    return f"hf:tests/data/hf/{arch}/config.json"


# ----------------------------------------------------------------------------- models


class UserNet(nn.Module):
    """An ordinary forward with glue between its layers: a scaled embedding, a position
    signal that is not batched (one row for all samples), residual blocks in a loop."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(USER_VOCAB, USER_HIDDEN)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(USER_HIDDEN), nn.Linear(USER_HIDDEN, USER_HIDDEN),
                          nn.GELU()) for _ in range(USER_DEPTH))
        self.head = nn.Linear(USER_HIDDEN, USER_VOCAB)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) * 2.0 + positions[:, :, None]  # (B, T, H) + (1, T, 1)
        for block in self.blocks:
            x = x + block(x)
        return self.head(torch.tanh(x))  # (B, T, V)


class TransposedBlock(nn.Module):
    """Reads its input transposed and returns a transpose (T == H: same shape): its output
    is not contiguous, and neither is its input's gradient."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(USER_HIDDEN, USER_HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x.transpose(1, 2))).transpose(1, 2)


class TransposedNet(nn.Module):
    """Layers that hand on transposes: gloo sends only contiguous tensors, so a stage
    boundary here must be made contiguous both ways (Whisper's encoder hands one on)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(USER_VOCAB, USER_HIDDEN)
        self.blocks = nn.ModuleList(TransposedBlock() for _ in range(USER_DEPTH))
        self.head = nn.Linear(USER_HIDDEN, USER_VOCAB)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + positions[:, :, None]  # (B, T, H)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


USER_MODELS = {"user": UserNet, "user-transposed": TransposedNet}
TRANSPOSED = "user-transposed"


def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def user_batch(rows: int, seed: int) -> tuple[dict, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, USER_VOCAB, (rows, SEQ), generator=g)
    positions = torch.linspace(-1.0, 1.0, SEQ).view(1, SEQ)
    return {"tokens": tokens, "positions": positions}, torch.randint(0, USER_VOCAB, (rows, SEQ),
                                                                      generator=g)




def build_model(spec: str):
    if spec in USER_MODELS:
        torch.manual_seed(SEED)
        return USER_MODELS[spec](), token_loss
    loaded = load_model(spec, micro_batch=1, seq_len=SEQ, device="cpu", seed=SEED)
    return zero_dropout(loaded.module), loaded.loss_fn


@functools.lru_cache(maxsize=None)
def graph_of(spec: str) -> LayerGraph:
    if spec in USER_MODELS:
        inputs, target = user_batch(2, 0)
        return build_layer_graph(USER_MODELS[spec](), inputs, target, token_loss, name=spec,
                                 dtype=torch.float32)
    loaded = load_model(spec, micro_batch=2, seq_len=SEQ, device="meta")
    return build_layer_graph(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                             name=loaded.name, dtype=torch.float32, seq_len=SEQ)


@functools.lru_cache(maxsize=None)
def batches_of(spec: str) -> list:
    if spec in USER_MODELS:
        return [user_batch(GLOBAL_BATCH, 1000 + step) for step in range(STEPS)]
    return [(lambda l: (l.inputs, l.target))(load_model(spec, micro_batch=GLOBAL_BATCH,
                                                        seq_len=SEQ, device="cpu",
                                                        seed=1000 + step))
            for step in range(STEPS)]


@functools.lru_cache(maxsize=None)
def reference(spec: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    model, loss_fn = build_model(spec)
    return train_one_device(model, loss_fn, batches_of(spec), optimizer_kwargs())


# ----------------------------------------------------------------------------- plans


def pipeline(boundary: int | None = None, **kw) -> Callable[[LayerGraph], ParallelPlan]:
    """pp=2 (unless kw says otherwise), fp32; `boundary`: the second stage's first layer."""
    kw.setdefault("pp", 2)

    def make(graph: LayerGraph) -> ParallelPlan:
        bounds = None if boundary is None else (boundary,)
        return uniform_plan(len(graph.layers), global_batch=GLOBAL_BATCH,
                            precision=Precision.FP32, stage_boundaries=bounds, **kw)
    return make


G, ONE, I = Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED
# a tied copy on another stage (name in the run -> the reference's name): it must end
# equal to the shared weight, as the tied-gradient sum keeps the copies equal
TIED_COPIES = {hf("gpt2"): {"lm_head.weight": "transformer.wte.weight"}}
CASES = [
    Case("zoo-gpt", 2, GPT, pipeline(micro_batch=2, schedule=G)),
    Case("llama", 2, hf("llama"), pipeline(micro_batch=2, schedule=ONE)),
    Case("gpt2-tied", 2, hf("gpt2"), pipeline(micro_batch=2, schedule=G)),  # wte | lm_head
    Case("bert", 2, hf("bert"), pipeline(micro_batch=2, schedule=ONE)),
    Case("t5", 2, hf("t5"), pipeline(micro_batch=2, schedule=G)),
    Case("bart", 2, hf("bart"), pipeline(boundary=5, micro_batch=2, schedule=ONE)),
    Case("mixtral", 2, hf("mixtral"), pipeline(micro_batch=2, schedule=G)),
    Case("user-factory", 2, USER, pipeline(boundary=1, micro_batch=2, schedule=ONE)),
    Case("user-transposed", 2, TRANSPOSED, pipeline(boundary=3, micro_batch=2, schedule=ONE)),
    Case("llama-dp-pp-interleaved", 4, hf("llama"),
         pipeline(dp=2, virtual_stages=2, zero=3, micro_batch=1, schedule=I)),
    Case("llama-tp-sp-pp-ckpt", 4, hf("llama"),
         pipeline(tp=2, sequence_parallel=True, checkpoint=Checkpoint.FULL, micro_batch=2)),
]


# ----------------------------------------------------------------------------- ranks


@functools.lru_cache(maxsize=None)
def results_for(world: int) -> dict:
    cases = [c for c in CASES if c.world == world]
    payload = [(c.name, c.model, c.plan(graph_of(c.model)), graph_of(c.model),
                batches_of(c.model), build_model) for c in cases]
    return spawn(run_cases, world, payload, timeout_s=240)[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=[f"{c.world}r-{c.name}" for c in CASES])
def test_pipeline_matches_single_device(case: Case):
    got = results_for(case.world)[case.name]
    ref_losses, ref_state = reference(case.model)
    assert_matches_reference(got, ref_losses, ref_state)
    for name, shared in TIED_COPIES.get(case.model, {}).items():
        assert_params_match(name, got["state"][name], ref_state[shared])
