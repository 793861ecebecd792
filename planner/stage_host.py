"""The step's host terms a stage adds to the search's T_r, priced by the functions the
estimate prices them with (`cost_models.estimate.stage_time`), so a CPU candidate is
pruned or kept on the score the estimate will give it:

    h(a, b, r) = engine starts + pipelining actions + the stage input's
                 accumulations, per micro-batch (`step_host.step_host_per_microbatch_s`)
               + the tied copies' gradient sums on rank r, once a step, / m
                     (`tied_sync.tied_group_seconds`, holders grouped by RANK as
                     `executors.tied.TiedGradients.sync` sums them)
               + the loop's own work and the optimizer's entry on rank r, once a step,
                 / m (`step_host.step_loop_s`; the loss's on the last stage's rank)
               + the stage's gradient accumulation, micro-batches 2..m, / m
                     (`step_host.grad_accumulation_s`)
               + the stage's placed layers (its first and last, and interior ones whose
                 recent-ops window a cut clips: `step_host.place_rank`, cold ops counted
                 against what rank r ran before them, forwards apart by whether a backward
                 ran just before) as placed less as traced: the layer tables
                 price `graph.layers` where they sit in the model
                     (`step_host.placed_compute` - `compute.layer_compute`)

so T_r = T*(a, b, r) + p2p(a, b) + h(a, b, r) (`planner.search`'s recurrence). The placed
change depends on the placed layers' strategies (a checkpointed one's recompute reruns the
forward's host): `stage_s` is h without it, and the stage program adds it per strategy
(`StageHost.delta_s`, `stage_program.StageSolver.placed`), at the strategy chosen.

The tied sum is priced on the full gradient (the path `tied_local_fraction` gives whenever a copy
sits on another rank or in another layout); a rank holding every copy in one layout sums
local shards, less, which no per-layer term can see: `tied_variants` solves the candidate
once more per such layout, the holders kept to it and h pricing the share.

On GPU presets every term is 0 (no kit figure): `stage_host` returns None and the search
runs as before (tests/test_search_pinned.py).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable

from cost_models.host_dispatch import backward_host_seconds, forward_host_seconds
from cost_models.step_host import (Placed, accumulation_priced, engine_start_s,
                                   grad_accumulation_s, input_accumulation_s,
                                   passes_per_stage,
                                   pipeline_action_s, place_rank, placed_compute,
                                   param_walk_s, prices_cold_ops,
                                   step_host_per_microbatch_s, step_loop_s)
from cost_models.tied_memory import (TieGroup, gradient_layout, shared_layout_fraction,
                                     tie_groups)
from cost_models.tied_sync import rank_tied_sums_s, tied_grad_bytes, tied_sums_priced
from ir.cluster import ClusterSpec
from ir.layer import LayerGraph
from ir.strategy import Precision
from planner.layer_tables import restrict
from planner.search_space import OuterCandidate

# price(j, s, placed): seconds of layer j's forward + backward + recompute for one
# micro-batch under strategy s, its passes as `placed` (`step_host.placed_compute`)
Price = Callable[[int, object, Placed], float]


class StageHost:
    """h(a, b, r) of one outer candidate (module docstring); `floor_s`, no stage's less."""

    def __init__(self, graph: LayerGraph, cluster: ClusterSpec, cand: OuterCandidate,
                 price: Price, grad_bytes: Callable[[int, str], float],
                 optimizer: str = "adamw", clip_ranks: int = 0):
        self.graph, self.cluster, self.cand = graph, cluster, cand
        self.optimizer = optimizer  # the plan's (`step_loop_s` prices its entry)
        self.clip_ranks = clip_ranks  # a clipping plan's world size (`step_loop_s`), else 0
        self.price, self.grad_bytes = price, grad_bytes
        self.cold = prices_cold_ops(cluster)
        self.tied = tied_sums_priced(cluster)
        self.pieces: dict[tuple[int, int], int] = {}  # interleaved: (a, b) -> plan stage
        # tie group -> the share of the gradient its sum takes where its holders all sit
        # on the rank (`tied_variants`: their tables restricted to one gradient layout)
        self.shared: dict[TieGroup, float] = {}
        self._cache: dict[tuple, float] = {}
        self._deltas: dict[tuple, float] = {}
        self._ranks: dict[int, dict[int, Placed]] = {}
        self.floor_s = self._floor()

    def with_pieces(self, pieces: list[tuple[int, int]]) -> StageHost:
        """Interleaved: the fixed chunks (stage i = pieces[i] on rank i mod p)."""
        self.pieces = {piece: i for i, piece in enumerate(pieces)}
        self._cache.clear()
        self._ranks.clear()
        return self

    def stage_s(self, a: int, b: int, r: int) -> float:
        """h(a, b, r) less the placed change (`edges`, `delta_s`): seconds per micro-batch
        stage a..b adds on rank r."""
        key = (a, b, r)
        out = self._cache.get(key)
        if out is None:
            out = self._cache[key] = self._stage_s(a, b, r)
        return out

    def _stage_s(self, a: int, b: int, r: int) -> float:
        c, m, p, v = self.cand, self.cand.num_microbatches, self.cand.pp, self.cand.virtual_stages
        stage = self.pieces[(a, b)] if v > 1 else r
        engine, actions, inputs = step_host_per_microbatch_s(self.cluster, c.schedule, p, m, v,
                                                             (stage,))
        # micro-batches 2..m add into the gradients (as the estimate's backward)
        out = engine + actions + inputs + grad_accumulation_s(self.cluster,
                                                              self.graph.layers[a:b + 1], m)
        once = v == 1 or stage == max(self._rank_stages(r))  # a rank's once-a-step terms
        # once a step: the loop walks the stage's parameter tensors (as the estimate's
        # step: the loop probe's own taken off once a rank)
        out += param_walk_s(self.cluster, self.graph.layers[a:b + 1], less_probe=once) / m
        if once:  # the last plan stage, p v - 1, runs on rank p - 1 (it holds the loss)
            out += step_loop_s(self.cluster, m, r == p - 1, self.optimizer,
                               self.clip_ranks) / m
        if self.tied and once:
            spans = [(a, b)] if v == 1 else [s for s, i in self.pieces.items() if i % p == r]
            out += self._tied_s(spans) / m
        return out

    def _rank_stages(self, r: int) -> list[int]:
        return [i for i in self.pieces.values() if i % self.cand.pp == r]

    def _placed(self, a: int, b: int, r: int) -> dict[int, Placed]:
        c = self.cand
        if c.virtual_stages == 1:  # the rank runs this stage alone
            return place_rank(self.graph.layers, {r: (a, b)}, c.schedule, c.pp, r,
                              c.num_microbatches, 1)
        if r not in self._ranks:
            spans = {i: piece for piece, i in self.pieces.items() if i % c.pp == r}
            self._ranks[r] = place_rank(self.graph.layers, spans, c.schedule, c.pp, r,
                                        c.num_microbatches, c.virtual_stages)
        return self._ranks[r]

    def edges(self, a: int, b: int, r: int) -> dict[int, tuple]:
        """Stage a..b's layers on rank r whose passes as placed differ from their
        trace's (its edge layers, and those whose recent ops' window reaches past a cut:
        `step_host.place_rank`): j -> (passes key, placed). Empty where cold ops are not
        priced."""
        key = ("edges", a, b, r)
        out = self._cache.get(key)
        if out is None:
            out = self._cache[key] = {}
            if self.cold:
                placed = self._placed(a, b, r)
                for j in sorted(j for j in placed if a <= j <= b):
                    passes = _passes_key(placed[j])
                    if passes != _passes_key(((1.0, self.graph.layers[j]),)):
                        out[j] = (passes, placed[j])
        return out

    def delta_s(self, j: int, strategy, placed: Placed) -> float:
        """Layer j under `strategy` as placed less as traced (what its table priced)."""
        key = (j, strategy, _passes_key(placed))
        out = self._deltas.get(key)
        if out is None:
            traced = ((1.0, self.graph.layers[j]),)
            out = self._deltas[key] = (self.price(j, strategy, placed)
                                       - self.price(j, strategy, traced))
        return out

    def _tied_s(self, spans: list[tuple[int, int]]) -> float:
        """Sync's sums on a rank holding layers `spans` (`tied_sync.rank_tied_sums_s`, as
        the estimate's `tied_sum_seconds`), each group's share `shared` where all its
        holders are here."""
        held = {j for a, b in spans for j in range(a, b + 1)}
        return rank_tied_sums_s(self.graph, self.cluster, held, lambda g: self.grad_bytes(
            g.copy, g.name) * (self.shared.get(g, 1.0) if held.issuperset(g.holders) else 1.0))

    def with_shared(self, shared: dict[TieGroup, float]) -> StageHost:
        """This h with tie groups' sums at `shared` shares where all holders are on a rank
        (`tied_variants`); its own caches."""
        out = copy.copy(self)
        out.shared, out._cache, out._ranks = dict(shared), {}, {}
        return out

    def _floor(self) -> float:
        """A lower bound on h: the least engine starts and actions of any stage, the sums
        >= 0, and the placed change at least each layer's traced cold terms taken away
        (its count 0, whichever entry is cheaper; `host_dispatch`, the host seconds
        `layer_compute` reads), once for a stage's first layer's forward and once for its
        last layer's backward, stretched as `compute.with_host` stretches host time, and
        twice for a recompute that reruns the forward's host."""
        c = self.cand
        m, p, v = c.num_microbatches, c.pp, c.virtual_stages
        least_s = min(sum(step_host_per_microbatch_s(self.cluster, c.schedule, p, m, v, (i,)))
                      for i in passes_per_stage(c.schedule, p, m, v))
        if not self.cold:
            return least_s
        worst_f = worst_b = 0.0
        for layer in self.graph.layers:
            traced_f = forward_host_seconds(layer, self.cluster)
            least_f = min(forward_host_seconds(dataclasses.replace(
                layer, cold_distinct_ops_fwd=0, forward_after_backward=after), self.cluster)
                for after in (False, True))
            traced_b = backward_host_seconds(layer, self.cluster)
            least_b = backward_host_seconds(dataclasses.replace(
                layer, cold_distinct_ops_bwd=0, cold_inner_ops_bwd=0), self.cluster)
            worst_f, worst_b = max(worst_f, traced_f - least_f), max(worst_b, traced_b - least_b)
        return least_s - (worst_f + worst_b) * 2 * max(1.0, self.cluster.host_share)


