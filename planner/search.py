"""Search per-layer strategies and pipeline stages: Galvatron's dynamic program, exact.

For one outer candidate (p pipeline ranks of D = world/p devices, a schedule, m
micro-batches; `search_space.outer_candidates`) we solve

    minimise    Pipe(T_0, ..., T_{p-1})
    over        contiguous stages (cut only at the IR's cut points) and a strategy s_i
                per layer (`search_space.layer_strategies`)
    subject to  sum_{i in stage r} mem_r(i, s_i) <= U_r    and   transient(i, s_i) <= cap

where, per layer and micro-batch (priced once per unique layer by
`layer_tables.price_layers`):
    t(i, s)      compute forward + backward + recompute (cost_models.compute), TP
                 collectives and exposed ZeRO traffic (cost_models.comm), plus the
                 exposed per-iteration gradient sync, optimizer step and, on GPUs, the
                 gradients' accumulation (cost_models.grad_accumulation) divided by m
    mem_r(i, s)  1F1B and GPipe: the walk's floor (`cost_models.walk_floor`): stored
                 weights and moments, unsharded working copies, gradients where a
                 forward follows a backward, + k_r x kept activations, k_r the
                 micro-batches in flight on rank r (cost_models.pipeline), so the
                 constraint admits every plan the walk fits (transient: none, cap 0;
                 U_r also less the rank's pipeline buffers,
                 `stage_program.StageSolver.units_within`).
                 Interleaved: params + grads + optimizer states + held DP units + k_r x
                 kept activations
    x(j, a, b)   forward + backward re-layout between layers j and j+1 when their
                 (TP, SP) layouts a, b differ, at layer j's own micro-batch
                 (cost_models.estimate.relayout_s, in
                 `layer_tables.transitions`); infinite where the executor cannot re-split layer
                 j+1's input (`ir.legality.layout_change_problem`)
    transient    one layer's recompute working set, gradient flow, ZeRO-3 gathered units
                 and unsharded gradients: the max-type buffers of cost_models.memory,
                 bounded by cap (a few caps are tried, `layer_tables.transient_caps`)
    U_r          `layer_tables.memory_budget_bytes` (device memory - runtime overhead -
                 DP buckets) - cap, in buckets (rounded down per layer for the floor)
and T_r = sum of t and x over the stage + its edges' p2p sends at the layouts the cut
layers take (`layer_tables.sends`) + h(a, b, r), the step's host terms the estimate adds per
stage on CPU processes (`planner.stage_host`: engine starts, pipelining actions, tied
gradient sums, the stage's edge layers' cold ops as placed; 0 on GPUs).
Pipe is 1F1B's sum_r T_r + (m-1) max_r T_r (cost_models.pipeline.pipeline_time).

Inner recurrence, one stage, memory in buckets (`stage_program._extend`):
    C[i][c][u] = min over s with layout(s) = c of
                 min_{c'} ( C[i-1][c'][u - mem(i, s)] + x(i-1, c', c) ) + t(i, s)
    C[first][c][u] = min { t(first, s) : layout(s) = c, mem(first, s) <= u }
so C[i][c][u] is the least time of the stage's first layers up to i, ending in layout c,
within u buckets. T*(a, b, r) = min_c C[b][c][U_r] + send(b, c), per send (the next
stage pays it back: `stage_program.StageSolver.sent`).

Outer recurrence, the stage partition (`partition.partition`), exact:
    F[r][b, v] = Pareto set over (sum, max) of F[r-1][a-1, v'] (+) (T*(a, b, r) + v'),
                 T* with send v, a-1 a cut point (entries `pareto.FrontEntry`, kept by
                 `pareto.pareto_front`)
    answer  = min over F[p-1][L-1, 0] of  sum + (m-1) max.

A stage's table is cached by the run of (structural hash, boundary bytes) it covers
(`stage_program.StageSolver`): 96 identical blocks cost one table per length. Interleaved
1F1B (v chunks per rank) uses stages of equal compute with the inner program per chunk
(`planner.interleaved`). Layers that must share one TP degree (`ir.legality.linked_runs`) and
that a stage boundary may split are solved once per degree (`_pipeline_tp_groups`): the
outer program carries no layout across stages, only the send a stage leaves.

Every memory figure (the rows, the walk, the estimate) is priced for the executor's path
of the model `search` is given (`cost_models.common.model_layer_configs`: a model built
on meta runs the lean host path on a CPU cluster, `ir.lean_host`).
The full memory model (`cost_models.memory.plan_memory`) checks each optimum; where it
does not fit, the candidate is solved again with a lower budget (`_solve_fitting`). Under
the floor a first optimum that fits is the best plan the budget admits.
On CPU kits that price the tied copies' sum, a candidate is solved once more per
gradient layout that lets it sum local shards (`stage_host.tied_variants`).
Every candidate's optimum, with the next partitions of its final front (FRONT_PLANS: the
estimate's 1F1B form is not a function of sum T and max T), is then priced by the full
model (`cost_models.estimate`), which decides; the uniform baselines
(`planner.baselines`) are priced the same way, so the chosen plan is never worse than any
uniform plan in the space.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from torch import nn

from cost_models.common import model_layer_configs
from cost_models.host_dispatch import host_position_key
from cost_models.compute_profile import ComputeProfile
from cost_models.estimate import Estimate, estimate
from cost_models.memory import plan_memory
from cost_models.pipeline import microbatches_in_flight
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.legality import input_readers, linked_runs
from ir.plan import ParallelPlan
from ir.strategy import Stage
from planner.layer_tables import (LayerTable, buffers_floor, crossing_bytes,
                                  memory_budget_bytes, price_layers, restrict, sends,
                                  transient_caps, transitions)
from planner.lower_bound import LOWER_BOUND_SLACK, _lower_bound, bound_budget_bytes
from planner.interleaved import interleaved
from planner.partition import partition
from planner.point_floor import next_point, point_floor_bytes, point_tables
from planner.search_space import OuterCandidate, SearchOptions, outer_candidates
from planner.search_scope import search_scope
from planner.search_stats import SearchStats
from planner.stage_host import StageHost, bound_shift_s, stage_host, tied_variants
from planner.stage_program import StageSolver, walk_back
from planner.uniform import uniform_groups

INF = math.inf


@dataclass(frozen=True)
class Candidate:
    """The optimum of one outer candidate: a plan, its DP objective and its estimate."""

    outer: OuterCandidate
    plan: ParallelPlan
    objective_s: float
    estimate: Estimate


@dataclass
class SearchResult:
    best: Candidate | None
    candidates: list[Candidate]  # feasible ones, best first
    stats: SearchStats = field(default_factory=SearchStats)
    baselines: list = field(default_factory=list)  # Baseline per classic uniform family


# ------------------------------------------------------------------ one candidate


def _pipeline_tp_groups(graph: LayerGraph, cand: OuterCandidate,
                        tables: list[LayerTable]) -> list[list[LayerTable]] | None:
    """Tables per TP degree when layers must share one TP degree beyond their neighbours:
    the first layer and the layers that may read the model's inputs
    (`ir.legality.input_readers`), and, with a pipeline, linked runs a stage boundary may
    split (`ir.legality.linked_runs`; the stage program sees no layout across stages).
    Such a candidate is solved once per degree. None: no need."""
    readers = input_readers(graph)
    # the model's inputs arrive split as a stage's first layer: their readers share its TP
    pinned = {0, *readers} if readers else set()
    if cand.pp > 1:
        cuts = graph.cut_points
        pinned |= {i for a, b in linked_runs(graph) if any(a <= c < b for c in cuts)
                   for i in range(a, b + 1)}
        if readers:
            pinned |= {c + 1 for c in cuts}  # any cut may start a stage whose readers follow
    if not pinned:
        return None
    out = []
    for tp in sorted({s.tp for i in pinned for s in tables[i].strategies}):
        done: dict[int, LayerTable | None] = {}
        group = []
        for i, t in enumerate(tables):
            if i not in pinned:
                group.append(t)
                continue
            if id(t) not in done:
                done[id(t)] = restrict([t], lambda s, tp=tp: s.tp == tp)
            if done[id(t)] is None:
                break
            group.append(done[id(t)][0])
        else:
            out.append(group)
    return out


# Partitions of the final (sum, max) front kept per outer candidate for the estimate to
# rank (`partition.partition`): the objective's sum T + (m-1) max T is not the estimate's
# pipeline form (on 2 CPU processes, tiny GPT pp 2, 1F1B, m 2: the estimate's best cut is
# the objective's 2nd of 4, 6.94 ms against the objective's best's 7.52 ms,
# tests/test_search.py's CPU oracle). 4: each is one estimate call more per priced candidate.
FRONT_PLANS = 4

# Re-solves of one candidate with a lowered budget when the full memory model rejects the
# DP's plan (each round lowers it by the excess it saw).
FIT_ROUNDS = 4
# Rounds more for a candidate without a pipeline, before any lowered budget: solves at
# the floors of a backward (`planner.point_floor`), and of one in twice the buckets where
# the program's rounding down alone admitted the plan, while layers x buckets stays
# within POINT_BUCKET_CELLS (a solve costs about that: 3 layers reach 8192 buckets from
# 32, 99 layers 256 from 128).
POINT_ROUNDS = 12
POINT_BUCKET_CELLS = 2 ** 15
# Each layer rounds down by up to a bucket, so the finest solve admits plans over the
# budget by up to layers^2 / POINT_BUCKET_CELLS of it: the rounds run where that is at
# most this share (36 layers: llama3-8b's 35 on 2 A100-40G need them). Beyond, they find
# plans the walk rejects again (gpt3-175b without a pipeline, 99 layers; 2026-11-25).
POINT_SLACK_SHARE = 1 / 24


def _solve_fitting(graph, cluster, cand, tables, layouts, options, global_batch, trans_cache,
                   stats, incumbent, memory_cache: dict, model=None, host=None):
    """`_solve`, then the full memory model on its plan: it fits when its walk leaves the
    DP-bucket reserve free (`layer_tables.memory_budget_bytes`); else solve again with the
    budget lowered by the excess, at most FIT_ROUNDS times, and never return it. 1F1B and
    GPipe add up the walk's floors (`cost_models.walk_floor`), which admit every plan that
    fits: the first round's plan, where it fits, is the candidate's best, and where the
    first round finds none, none fits. Without a pipeline the walk often peaks in backward:
    a plan the forward's floor admits but the walk rejects is solved again at a floor of
    that backward which rejects it (`planner.point_floor`), as exact; only where none
    does is the budget lowered, which may pass a fitting plan over. Interleaved
    schedules add up the program's sums.
    The walk prices the executor's path for `model` (`common.model_layer_configs`)."""
    budget = memory_budget_bytes(cluster, options)
    limit = budget + cluster.runtime_overhead_bytes
    floor = cand.virtual_stages == 1
    # without a pipeline: the floors at a backward first (`planner.point_floor`)
    points = POINT_ROUNDS if floor and cand.pp == 1 and (
        len(tables) ** 2 <= POINT_BUCKET_CELLS * POINT_SLACK_SHARE) else 0
    shrink, solved, solve_options, tried, j, shrinks = 0.0, tables, options, set(), None, 0
    for round_ in range(points + FIT_ROUNDS):
        result = _solve(graph, cluster, cand, solved, layouts, solve_options, global_batch,
                        trans_cache, stats, incumbent, shrink, host, floor)
        if result is None:
            return None
        memory = plan_memory(graph, result[1], cluster, model_layer_configs(
            graph, result[1], cluster.device, model), memory_cache)
        if memory.fits and memory.peak_bytes <= limit:
            return result
        stats.refits += 1
        if round_ + 1 < points:
            strategies = list(result[1].layer_strategies)
            finer = 2 * solve_options.memory_buckets * len(tables) <= POINT_BUCKET_CELLS
            if finer and j is not None and point_floor_bytes(tables, strategies, j) > budget:
                # admitted by rounding each layer down: the same floor in finer buckets
                solve_options = dataclasses.replace(
                    solve_options, memory_buckets=2 * solve_options.memory_buckets)
                continue
            j = next_point(tables, strategies, budget, tried)
            if j is not None:  # a floor that rejects this plan and admits every one that fits
                tried.add(j)
                solved = point_tables(tables, j)
                continue
            points = 0
        # none: lower the forward's floor's budget by the excess (may pass one over)
        if shrinks == FIT_ROUNDS:  # counted apart: point rounds cut short leave theirs
            return None
        solved, solve_options, shrinks = tables, options, shrinks + 1
        shrink += max(memory.peak_bytes - limit, 1)  # 1: the host wall's, not the device's
    return None


