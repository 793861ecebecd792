"""examples/train_gpt.py runs as its docstring says: one process, and under torchrun."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.multiprocess]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "train_gpt.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def losses(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"step\s+\d+\s+loss (\d+\.\d+)", output)]


def run(cmd: list[str]) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.timeout(160)
def test_one_process_searches_a_plan_and_learns():
    out = run([sys.executable, SCRIPT, "--steps", "15"])
    assert "1 processes" in out
    values = losses(out)
    assert len(values) >= 3 and values[-1] < values[0] - 0.3, out


@pytest.mark.timeout(160)
def test_torchrun_two_processes_with_a_uniform_tp_plan():
    out = run([TORCHRUN, "--standalone", "--nproc-per-node", "2", SCRIPT, "--steps", "5",
               "--uniform", "--tp", "2", "--sequence-parallel"])
    assert "tp2+sp·dp1" in out and len(losses(out)) == 2, out  # steps 1 and 5 are printed
