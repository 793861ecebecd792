"""Search per-layer strategies and pipeline stages: Galvatron's dynamic program, exact.

For one outer candidate (p pipeline ranks of D = world/p devices, a schedule, m
micro-batches; `search_space.outer_candidates`) we solve

    minimise    Pipe(T_0, ..., T_{p-1})
    over        contiguous stages (cut only at the IR's cut points) and a strategy s_i
                per layer (`search_space.layer_strategies`)
    subject to  sum_{i in stage r} mem_r(i, s_i) <= U_r    and   transient(i, s_i) <= cap

where, per layer and micro-batch (priced once per unique layer by `_price`):
    t(i, s)      compute forward + backward + recompute (cost_models.compute), TP
                 collectives and exposed ZeRO traffic (cost_models.comm), plus the
                 exposed per-iteration gradient sync and optimizer step divided by m
    mem_r(i, s)  params + grads + optimizer states + k_r x kept activations, k_r the
                 micro-batches in flight on rank r (cost_models.pipeline)
    x(j, a, b)   forward + backward re-layout between layers j and j+1 when their
                 (TP, SP) layouts a, b differ (cost_models.comm.tp_transition_s, in
                 `_transitions`); infinite where the executor cannot re-split layer
                 j+1's input (`ir.legality.layout_change_problem`)
    transient    one layer's recompute working set, gradient flow, ZeRO-3 gathered units
                 and unsharded gradients: the max-type buffers of cost_models.memory,
                 bounded by cap (a few caps are tried, `_transient_caps`)
    U_r          (device memory - runtime overhead - DP buckets - cap) in buckets
and T_r = sum of t and x over the stage + the p2p sends at its edges (`_stage_edges_s`).
Pipe is 1F1B's sum_r T_r + (m-1) max_r T_r (cost_models.pipeline.pipeline_time).

Inner recurrence, one stage, memory in buckets (`_extend`):
    C[i][c][u] = min over s with layout(s) = c of
                 min_{c'} ( C[i-1][c'][u - mem(i, s)] + x(i-1, c', c) ) + t(i, s)
    C[first][c][u] = min { t(first, s) : layout(s) = c, mem(first, s) <= u }
so C[i][c][u] is the least time of the stage's first layers up to i, ending in layout c,
within u buckets. T*(a, b, r) = min_c C[b][c][U_r] + p2p.

Outer recurrence, the stage partition (`_partition`), exact:
    F[r][b] = Pareto set over (sum, max) of F[r-1][a-1] (+) T*(a, b, r),  a-1 a cut point
    answer  = min over F[p-1][L-1] of  sum + (m-1) max.

A stage's table is cached by the run of (structural hash, boundary bytes) it covers, so
96 identical blocks cost one table per length, not one per position. Interleaved 1F1B
(v chunks per rank) uses stages of equal compute with the inner program per chunk
(`_interleaved`). Layers that must share one TP degree (`ir.legality.linked_runs`) and
that a stage boundary may split are solved once per degree (`_pipeline_tp_groups`): the
outer program does not carry layouts across stages.

Every candidate's optimum is then priced by the full model (`cost_models.estimate`),
which decides; the uniform baselines (`planner.baselines`) are priced the same way, so
the chosen plan is never worse than any uniform plan in the space.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from cost_models.comm import layer_comm, p2p_s, tp_transition_s
from cost_models.common import StepConfig
from cost_models.compute import ComputeProfile, layer_compute
from cost_models.estimate import Estimate, estimate, exposed, overlap_efficiency
from cost_models.memory import (DP_BUCKET_BYTES, DP_BUCKETS_IN_FLIGHT, ZERO3_UNITS_IN_FLIGHT,
                                held_through_step, layer_memory, plan_memory)
from cost_models.model_states import bytes_per_param
from cost_models.pipeline import microbatches_in_flight
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.layer import LayerGraph
from ir.legality import linked_runs
from ir.plan import ParallelPlan
from ir.strategy import Schedule, Stage
from planner.search_space import (OuterCandidate, SearchOptions, layer_strategies,
                                  model_tp_degrees, outer_candidates)

INF = math.inf


@dataclass
class LayerTable:
    """One layer's legal strategies under one outer candidate, priced (arrays over s)."""

    strategies: list
    time_s: np.ndarray  # per micro-batch, see t(i, s)
    state_bytes: np.ndarray  # params + grads + optimizer states
    kept_bytes: np.ndarray  # activations kept per micro-batch
    transient_bytes: np.ndarray
    layout: np.ndarray  # index into the candidate's layouts (tp, sp)


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
    stats: dict = field(default_factory=dict)
    baselines: list = field(default_factory=list)  # Baseline per classic uniform family