def _solve(graph, cluster, cand: OuterCandidate, tables, layouts, options: SearchOptions,
           global_batch: int, trans_cache: dict, stats: SearchStats, incumbent: float = INF,
           shrink_bytes: float = 0.0, host: StageHost | None = None, floor: bool = False):
    """Best (objective, plan, others) of one outer candidate over the transient caps, or
    None; `others`: the next (objective, plan) of the best cap's final partition front
    (`partition.partition`, FRONT_PLANS in all), for the estimate to rank. `shrink_bytes`
    lowers the memory budget (see `_solve_fitting`); `host`: the step's host terms per
    stage (`planner.stage_host`; None where none is priced)."""
    world = cluster.world_size
    stage_devices = world // cand.pp
    samples = global_batch // cand.num_microbatches
    budget = memory_budget_bytes(cluster, options) - shrink_bytes
    crossing = crossing_bytes(graph, trans_cache)
    x = transitions(graph, cluster, options, layouts, samples, stage_devices, trans_cache,
                    crossing)
    send = sends(graph, cluster, options, layouts, samples, stage_devices, trans_cache,
                 crossing)
    def host_s(a: int, b: int, r: int) -> float:  # T_r's host terms (`planner.stage_host`)
        return host.stage_s(a, b, r) if host else 0.0
    floor_s = host.floor_s if host else 0.0
    places = [host_position_key(layer, cluster) for layer in graph.layers]
    units = options.memory_buckets
    buffers = buffers_floor(graph, cluster, options, cand, layouts, global_batch,
                            trans_cache) if floor else None
    best = None
    for cap in transient_caps(tables, options.transient_levels, floor):
        usable = budget - cap
        if usable <= 0:
            continue
        v = cand.virtual_stages
        made: list[StageSolver] = []
        steps: dict = {}  # the solvers of this cap (one per first-layer TP degree) share it

        def make_solver(stage_tables: list[LayerTable]) -> StageSolver:
            made.append(StageSolver(graph, stage_tables, x, len(layouts), units,
                                    usable / units / v, cap, crossing, steps, places, floor,
                                    buffers, host))
            return made[-1]

        if v > 1:
            found = interleaved(graph, tables, make_solver, cand, send, host_s, host)
            found = [found] if found else None
        else:
            solver = make_solver(tables)
            ks = [microbatches_in_flight(cand.schedule, cand.pp, r, cand.num_microbatches)
                  for r in range(cand.pp)]
            bar = incumbent if best is None else min(incumbent, best[0])
            found = partition(graph, solver, cand, ks, send, host_s, bar, floor_s,
                              FRONT_PLANS)
            if found:
                found = [(objective, [(a, b, c, ks[r], r, solver)
                                      for r, (a, b, c) in enumerate(ranges)])
                         for objective, ranges in found]
        stats.dp_extensions += sum(s.extensions for s in made)
        if not found or (best is not None and found[0][0] >= best[0]):
            continue
        plans = []
        for objective, ranges in found:
            strategies = []
            for a, b, c, k, r, solver in ranges:
                strategies += walk_back(solver.placed(a, b, k, r), tables, a, b, c,
                                        solver.units_within(a, b))
            plans.append((objective, make_plan(cand, [(a, b) for a, b, *_ in ranges],
                                               strategies, stage_devices, global_batch,
                                               options)))
        best = (*plans[0], plans[1:])
    return best