def tied_variants(graph: LayerGraph, tables: list, host: StageHost | None,
                  precision: Precision) -> list[tuple[list, StageHost | None]]:
    """(tables, h) to solve a candidate with: as given (each tied sum on the full
    gradient, what any plan pays at most), then, per tie group and per gradient layout L
    (`tied_memory.gradient_layout`) under which the sum takes a share f < 1 of it
    (`shared_layout_fraction`, read off the copy's strategy), the holders' tables kept to
    L (and the copy's to f) with h pricing the sum at f where every holder sits on one
    rank: the estimate's `tied_local_fraction`, which reads every holder's strategy and
    so no per-layer term can price. The least of the variants' optima is the optimum."""
    out = [(tables, host)]
    if host is None or not host.tied:
        return out
    for group in tie_groups(graph):
        holders, first = group.holders, group.copy
        keys = {(gradient_layout(s), f) for s in tables[first].strategies
                if (f := shared_layout_fraction(graph, first, s, precision, group.name)) < 1.0}
        for layout, f in sorted(keys):
            kept, ok = list(tables), True
            for j in holders:
                narrowed = restrict([tables[j]], lambda s, j=j: gradient_layout(s) == layout and (
                    j != first or shared_layout_fraction(graph, j, s, precision,
                                                         group.name) == f))
                if narrowed is None:
                    ok = False
                    break
                kept[j] = narrowed[0]
            if ok:
                out.append((kept, host.with_shared({**host.shared, group: f})))
    return out


