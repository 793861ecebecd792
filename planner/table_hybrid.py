"""Recommendation models end to end: the dense layers searched data parallel, the tables
placed model parallel, one plan (`ParallelPlan.embeddings`) and one prediction.

    tables = recommendation_tables(module, inputs, graph)      # [] for a dense model
    hybrid = plan_hybrid(graph, tables, cluster, 4096, options, module, inputs)
    hybrid.plan.embeddings.tables[0]   # PlacedTable(tables.0: row_range on [0, 1, 2, 3])

The plan is TorchRec's hybrid: every table is sharded by `planner.table_placement`
(its cost model `cost_models.embedding`); every other layer runs data parallel over all
ranks in one stage, its strategy (ZeRO stage, checkpointing, micro-batches) searched by
`planner.search` on the layer graph with the table layers' parameters taken out
(`dense_graph`: their shards, gradients and optimizer state are the embedding model's).

Prediction (`combined_prediction`): the step is the dense estimate (`dense_estimate`:
the ONE dense figure, which the placement search also prices its steps with) plus the
slowest rank's table seconds (lookups, sparse update, all-to-alls: the all-to-alls synchronise
every rank, so the slowest sets the step: `cost_models.embedding`'s accounting); rank r's
peak is the dense peak plus its tables' bytes (shards + optimizer state).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from torch import nn

from cost_models.common import model_layer_configs
from cost_models.embedding import DenseCost, EmbeddingConfig, PlacementCost, evaluate
from cost_models.estimate import Estimate, estimate
from ir.cluster import ClusterSpec
from ir.embedding_tables import EmbeddingPlan, EmbeddingTable, PlacedTable
from ir.errors import PlannerError
from ir.kernel_records import KernelRecords
from ir.layer import LayerGraph
from ir.plan import ParallelPlan, PlanDocument, model_identity, record_implementation
from planner.search import search
from planner.search_space import SearchOptions
from planner.search_stats import SearchStats
from planner.table_inventory import find_tables
from planner.table_placement import TablePlan, plan_tables
from planner.table_report import cost_json

# Module classes whose layers may be recommendation tables (pooled lookups): a layer of
# this kind alone is what `recommendation_tables` looks at before tracing the model.
TABLE_LAYER_KINDS = ("EmbeddingBag",)
DEFAULT_SPARSE_OPTIMIZER = "rowwise_adagrad"  # TorchRec's and FBGEMM's default


def has_table_layers(graph: LayerGraph) -> bool:
    return any(layer.kind in TABLE_LAYER_KINDS for layer in graph.layers)


def recommendation_tables(module: nn.Module, inputs: dict,
                          graph: LayerGraph) -> list[EmbeddingTable]:
    """The model's pooled tables (EmbeddingBag-like, sum or mean) that are layers of their
    own: those the hybrid plan shards. A token embedding (nn.Embedding, no pooling, often
    tied to the head) stays an ordinary layer."""
    if not has_table_layers(graph):
        return []
    names = {layer.name for layer in graph.layers}
    if any(p.is_meta for p in module.parameters()):  # a meta build: shapes only
        inputs = {k: v.to("meta") if hasattr(v, "to") else v for k, v in inputs.items()}
    return [t for t in find_tables(module, inputs)
            if t.pooling in ("sum", "mean") and t.name in names]


def dense_graph(graph: LayerGraph, table_names: set[str]) -> LayerGraph:
    """`graph` with the table layers' parameters and kernels taken out (the embedding
    cost model prices their shards, lookups and sparse updates: the executor never runs
    a table's dense gradient); everything else, activations included, as measured."""
    no_compute = dict(flops_fwd=0, flops_bwd=0, ops_fwd=0, ops_bwd=0, random_elements_fwd=0,
                      random_tp_sharded_elements_fwd=0, kernels=KernelRecords())
    layers = tuple(dataclasses.replace(
        layer, params=0, param_bytes=0, tp_params=0, max_param_numel=0, param_names=(),
        measured=dataclasses.replace(layer.measured, **no_compute))
        if layer.name in table_names else layer for layer in graph.layers)
    params = graph.num_params - sum(l.params for l in graph.layers if l.name in table_names)
    return dataclasses.replace(graph, layers=layers, num_params=params, _graph=None)


