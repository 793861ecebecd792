"""`planner plan-tables MODEL --cluster ... --nodes N --global-batch B [--out FILE.json]`:
place a recommendation model's embedding tables on ranks (dense part data-parallel),
beside the TorchRec-style greedy placement under the same cost model.

    planner plan-tables dlrm-criteo-tb --cluster a100-80g --nodes 2 --global-batch 65536

`--out` writes a whole plan file (planner.plan/v1: the dense layers' data-parallel
strategy searched as `planner plan` does, these table placements in "embedding_tables")
that `planner validate` and `auto_parallel(plan=...)` run; `--json` prints the
placement report (planner.table_plan/v1).
"""

from __future__ import annotations

import json

import torch

from cost_models.clusters import get_cluster, preset_names
from cost_models.embedding import OPTIMIZER_STATE
from ir.embedding_tables import TableSharding
from ir.errors import PlannerError
from planner import table_report
from planner.models import load_model
from planner.table_inventory import find_tables, with_profile
from planner.table_hybrid import hybrid_document, plan_hybrid
from ir.plan import save_plan
from planner.arg_types import check_out
from planner.commands.estimate import default_precision
from planner.models import load_layer_graph
from planner.search_space import SearchOptions

# Samples per example input when reading the tables' ids per sample (any batch works).
PROBE_BATCH = 2


def register(sub) -> None:
    p = sub.add_parser("plan-tables", help="place embedding tables on ranks (recommendation models)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("model", metavar="MODEL", help="preset (dlrm-criteo-tb, dlrm-large, ...), "
                   "family:overrides or package.module:factory")
    p.add_argument("--cluster", default="a100-80g",
                   help=f"preset ({', '.join(preset_names())}) or spec JSON (default a100-80g)")
    p.add_argument("--nodes", type=int, default=None, help="number of nodes (preset's: 1)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="devices per node")
    p.add_argument("--global-batch", type=int, required=True, help="samples per step")
    p.add_argument("--optimizer", default="rowwise_adagrad", choices=sorted(OPTIMIZER_STATE),
                   help="sparse optimizer of the tables (rowwise_adagrad)")
    p.add_argument("--method", default="auto", choices=["auto", "exact", "heuristic"],
                   help="exact branch and bound or the LPT + local-search heuristic "
                        "(auto: exact for small instances)")
    p.add_argument("--sharding", default=None, metavar="KIND[,KIND...]",
                   help="pin the tables' shardings, cycled over the tables in order (e.g. "
                        "table_wise, or table_wise,row_range,column_wise,replicated for a "
                        "mixed plan); ranks are still searched")
    p.add_argument("--ids", default=None, metavar="SAMPLE.pt",
                   help="a sample of real ids, {table name: int tensor} saved with torch.save "
                        "(loaded as data only): measures each table's hot-row fraction")
    p.add_argument("--out", default=None, metavar="FILE.json",
                   help="write the plan file (planner.plan/v1, with the dense part)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.set_defaults(func=run)


def run(args) -> int:
    cluster = get_cluster(args.cluster, nodes=args.nodes, gpus_per_node=args.gpus_per_node)
    if args.global_batch % cluster.world_size:
        raise PlannerError(f"--global-batch {args.global_batch} does not split evenly over "
                           f"{cluster.world_size} ranks; use a multiple of {cluster.world_size}")
    loaded = load_model(args.model, micro_batch=PROBE_BATCH, device="meta")
    tables = find_tables(loaded.module, loaded.inputs)
    if not tables:
        raise PlannerError(f"model {args.model!r} has no embedding tables (nn.Embedding, "
                           "nn.EmbeddingBag); use `planner plan` for dense models")
    if args.ids:
        tables = profile_tables(tables, args.ids)
    if args.out:
        check_out(args.out)
    # the dense part searched (its estimate is the placement's dense cost), tables placed
    precision = default_precision(cluster)
    graph = load_layer_graph(args.model, 1, None, getattr(torch, precision.compute_dtype))
    hybrid = plan_hybrid(graph, tables, cluster, args.global_batch,
                         SearchOptions(precision=precision), loaded.module, loaded.inputs,
                         args.optimizer, args.method, parse_pins(args.sharding))
    plan = hybrid.tables
    if args.out:  # the whole plan: the dense part's strategy, these tables placed
        save_plan(hybrid_document(graph, cluster, hybrid, model_spec=args.model), args.out)
    document = table_report.to_json(plan, args.model, cluster.name, cluster.world_size,
                                    args.global_batch, args.optimizer)
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{args.model}: {len(tables)} tables, {sum(t.param_bytes for t in tables) / 2**30:.1f} "
          f"GiB, on {cluster.num_nodes} x {cluster.devices_per_node} {cluster.device}, "
          f"global batch {args.global_batch}, {args.optimizer}")
    print()
    print(table_report.render(plan, cluster.world_size))
    if args.out:
        print(f"plan written to {args.out}")
    return 0


def parse_pins(text: str | None) -> list[TableSharding] | None:
    """`--sharding a,b,...` as TableSharding values; None when not given."""
    if text is None:
        return None
    known = [s.value for s in TableSharding]
    pins = []
    for word in text.split(","):
        if word.strip() not in known:
            raise PlannerError(f"--sharding: {word.strip()!r} is not a sharding; use one of "
                               f"{', '.join(known)}")
        pins.append(TableSharding(word.strip()))
    return pins


def profile_tables(tables, path: str):
    """Tables with their hot-row fraction measured from the id sample at `path`."""
    try:
        sample = torch.load(path, map_location="cpu", weights_only=True)  # data, never code
    except (OSError, RuntimeError, ValueError) as exc:
        raise PlannerError(f"cannot read the id sample {path}: {exc}") from None
    if not isinstance(sample, dict) or not all(isinstance(v, torch.Tensor) for v in sample.values()):
        raise PlannerError(f"id sample {path}: expected {{table name: int tensor}}")
    names = {t.name for t in tables}
    unknown = sorted(set(sample) - names)
    if unknown:
        raise PlannerError(f"id sample {path}: no table named {', '.join(unknown)}; the model's "
                           f"tables are {', '.join(sorted(names))}")
    out = []
    for t in tables:
        ids = sample.get(t.name)
        if ids is not None and (ids.is_floating_point() or (ids.numel() and (ids.min() < 0 or ids.max() >= t.rows))):
            raise PlannerError(f"id sample {path}: table {t.name} ids must be integers in "
                               f"[0, {t.rows})")
        out.append(with_profile(t, ids) if ids is not None and ids.numel() else t)
    return out
