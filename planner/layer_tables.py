"""Each layer's legal strategies under one outer candidate, priced for the search.

`price_layers` turns every (layer, strategy) into the four figures the dynamic program
adds up (see `planner.search`'s docstring: t(i, s), state and kept bytes for mem_r(i, s),
transient bytes); identical layers share one `LayerTable`. `transitions` prices the
re-layout x(j, a, b) between neighbours; `memory_budget_bytes` is what a rank may fill.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
from torch import nn

from cost_models.activations import boundary_bytes
from cost_models.comm import layer_comm
from cost_models.common import StepConfig, device_type_of, layer_lean
from cost_models.compute import layer_compute
from cost_models.host_dispatch import host_position_key
from cost_models.estimate import boundary_send_s, exposed, overlap_efficiency, relayout_s
from cost_models.grad_accumulation import accumulation_step_seconds
from cost_models.memory import (DP_BUCKET_BYTES, DP_BUCKETS_IN_FLIGHT, ZERO3_UNITS_IN_FLIGHT,
                                LayerMemory, held_through_step, layer_memory)
from cost_models.model_states import bytes_per_param
from cost_models.memory_walk import model_output_bytes
from cost_models.walk_floor import (PipelineBuffersFloor, backward_floor_row,
                                    forward_after_backward, walk_floor_row)
from ir.cluster import ClusterSpec
from ir.layer import LayerGraph
from planner.search_space import (OuterCandidate, SearchOptions, layer_strategies,
                                  model_tp_degrees)

INF = math.inf
# Figures per priced row: t(i, s), the program's three memory figures, the walk's floor's
# two, and, without a pipeline, its floor's after / during a backward and the model output.
ROW_FIGURES = 9


@dataclass
class LayerTable:
    """One layer's legal strategies under one outer candidate, priced (arrays over s)."""

    strategies: list
    time_s: np.ndarray  # per micro-batch, see t(i, s)
    state_bytes: np.ndarray  # params + grads + optimizer states
    kept_bytes: np.ndarray  # activations kept per micro-batch
    transient_bytes: np.ndarray
    layout: np.ndarray  # index into the candidate's layouts (tp, sp)
    # state and kept bytes as a lower bound on the walk (`cost_models.walk_floor`)
    floor_state_bytes: np.ndarray
    floor_kept_bytes: np.ndarray
    # without a pipeline (else 0): the walk's floor once the layer's backward is done,
    # while it runs, and the model output it holds where it ends the model
    # (`walk_floor.backward_floor_row`, `planner.point_floor`)
    after_bytes: np.ndarray
    during_bytes: np.ndarray
    output_bytes: np.ndarray

    def memory(self, floor: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(state, kept, transient) bytes: the program's sums, or the walk's floor (which
        needs no transient: it is the walk at the end of a forward)."""
        if floor:
            return self.floor_state_bytes, self.floor_kept_bytes, self.floor_transient_bytes
        return self.state_bytes, self.kept_bytes, self.transient_bytes

    @functools.cached_property
    def floor_transient_bytes(self) -> np.ndarray:
        """Zeros, made once per table (the programs ask per layer and cap), read-only."""
        zeros = np.zeros_like(self.floor_state_bytes)
        zeros.flags.writeable = False
        return zeros



def reserved_bytes(cluster: ClusterSpec) -> int:
    """What the search sets aside on every rank before any layer: the runtime's fixed
    overhead and the DP buckets in flight (`cost_models.memory`)."""
    return cluster.runtime_overhead_bytes + DP_BUCKETS_IN_FLIGHT * DP_BUCKET_BYTES


def memory_budget_bytes(cluster: ClusterSpec, options: SearchOptions) -> float:
    """Bytes a rank's model states and activations may fill: the device (or the user's
    budget) less `reserved_bytes`."""
    return ((options.memory_budget_bytes or cluster.device_memory_bytes)
            - reserved_bytes(cluster))


def price_layers(graph: LayerGraph, cluster: ClusterSpec, cand: OuterCandidate, options: SearchOptions,
           global_batch: int, profile, cache: dict, prune: bool = True,
           model: nn.Module | None = None) -> tuple[list[LayerTable], list[tuple]]:
    """Price every layer's strategies; identical layers share one table. `prune=False`
    keeps dominated strategies (for the brute-force oracle in the tests). `model`: the
    module the executor gets, whose build decides its path (`common.layer_lean`)."""
    served = (options, global_batch, id(graph), id(cluster), id(profile), id(model))
    if cache.setdefault("serves", served) != served:
        raise ValueError("a price cache serves one graph, cluster, batch, options and profile")
    if not cluster.offload_known:  # no PCIe / host memory figures: offload is not offered
        options = dataclasses.replace(options, no_offload=True)
    stage_devices = cluster.world_size // cand.pp
    samples = global_batch // cand.num_microbatches
    per_param = bytes_per_param(options.precision, options.optimizer)
    overlap = overlap_efficiency(cluster)
    # Rows by (layer, strategy, micro-batch, m, pipelined): what they read beyond the
    # strategy, and the schedule's `forward_after_backward` (`held`, which only the
    # floor reads: 1F1B and interleaved candidates of one pp and m differ in it). The
    # uniform baselines' searches share them (`row_cache`), so a row the full search
    # priced is not priced again.
    row_cache = cache.setdefault("rows", {})
    row_served = (id(graph), id(cluster), id(profile), global_batch, options.precision,
                  options.optimizer, options.optimizer_impl, options.clip_grad_norm, id(model))
    if row_cache.setdefault("serves", row_served) != row_served:
        raise ValueError("a row cache serves one graph, cluster, batch, precision, optimizer "
                         "(and its implementation), profile and model")
    layouts: dict[tuple, int] = {}
    tables = []
    shared: dict[tuple, LayerTable] = {}
    degrees_key = ("tp-degrees", stage_devices)
    if degrees_key not in cache:
        cache[degrees_key] = model_tp_degrees(graph, stage_devices, options.max_tp)
    # per layer, what its rows and tables are keyed by: its structure, what of its place
    # it prices (a stack's first block may price apart) and its parameters
    if "layer-keys" not in cache:  # the cache serves one graph and cluster (`served`)
        cache["layer-keys"] = [(layer.structural_hash, host_position_key(layer, cluster),
                                layer.params) for layer in graph.layers]
    held = forward_after_backward(cand.schedule, cand.pp, cand.num_microbatches)
    for layer, layer_key in zip(graph.layers, cache["layer-keys"]):
        key = (*layer_key, stage_devices, samples, cand.num_microbatches, held, prune)
        if key not in cache:
            strategies = layer_strategies(layer, stage_devices, samples, options, graph.seq_len,
                                          cache[degrees_key])
            rows = []
            for s in strategies:
                priced_key = (*layer_key, s, samples // s.dp, cand.num_microbatches,
                              cand.pp > 1)
                row = row_cache.get((*priced_key, held))
                if row is None:
                    priced = row_cache.get(priced_key)
                    if priced is None:
                        priced = row_cache[priced_key] = _price(
                            graph, layer, s, cluster, options, cand, samples // s.dp, profile,
                            per_param, overlap, model, row_cache)
                    row = row_cache[(*priced_key, held)] = _with_floor(layer, s, priced, held,
                                                                      cand.pp > 1)
                rows.append(row)
            rows = np.array(rows, dtype=float).reshape(-1, ROW_FIGURES)
            keep = _undominated(strategies, rows) if prune else list(range(len(strategies)))
            cache[key] = ([strategies[i] for i in keep], rows[keep])
        table = shared.get(key)
        if table is None:  # identical layers share one table (and the programs' work on it)
            strategies, rows = cache[key]
            layout = np.array([layouts.setdefault((s.tp, s.sequence_parallel), len(layouts))
                               for s in strategies], dtype=np.int64)
            table = shared[key] = LayerTable(strategies, rows[:, 0], rows[:, 1], rows[:, 2],
                                             rows[:, 3], layout, *rows[:, 4:].T)
        tables.append(table)
    order = sorted(layouts, key=layouts.get)
    return tables, order


def row_config(graph: LayerGraph, layer, s, cluster: ClusterSpec, options: SearchOptions,
               micro_batch: int, model: nn.Module | None, pipelined: bool = False,
               configs: dict | None = None) -> StepConfig:
    """The step config one (layer, strategy) row is priced under: the executor's path for
    `model` (`common.layer_lean`: the lean host path). `configs`: the configs built so
    far for this graph, cluster, precision and optimizer (a row cache's), by what else
    they read (micro-batch, pipelined): a StepConfig costs more to build than to find."""
    key = ("step-config", micro_batch, pipelined)
    config = None if configs is None else configs.get(key)
    if config is None:
        config = dataclasses.replace(step_config(graph, options, cluster, micro_batch),
                                     pipelined=pipelined)
        if configs is not None:
            configs[key] = config
    lean = layer_lean(model, cluster.device, layer, s)
    return config if lean is None else dataclasses.replace(config, lean=lean)


def _price(graph: LayerGraph, layer, s, cluster: ClusterSpec, options: SearchOptions,
           cand: OuterCandidate, micro_batch: int, profile, per_param: float,
           overlap: float, model: nn.Module | None, configs: dict | None = None
           ) -> tuple[tuple[float, ...], StepConfig, LayerMemory]:
    """(t(i, s), state bytes, kept bytes, transient bytes) of one layer and strategy, with
    the config and memory `_with_floor` reads; its memory as the executor runs `model`
    (`common.layer_lean`: the lean host path). On GPUs t prices each of the layer's
    passes at max(device, host), an upper bound of the estimate's runs of passes
    (`estimate.gpu_runs_s`: max of the run's sums, less by at most the smaller sum): the
    program stays additive and the estimate prices the finalists (`search`'s
    FRONT_PLANS) and so decides."""
    config = row_config(graph, layer, s, cluster, options, micro_batch, model, cand.pp > 1,
                        configs)
    c = layer_compute(layer, s, cluster, config, profile)
    comm = layer_comm(layer, s, cluster, config, per_param)
    mem = layer_memory(layer, s, config, per_param)
    fwd, bwd = c.forward_s, c.backward_s + c.recompute_s
    t = (fwd + bwd + comm.tp_forward_s + comm.tp_backward_s
         + exposed(comm.dp_forward_s, fwd, overlap)
         + exposed(comm.dp_backward_s, bwd, overlap)
         + (comm.tp_step_s + exposed(comm.dp_step_s, bwd, overlap)
            + comm.dp_after_step_s + c.optimizer_s
            + accumulation_step_seconds(layer, s, cluster, config, cand.num_microbatches)
            ) / cand.num_microbatches)
    # The DP unit's working copy and unreduced gradient held across the step.
    states = (mem.states.params + mem.states.grads + mem.states.optimizer
              + held_through_step(mem, num_microbatches=cand.num_microbatches,
                                  pipelined=cand.pp > 1))
    transient = (mem.activations.recompute_bytes + mem.activations.grad_flow_bytes
                 + gathered_in_flight_bytes(mem) + mem.unsharded_grad_bytes)
    return (t, states, mem.activations.kept_bytes, transient), config, mem


def _with_floor(layer, s, priced: tuple, held: bool, pipelined: bool) -> tuple[float, ...]:
    """A `_price`d row with the walk's floor's state and kept bytes, and without a pipeline
    its after / during bytes and the model output; `held`: `forward_after_backward`."""
    figures, config, mem = priced
    floor = walk_floor_row(layer, s, config, mem, held)
    point = (0.0, 0.0, 0.0) if pipelined else (
        *backward_floor_row(layer, s, config, mem, held), model_output_bytes(layer, s, config))
    return (*figures, *floor, *point)


def gathered_in_flight_bytes(mem: LayerMemory) -> float:
    """A ZeRO-3 unit's gathered copies alive at once, as `cost_models.memory_walk` walks
    them: FSDP2 gathers it again for backward with the next unit prefetched
    (ZERO3_UNITS_IN_FLIGHT); the lean host path (`mem.backward_prefetch` off) prefetches
    nothing and gathers only `backward_gather_bytes` again, so its forward copy is the most."""
    if mem.backward_prefetch:
        return ZERO3_UNITS_IN_FLIGHT * mem.gather_unit_bytes
    again = mem.gather_unit_bytes if mem.backward_gather_bytes is None \
        else min(mem.gather_unit_bytes, mem.backward_gather_bytes)
    return max(mem.gather_unit_bytes, again)


def _undominated(strategies: list, rows: np.ndarray) -> list[int]:
    """Drop a strategy when another of the same (TP, SP) layout is no worse on time and
    every memory figure, the program's and the floor's, and better on one of the first
    four (or equal and listed first): swapping it in never hurts either program, so the
    optimum is unchanged, and a strategy kept by the first four alone stays kept (the
    uniform families, `planner.uniform`, read these tables). All pairs at once: [i, j]
    asks whether j drops i."""
    ids: dict[tuple, int] = {}
    layout = np.array([ids.setdefault((s.tp, s.sequence_parallel), len(ids))
                       for s in strategies], dtype=np.int64)
    n = len(strategies)
    no_worse = (rows[None, :, :] <= rows[:, None, :]).all(axis=2)
    better = (rows[None, :, :4] < rows[:, None, :4]).any(axis=2)
    earlier = np.tri(n, k=-1, dtype=bool)  # [i, j]: j < i
    drops = no_worse & (earlier | better) & (layout[None, :] == layout[:, None])
    np.fill_diagonal(drops, False)
    return np.flatnonzero(~drops.any(axis=1)).tolist()


def step_config(graph: LayerGraph, options: SearchOptions, cluster: ClusterSpec,
            micro_batch: int) -> StepConfig:
    return StepConfig(micro_batch=max(1, micro_batch), graph_micro_batch=graph.micro_batch,
                      graph_dtype=graph.dtype, precision=options.precision,
                      optimizer=options.optimizer, seq_len=graph.seq_len,
                      device_type=device_type_of(cluster.device),
                      optimizer_impl=options.optimizer_impl,
                      clip_grad_norm=options.clip_grad_norm)


def crossing_bytes(graph: LayerGraph, cache: dict) -> list[float]:
    """Bytes crossing the cut after each layer (one pass over the edges)."""
    if "crossing" not in cache:
        diff = np.zeros(len(graph.layers) + 1)
        for src, dst, nbytes in graph.edges:
            diff[src] += nbytes
            diff[dst] -= nbytes
        cache["crossing"] = [float(x) for x in np.cumsum(diff)[:-1]]
    return cache["crossing"]


def transitions(graph: LayerGraph, cluster: ClusterSpec, options: SearchOptions,
                layouts: list[tuple], samples: int, stage_devices: int, cache: dict,
                crossing: list[float]) -> list[np.ndarray]:
    """x(j, a, b) for every j: the re-layout after layer j, forward plus backward, at the
    source layout's micro-batch (`samples` / its dp = `stage_devices` / its TP degree;
    `cost_models.estimate.relayout_s`, as the estimate prices it)."""
    out = []
    configs = {tp: step_config(graph, options, cluster, samples // (stage_devices // tp))
               for tp, _ in layouts}
    # candidates whose micro-batches scale alike share the matrices
    scales = tuple(sorted((tp, c.activation_scale) for tp, c in configs.items()))
    n_layers = len(graph.layers)
    for j in range(n_layers):
        # A TP change into a layer the executor cannot re-split is infinitely expensive.
        chain = j + 1 >= n_layers or graph.layers[j + 1].chain_input
        key = (crossing[j], tuple(layouts), chain, scales)
        if key not in cache:
            n = len(layouts)
            x = np.zeros((n, n))
            for a, (tp_a, sp_a) in enumerate(layouts):
                for b, (tp_b, sp_b) in enumerate(layouts):
                    if tp_a != tp_b and (not chain or max(tp_a, tp_b) % min(tp_a, tp_b)):
                        x[a, b] = INF  # ir.legality.layout_change_problem
                    else:
                        x[a, b] = 2 * relayout_s(crossing[j], configs[tp_a], tp_a, tp_b,
                                                 sp_a, sp_b, cluster)
            cache[key] = x
        out.append(cache[key])
    return out


def buffers_floor(graph: LayerGraph, cluster: ClusterSpec, options: SearchOptions,
                  cand: OuterCandidate, layouts: list[tuple], global_batch: int, cache: dict):
    """`walk_floor.PipelineBuffersFloor` of a 1F1B or GPipe candidate (None without a
    pipeline, or interleaved), at the least factor any of its layouts scales a boundary's
    graph bytes by (`cost_models.memory._boundary`): its layer's activation scale at its
    micro-batch (samples / its dp), sequence-split by its TP degree under SP."""
    if cand.pp == 1 or cand.virtual_stages > 1:
        return None
    samples, devices = global_batch // cand.num_microbatches, cluster.world_size // cand.pp
    configs = [step_config(graph, options, cluster, samples // (devices // tp))
               for tp, _ in layouts]
    scale = min(boundary_bytes(1.0, config, tp, sp)
                for (tp, sp), config in zip(layouts, configs))
    return PipelineBuffersFloor(crossing_bytes(graph, cache), graph.cut_points,
                                cand.num_microbatches, scale)


def sends(graph: LayerGraph, cluster: ClusterSpec, options: SearchOptions,
          layouts: list[tuple], samples: int, stage_devices: int, cache: dict,
          crossing: list[float]) -> list[tuple[float, ...]]:
    """Per cut j, per layout (tp, sp): seconds of one p2p send of the activation after
    layer j (or its gradient back) between stages of `stage_devices`, at the layout's
    micro-batch (`samples` / its dp = `stage_devices` / its TP degree), as the estimate
    prices it (`cost_models.estimate.boundary_send_s`). Equal cuts share one tuple."""
    configs = [step_config(graph, options, cluster, samples // (stage_devices // tp))
               for tp, _ in layouts]
    scales = tuple(c.activation_scale for c in configs)
    out = []
    for nbytes in crossing:
        key = ("send", nbytes, tuple(layouts), scales, stage_devices)
        if key not in cache:
            cache[key] = tuple(boundary_send_s(nbytes, config, tp, sp, cluster, stage_devices)
                               for (tp, sp), config in zip(layouts, configs))
        out.append(cache[key])
    return out


def unique(tables: list[LayerTable]) -> list[LayerTable]:
    """Each table once, in first-use order: identical layers share one table, so a
    per-table figure (a min, a column) is computed once, not once per layer."""
    return list({id(t): t for t in tables}.values())


def transient_caps(tables: list[LayerTable], levels: int, floor: bool = False) -> list[float]:
    """Caps on the max-type transient buffers: every plan needs at least the largest of
    the layers' smallest transients; try up to `levels` values from there to the top
    (`floor`: of the walk's floor figures)."""
    columns = [t.memory(floor)[2] for t in unique(tables)]
    least = max(float(c.min()) for c in columns)
    values = sorted({float(v) for c in columns for v in c if v >= least})
    if len(values) <= levels:
        return values
    return sorted({values[round(i * (len(values) - 1) / (levels - 1))] for i in range(levels)})


def select(t: LayerTable, idx: list[int]) -> LayerTable | None:
    """`t` with only the strategies at `idx` (in that order); None when there are none."""
    if not idx:
        return None
    ix = np.array(idx, dtype=np.int64)
    return LayerTable([t.strategies[i] for i in idx], t.time_s[ix], t.state_bytes[ix],
                      t.kept_bytes[ix], t.transient_bytes[ix], t.layout[ix],
                      t.floor_state_bytes[ix], t.floor_kept_bytes[ix], t.after_bytes[ix],
                      t.during_bytes[ix], t.output_bytes[ix])


def restrict(tables: list[LayerTable], keep) -> list[LayerTable] | None:
    """Tables with only the strategies `keep` accepts; identical layers keep sharing one."""
    done: dict[int, LayerTable | None] = {}
    out = []
    for t in tables:
        if id(t) not in done:
            done[id(t)] = select(t, [i for i, s in enumerate(t.strategies) if keep(s)])
        if done[id(t)] is None:
            return None
        out.append(done[id(t)])
    return out