# ----------------------------------------------------------------- pricing a layer


def _price(graph: LayerGraph, cluster: ClusterSpec, cand: OuterCandidate, options: SearchOptions,
           global_batch: int, profile, cache: dict, prune: bool = True,
           ) -> tuple[list[LayerTable], list[tuple]]:
    """Price every layer's strategies; identical layers share one table. `prune=False`
    keeps dominated strategies (for the brute-force oracle in the tests)."""
    if not cluster.offload_known:  # no PCIe / host memory figures: offload is not offered
        options = dataclasses.replace(options, no_offload=True)
    stage_devices = cluster.world_size // cand.pp
    samples = global_batch // cand.num_microbatches
    per_param = bytes_per_param(options.precision, options.optimizer)
    overlap = overlap_efficiency(cluster)
    layouts: dict[tuple, int] = {}
    tables = []
    degrees_key = ("tp-degrees", stage_devices)
    if degrees_key not in cache:
        cache[degrees_key] = model_tp_degrees(graph, stage_devices, options.max_tp)
    for layer in graph.layers:
        key = (layer.structural_hash, layer.params, stage_devices, samples, cand.num_microbatches,
               prune)
        if key not in cache:
            strategies = layer_strategies(layer, stage_devices, samples, options, graph.seq_len,
                                          cache[degrees_key])
            rows = []
            for s in strategies:
                config = _config(graph, options, cluster, samples // s.dp)
                c = layer_compute(layer, s, cluster, config, profile)
                comm = layer_comm(layer, s, cluster, config, per_param)
                mem = layer_memory(layer, s, config, per_param)
                fwd, bwd = c.forward_s, c.backward_s + c.recompute_s
                t = (fwd + bwd + comm.tp_forward_s + comm.tp_backward_s
                     + exposed(comm.dp_forward_s, fwd, overlap)
                     + exposed(comm.dp_backward_s, bwd, overlap)
                     + (comm.tp_step_s + exposed(comm.dp_step_s, bwd, overlap)
                        + comm.dp_after_step_s + c.optimizer_s) / cand.num_microbatches)
                # The DP unit's working copy and unreduced gradient held across the step.
                states = (mem.states.params + mem.states.grads + mem.states.optimizer
                          + held_through_step(mem, num_microbatches=cand.num_microbatches,
                                              pipelined=cand.pp > 1))
                transient = (mem.activations.recompute_bytes + mem.activations.grad_flow_bytes
                             + ZERO3_UNITS_IN_FLIGHT * mem.gather_unit_bytes
                             + mem.unsharded_grad_bytes)
                rows.append((t, states, mem.activations.kept_bytes, transient))
            rows = np.array(rows, dtype=float).reshape(-1, 4)
            keep = _undominated(strategies, rows) if prune else list(range(len(strategies)))
            cache[key] = ([strategies[i] for i in keep], rows[keep])
        strategies, rows = cache[key]
        layout = np.array([layouts.setdefault((s.tp, s.sequence_parallel), len(layouts))
                           for s in strategies], dtype=np.int64)
        tables.append(LayerTable(strategies, rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3],
                                 layout))
    order = sorted(layouts, key=layouts.get)
    return tables, order


def _undominated(strategies: list, rows: np.ndarray) -> list[int]:
    """Drop a strategy when another of the same (TP, SP) layout is no worse on time, state,
    kept and transient bytes (and better on one): swapping it in never hurts, so the
    optimum is unchanged."""
    keep = []
    costs = rows[:, :4]
    for i, s in enumerate(strategies):
        dominated = False
        for j, o in enumerate(strategies):
            if j == i or (o.tp, o.sequence_parallel) != (s.tp, s.sequence_parallel):
                continue
            if np.all(costs[j] <= costs[i]) and (np.any(costs[j] < costs[i]) or j < i):
                dominated = True
                break
        if not dominated:
            keep.append(i)
    return keep


def _config(graph: LayerGraph, options: SearchOptions, cluster: ClusterSpec,
            micro_batch: int) -> StepConfig:
    return StepConfig(micro_batch=max(1, micro_batch), graph_micro_batch=graph.micro_batch,
                      graph_dtype=graph.dtype, precision=options.precision,
                      optimizer=options.optimizer, seq_len=graph.seq_len,
                      device_type="cpu" if cluster.device.lower() == "cpu" else "cuda")


def _crossing_bytes(graph: LayerGraph, cache: dict) -> list[float]:
    """Bytes crossing the cut after each layer (one pass over the edges)."""
    if "crossing" not in cache:
        diff = np.zeros(len(graph.layers) + 1)
        for src, dst, nbytes in graph.edges:
            diff[src] += nbytes
            diff[dst] -= nbytes
        cache["crossing"] = [float(x) for x in np.cumsum(diff)[:-1]]
    return cache["crossing"]


