"""Sparse optimizer updates of embedding tables: only the rows a step looked up change.

    opt = SparseRowOptimizer(tables, SparseOptimizerSpec("rowwise_adagrad", lr=0.1))
    opt.step()   # after backward; every rank, same order (column-wise adagrad talks)

A table's gradient is a sparse COO tensor (its rows, the id gradients); `coalesce()` sums
duplicate ids first. For touched rows r with summed gradient g_r (one row of width w):

  sgd              w_r -= lr * g_r
  rowwise_adagrad  s_r += mean(g_r ** 2) over the FULL dim;  w_r -= lr * g_r / (sqrt(s_r) + eps)
                   (FBGEMM's EXACT_ROWWISE_ADAGRAD, TorchRec's default: one float per row).
                   Column-wise shards each hold a slice of g_r, so their sums of squares
                   are exchanged (one all_to_all_single for all such tables) and every shard
                   adds them in shard order: all shards keep the same s_r, equal to the
                   unsharded table's.
  adam             torch.optim.SparseAdam's lazy Adam: m_r, v_r (per element) updated only
                   for touched rows; bias correction from the table's step count (+1 every
                   step); w_r -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m_r / (sqrt(v_r) + eps).
                   Unlike dense Adam, an untouched row keeps its m, v and value (dense Adam
                   decays m and v of every row each step and keeps moving rows whose m is
                   not zero), so the reference is SparseAdam, not Adam.

Rows not in the gradient, and their state, are never written: bit-identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from executors.sharded_embedding import ReplicatedEmbedding, ShardedEmbedding, ShardedTables
from ir.embedding_tables import SPARSE_OPTIMIZERS, TableSharding
from ir.errors import PlannerError

KINDS = SPARSE_OPTIMIZERS


@dataclass(frozen=True, slots=True)
class SparseOptimizerSpec:
    kind: str
    lr: float
    eps: float = 1e-8  # FBGEMM's and torch.optim.SparseAdam's default
    betas: tuple[float, float] = (0.9, 0.999)  # Adam (Kingma & Ba 2015)'s defaults

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PlannerError(f"sparse optimizer {self.kind!r} is not one of {KINDS}")

    def __str__(self) -> str:
        return f"{self.kind}(lr={self.lr:g})"


def state_shapes(spec: SparseOptimizerSpec, rows: int, width: int) -> dict[str, tuple[int, ...]]:
    """The per-row state tensors of one shard of `rows` x `width` (besides Adam's step)."""
    if spec.kind == "rowwise_adagrad":
        return {"sum_sq": (rows,)}
    if spec.kind == "adam":
        return {"exp_avg": (rows, width), "exp_avg_sq": (rows, width)}
    return {}


class SparseRowOptimizer:
    """Row-sparse updates of the tables of one `ShardedTables`, in model order."""

    def __init__(self, tables: ShardedTables, spec: SparseOptimizerSpec):
        self.tables, self.spec = tables, spec
        self.state: dict[str, dict[str, torch.Tensor]] = {}
        for name, module in tables.modules.items():
            rows, width = module.weight.shape
            slots = {key: torch.zeros(shape, dtype=module.weight.dtype)
                     for key, shape in state_shapes(spec, rows, width).items()}
            if spec.kind == "adam":
                slots["step"] = torch.zeros((), dtype=torch.int64)
            self.state[name] = slots

    def zero_grad(self) -> None:
        for module in self.tables.modules.values():
            module.weight.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = []  # (name, module, rows, values) in model order
        for name, module in self.tables.modules.items():
            weight = module.weight
            grad = weight.grad
            if grad is None:
                rows = torch.empty(0, dtype=torch.int64)
                values = weight.new_empty((0, weight.shape[1]))
            else:
                grad = grad.coalesce()  # duplicate ids summed, rows sorted
                rows, values = grad.indices()[0], grad.values()
            grads.append((name, module, rows, values))
        square_sums = {}
        if self.spec.kind == "rowwise_adagrad":  # (n,) this shard's columns, summed over shards
            partial = {name: (values * values).sum(1) for name, _, _, values in grads}
            square_sums = _column_totals([m for _, m, _, _ in grads], partial)
        for name, module, rows, values in grads:
            self._update(name, module, rows, values, square_sums.get(name))

    def _update(self, name: str, module, rows: torch.Tensor, values: torch.Tensor,
                square_sums: torch.Tensor | None) -> None:
        weight, spec, state = module.weight, self.spec, self.state[name]
        if spec.kind == "sgd":
            weight.index_add_(0, rows, values, alpha=-spec.lr)
        elif spec.kind == "rowwise_adagrad":
            sum_sq = state["sum_sq"]
            sum_sq[rows] += square_sums / module.table.dim
            scale = spec.lr / (sum_sq[rows].sqrt() + spec.eps)  # (n,)
            weight[rows] -= values * scale[:, None]
        else:
            beta1, beta2 = spec.betas
            state["step"] += 1
            t = int(state["step"])
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            m = exp_avg[rows].mul_(beta1).add_(values, alpha=1 - beta1)
            v = exp_avg_sq[rows].mul_(beta2).addcmul_(values, values, value=1 - beta2)
            exp_avg[rows], exp_avg_sq[rows] = m, v
            step_size = spec.lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
            weight[rows] -= step_size * m / (v.sqrt() + spec.eps)


def _column_totals(modules: list, partial: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each table's `partial` (one value per touched row), summed over the column shards
    of every COLUMN_WISE table in shard order: ONE world all_to_all_single for all of them
    (to each peer, the partials of every column-wise table both ranks hold, in model
    order; none when no table is column-wise). Every column shard touched the same rows
    (each got every id), so the vectors line up row for row. Other tables: `partial`."""
    columns = [m for m in modules if isinstance(m, ShardedEmbedding)
               and m.placement.sharding is TableSharding.COLUMN_WISE]
    if not columns:
        return partial
    world = columns[0].world_size
    mine = [m for m in columns if m.shard_index is not None]
    peers = {m.table.name: [s.rank for s in m.shards] for m in mine}
    pieces = [[partial[m.table.name] for m in mine if r in peers[m.table.name]]
              for r in range(world)]  # per destination rank, model order
    splits = [sum(len(x) for x in p) for p in pieces]
    reference = next(iter(partial.values()))
    flat = [x for p in pieces for x in p]
    send = torch.cat(flat) if flat else reference.new_empty(0)
    received = reference.new_empty(sum(splits))
    dist.all_to_all_single(received, send, splits, splits)
    by_rank = dict(zip(range(world), received.split(splits)))
    totals = dict(partial)
    for m in mine:
        totals[m.table.name] = torch.zeros_like(partial[m.table.name])
    offsets = [0] * world  # each source sent its tables in model order: walk them so
    for m in mine:
        name, n = m.table.name, len(partial[m.table.name])
        for r in peers[name]:  # shard order: the same additions on every shard
            totals[name] += by_rank[r][offsets[r]:offsets[r] + n]
            offsets[r] += n
    return totals


def replicated_tables(tables: ShardedTables) -> list[ReplicatedEmbedding]:
    return [m for m in tables.modules.values() if isinstance(m, ReplicatedEmbedding)]