def hybrid_options(options: SearchOptions) -> SearchOptions:
    """The dense part's search space: one stage, data parallel (tp = 1)."""
    if options.tp not in (None, 1) or options.pp not in (None, 1):
        raise PlannerError(f"a model with sharded tables runs its dense layers data parallel "
                           f"in one stage; drop --tp {options.tp} / --pp {options.pp}")
    return dataclasses.replace(options, tp=None, pp=None, max_tp=1, no_pp=True)


@dataclass
class HybridPlan:
    plan: ParallelPlan
    predicted: dict  # the dense estimate's JSON with the tables added (combined_prediction)
    tables: TablePlan  # the placement, the greedy baseline's, their costs
    stats: SearchStats


def plan_hybrid(graph: LayerGraph, tables: list[EmbeddingTable], cluster: ClusterSpec,
                global_batch: int, options: SearchOptions, module: nn.Module, inputs: dict,
                sparse_optimizer: str = DEFAULT_SPARSE_OPTIMIZER,
                method: str = "auto", pins: list | None = None,
                executor_model: nn.Module | None = None) -> HybridPlan:
    """Search the dense part, place the tables, and join them into one plan (`pins`:
    `plan_tables`'s sharding per table; `executor_model`: the module the executor gets,
    whose build decides how the dense part's memory is priced, `planner.search.search`)."""
    if not tables:
        raise PlannerError(f"{graph.model} has no pooled embedding tables to shard")
    names = {t.name for t in tables}
    result = search(dense_graph(graph, names), cluster, global_batch, hybrid_options(options),
                    model=executor_model)
    if result.best is None:
        raise PlannerError(f"no data-parallel plan for {graph.model}'s dense layers fits "
                           f"{cluster.device_memory_bytes / 2**30:.1f} GiB per device; add "
                           "devices or shrink the global batch")
    dense = dense_estimate(graph, names, result.best.plan, cluster, model=executor_model)
    placed = plan_tables(tables, cluster, table_config(result.best.plan, sparse_optimizer),
                         DenseCost.of(dense), method=method, pins=pins)
    by_name = {p.table: p for p in placed.placements}
    embeddings = EmbeddingPlan(tuple(PlacedTable(t, by_name[t.name]) for t in tables),
                               sparse_optimizer, cluster.devices_per_node)
    plan = dataclasses.replace(result.best.plan, embeddings=embeddings)
    predicted = combined_prediction(dense.to_json(), placed.cost, global_batch)
    return HybridPlan(plan, predicted, placed, result.stats)


def table_config(plan: ParallelPlan, sparse_optimizer: str) -> EmbeddingConfig:
    """The tables' step under `plan` (its global batch, whether it clips): one figure for
    the placement search (`plan_hybrid`) and the estimate (`price_hybrid`)."""
    return EmbeddingConfig(plan.global_batch, sparse_optimizer, plan.clip_grad_norm)


def dense_estimate(graph: LayerGraph, table_names: set[str], plan: ParallelPlan,
                   cluster: ClusterSpec, profile=None, model: nn.Module | None = None
                   ) -> Estimate:
    """The dense part of a hybrid plan: `cost_models.estimate` of its layers with the
    tables taken out (`dense_graph`). One function for the table planner's dense cost
    (`DenseCost.of`), `planner estimate` and `planner validate` (`price_hybrid`); its
    memory as the executor runs `model` (`cost_models.common.model_layer_configs`)."""
    dense = dense_graph(graph, table_names)
    return estimate(dense, plan, cluster, profile,
                    configs=model_layer_configs(dense, plan, cluster.device, model))