def _transitions(graph: LayerGraph, cluster: ClusterSpec, options: SearchOptions,
                 layouts: list[tuple], micro_batch: int, cache: dict,
                 crossing: list[float]) -> list[np.ndarray]:
    """x(j, a, b) for every j: the re-layout after layer j, forward plus backward."""
    out = []
    scale = _config(graph, options, cluster, micro_batch).activation_scale
    n_layers = len(graph.layers)
    for j in range(n_layers):
        nbytes = crossing[j] * scale
        # A TP change into a layer the executor cannot re-split is infinitely expensive.
        chain = j + 1 >= n_layers or graph.layers[j + 1].chain_input
        key = (nbytes, tuple(layouts), chain)
        if key not in cache:
            n = len(layouts)
            x = np.zeros((n, n))
            for a, (tp_a, sp_a) in enumerate(layouts):
                for b, (tp_b, sp_b) in enumerate(layouts):
                    if tp_a != tp_b and (not chain or max(tp_a, tp_b) % min(tp_a, tp_b)):
                        x[a, b] = INF  # ir.legality.layout_change_problem
                    elif (tp_a, sp_a) != (tp_b, sp_b):
                        x[a, b] = 2 * tp_transition_s(nbytes, tp_a, tp_b, sp_a, sp_b, cluster)
            cache[key] = x
        out.append(cache[key])
    return out


# ------------------------------------------------------------ the inner program


@dataclass
class _Node:
    """C[b] for one stage prefix (layouts x buckets). Choices are recovered on the walk
    back (`_walk_back`), which only final plans need, so no back-pointers are stored."""

    value: np.ndarray
    parent: "_Node | None"
    table: LayerTable
    x_in: np.ndarray | None  # x(b-1, c', c) into this layer
    step: "_Step"


@dataclass
class _Step:
    """A layer table's per-(k, bucket, cap) index arrays, grouped by layout."""

    mem: np.ndarray  # buckets per strategy (units + 1 when over the cap)
    order: np.ndarray  # strategies sorted by layout, those that fit at all
    layouts: np.ndarray  # layout of each group
    starts: np.ndarray  # first row of each group in `order`
    src: np.ndarray  # (rows, units+1): bucket before this layer, clipped
    valid: np.ndarray  # (rows, units+1): src was >= 0
    time: np.ndarray  # (rows, 1)


def _step(table: LayerTable, k: float, bucket_bytes: float, cap: float, units: int,
          cache: dict) -> _Step:
    key = (id(table), k)
    step = cache.get(key)
    if step is None:
        mem = np.ceil((table.state_bytes + k * table.kept_bytes) / bucket_bytes - 1e-9)
        mem = np.where(table.transient_bytes <= cap, mem, units + 1).astype(np.int64)
        fits = np.flatnonzero(mem <= units)
        order = fits[np.argsort(table.layout[fits], kind="stable")]
        layouts, starts = np.unique(table.layout[order], return_index=True)
        src = np.arange(units + 1)[None, :] - mem[order][:, None]
        step = _Step(mem, order, layouts, starts, np.maximum(src, 0), src >= 0,
                     table.time_s[order][:, None])
        cache[key] = step
    return step


def _extend(parent: _Node | None, table: LayerTable, x_in: np.ndarray | None, step: _Step,
            n_layouts: int, units: int) -> _Node:
    """One step of the inner recurrence (module docstring), all strategies at once."""
    value = np.full((n_layouts, units + 1), INF)
    if step.order.size:
        if parent is None:
            entry = np.zeros((n_layouts, units + 1))
        else:  # min over the previous layout c' of C[i-1][c'][u] + x(c', c)
            entry = (parent.value[:, None, :] + x_in[:, :, None]).min(axis=0)
        rows = table.layout[step.order]
        vals = np.where(step.valid, entry[rows[:, None], step.src] + step.time, INF)
        value[step.layouts] = np.minimum.reduceat(vals, step.starts, axis=0)
    return _Node(value, parent, table, x_in, step)


