"""Memory under every checkpointing mode against what the executor really holds.

Each case runs real CPU training steps of the executor (one device, fp32 AdamW, every
layer checkpointed in the mode) inside the live-tensor tracker and compares the peak
with `plan_memory`'s prediction (issue 17: within 5% at three shapes). The search case
puts a memory wall between no checkpointing and full recomputation and checks that the
search picks selective checkpointing there, and that the executor then holds what the
search predicted.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cost_models.clusters import get_cluster
from cost_models.memory import plan_memory
from ir.plan import ParallelPlan
from ir.strategy import Checkpoint, LayerStrategy, Precision, Stage
from planner.models import load_layer_graph

MEMORY_TARGET = 0.05  # issue 17: every checkpointing mode within 5% of the tracker

# (model, micro-batch): the review's GPT shape, a wider GPT, a small Llama (GQA, SwiGLU)
SHAPES = [
    ("gpt:layers=2,hidden=128,heads=4,vocab=128,seq=256", 8),
    ("gpt:layers=2,hidden=256,heads=8,vocab=512,seq=128", 4),
    ("llama:layers=2,hidden=128,heads=4,kv_heads=2,ffn=352,vocab=256,seq=128", 4),
]


def _one_device_plan(graph, mode: Checkpoint, batch: int) -> ParallelPlan:
    n = len(graph.layers)
    return ParallelPlan(stages=(Stage(0, n - 1, 1),),
                        layer_strategies=(LayerStrategy(checkpoint=mode),) * n,
                        global_batch=batch, micro_batch=batch, num_microbatches=1,
                        precision=Precision.FP32, optimizer="adamw")


def _predicted_and_measured(spec: str, graph, plan) -> tuple[int, int]:
    from planner.trial.rank import measure_one_process

    stage = plan_memory(graph, plan, get_cluster("local")).stages[0]
    measured = measure_one_process(spec, plan, graph, steps=2).peak_bytes
    return stage.peak_bytes - stage.overhead, measured


@pytest.fixture(scope="module")
def graphs():
    return {spec: load_layer_graph(spec, micro_batch=b, dtype=torch.float32)
            for spec, b in SHAPES}


@pytest.mark.parametrize("mode", list(Checkpoint), ids=str)
@pytest.mark.parametrize("spec, batch", SHAPES, ids=["gpt-h128-s256-b8", "gpt-h256-s128-b4",
                                                      "llama-h128-s128-b4"])
def test_checkpointing_peak_matches_the_executor(graphs, spec, batch, mode):
    graph = graphs[spec]
    predicted, measured = _predicted_and_measured(spec, graph,
                                                  _one_device_plan(graph, mode, batch))
    assert predicted == pytest.approx(measured, rel=MEMORY_TARGET), (mode, predicted, measured)


def test_selective_is_what_the_executor_keeps(graphs):
    """The IR's selective figures are the policy's, not the attention scores: a GPT
    block keeps its linears' matmul outputs (q, k, v and fc1 split by TP, the two
    row-parallel outputs whole), 9 b*s*h tensors, and recomputes the rest."""
    spec, batch = SHAPES[0]
    block = graphs[spec].layer("blocks.0")
    tensor = batch * 256 * 128 * 4  # one b x s x h fp32 tensor
    assert block.selective_kept_tp_sharded_bytes == (3 + 4) * tensor
    assert block.selective_kept_rowwise_bytes == 2 * tensor
    assert block.selective_kept_bytes == 9 * tensor
    # its backward rebuilds at most what the layer saves, plus gradients inside it
    assert block.selective_backward_bytes < block.full_backward_bytes
    assert block.full_backward_bytes > block.saved_activation_bytes - block.input_bytes


def test_search_picks_selective_behind_a_memory_wall(graphs):
    """A budget that all-selective fits and no checkpointing does not: the search picks
    selective checkpointing (cheaper to recompute than full), and the executor holds
    what it predicted."""
    from planner.layer_tables import memory_budget_bytes
    from planner.search import search
    from planner.search_space import SearchOptions

    spec, batch = SHAPES[0]
    graph = graphs[spec]
    cluster = get_cluster("local", gpus_per_node=1)
    peaks = {mode: plan_memory(graph, _one_device_plan(graph, mode, batch), cluster).peak_bytes
             for mode in Checkpoint}
    assert peaks[Checkpoint.FULL] < peaks[Checkpoint.SELECTIVE] < peaks[Checkpoint.NONE]
    options = SearchOptions(precision=Precision.FP32, micro_batch=batch, no_pp=True,
                            no_offload=True)
    # what the search keeps back beyond the runtime overhead (the peaks include that)
    reserve = (cluster.device_memory_bytes - memory_budget_bytes(cluster, options)
               - cluster.runtime_overhead_bytes)
    # room for all-selective and some more, not for the first block left uncheckpointed
    budget = peaks[Checkpoint.SELECTIVE] + reserve + (peaks[Checkpoint.NONE]
                                                      - peaks[Checkpoint.SELECTIVE]) // 2
    result = search(graph, cluster, batch, SearchOptions(
        precision=Precision.FP32, micro_batch=batch, no_pp=True, no_offload=True,
        memory_budget_bytes=budget))
    plan = result.best.plan
    modes = {l.name: s.checkpoint for l, s in zip(graph.layers, plan.layer_strategies)}
    blocks = [name for name in modes if name.startswith("blocks.")]
    # The first block is checkpointed selectively (none fully). The last may stay whole:
    # its kept activations are freed as the backward starts, so leaving it whole adds
    # ~0.2% to the walk's peak (469.2 vs 468.2 MB here), which the exact memory wall
    # (planner: the walk's floor, verified by the walk) now lets the search see.
    assert modes[blocks[0]] is Checkpoint.SELECTIVE, modes
    assert not any(modes[b] is Checkpoint.FULL for b in blocks), modes
    # the wall is real: the same plan with the first block not checkpointed does not fit
    one_none = dataclasses.replace(plan, layer_strategies=tuple(
        dataclasses.replace(s, checkpoint=Checkpoint.NONE) if l.name == blocks[0] else s
        for l, s in zip(graph.layers, plan.layer_strategies)))
    assert plan_memory(graph, one_none, cluster).peak_bytes > budget - reserve
    predicted, measured = _predicted_and_measured(spec, graph, plan)
    assert predicted + cluster.runtime_overhead_bytes <= budget - reserve
    assert predicted == pytest.approx(measured, rel=MEMORY_TARGET), (modes, predicted, measured)