def combined_prediction(dense: dict, cost: PlacementCost, global_batch: int) -> dict:
    """The dense estimate's JSON (`Estimate.to_json`) with the tables' time and bytes
    added (module docstring); `embedding` holds the tables' per-rank breakdown."""
    out = copy.deepcopy(dense)
    table_s = cost.max_embedding_s
    out["iteration_seconds"] = dense["iteration_seconds"] + table_s  # = cost.step_s
    out["samples_per_second"] = global_batch / out["iteration_seconds"]
    out["time"] = {**dense.get("time", {}), "embedding": table_s}
    stage = out["memory"]["stages"][0]  # one stage: ParallelPlan's rule for tables
    world = len(cost.memory_bytes)
    dense_peaks = stage.get("device_peak_bytes") or [stage["peak_bytes"]] * world
    peaks = [int(b + m) for b, m in zip(dense_peaks, cost.memory_bytes)]
    stage["device_peak_bytes"] = peaks
    stage["peak_bytes"] = max(peaks)
    stage.setdefault("breakdown", {})["tables"] = int(max(cost.memory_bytes))
    out["memory"]["peak_bytes"] = max(peaks)
    out["embedding"] = cost_json(cost)
    return out


def hybrid_document(graph: LayerGraph, cluster: ClusterSpec, hybrid: HybridPlan,
                    extra: dict | None = None, model_spec: str | None = None) -> PlanDocument:
    """The plan file of a hybrid plan; `search.tables` records the placement method, its
    lower bound and the TorchRec-style greedy baseline's step under the same model."""
    t = hybrid.tables
    tables = {"method": t.method, "plan_s": t.plan_s, "step_s": t.cost.step_s,
              "lower_bound_s": t.lower_bound_s, "imbalance": t.cost.imbalance,
              "greedy_step_s": t.greedy_cost.step_s if t.greedy_cost else None}
    return PlanDocument(plan=record_implementation(hybrid.plan, cluster.device),
                        model_name=graph.model, cluster=cluster.to_dict(),
                        predicted=hybrid.predicted,
                        search={**hybrid.stats.to_json(), "tables": tables, **(extra or {})},
                        model_spec=model_spec, **model_identity(graph))


# Samples per example input when reading a zoo model's tables (any batch works).
PROBE_BATCH = 2


def plan_spec_hybrid(model_spec: str, graph: LayerGraph, cluster: ClusterSpec,
                     global_batch: int, options: SearchOptions,
                     sparse_optimizer: str = DEFAULT_SPARSE_OPTIMIZER,
                     method: str = "auto", meta_init: bool = False) -> HybridPlan | None:
    """`plan_hybrid` for a MODEL spec (built on meta to read its tables); None when the
    model has no pooled tables of its own (a dense model: plan it as usual). `meta_init`:
    the executor gets the model built on meta (priced so, `planner.search.search`)."""
    from planner.models import load_model

    if not has_table_layers(graph):
        return None
    loaded = load_model(model_spec, micro_batch=PROBE_BATCH, device="meta")
    tables = recommendation_tables(loaded.module, loaded.inputs, graph)
    if not tables:
        return None
    return plan_hybrid(graph, tables, cluster, global_batch, options, loaded.module,
                       loaded.inputs, sparse_optimizer, method,
                       executor_model=loaded.module if meta_init else None)


def price_hybrid(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec,
                 profile=None, model: nn.Module | None = None
                 ) -> tuple[Estimate, PlacementCost]:
    """A hybrid plan priced on `cluster` (e.g. a calibrated spec): the dense layers by
    `cost_models.estimate` with the tables' parameters taken out, the placement as it
    stands by `cost_models.embedding.evaluate` (its tables' seconds and bytes only)."""
    tables = [t.table for t in plan.embeddings.tables]
    dense = dense_estimate(graph, {t.name for t in tables}, plan, cluster, profile, model)
    cost = evaluate(tables, plan.embeddings.placements, cluster,
                    table_config(plan, plan.embeddings.sparse_optimizer), DenseCost.of(dense))
    return dense, cost


def estimate_hybrid(graph: LayerGraph, plan: ParallelPlan, cluster: ClusterSpec) -> dict:
    """`price_hybrid` as the JSON of `combined_prediction`."""
    dense, cost = price_hybrid(graph, plan, cluster)
    return combined_prediction(dense.to_json(), cost, plan.global_batch)