def _walk_back(node: _Node, tables: list[LayerTable], first: int, last: int, layout: int,
               u: int) -> list:
    """The strategies of layers first..last that reach `node`'s value at (layout, u)."""
    chosen = []
    for i in range(last, first - 1, -1):
        table, step, parent = node.table, node.step, node.parent
        if parent is None:
            entry_c = np.zeros(u + 1)
            from_layout = np.full(u + 1, -1)
        else:
            both = parent.value + node.x_in[:, layout][:, None]  # (c', buckets)
            from_layout = both.argmin(axis=0)
            entry_c = both.min(axis=0)
        best_s, best_v = -1, INF
        for s in np.flatnonzero((table.layout == layout) & (step.mem <= u)):
            v = entry_c[u - step.mem[s]] + table.time_s[s]
            if v < best_v:
                best_s, best_v = int(s), v
        chosen.append(table.strategies[best_s])
        prev_u = u - int(step.mem[best_s])
        layout, u, node = int(from_layout[prev_u]), prev_u, parent
    return chosen[::-1]


class _StageSolver:
    """T*(a, b, r): the inner program over layers a..b for a rank with k in flight.

    A node is interned by (its parent node, the next layer's content), so ranges with the
    same run of layers share one table wherever they sit in the model."""

    def __init__(self, graph, tables, transitions, n_layouts, units, bucket_bytes, cap,
                 crossing: list[float]):
        self.graph, self.tables, self.transitions = graph, tables, transitions
        self.n_layouts, self.units, self.bucket, self.cap = n_layouts, units, bucket_bytes, cap
        self.by_range: dict[tuple, _Node] = {}
        self.by_content: dict[tuple, _Node] = {}
        self.best_cache: dict[tuple, tuple[float, int]] = {}
        self.step_cache: dict[tuple, _Step] = {}
        self.extensions = 0
        # A layer's content inside a stage: its hash and the bytes crossing into it.
        self.elems = [(l.structural_hash, crossing[i - 1] if i else 0.0)
                      for i, l in enumerate(graph.layers)]

    def node(self, a: int, b: int, k: float) -> _Node:
        node = self.by_range.get((a, b, k))
        if node is not None:
            return node
        parent = self.node(a, b - 1, k) if b > a else None
        content = (k, id(parent), self.elems[b] if parent is not None else self.elems[b][0])
        node = self.by_content.get(content)
        if node is None:
            x_in = self.transitions[b - 1] if parent is not None else None
            step = _step(self.tables[b], k, self.bucket, self.cap, self.units, self.step_cache)
            node = _extend(parent, self.tables[b], x_in, step, self.n_layouts, self.units)
            self.by_content[content] = node
            self.extensions += 1
        self.by_range[(a, b, k)] = node
        return node

    def best(self, a: int, b: int, k: float) -> tuple[float, int]:
        key = (a, b, k)
        hit = self.best_cache.get(key)
        if hit is None:
            column = self.node(a, b, k).value[:, self.units]
            c = int(column.argmin())
            hit = self.best_cache[key] = (float(column[c]), c)
        return hit


# ------------------------------------------------------------ the partition program


def _edge_costs(crossing: list[float], cluster, stage_devices, scale) -> list[float]:
    """p2p seconds of sending the activation after layer j (and its gradient back)."""
    return [p2p_s(nbytes * scale, cluster, stage_devices) for nbytes in crossing]


def _stage_edges_s(edges: list[float], a: int, b: int) -> float:
    """A stage sends its output forward (not the last) and its input's gradient back."""
    return (edges[b] if b < len(edges) - 1 else 0.0) + (edges[a - 1] if a > 0 else 0.0)


def _partition(graph, solver: _StageSolver, cand: OuterCandidate, ks: list[float],
               edge_cost, incumbent: float = INF) -> tuple[float, list[tuple[int, int, int]]] | None:
    """Exact stage partition minimising sum T + (m-1) max T (module docstring).

    A front entry is (sum, max, previous entry, first layer, last layer, layout).
    Memory and time only grow as a stage gets longer, so once a..b does not fit, or
    (m-1) T alone reaches `incumbent` (an objective already found elsewhere), no longer
    stage from a helps; partial partitions whose objective reaches it are dropped too.
    The last rank must end at the last layer."""
    n, p, m = len(graph.layers), cand.pp, cand.num_microbatches
    cut_set = set(graph.cut_points)
    ends = [b for b in range(n) if b in cut_set or b == n - 1]
    starts = [0] + [c + 1 for c in graph.cut_points]

    def stages_from(a: int, r: int):
        """(b, t, layout) for the stages rank r could run starting at layer a."""
        if r == p - 1:
            t, c = solver.best(a, n - 1, ks[r])
            if t < INF and (m - 1) * t < incumbent:
                yield n - 1, t + edge_cost(a, n - 1), c
            return
        last_end = n - 1 - (p - 1 - r)  # the later ranks need a layer each
        for b in ends:
            if b < a:
                continue
            if b > last_end:
                break
            t, c = solver.best(a, b, ks[r])
            if t == INF or (m - 1) * t >= incumbent:
                break
            yield b, t + edge_cost(a, b), c

    front: dict[int, list] = {}
    for b, t, c in stages_from(0, 0):
        front[b] = [(t, t, None, 0, b, c)]
    for r in range(1, p):
        new: dict[int, list] = {}
        for a in starts:
            if a < r or (a - 1) not in front:
                continue
            previous = front[a - 1]
            for b, t, c in stages_from(a, r):
                new.setdefault(b, []).extend(
                    (e[0] + t, max(e[1], t), e, a, b, c) for e in previous)
        front = {b: kept for b, options in new.items()
                 if (kept := [e for e in _pareto(options) if e[0] + (m - 1) * e[1] < incumbent])}
        if not front:
            return None
    final = front.get(n - 1)
    if not final:
        return None
    entry = min(final, key=lambda e: e[0] + (m - 1) * e[1])
    objective = entry[0] + (m - 1) * entry[1]
    stages = []
    while entry is not None:
        stages.append((entry[3], entry[4], entry[5]))
        entry = entry[2]
    return objective, stages[::-1]


