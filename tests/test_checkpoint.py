"""Checkpoints: save every K steps, resume under the same plan, a different plan and a
different world size (DCP resharding on load), and refuse partial or corrupted ones.

One uninterrupted single-process run of STEPS AdamW steps is the reference (executed
plans equal it within 1e-5, tests/test_exec_plans.py). The chain of runs is

    4 ranks, TP2 x FSDP2 (ZeRO-3) + SP:  steps 0-2, save at 3   -> A
    4 ranks, the same plan:              resume A, steps 3-5    (same plan)
    2 ranks, DDP + ZeRO-1:               resume A, steps 3-4, save at 5 -> B   (4 -> 2)
    4 ranks, PP2 x ZeRO-2 (1F1B):        resume B, step 5       (2 -> 4, another plan)

and every loss must equal the reference's within RTOL.
"""

from __future__ import annotations

import functools
import json
import os
import shutil

import pytest
import torch

from executors import apply
from executors.checkpoint import (MARKER, check_checkpoint, complete_steps, latest_checkpoint,
                                  save_checkpoint, load_checkpoint, step_dir)
from executors.checkpoint_files import file_digest
from ir.errors import PlannerError
from ir.plan import uniform_plan
from ir.strategy import Precision
from ir.trace import model_output_tensor
from planner.models import load_layer_graph, load_model

from dist_utils import spawn

pytestmark = [pytest.mark.multiprocess]

GPT = "gpt:layers=4,hidden=64,heads=4,vocab=128,seq=32,dropout=0"
SEQ = 32
GLOBAL_BATCH = 8
STEPS = 6
SEED = 1234
RTOL = 1e-5
OPT = {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}  # eps: see tests/test_exec_plans.py

PLANS = {  # name -> uniform_plan kwargs
    "tp2-fsdp2-sp": dict(tp=2, dp=2, zero=3, sequence_parallel=True, micro_batch=4),
    "ddp2-zero1": dict(dp=2, zero=1, micro_batch=4),
    "pp2-zero2": dict(pp=2, dp=2, zero=2, micro_batch=2),
}


@functools.lru_cache(maxsize=None)
def graph():
    return load_layer_graph(GPT, micro_batch=2, seq_len=SEQ, dtype=torch.float32)


def plan_of(name: str):
    return uniform_plan(len(graph().layers), global_batch=GLOBAL_BATCH,
                        precision=Precision.FP32, **PLANS[name])


@functools.lru_cache(maxsize=None)
def batches() -> list:
    return [tuple(load_model(GPT, micro_batch=GLOBAL_BATCH, seq_len=SEQ, device="cpu",
                             seed=1000 + k).__dict__[f] for f in ("inputs", "target"))
            for k in range(STEPS)]


@functools.lru_cache(maxsize=None)
def reference() -> list[float]:
    loaded = load_model(GPT, micro_batch=1, seq_len=SEQ, device="cpu", seed=SEED)
    opt = torch.optim.AdamW(loaded.module.parameters(), **OPT)
    out = []
    for inputs, target in batches():
        opt.zero_grad()
        loss = loaded.loss_fn(model_output_tensor(loaded.module(**inputs)), target)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def build(plan, g):
    loaded = load_model(GPT, micro_batch=1, seq_len=SEQ, device="cpu", seed=SEED)
    return apply(loaded.module, plan, g, loss_fn=loaded.loss_fn, optimizer_kwargs=OPT,
                 example_inputs=loaded.inputs)


def train(pm, data, stop: int) -> list[float]:
    out = []
    while pm.steps < stop:
        out.append(pm.train_step(*data[pm.steps]))
    return out


def worker(rank: int, world: int, p: dict) -> dict:
    result = {}
    pm = build(p["plan"], p["graph"])
    if p.get("resume"):
        result["resumed_at"] = load_checkpoint(pm, latest_checkpoint(p["resume"]))
    result["losses"] = train(pm, p["batches"], p["stop"])
    if p.get("save"):
        save_checkpoint(pm, p["save"])
    if p.get("same_plan_until"):  # resume the checkpoint just written, same plan
        pm2 = build(p["plan"], p["graph"])
        result["same_plan_resumed_at"] = load_checkpoint(pm2, latest_checkpoint(p["save"]))
        result["same_plan_losses"] = train(pm2, p["batches"], p["same_plan_until"])
    return result