def host_terms_priced(cluster: ClusterSpec, clip_ranks: int = 0) -> bool:
    """Whether any term of h is non-zero on `cluster` (CPU kits; on a GPU preset only a
    clipping plan's norm all-reduce over `clip_ranks`, `step_host.step_loop_s`)."""
    return (engine_start_s(cluster) > 0 or pipeline_action_s(cluster) > 0
            or input_accumulation_s(cluster) > 0
            or accumulation_priced(cluster)
            or step_loop_s(cluster, 1, True, "adam", clip_ranks) > 0
            or tied_sums_priced(cluster)
            or prices_cold_ops(cluster))


def bound_shift_s(cand: OuterCandidate, floor_s: float) -> float:
    """What h >= floor_s adds at least to the search's objective: sum T + (m-1) max T
    grows by p + m - 1 floors; interleaved's m max T + (sum T - max T)/v, each rank v
    chunks, by m v + p - 1 (both objectives grow with every T_r)."""
    p, m, v = cand.pp, cand.num_microbatches, cand.virtual_stages
    if floor_s == 0.0 or math.isinf(floor_s):
        return 0.0
    return (m * v + p - 1 if v > 1 else p + m - 1) * floor_s


def stage_host(graph: LayerGraph, cluster: ClusterSpec, cand: OuterCandidate, tables: list,
               options, global_batch: int, profile, model,
               cache: dict | None = None) -> StageHost | None:
    """The candidate's h, a layer's placed change priced per strategy under the config
    its row was priced with (`layer_tables.row_config`); None where nothing of h is
    priced (`host_terms_priced`: GPU presets without clipping). `cache`: prices by (layer,
    strategy, micro-batch, passes), shared by a search's candidates (`price_layers`' row
    cache serves one graph, cluster, batch, precision, optimizer, profile and model)."""
    # the clip's all-reduce spans the plan's ranks: the search's plans span the cluster
    # (`make_plan` at cluster.world_size // pp per stage), the estimate's plan.world_size
    clip_ranks = cluster.world_size if options.clip_grad_norm else 0
    if not host_terms_priced(cluster, clip_ranks):
        return None
    from planner.layer_tables import row_config

    samples = global_batch // cand.num_microbatches
    cache = {} if cache is None else cache

    def config(j: int, s):
        return row_config(graph, graph.layers[j], s, cluster, options, samples // s.dp, model)

    def price(j: int, s, placed: Placed) -> float:
        key = (j, s, samples // s.dp, _passes_key(placed))
        out = cache.get(key)
        if out is None:
            out = cache[key] = placed_compute(placed, s, cluster, config(j, s), profile).total_s
        return out

    # the tied copies' gradient bytes do not depend on the micro-batch: any strategy's
    # config prices them
    first = [t.strategies[0] for t in tables]
    return StageHost(graph, cluster, cand, price, lambda j, name: tied_grad_bytes(
        graph.layers[j], config(j, first[j]), name=name), options.optimizer, clip_ranks)


def _passes_key(placed: Placed) -> tuple:
    """What of a placed layer's passes its price reads beyond the layer's structure."""
    return tuple((share, l.forward_after_backward, l.same_code_before, l.cold_distinct_ops_fwd,
                  l.cold_distinct_ops_bwd, l.cold_inner_ops_bwd, l.recent_ops_fwd,
                  l.recent_ops_bwd) for share, l in placed)
