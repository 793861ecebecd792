"""The classic uniform baselines a searched plan is ranked against: DDP, ZeRO-3 (FSDP)
and the best Megatron TP x PP x DP grid point, each the best uniform plan of its family
within the user's pins, or, where none fits, the least memory that family needs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from cost_models.common import model_layer_configs
from cost_models.memory import plan_peak_bytes
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.plan import ParallelPlan
from ir.strategy import Checkpoint
from planner.layer_tables import price_layers
from planner.search import Candidate, make_plan, search
from planner.search_space import SearchOptions, outer_candidates
from planner.uniform import even_chunks, uniform_groups

BASELINES = {
    "DDP": dict(tp=1, pp=1, zero=0, no_checkpoint=True),
    "ZeRO-3 (FSDP)": dict(tp=1, pp=1, zero=3),
    "Megatron TPxPPxDP": dict(zero=0),
}


@dataclass(frozen=True)
class Baseline:
    name: str
    candidate: Candidate | None
    needs_bytes: int | None  # least peak memory of this family when nothing fits
    excluded_by: str | None = None  # the user's pin this family contradicts
    reason: str | None = None  # why the family has no legal configuration at all


def baselines(graph: LayerGraph, cluster: ClusterSpec, global_batch: int,
              options: SearchOptions, profile=None,
              row_cache: dict | None = None, model=None) -> list[Baseline]:
    """The best uniform plan of each classic family (within the user's pins), or what it
    would need. `row_cache`: the priced (layer, strategy) rows of a search with the same
    graph, cluster, batch, profile and `model` (`layer_tables.price_layers`), shared;
    `model`: the module the executor gets (`planner.search.search`)."""
    out = []
    for name, pins in BASELINES.items():
        # unset is None (or False for a flag); a pin of 0 is a pin (`0 in (None, False)`
        # is true: --zero 0 once let the ZeRO-3 baseline in, outside the user's space)
        clash = [k for k, v in pins.items()
                 if (value := getattr(options, k)) is not None and value is not False
                 and value != v]
        if pins.get("no_checkpoint") and options.checkpoint not in (None, Checkpoint.NONE):
            clash.append("checkpoint")  # DDP runs without checkpointing
        if clash:
            out.append(Baseline(name, None, None, excluded_by=f"--{clash[0].replace('_', '-')}"))
            continue
        base = dataclasses.replace(options, uniform=True, top_k=1, time_limit_s=None, **pins)
        tables: dict = {} if row_cache is None else {"rows": row_cache}
        # priced once for the family's search and its least memory
        try:
            result = search(graph, cluster, global_batch, base, profile, with_baselines=False,
                            price_cache=tables, model=model)
        except PlannerError as exc:
            out.append(Baseline(name, None, None, reason=str(exc)))
            continue
        needs = None if result.best else least_memory(graph, cluster, global_batch, base,
                                                      profile, tables, model)[0]
        out.append(Baseline(name, result.best, needs))
    return out


def least_memory(graph: LayerGraph, cluster: ClusterSpec, global_batch: int,
                 options: SearchOptions, profile=None, price_cache: dict | None = None,
                 model=None) -> tuple[int | None, ParallelPlan | None]:
    """Peak bytes of the most memory-frugal uniform plan the options allow (`price_cache`:
    the layer tables of a search with the same inputs), priced as the executor runs
    `model` (`cost_models.common.model_layer_configs`)."""
    price_cache = {} if price_cache is None else price_cache
    layer_cache: dict = {}  # the walks' per-layer figures (`memory.plan_peak_bytes`)
    best: tuple[int | None, ParallelPlan | None] = (None, None)
    for cand in outer_candidates(graph, cluster.world_size, global_batch, options):
        tables, _ = price_layers(graph, cluster, cand, options, global_batch, profile,
                                 price_cache, model=model)
        if any(not t.strategies for t in tables):
            continue
        # per layer: the strategy with the least state + kept bytes that the others share
        # the likely-frugal groups first, so the walks of the rest stop early
        for group in sorted(uniform_groups(graph, tables), key=_layer_bytes):
            strategies = [g.strategies[0] for g in group]
            stages = even_chunks(graph, group, cand.pp * cand.virtual_stages)
            if stages is None:
                continue
            try:
                plan = make_plan(cand, stages, strategies, cluster.world_size // cand.pp,
                                 global_batch, options)
            except PlannerError:
                continue
            # A plan that cannot beat the best so far is walked only until that is sure.
            peak = plan_peak_bytes(graph, plan, cluster,
                                   math.inf if best[0] is None else best[0], layer_cache,
                                   model_layer_configs(graph, plan, cluster.device, model))
            if peak is not None and (best[0] is None or peak < best[0]):
                best = (peak, plan)
    return best


def _layer_bytes(group) -> float:
    """States plus kept activations of a uniform group's layers, summed: an ordering key."""
    return sum(float(t.state_bytes[0] + t.kept_bytes[0]) for t in group)
