"""Find a model's embedding tables: the table planner's inputs (the dense part is priced
by `planner.table_hybrid.dense_estimate`).

`find_tables(module, inputs)` runs the model once (on meta: shapes only) with a hook on
every table and returns one `EmbeddingTable` per table: rows, dimension, dtype bytes,
pooling and ids per sample, read from the ids the table actually received. A table is an
`nn.Embedding`, an `nn.EmbeddingBag`, or any module that has `num_embeddings`,
`embedding_dim` and a 2-D `weight` of that shape (user re-implementations, quantised
wrappers). `hot_row_fraction(ids, rows)` measures the hot-row share from a sample of real
ids; `measured_shard_shares` measures how a row-sharded table's lookups split.

    >>> loaded = load_model("dlrm-small", micro_batch=8)          # doctest: +SKIP
    >>> [str(t.name) for t in find_tables(loaded.module, loaded.inputs)][:2]
    ['tables.0', 'tables.1']
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from cost_models.embedding import HOT_ROW_SHARE
from ir.embedding_tables import (EmbeddingTable, HashRing, TableDtype, TableSharding,
                                 row_shard_bounds)
from ir.errors import PlannerError


def is_table(module: nn.Module) -> bool:
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return True
    weight = getattr(module, "weight", None)
    rows, dim = getattr(module, "num_embeddings", None), getattr(module, "embedding_dim", None)
    return (isinstance(rows, int) and isinstance(dim, int) and isinstance(weight, torch.Tensor)
            and tuple(weight.shape) == (rows, dim))


def _pooling(module: nn.Module) -> str | None:
    if isinstance(module, nn.Embedding):
        return None
    return getattr(module, "mode", None)


def find_tables(module: nn.Module, inputs: dict[str, torch.Tensor]) -> list[EmbeddingTable]:
    """Every table of `module` with the ids per sample its forward on `inputs` gives it."""
    found = [(name, m) for name, m in module.named_modules() if name and is_table(m)]
    if not found:
        return []
    batch = _batch_size(inputs)
    ids_per_sample: dict[str, float] = {}
    hooks = []
    for name, m in found:
        def hook(mod, args, kwargs, name=name):
            ids = args[0] if args else kwargs.get("input")
            offsets = args[1] if len(args) > 1 else kwargs.get("offsets")
            # (B, L) ids, or flat ids with B offsets: L = numel / B per sample; a table
            # called more than once per forward adds up its calls
            samples = batch if offsets is not None or ids.dim() > 1 else 1
            ids_per_sample[name] = ids_per_sample.get(name, 0) + ids.numel() / samples
        hooks.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            module(**inputs)
    finally:
        for h in hooks:
            h.remove()
    out = []
    for name, m in found:
        if name not in ids_per_sample:
            raise PlannerError(f"table {name}: the model's forward never looked it up on the "
                               "example inputs; give inputs that reach every table")
        per_sample = ids_per_sample[name]
        out.append(EmbeddingTable(name=name, rows=int(m.weight.shape[0]), dim=int(m.weight.shape[1]),
                                  dtype=TableDtype.of(m.weight.dtype, name), pooling=_pooling(m),
                                  ids_per_sample=max(1, round(per_sample))))
    return out


def _batch_size(inputs: dict[str, torch.Tensor]) -> int:
    sizes = {t.shape[0] for t in inputs.values() if isinstance(t, torch.Tensor) and t.dim() > 0}
    if len(sizes) != 1:
        raise PlannerError(f"example inputs disagree on the batch size: {sorted(sizes)}")
    return sizes.pop()


def hot_row_fraction(ids: torch.Tensor, rows: int) -> float:
    """Share of the lookups in `ids` that hit the most frequent 1% of rows (at least one)."""
    counts = torch.bincount(ids.reshape(-1).to(torch.int64), minlength=rows)
    top = max(1, int(HOT_ROW_SHARE * rows))
    return float(torch.topk(counts, min(top, rows)).values.sum() / max(1, ids.numel()))


def with_profile(table: EmbeddingTable, ids: torch.Tensor) -> EmbeddingTable:
    """`table` with its hot-row fraction measured from a sample of its ids."""
    return dataclasses.replace(table, hot_row_fraction=hot_row_fraction(ids, table.rows))


def measured_shard_shares(table: EmbeddingTable, ids: torch.Tensor, sharding: TableSharding,
                          num_shards: int) -> list[float]:
    """Share of the sampled lookups each row shard serves (range: key ranges; hash: the
    executor's ring), for `cost_models.embedding.lookup_shares(measured=...)`."""
    flat = ids.reshape(-1).to(torch.int64)
    if sharding is TableSharding.ROW_HASH:
        owner = HashRing.build(table.name, num_shards).owner(flat, table.name)
    elif sharding.splits_rows:
        stops = torch.tensor([stop for _, stop in row_shard_bounds(table.rows, num_shards)])
        owner = torch.searchsorted(stops, flat, right=True)
    else:
        raise PlannerError(f"table {table.name}: {sharding} does not split rows")
    counts = torch.bincount(owner, minlength=num_shards).to(torch.float64)
    return (counts / max(1, flat.numel())).tolist()
