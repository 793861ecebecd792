"""Checkpointed ZeRO-2 on 4 gloo ranks: every rank's peak, every step, is the prediction.

Issue 17: llama-tiny under ZeRO-2 x 4 with full checkpointing read 1.4-8.9% above the
prediction on some ranks of some runs and exactly on it otherwise. The live-tensor
timelines of a high and a low rank differ by one storage: the full-size clone that gloo's
reduce-scatter makes of a unit's gradients (ProcessGroupGloo clones the input and
all-reduces the clone on a worker thread), alive from one unit's reduction into the next
unit's backward when the worker thread dropped its last reference late. The executor now
reduces in FSDP2's own buffer (`ir.gloo_collectives.GlooReduceScatter`).

The test makes the worker thread's late release frequent without touching what it
measures: each rank runs on one core (its gloo worker threads, made later with the
data-parallel group, inherit that) with a long GIL switch interval. With the old
reduce-scatter it failed 4 times in 4 (some rank one clone, 172,544 B, +8.7% above the
prediction); with the new one it passed 7 times in 7. Each rank measures MEMORY_STEPS
steps after a warm-up (`planner.trial.rank.run_rank`, the yardstick `planner validate`
uses) in each of ROUNDS groups; every peak must be within 5% of the plan's prediction,
and all within MAX_SPREAD of each other (the ranks run the same shapes).
"""

from __future__ import annotations

import os
import sys

import pytest

from ir.plan import load_plan, plan_to_json
from planner.cli import main
from planner.trial.predict import plan_graph, predict
from planner.trial.reference import global_batches
from tests.dist_utils import spawn

MEMORY_TARGET = 0.05  # issue 17: every rank within 5%
RANKS = 4
ROUNDS = 2  # process groups started; each rank measures MEMORY_STEPS steps in each
MEMORY_STEPS = 6
# Seconds between forced GIL hand-offs (Python's default is 0.005): a waiting gloo worker
# thread gets the GIL only when the training thread blocks, as on a loaded machine.
SWITCH_INTERVAL_S = 1.0
MODEL = "llama-tiny"
# Largest relative spread of the peaks over ranks and rounds: the clone was 8.9% of a
# peak; 1% leaves room for a stray small buffer and none for a unit's gradients.
MAX_SPREAD = 0.01


def _rank(rank: int, world_size: int, payload) -> int:
    from planner.trial.rank import run_rank

    os.sched_setaffinity(0, {rank % os.cpu_count()})  # this thread and those it starts
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return run_rank(payload).peak_bytes


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("zero2") / "plan.json"
    assert main(["plan", MODEL, "--cluster", "local", "--gpus-per-node", str(RANKS),
                 "--global-batch", "8", "--uniform", "--dp", str(RANKS), "--zero", "2",
                 "--checkpoint", "full", "--out", str(path)]) == 0
    return str(path)


@pytest.mark.multiprocess
def test_checkpointed_zero2_peaks_are_the_prediction_on_every_rank_and_step(plan_path):
    from planner.trial.records import RankPayload

    doc = load_plan(plan_path)
    graph = plan_graph(doc, plan_path)
    predicted = predict(doc, graph, None).peak_bytes_by_rank
    steps = 1 + MEMORY_STEPS + 3  # warm-up, measured, run_rank's untimed and timed steps
    payload = RankPayload(plan_json=plan_to_json(doc), plan_path=plan_path, model=MODEL,
                          seq_len=doc.seq_len, graph=graph,
                          batches=global_batches(MODEL, doc.plan.global_batch, doc.seq_len,
                                                 steps),
                          memory_steps=MEMORY_STEPS, steps=1, backend="gloo",
                          check_steps=0, threads=1)
    peaks = [spawn(_rank, RANKS, payload, timeout_s=300) for _ in range(ROUNDS)]
    for round_peaks in peaks:
        for rank, measured in enumerate(round_peaks):
            error = (predicted[rank] - measured) / measured
            assert abs(error) <= MEMORY_TARGET, (rank, measured, predicted[rank], peaks)
    every = [p for round_peaks in peaks for p in round_peaks]
    assert (max(every) - min(every)) / min(every) <= MAX_SPREAD, peaks
