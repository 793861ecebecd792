"""`full_state_dict` keeps every parameter's dtype: a user's fp64 model gathered and
loaded back round-trips bit-exactly (review of issue 17: it cast every tensor to fp32).

gpt-tiny (zoo, dropout 0) is built in fp64 and applied under several 2-rank plans (TP 2
with its fused qkv split per part, ZeRO-3, PP 2). Right after `apply` the gathered state
must equal the model's own `state_dict()` element for element, in fp64; loading it back
(`load_full_state_dict`) and gathering again must change nothing. A 16-bit ZeRO-1 run's
working copies (bf16 storage of an fp32 or fp64 model: `executors.zero1`) gather in the
model's dtype; a bf16 model's parameters, never cast, as stored. All entries run in ONE spawned 2-rank gloo group.
"""

from __future__ import annotations

import functools

import pytest
import torch

from executors import apply, full_state_dict
from executors.state import load_full_state_dict
from ir.plan import uniform_plan
from ir.strategy import Precision, Schedule
from planner.models import load_layer_graph, load_model

from dist_utils import spawn, zero_dropout

pytestmark = [pytest.mark.multiprocess]

GPT = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=16,dropout=0"
SEQ = 16
GLOBAL_BATCH = 4
SEED = 1234

# name: (model dtype, precision, uniform_plan keywords)
CASES = {
    "fp64-tp2": (torch.float64, Precision.FP32, dict(tp=2, micro_batch=4)),
    "fp64-zero3": (torch.float64, Precision.FP32, dict(dp=2, zero=3, micro_batch=2)),
    "fp64-pp2": (torch.float64, Precision.FP32,
                 dict(pp=2, micro_batch=2, schedule=Schedule.GPIPE)),
    "fp32-zero1-bf16": (torch.float32, Precision.BF16_MIXED,
                        dict(dp=2, zero=1, micro_batch=2)),
    # not cast (already bf16): gathered as stored, bit-exact; an fp64 model's copies: fp64
    "bf16-zero1-bf16": (torch.bfloat16, Precision.BF16_MIXED,
                        dict(dp=2, zero=1, micro_batch=2)),
    "fp64-zero1-bf16": (torch.float64, Precision.BF16_MIXED,
                        dict(dp=2, zero=1, micro_batch=2)),
}


def build(dtype: torch.dtype):
    loaded = load_model(GPT, micro_batch=1, seq_len=SEQ, device="cpu", seed=SEED)
    return zero_dropout(loaded.module).to(dtype), loaded.loss_fn


@functools.lru_cache(maxsize=None)
def graph():
    return load_layer_graph(GPT, micro_batch=2, seq_len=SEQ, dtype=torch.float32)


def run_cases(rank: int, world_size: int, payload: list) -> dict:
    results = {}
    for name, dtype, plan, graph_ in payload:
        model, loss_fn = build(dtype)
        pm = apply(model, plan, graph_, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                   optimizer_kwargs={"lr": 1e-2})
        first = full_state_dict(pm)
        load_full_state_dict(pm, first)
        results[name] = {"first": first, "again": full_state_dict(pm)}
    return results


@functools.lru_cache(maxsize=None)
def results() -> dict:
    payload = [(name, dtype, uniform_plan(len(graph().layers), global_batch=GLOBAL_BATCH,
                                          precision=precision, **kw), graph())
               for name, (dtype, precision, kw) in CASES.items()]
    return spawn(run_cases, 2, payload, timeout_s=200)[0]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(CASES))
def test_full_state_dict_round_trips_the_model_dtype(name: str):
    dtype = CASES[name][0]
    expected = dict(build(dtype)[0].named_parameters(remove_duplicate=False))  # tied: both names
    got = results()[name]
    assert set(got["first"]) == set(expected)
    for key, want in expected.items():
        for label in ("first", "again"):
            value = got[label][key]
            assert value.dtype == dtype, f"{label} {key}: {value.dtype}, the model's {dtype}"
            if CASES[name][1] == Precision.FP32 or dtype == torch.bfloat16:  # no cast at all
                assert torch.equal(value, want.detach()), f"{label} {key} changed"