def _pareto(options: list) -> list:
    """Keep entries no other beats on both sum and max."""
    options.sort(key=lambda e: (e[0], e[1]))
    out, best_max = [], INF
    for e in options:
        if e[1] < best_max:
            out.append(e)
            best_max = e[1]
    return out


# ------------------------------------------------------------------ one candidate


def _transient_caps(tables: list[LayerTable], levels: int) -> list[float]:
    """Caps on the max-type transient buffers: every plan needs at least the largest of
    the layers' smallest transients; try up to `levels` values from there to the top."""
    floor = max(float(t.transient_bytes.min()) for t in tables)
    values = sorted({float(v) for t in tables for v in t.transient_bytes if v >= floor})
    if len(values) <= levels:
        return values
    return sorted({values[round(i * (len(values) - 1) / (levels - 1))] for i in range(levels)})


def _restrict(tables: list[LayerTable], keep) -> list[LayerTable] | None:
    """Tables with only the strategies `keep` accepts; identical layers keep sharing one."""
    done: dict[int, LayerTable | None] = {}
    out = []
    for t in tables:
        if id(t) not in done:
            idx = [i for i, s in enumerate(t.strategies) if keep(s)]
            ix = np.array(idx, dtype=np.int64)
            done[id(t)] = LayerTable([t.strategies[i] for i in idx], t.time_s[ix],
                                     t.state_bytes[ix], t.kept_bytes[ix],
                                     t.transient_bytes[ix], t.layout[ix]) if idx else None
        if done[id(t)] is None:
            return None
        out.append(done[id(t)])
    return out


def _pipeline_tp_groups(graph: LayerGraph, cand: OuterCandidate,
                        tables: list[LayerTable]) -> list[list[LayerTable]] | None:
    """Tables per TP degree when a stage boundary may split a linked run (layers that
    must share one TP degree, `ir.legality.linked_runs`): the stage program sees no
    layout across stages, so such a candidate is solved once per degree. None: no need."""
    if cand.pp == 1:
        return None
    cuts = graph.cut_points
    pinned = {i for a, b in linked_runs(graph) if any(a <= c < b for c in cuts)
              for i in range(a, b + 1)}
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
                done[id(t)] = _restrict([t], lambda s, tp=tp: s.tp == tp)
            if done[id(t)] is None:
                break
            group.append(done[id(t)][0])
        else:
            out.append(group)
    return out


def _even_chunks(graph: LayerGraph, tables: list[LayerTable], chunks: int) -> list[tuple[int, int]] | None:
    """Contiguous chunks of about equal fastest compute, cut only at cut points."""
    weight = np.array([float(t.time_s.min()) for t in tables])
    total = weight.sum()
    cuts, acc, chosen = sorted(graph.cut_points), np.cumsum(weight), []
    for k in range(1, chunks):
        target = total * k / chunks
        options = [c for c in cuts if (not chosen or c > chosen[-1])]
        if not options:
            return None
        chosen.append(min(options, key=lambda c: abs(acc[c] - target)))
    bounds = [0] + [c + 1 for c in chosen] + [len(tables)]
    pieces = [(bounds[i], bounds[i + 1] - 1) for i in range(chunks)]
    return pieces if all(a <= b for a, b in pieces) else None


# Re-solves of one candidate with a lowered budget when the full memory model rejects the
# DP's plan (each round lowers it by the excess it saw).
FIT_ROUNDS = 4


