"""The table plan for people (`render`) and for programs (`to_json`, `write_json`).

    table      sharding     ranks          rows       GiB
    tables.0   column_wise  3,12           40.00M     19.07
    ...
    rank  memory GiB  lookup ms  update ms  comm ms  total ms
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from cost_models.embedding import PlacementCost
from ir.embedding_tables import EmbeddingPlan, EmbeddingTable, TablePlacement
from planner.fmt import human_count, table
from planner.table_placement import TablePlan

TABLE_PLAN_SCHEMA = "planner.table_plan/v1"
GiB = 2**30


def _ranks_text(ranks: tuple[int, ...], world: int) -> str:
    if len(ranks) == world and ranks == tuple(range(world)):
        return f"all {world}"
    if len(ranks) > 2 and ranks == tuple(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def placement_table(tables: list[EmbeddingTable], placements: list[TablePlacement],
                    world: int) -> str:
    """table -> sharding -> ranks, with its size."""
    by_name = {t.name: t for t in tables}
    rows = []
    for p in placements:
        t = by_name[p.table]
        rows.append([p.table, str(p.sharding), _ranks_text(p.ranks, world), human_count(t.rows),
                     t.dim, f"{t.param_bytes / GiB:.2f}"])
    return table(["table", "sharding", "ranks", "rows", "dim", "GiB"], rows)


def rank_table(ranks: list[dict]) -> str:
    """Memory and seconds per rank, from `cost_json(cost)["ranks"]` (a plan file's
    `predicted.embedding.ranks` reads the same)."""
    rows = [[r["rank"], f"{r['memory_bytes'] / GiB:.2f}", f"{r['lookup_s'] * 1e3:.3f}",
             f"{r['update_s'] * 1e3:.3f}", f"{r['comm_s'] * 1e3:.3f}", f"{r['total_s'] * 1e3:.3f}"]
            for r in ranks]
    return table(["rank", "memory GiB", "lookup ms", "update ms", "comm ms", "total ms"], rows,
                 right=set(range(6)))


def summary(plan: TablePlan) -> str:
    def line(name: str, c: PlacementCost) -> str:
        return (f"{name:<22} step {c.step_s * 1e3:8.3f} ms  = dense {c.dense_s * 1e3:.3f} + "
                f"slowest rank {c.max_embedding_s * 1e3:.3f}; imbalance {c.imbalance * 100:5.1f}%; "
                f"peak {max(c.memory_bytes) / GiB:.2f} of {c.capacity_bytes / GiB:.2f} GiB")
    out = [line(f"plan ({plan.method})", plan.cost)]
    if plan.greedy_cost is not None:
        out.append(line("TorchRec-style greedy", plan.greedy_cost))
        out.append(f"speed-up over greedy: {plan.greedy_cost.step_s / plan.cost.step_s:.3f}x")
    out.append(f"lower bound {plan.lower_bound_s * 1e3:.3f} ms: the plan is within "
               f"{plan.gap * 100:.1f}% of optimal; planned in {plan.plan_s:.2f} s")
    return "\n".join(out)


def render(plan: TablePlan, world: int) -> str:
    return "\n\n".join([placement_table(plan.tables, plan.placements, world),
                        rank_table(cost_json(plan.cost)["ranks"]), summary(plan)])


def plan_tables_text(embeddings: EmbeddingPlan, world: int, embedding: dict | None) -> str:
    """A plan file's tables: placements, and (`embedding`: its prediction's per-rank
    `cost_json`) memory and seconds per rank with the slowest rank's line."""
    out = [f"tables ({embeddings.sparse_optimizer} sparse optimizer):",
           placement_table([t.table for t in embeddings.tables], embeddings.placements, world)]
    if embedding:
        out += ["", rank_table(embedding["ranks"]),
                f"tables: slowest rank {embedding['max_embedding_s'] * 1e3:.3f} ms per step, "
                f"imbalance {embedding['imbalance'] * 100:.1f}%, largest rank's tables "
                f"{max(r['memory_bytes'] for r in embedding['ranks']) / GiB:.2f} GiB"]
    return "\n".join(out)


def cost_json(c: PlacementCost) -> dict:
    return {"step_s": c.step_s, "dense_s": c.dense_s,
            "max_embedding_s": c.max_embedding_s, "imbalance": c.imbalance, "fits": c.fits,
            "capacity_bytes": c.capacity_bytes,
            "ranks": [{"rank": r, "memory_bytes": m, "lookup_s": t.lookup_s, "update_s": t.update_s,
                       "comm_s": t.comm_s, "total_s": t.total_s}
                      for r, (t, m) in enumerate(zip(c.per_rank, c.memory_bytes))]}


def _placements_json(placements: list[TablePlacement]) -> list[dict]:
    return [{"table": p.table, "sharding": p.sharding.value, "ranks": list(p.ranks)}
            for p in placements]


def to_json(plan: TablePlan, model: str, cluster_name: str, world: int, global_batch: int,
            optimizer: str) -> dict:
    return {
        "schema": TABLE_PLAN_SCHEMA, "model": model, "cluster": cluster_name, "world_size": world,
        "global_batch": global_batch, "sparse_optimizer": optimizer, "method": plan.method,
        "plan_s": plan.plan_s, "lower_bound_s": plan.lower_bound_s, "gap": plan.gap,
        "tables": [{"name": t.name, "rows": t.rows, "dim": t.dim, "dtype": t.dtype.value,
                    "dtype_bytes": t.dtype_bytes,
                    "pooling": t.pooling, "ids_per_sample": t.ids_per_sample,
                    "hot_row_fraction": t.hot_row_fraction} for t in plan.tables],
        "placements": _placements_json(plan.placements),
        "predicted": cost_json(plan.cost),
        "greedy": None if plan.greedy_cost is None else {
            "placements": _placements_json(plan.greedy_placements),
            "predicted": cost_json(plan.greedy_cost)},
    }


def write_json(document: dict, path: str | os.PathLike) -> None:
    """Atomically: a temporary file in the same folder, then os.replace."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(document, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