def make_plan(cand: OuterCandidate, ranges: list[tuple[int, int]], strategies: list,
              stage_devices: int, global_batch: int, options: SearchOptions) -> ParallelPlan:
    """The ParallelPlan of per-layer strategies over stage layer ranges."""
    max_dp = max(s.dp for s in strategies)
    return ParallelPlan(
        stages=tuple(Stage(a, b, stage_devices) for a, b in ranges),
        layer_strategies=tuple(strategies), global_batch=global_batch,
        micro_batch=global_batch // (cand.num_microbatches * max_dp),
        num_microbatches=cand.num_microbatches, schedule=cand.schedule,
        precision=options.precision, optimizer=options.optimizer,
        optimizer_impl=options.optimizer_impl, virtual_stages=cand.virtual_stages,
        clip_grad_norm=options.clip_grad_norm)


# ------------------------------------------------------------------------ search

def search(graph: LayerGraph, cluster: ClusterSpec, global_batch: int,
           options: SearchOptions = SearchOptions(), profile: ComputeProfile | None = None,
           with_baselines: bool = True, price_cache: dict | None = None,
           model: nn.Module | None = None) -> SearchResult:
    """The fastest plans that fit, best first (see the module docstring). Unless the
    search is uniform itself, the classic uniform baselines join the final ranking.
    `price_cache` shares layer tables with a later call for the same inputs.

    `model`: the module the executor will get. Its build decides the executor's path and
    so the memory every check prices (`cost_models.common.model_layer_configs`): a model
    built on meta on a CPU cluster runs the lean host path (`ir.lean_host`); None, or any
    other, FSDP2's own.

    CPU offload costs PCIe and host time, so it enters only when the memory wall requires
    it: the space without offload first, and the space with it only if nothing fits.

    It runs in a `planner.search_scope.search_scope`: Python's cyclic garbage collector
    paused (some 10^6 small acyclic objects; issue 19), per-layer figures memoised."""
    with search_scope():
        return _search_offload_last(graph, cluster, global_batch, options, profile,
                                    with_baselines, price_cache, model)


