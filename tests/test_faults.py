"""Fault recovery under torchrun: a rank dies mid-training, the elastic agent restarts the
job, and it resumes from the last checkpoint with the losses of an uninterrupted run.

examples/train_resumable.py runs on 2 gloo ranks (`torchrun --standalone
--max-restarts 1`), checkpoints every 3 steps, and on the first attempt rank 1 SIGKILLs
itself before step 5. The second attempt must start at step 3 (the newest complete
checkpoint; step 6 was never reached), redo steps 3-4 with exactly the losses of the
first attempt, and every step's loss must equal an uninterrupted single-process run of
the same model on the same batches within 1e-5 (executed plans equal it:
tests/test_exec_plans.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from ir.trace import model_output_tensor
from planner.models import load_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples"))
import train_resumable as script  # noqa: E402

pytestmark = [pytest.mark.multiprocess]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, SAVE_EVERY, KILL_AT = 8, 3, 5
RTOL = 1e-5


def run_in_own_group(cmd: list[str], timeout_s: float = 180,
                     env: dict | None = None) -> subprocess.CompletedProcess:
    """Run torchrun in its own process group; on timeout kill the whole group (agent and
    workers), so a hung rendezvous leaves no stray ranks behind."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun ran past {timeout_s} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def uninterrupted_losses(args) -> list[float]:
    loaded = load_model(args.model, micro_batch=1, seq_len=args.seq_len, device="cpu",
                        seed=script.SEED)
    opt = torch.optim.AdamW(loaded.module.parameters(), **script.OPTIMIZER_KWARGS)
    out = []
    for step in range(args.steps):
        inputs, target = script.global_batch(args.model, args.global_batch, args.seq_len, step)
        opt.zero_grad()
        loss = loaded.loss_fn(model_output_tensor(loaded.module(**inputs)), target)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_killed_rank_resumes_from_last_checkpoint_with_the_same_losses(tmp_path):
    ckpt, losses_file = tmp_path / "ckpt", tmp_path / "losses.jsonl"
    argv = ["--ckpt-dir", str(ckpt), "--steps", str(STEPS), "--save-every", str(SAVE_EVERY),
            "--kill-at-step", str(KILL_AT), "--kill-rank", "1", "--losses-out", str(losses_file)]
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = run_in_own_group([torchrun, "--standalone", "--nproc-per-node", "2",
                             "--max-restarts", "1", "--monitor-interval", "0.2",
                             os.path.join(ROOT, "examples", "train_resumable.py"), *argv])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fault drill, killing myself before step 5" in proc.stdout
    rows = [json.loads(line) for line in losses_file.read_text().splitlines()]
    first = {r["step"]: r["loss"] for r in rows if r["attempt"] == 0}
    second = {r["step"]: r["loss"] for r in rows if r["attempt"] == 1}
    assert sorted(first) == list(range(KILL_AT))  # died before step 5
    assert sorted(second) == list(range(SAVE_EVERY, STEPS))  # resumed at the step-3 checkpoint
    assert "attempt 1: 2 ranks" in proc.stdout and "starting at step 3" in proc.stdout
    for step in range(SAVE_EVERY, KILL_AT):  # redone after recovery: bit for bit
        assert second[step] == first[step], (step, second[step], first[step])
    want = uninterrupted_losses(script.parse_args(argv))
    got = [first.get(s, second.get(s)) for s in range(SAVE_EVERY)] + \
          [second[s] for s in range(SAVE_EVERY, STEPS)]
    for step, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= RTOL * abs(w), (step, g, w)
    assert sorted(os.listdir(ckpt)) == ["step-00000003", "step-00000006"]
