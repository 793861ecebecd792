"""Rank walks kept by content (`cost_models.walk_cache`) give what walking again gives.

Equal ranks are walked once, whichever rank index they carry; a walk stopped early
(`stop_above_bytes`) answers a later lower limit at once and a higher one by walking
again; and a whole search (a bench/bench_search.py --quick case) finds exactly what it
finds when every rank is walked.
tests/test_search_pinned.py pins the headline searches' figures.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from cost_models import walk_cache
from cost_models.activations import LayerActivations
from cost_models.memory_walk import ChunkMemory, LayerMemory, OverLimit, walk_rank
from cost_models.model_states import ModelStates
from cost_models.pipeline_ops import rank_ops
from ir.strategy import Schedule

SETTINGS = dict(num_microbatches=4, pipelined=True, overhead_bytes=1000, optimizer="adamw",
                implementation="foreach")


def _chunks(kept_bytes: float) -> list[ChunkMemory]:
    acts = LayerActivations(kept_bytes=kept_bytes, recompute_bytes=300.0, grad_flow_bytes=80.0)
    layer = LayerMemory(states=ModelStates(params=100.0, grads=100.0, optimizer=400.0),
                        activations=acts, gather_unit_bytes=0.0, unsharded_grad_bytes=0.0,
                        step_tensor_params=(25.0,), fp32_moment_bytes=200.0)
    return [ChunkMemory((layer, layer), held_output_bytes=50.0, persistent_bytes=70.0)]


@pytest.fixture
def walks(monkeypatch):
    """Counts the walks `walk_cache` makes."""
    count = []
    live = walk_cache.walk_rank_live

    def counted(*args, **kwargs):
        count.append(kwargs["stage"])
        return live(*args, **kwargs)

    monkeypatch.setattr(walk_cache, "walk_rank_live", counted)
    return count


def test_equal_ranks_are_walked_once(walks):
    ops = tuple(rank_ops(Schedule.ONE_F_ONE_B, 2, 1, 4))
    cache: dict = {}
    for stage in (0, 3, 0):
        got = walk_cache.walk_rank_once(cache, _chunks(1e4), ops, stage=stage, **SETTINGS)
        assert got == walk_rank(_chunks(1e4), ops, stage=stage, **SETTINGS)
    assert walks == [0]  # the second and third from the cache, relabelled
    other = walk_cache.walk_rank_once(cache, _chunks(2e4), ops, stage=0, **SETTINGS)
    assert other == walk_rank(_chunks(2e4), ops, stage=0, **SETTINGS)
    assert other.peak_bytes > walk_rank(_chunks(1e4), ops, stage=0, **SETTINGS).peak_bytes
    other_ops = tuple(rank_ops(Schedule.ONE_F_ONE_B, 2, 0, 4))  # passes told apart
    assert walk_cache.walk_rank_once(cache, _chunks(1e4), other_ops, stage=0, **SETTINGS) == \
        walk_rank(_chunks(1e4), other_ops, stage=0, **SETTINGS)
    assert walks == [0, 0, 0]


def test_a_stopped_walk_answers_lower_limits_and_is_walked_again_for_higher(walks):
    ops = tuple(rank_ops(Schedule.ONE_F_ONE_B, 2, 0, 4))
    peak = walk_rank(_chunks(1e4), ops, stage=0, **SETTINGS).peak_bytes
    cache: dict = {}
    for stop in (peak // 2, peak // 4, peak - 10, peak + 10, peak - 10, math.inf):
        try:
            expected = walk_rank(_chunks(1e4), ops, stage=0, stop_above_bytes=stop, **SETTINGS)
        except OverLimit:
            expected = None
        try:
            got = walk_cache.walk_rank_once(cache, _chunks(1e4), ops, stage=0,
                                            stop_above_bytes=stop, **SETTINGS)
        except OverLimit:
            got = None
        assert got == expected, stop
    # walked: peak / 2 (stopped), peak / 4 answered, peak - 10 walked again (stopped
    # later), peak + 10 walked whole; the rest from the whole walk
    assert len(walks) == 3


def test_a_search_finds_what_it_finds_walking_every_rank(monkeypatch):
    """llama3-70b on 8 x 8 H100 (a headline case): its baselines' least-memory pass
    stops walks early; the other quick cases were compared the same way once (the
    commit that brought the cache)."""
    from cost_models import memory
    from cost_models.clusters import get_cluster
    from planner.models import load_layer_graph
    from planner.search import search

    graph = load_layer_graph("llama3-70b", 1, None, torch.bfloat16)
    spec = get_cluster("h100-80g", nodes=8)

    def outputs():
        result = search(graph, spec, 512)
        stats = dataclasses.replace(result.stats, search_seconds=0.0)
        # every candidate's plan, objective and whole estimate; the baselines; the counters
        return [repr(result.best), *map(repr, result.candidates),
                *map(repr, result.baselines), repr(stats)]

    kept = outputs()
    walked = walk_cache.walk_rank_once
    monkeypatch.setattr(memory, "walk_rank_once",
                        lambda cache, *args, **kwargs: walked(None, *args, **kwargs))
    assert outputs() == kept