def _search_offload_last(graph, cluster, global_batch, options, profile, with_baselines,
                         price_cache, model) -> SearchResult:
    if options.no_offload or not cluster.offload_known:
        return _search(graph, cluster, global_batch, options, profile, with_baselines,
                       price_cache, model)
    # `price_cache` serves the caller's options only: the pass without offload gets its own
    result = _search(graph, cluster, global_batch,
                     dataclasses.replace(options, no_offload=True), profile, with_baselines, {},
                     model)
    if result.best is not None:
        return result
    return _search(graph, cluster, global_batch, options, profile, with_baselines, price_cache,
                   model)


def _search(graph: LayerGraph, cluster: ClusterSpec, global_batch: int,
            options: SearchOptions, profile: ComputeProfile | None,
            with_baselines: bool, price_cache: dict | None, model: nn.Module | None
            ) -> SearchResult:
    if global_batch < 1:
        raise PlannerError(f"--global-batch must be >= 1, got {global_batch}")
    start = time.perf_counter()
    world = cluster.world_size
    if options.max_tp is None and options.tp is None:
        # TP across nodes is never worth its all-reduces on these links (Narayanan et al.
        # 2021, sec. 3.3); --max-tp lifts the limit.
        options = dataclasses.replace(options, max_tp=cluster.devices_per_node)
    outers = outer_candidates(graph, world, global_batch, options)
    price_cache = {} if price_cache is None else price_cache
    trans_cache: dict = {}
    memory_cache: dict = {}  # rank walks by what they read (cost_models.memory.plan_memory)
    stats = SearchStats(outer_candidates=len(outers))
    found = []
    others: dict[ParallelPlan, list] = {}  # a candidate's best plan -> its front's next
    priced = []
    budget_of: dict[OuterCandidate, float] = {}
    for cand in outers:
        tables, layouts = price_layers(graph, cluster, cand, options, global_batch, profile,
                                       price_cache, model=model)
        if any(not t.strategies for t in tables):
            continue  # some layer has no legal strategy here (e.g. dp does not divide)
        budget = budget_of[cand] = bound_budget_bytes(
            cand, tables, memory_budget_bytes(cluster, options),
            buffers_floor(graph, cluster, options, cand, layouts, global_batch, trans_cache))
        host = stage_host(graph, cluster, cand, tables, options, global_batch, profile, model,
                          price_cache["rows"].setdefault("stage-host", {}))
        shift = bound_shift_s(cand, host.floor_s) if host else 0.0
        priced.append((_lower_bound(cand, tables, budget) + shift, cand, tables, layouts,
                       host, shift))
    # Single-stage candidates first (cheap, often good): an early incumbent prunes more.
    if not priced:
        tp = options.tp or options.max_tp or 1
        pp = options.pp or 1
        raise PlannerError(
            f"no legal configuration: global batch {global_batch} does not split into "
            f"micro-batches over the data-parallel replicas ({world} devices / tp {tp} / pp "
            f"{pp} = dp {max(1, world // (tp * pp))}); use a global batch that is a multiple "
            "of the data-parallel degree, or allow more tensor/pipeline parallelism")
    priced.sort(key=lambda item: (item[1].pp > 1, item[0]))  # the bound, then the rest
    keep_best = max(options.top_k, 1)
    for bound, cand, tables, layouts, host, shift in priced:
        if options.time_limit_s is not None and time.perf_counter() - start > options.time_limit_s:
            stats.timed_out = True
            break
        objectives = sorted(f[0] for f in found)
        if bound == INF or (len(objectives) >= keep_best
                            and bound >= objectives[keep_best - 1] * LOWER_BOUND_SLACK):
            stats.outer_pruned += 1
            continue  # cannot fit, or cannot beat the plans already found
        stats.outer_searched += 1
        stats.strategies_per_layer_max = max(stats.strategies_per_layer_max,
                                             max(len(t.strategies) for t in tables))
        if options.uniform:
            groups = uniform_groups(graph, tables, trans_cache)
            # Each uniform strategy is its own small problem: bound it too, best first.
            groups = sorted(((_lower_bound(cand, g, budget_of[cand]) + shift, g)
                             for g in groups), key=lambda item: item[0])
        elif (per_degree := _pipeline_tp_groups(graph, cand, tables)) is not None:
            groups = sorted(((_lower_bound(cand, g, budget_of[cand]) + shift, g)
                             for g in per_degree), key=lambda item: item[0])
        else:
            groups = [(bound, tables)]
        for group_bound, group in groups:
            objectives = sorted(f[0] for f in found)
            if group_bound == INF or (len(objectives) >= keep_best and
                                      group_bound >= objectives[keep_best - 1] * LOWER_BOUND_SLACK):
                continue
            # the tied sums on local shards, priced per gradient layout (`tied_variants`):
            # one group's variants are one problem, so only their least joins `found`
            best = None
            for variant, variant_host in tied_variants(graph, group, host, options.precision):
                objectives = sorted(f[0] for f in found)
                incumbent = objectives[keep_best - 1] if len(objectives) >= keep_best else INF
                result = _solve_fitting(graph, cluster, cand, variant, layouts, options,
                                        global_batch, trans_cache, stats,
                                        incumbent * LOWER_BOUND_SLACK, memory_cache, model,
                                        variant_host)
                if result is not None and (best is None or result[0] < best[0]):
                    best = result
            if best is not None:
                found.append((best[0], cand, best[1]))
                others[best[1]] = [(objective, cand, plan) for objective, plan in best[2]]
    found.sort(key=lambda f: f[0])
    candidates, seen = [], set()

    def price(objective, cand, plan) -> bool:
        """Whether the plan, new, fits: then it joins `candidates`."""
        if plan in seen:
            return False
        seen.add(plan)
        est = estimate(graph, plan, cluster, profile, memory_cache,
                       model_layer_configs(graph, plan, cluster.device, model))
        fits = est.memory.fits and (options.memory_budget_bytes is None
                                    or est.memory.peak_bytes <= options.memory_budget_bytes)
        if fits:
            candidates.append(Candidate(cand, plan, objective, est))
        return fits

    bests = 0
    for objective, cand, plan in found:
        if price(objective, cand, plan):
            bests += 1
            # the partitions the estimate may rank above the DP's best (FRONT_PLANS)
            for other in others.get(plan, ()):
                price(*other)
        if bests >= max(options.top_k, 1) + 7:
            break  # priced enough of the DP's best to re-rank by the full model
    base = []
    if with_baselines and not options.uniform:
        from planner.baselines import baselines  # they search too: imported at call time

        base = baselines(graph, cluster, global_batch, options, profile,
                         price_cache.setdefault("rows", {}), model)
        candidates += [b.candidate for b in base
                       if b.candidate is not None and b.candidate.plan not in seen]
    candidates.sort(key=lambda c: c.estimate.iteration_seconds)
    stats.search_seconds = time.perf_counter() - start
    stats.feasible_candidates = len(found)
    return SearchResult(candidates[0] if candidates else None, candidates, stats, base)
