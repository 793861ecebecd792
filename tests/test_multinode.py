"""Several nodes: two torchrun launchers on this machine stand in for two nodes.

Each launcher runs `torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d`, as a
user runs one per node; the searched plan (TP 2 pinned) must keep its TP groups inside a
node, and the losses must equal one process training the same global batches.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.dist_utils import free_port
from tests.test_exec_example import ROOT, SCRIPT, TORCHRUN, losses, run

pytestmark = [pytest.mark.multiprocess]

STEPS = 3
LOSS_RTOL = 1e-5  # fp32 on gloo: only the reduction order differs from one process
MODEL = "gpt:layers=4,hidden=64,heads=4,vocab=128,seq=32,dropout=0"  # gpt-tiny, no dropout


@pytest.mark.timeout(300)
def test_two_node_torchrun_keeps_tp_in_a_node_and_equals_one_process():
    port = free_port()
    launcher = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"two-nodes-{port}",
                SCRIPT, "--steps", str(STEPS), "--log-every", "1", "--tp", "2", "--model", MODEL]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(launcher, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
             for _ in range(2)]
    outputs = []
    try:
        for node in nodes:
            out, err = node.communicate(timeout=240)
            assert node.returncode == 0, out[-2000:] + err[-4000:]
            outputs.append(out)
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, 9)
    out = next(o for o in outputs if "node of each rank" in o)  # rank 0's launcher
    assert "4 processes" in out and "tp2" in out, out
    assert "node of each rank: [0, 0, 1, 1]" in out, out  # torchrun orders ranks by node
    assert "TP groups inside one node: yes" in out, out

    reference = losses(run([sys.executable, SCRIPT, "--model", MODEL, "--steps", str(STEPS),
                            "--log-every", "1", "--uniform"]))
    got = losses(out)
    assert len(got) == len(reference) == STEPS, (got, reference)
    for step, (a, b) in enumerate(zip(got, reference), start=1):
        assert abs(a - b) <= LOSS_RTOL * abs(b), f"step {step}: {a} vs one process {b}"