def _solve_fitting(graph, cluster, cand, tables, layouts, options, global_batch, trans_cache,
                   stats, incumbent, profile):
    """`_solve`, then the full memory model on its plan: the DP adds layers up while the
    full model walks the step (pipeline schedules, FSDP2 buffers in flight), so where the
    DP's plan does not fit, solve again with the budget lowered by the excess, at most
    FIT_ROUNDS times. A plan the full model rejects is never returned as the candidate's."""
    shrink = 0.0
    limit = options.memory_budget_bytes or cluster.device_memory_bytes
    for _ in range(FIT_ROUNDS):
        result = _solve(graph, cluster, cand, tables, layouts, options, global_batch,
                        trans_cache, stats, incumbent, shrink)
        if result is None:
            return None
        memory = plan_memory(graph, result[1], cluster)
        peak = memory.peak_bytes
        if memory.fits and peak <= limit:
            return result
        stats["refits"] = stats.get("refits", 0) + 1
        shrink += peak - limit
    return None


def _solve(graph, cluster, cand: OuterCandidate, tables, layouts, options: SearchOptions,
           global_batch: int, trans_cache: dict, stats: dict, incumbent: float = INF,
           shrink_bytes: float = 0.0):
    """Best (objective, plan) of one outer candidate over the transient caps, or None.
    `shrink_bytes` lowers the memory budget (see `_solve_fitting`)."""
    world = cluster.world_size
    stage_devices = world // cand.pp
    samples = global_batch // cand.num_microbatches
    budget = ((options.memory_budget_bytes or cluster.device_memory_bytes)
              - cluster.runtime_overhead_bytes - DP_BUCKETS_IN_FLIGHT * DP_BUCKET_BYTES
              - shrink_bytes)
    scale_batch = max(1, samples // stage_devices)
    crossing = _crossing_bytes(graph, trans_cache)
    transitions = _transitions(graph, cluster, options, layouts, scale_batch, trans_cache, crossing)
    scale = _config(graph, options, cluster, scale_batch).activation_scale
    edges = _edge_costs(crossing, cluster, stage_devices, scale)
    edge = lambda a, b: _stage_edges_s(edges, a, b)  # noqa: E731
    units = options.memory_buckets
    best = None
    for cap in _transient_caps(tables, options.transient_levels):
        usable = budget - cap
        if usable <= 0:
            continue
        v = cand.virtual_stages
        made: list[_StageSolver] = []

        def make_solver(stage_tables: list[LayerTable]) -> _StageSolver:
            made.append(_StageSolver(graph, stage_tables, transitions, len(layouts), units,
                                     usable / units / v, cap, crossing))
            return made[-1]

        if v > 1:
            found = _interleaved(graph, tables, make_solver, cand, edge)
        else:
            solver = make_solver(tables)
            ks = [microbatches_in_flight(cand.schedule, cand.pp, r, cand.num_microbatches)
                  for r in range(cand.pp)]
            bar = incumbent if best is None else min(incumbent, best[0])
            found = _partition(graph, solver, cand, ks, edge, bar)
            if found:
                objective, ranges = found
                found = objective, [(a, b, c, ks[r], solver)
                                    for r, (a, b, c) in enumerate(ranges)]
        stats["dp_extensions"] = stats.get("dp_extensions", 0) + sum(s.extensions for s in made)
        if not found or (best is not None and found[0] >= best[0]):
            continue
        objective, ranges = found
        strategies = []
        for a, b, c, k, solver in ranges:
            strategies += _walk_back(solver.node(a, b, k), tables, a, b, c, units)
        plan = _plan(cand, [(a, b) for a, b, *_ in ranges], strategies, stage_devices,
                     global_batch, options)
        best = (objective, plan)
    return best


def _plan(cand: OuterCandidate, ranges: list[tuple[int, int]], strategies: list,
          stage_devices: int, global_batch: int, options: SearchOptions) -> ParallelPlan:
    """The ParallelPlan of per-layer strategies over stage layer ranges."""
    max_dp = max(s.dp for s in strategies)
    return ParallelPlan(
        stages=tuple(Stage(a, b, stage_devices) for a, b in ranges),
        layer_strategies=tuple(strategies), global_batch=global_batch,
        micro_batch=global_batch // (cand.num_microbatches * max_dp),
        num_microbatches=cand.num_microbatches, schedule=cand.schedule,
        precision=options.precision, optimizer=options.optimizer,
        virtual_stages=cand.virtual_stages)


def _interleaved(graph, tables: list[LayerTable], make_solver, cand: OuterCandidate, edge):
    """v chunks per rank at equal compute; each chunk gets 1/v of the rank's memory.

    The chunks of one rank read the model inputs in one layout (`executors.pipeline`), so
    their first layers share one TP degree: each rank takes the degree that makes its
    chunks fastest (ranks are independent, so that also minimises the max and the sum)."""
    p, v, m = cand.pp, cand.virtual_stages, cand.num_microbatches
    pieces = _even_chunks(graph, tables, p * v)
    if pieces is None:
        return None
    firsts = {a for a, _ in pieces}
    per_rank = [INF] * p
    ranges: list = [None] * len(pieces)
    for tp in sorted({s.tp for a in firsts for s in tables[a].strategies}):
        pinned = {a: _restrict([tables[a]], lambda s, tp=tp: s.tp == tp) for a in firsts}
        solver = make_solver([pinned[i][0] if pinned.get(i) else t
                              for i, t in enumerate(tables)])
        for r in range(p):
            total, chosen = 0.0, []
            for i in range(r, len(pieces), p):
                a, b = pieces[i]
                k = microbatches_in_flight(Schedule.INTERLEAVED, p, r, m, v)
                t, c = solver.best(a, b, k) if pinned[a] else (INF, -1)
                if t == INF:
                    total = INF
                    break
                total += t + edge(a, b)
                chosen.append((i, (a, b, c, k, solver)))
            if total < per_rank[r]:
                per_rank[r] = total
                for i, entry in chosen:
                    ranges[i] = entry
    if INF in per_rank:
        return None
    worst = max(per_rank)
    return m * worst + (sum(per_rank) - worst) / v, ranges  # pipeline.pipeline_time


# ------------------------------------------------------------------------ search

# Outer candidates whose lower bound reaches the k-th best objective times this are
# skipped: 1.0 loses nothing the dynamic program could find.
LOWER_BOUND_SLACK = 1.0


def _lower_bound(cand: OuterCandidate, tables: list[LayerTable], budget_bytes: float) -> float:
    """No plan of this candidate beats it.

    Every rank's time is at least the average, so sum T + (m-1) max T >= f * sum_i t_i
    with f = 1 + (m-1)/p (interleaved: m/p). And every rank keeps at least one micro-batch
    in flight within its budget, so sum_i (state_i + kept_i) <= p * budget: for any
    lambda >= 0 (Lagrangian relaxation)
        sum_i t_i >= sum_i min_s (t_is + lambda * mem_is) - lambda * p * budget.
    The best lambda of a log-spaced grid gives the bound. Also, some rank holds at least
    ceil(L / p) layers over its chunks (pigeonhole), so max T is at least the sum of
    that many of the smallest fastest layer times."""
    p, m, v = cand.pp, cand.num_microbatches, cand.virtual_stages
    fastest_each = sorted(float(t.time_s.min()) for t in tables)
    pigeon = sum(fastest_each[: -(-len(tables) // p)])
    unique: dict[int, tuple[LayerTable, int]] = {}
    for t in tables:
        table, count = unique.get(id(t), (t, 0))
        unique[id(t)] = (table, count + 1)
    fastest = sum(count * float(t.time_s.min()) for t, count in unique.values())
    capacity = p * budget_bytes
    if capacity <= 0:
        return INF
    # Provably infeasible: a layer that fits nowhere, or more memory than all ranks have.
    least = [float((t.state_bytes + t.kept_bytes).min()) for t in tables]
    if max(least) > budget_bytes * v or sum(least) > capacity:
        return INF
    lams = (fastest / capacity) * np.logspace(-2, 3, 26)
    relaxed = -lams * capacity
    for t, count in unique.values():
        mem = t.state_bytes + t.kept_bytes
        relaxed = relaxed + count * (t.time_s[:, None] + mem[:, None] * lams[None, :]).min(axis=0)
    best = max(fastest, float(relaxed.max()))
    if v > 1:  # m max T + (sum T - max T)/v
        return max(m * best / p, m * pigeon)
    return best + (m - 1) * max(best / p, pigeon)


def search(graph: LayerGraph, cluster: ClusterSpec, global_batch: int,
           options: SearchOptions = SearchOptions(), profile: ComputeProfile | None = None,
           with_baselines: bool = True) -> SearchResult:
    """The fastest plans that fit, best first (see the module docstring). Unless the
    search is uniform itself, the classic uniform baselines join the final ranking."""
    if global_batch < 1:
        raise PlannerError(f"--global-batch must be >= 1, got {global_batch}")
    start = time.perf_counter()
    world = cluster.world_size
    if options.max_tp is None and options.tp is None:
        # TP across nodes is never worth its all-reduces on these links (Narayanan et al.
        # 2021, sec. 3.3); --max-tp lifts the limit.
        options = dataclasses.replace(options, max_tp=cluster.devices_per_node)
    outers = outer_candidates(graph, world, global_batch, options)
    price_cache: dict = {}
    trans_cache: dict = {}
    stats: dict = {"outer_candidates": len(outers), "outer_searched": 0, "timed_out": False}
    found = []
    priced = []
    budget_of: dict[OuterCandidate, float] = {}
    for cand in outers:
        tables, layouts = _price(graph, cluster, cand, options, global_batch, profile, price_cache)
        if any(not t.strategies for t in tables):
            continue  # some layer has no legal strategy here (e.g. dp does not divide)
        budget = ((options.memory_budget_bytes or cluster.device_memory_bytes)
                  - cluster.runtime_overhead_bytes - DP_BUCKETS_IN_FLIGHT * DP_BUCKET_BYTES
                  - max(float(t.transient_bytes.min()) for t in tables))
        budget_of[cand] = budget
        priced.append((_lower_bound(cand, tables, budget), cand, tables, layouts))
    # Single-stage candidates first (cheap, often good): an early incumbent prunes more.
    if not priced:
        tp = options.tp or options.max_tp or 1
        pp = options.pp or 1
        raise PlannerError(
            f"no legal configuration: global batch {global_batch} does not split into "
            f"micro-batches over the data-parallel replicas ({world} devices / tp {tp} / pp "
            f"{pp} = dp {max(1, world // (tp * pp))}); use a global batch that is a multiple "
            "of the data-parallel degree, or allow more tensor/pipeline parallelism")
    priced.sort(key=lambda item: (item[1].pp > 1, item[0]))
    keep_best = max(options.top_k, 1)
    for bound, cand, tables, layouts in priced:
        if options.time_limit_s is not None and time.perf_counter() - start > options.time_limit_s:
            stats["timed_out"] = True
            break
        objectives = sorted(f[0] for f in found)
        if bound == INF or (len(objectives) >= keep_best
                            and bound >= objectives[keep_best - 1] * LOWER_BOUND_SLACK):
            stats["outer_pruned"] = stats.get("outer_pruned", 0) + 1
            continue  # cannot fit, or cannot beat the plans already found
        stats["outer_searched"] += 1
        stats["strategies_per_layer_max"] = max(stats.get("strategies_per_layer_max", 0),
                                                max(len(t.strategies) for t in tables))
        if options.uniform:
            keys = {(s.tp, s.dp_mode, s.sequence_parallel, s.checkpoint, s.offload)
                    for t in tables for s in t.strategies}
            groups = [g for key in sorted(keys, key=str)
                      if (g := _restrict(tables, lambda s, key=key: (s.tp, s.dp_mode, s.sequence_parallel,
                                                                   s.checkpoint, s.offload) == key))]
            # Each uniform strategy is its own small problem: bound it too, best first.
            groups = sorted(((_lower_bound(cand, g, budget_of[cand]), g) for g in groups),
                            key=lambda item: item[0])
        elif (per_degree := _pipeline_tp_groups(graph, cand, tables)) is not None:
            groups = sorted(((_lower_bound(cand, g, budget_of[cand]), g) for g in per_degree),
                            key=lambda item: item[0])
        else:
            groups = [(bound, tables)]
        for group_bound, group in groups:
            objectives = sorted(f[0] for f in found)
            if group_bound == INF or (len(objectives) >= keep_best and
                                      group_bound >= objectives[keep_best - 1] * LOWER_BOUND_SLACK):
                continue
            incumbent = objectives[keep_best - 1] if len(objectives) >= keep_best else INF
            result = _solve_fitting(graph, cluster, cand, group, layouts, options, global_batch,
                                    trans_cache, stats, incumbent * LOWER_BOUND_SLACK, profile)
            if result is not None:
                found.append((result[0], cand, result[1]))
    found.sort(key=lambda f: f[0])
    candidates, seen = [], set()
    for objective, cand, plan in found:
        if plan in seen:
            continue
        seen.add(plan)
        est = estimate(graph, plan, cluster, profile)
        if est.memory.fits and (options.memory_budget_bytes is None
                                or est.memory.peak_bytes <= options.memory_budget_bytes):
            candidates.append(Candidate(cand, plan, objective, est))
        if len(candidates) >= max(options.top_k, 1) + 7:
            break  # priced enough of the DP's best to re-rank by the full model
    base = []
    if with_baselines and not options.uniform:
        from planner.baselines import baselines  # they search too: imported at call time

        base = baselines(graph, cluster, global_batch, options, profile)
        candidates += [b.candidate for b in base
                       if b.candidate is not None and b.candidate.plan not in seen]
    candidates.sort(key=lambda c: c.estimate.iteration_seconds)
    stats["search_seconds"] = time.perf_counter() - start
    stats["feasible_candidates"] = len(found)
    return SearchResult(candidates[0] if candidates else None, candidates, stats, base)