def close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= RTOL * abs(w) for g, w in zip(got, want))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """4 ranks, TP x FSDP: steps 0-2, checkpoint A at step 3, then the same-plan resume."""
    root = tmp_path_factory.mktemp("ckpt")
    a = str(root / "a")
    out = spawn(worker, 4, {"plan": plan_of("tp2-fsdp2-sp"), "graph": graph(),
                            "batches": batches(), "stop": 3, "save": a, "same_plan_until": STEPS},
                timeout_s=120)
    return root, a, out


def test_save_is_complete_and_resume_same_plan_gives_identical_losses(first_run):
    root, a, out = first_run
    assert complete_steps(a) == [3]
    assert not [n for n in os.listdir(a) if n.startswith(".tmp")]
    marker = check_checkpoint(step_dir(a, 3))
    assert marker["step"] == 3 and marker["world_size"] == 4
    folder = step_dir(a, 3)
    assert sorted(marker["files"]) == sorted(n for n in os.listdir(folder) if n != MARKER)
    for name, entry in marker["files"].items():  # the digest of every file, as saved
        assert (entry["bytes"], entry["sha256"]) == file_digest(os.path.join(folder, name))
    ref = reference()
    assert close(out[0]["losses"], ref[:3]), (out[0]["losses"], ref[:3])
    for r in out:
        assert r["same_plan_resumed_at"] == 3
        assert close(r["same_plan_losses"], ref[3:]), (r["same_plan_losses"], ref[3:])


def test_replan_on_resume_4_to_2_and_back_to_4(first_run):
    root, a, _ = first_run
    b = str(root / "b")
    two = spawn(worker, 2, {"plan": plan_of("ddp2-zero1"), "graph": graph(),
                            "batches": batches(), "resume": a, "stop": 5, "save": b},
                timeout_s=120)
    ref = reference()
    for r in two:
        assert r["resumed_at"] == 3
        assert close(r["losses"], ref[3:5]), (r["losses"], ref[3:5])
    four = spawn(worker, 4, {"plan": plan_of("pp2-zero2"), "graph": graph(),
                             "batches": batches(), "resume": b, "stop": STEPS}, timeout_s=120)
    for r in four:
        assert r["resumed_at"] == 5
        assert close(r["losses"], ref[5:]), (r["losses"], ref[5:])


def _copy(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def test_interrupted_save_is_never_the_latest(first_run, tmp_path):
    root, a, _ = first_run
    d = tmp_path / "run"
    _copy(step_dir(a, 3), d / "step-00000003")
    _copy(step_dir(a, 3), d / ".tmp-step-00000006")  # a save killed before its rename
    partial = _copy(step_dir(a, 3), d / "step-00000009")
    os.unlink(os.path.join(partial, MARKER))  # renamed by hand, never completed
    assert latest_checkpoint(str(d)) == step_dir(str(d), 3)


def test_partial_checkpoint_is_a_clear_error(first_run, tmp_path):
    _, a, _ = first_run
    partial = _copy(step_dir(a, 3), tmp_path / "step-00000003")
    os.unlink(os.path.join(partial, MARKER))
    with pytest.raises(PlannerError, match=r"is partial \(no COMPLETE.json: its save was "
                                           r"interrupted\)"):
        check_checkpoint(partial)


def test_truncated_checkpoint_file_is_a_clear_error(first_run, tmp_path):
    _, a, _ = first_run
    bad = _copy(step_dir(a, 3), tmp_path / "step-00000003")
    data = sorted(n for n in os.listdir(bad) if n.endswith(".distcp"))[0]
    with open(os.path.join(bad, data), "r+b") as fh:
        fh.truncate(10)
    with pytest.raises(PlannerError, match=rf"is corrupted \(file {data} has 10 bytes"):
        check_checkpoint(bad)


def test_corrupted_marker_is_a_clear_error(first_run, tmp_path):
    _, a, _ = first_run
    bad = _copy(step_dir(a, 3), tmp_path / "step-00000003")
    with open(os.path.join(bad, MARKER), "w") as fh:
        fh.write('{"schema": "planner.checkpoint/v1", "st')
    with pytest.raises(PlannerError, match="is corrupted .COMPLETE.json is not valid JSON"):
        check_checkpoint(bad)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(PlannerError, match="does not exist"):
        check_checkpoint(str(tmp_path / "nope"))
    assert latest_checkpoint(str(tmp_path / "nope")) is None
    json.dumps(PLANS)  # plans table stays plain data
