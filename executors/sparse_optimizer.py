"""Sparse optimizer updates of embedding tables: only the rows a step looked up change.

    opt = SparseRowOptimizer(tables, SparseOptimizerSpec("rowwise_adagrad", lr=0.1))
    opt.step()   # after backward; every rank, same order (column-wise adagrad talks)

A table's gradient is a sparse COO tensor (its rows, the id gradients); `coalesce()` sums
duplicate ids first. For touched rows r with summed gradient g_r (one row of width w):

  sgd              w_r -= lr * g_r
  rowwise_adagrad  s_r += mean(g_r ** 2) over the FULL dim;  w_r -= lr * g_r / (sqrt(s_r) + eps)
                   (FBGEMM's EXACT_ROWWISE_ADAGRAD, TorchRec's default: one float per row).
                   Column-wise shards each hold a slice of g_r, so their sums of squares
                   are exchanged (all_to_all_single among the shard ranks) and every shard
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
        for name, module in self.tables.modules.items():
            weight = module.weight
            grad = weight.grad
            if grad is None:
                rows = torch.empty(0, dtype=torch.int64)
                values = weight.new_empty((0, weight.shape[1]))
            else:
                grad = grad.coalesce()  # duplicate ids summed, rows sorted
                rows, values = grad.indices()[0], grad.values()
            self._update(name, module, rows, values)

    def _update(self, name: str, module, rows: torch.Tensor, values: torch.Tensor) -> None:
        weight, spec, state = module.weight, self.spec, self.state[name]
        if spec.kind == "sgd":
            weight.index_add_(0, rows, values, alpha=-spec.lr)
        elif spec.kind == "rowwise_adagrad":
            square_sums = (values * values).sum(1)  # (n,) this shard's columns
            square_sums = _column_total(module, square_sums)
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


def _column_total(module, partial: torch.Tensor) -> torch.Tensor:
    """Sum `partial` (one value per touched row) over the column shards of a COLUMN_WISE
    table, in shard order (a world all_to_all_single; ranks without a shard send and
    receive nothing). Every column shard touched the same rows (each got every id), so
    the vectors line up row for row. Other tables: `partial` itself."""
    if not (isinstance(module, ShardedEmbedding)
            and module.placement.sharding is TableSharding.COLUMN_WISE):
        return partial
    world = module.world_size
    peers = [s.rank for s in module.shards]
    mine = module.shard_index is not None
    splits = [len(partial) if mine and r in peers else 0 for r in range(world)]
    send = partial.repeat(len(peers)) if mine else partial.new_empty(0)
    received = partial.new_empty(sum(splits))
    dist.all_to_all_single(received, send, splits, splits)
    if not mine:
        return partial
    by_rank = dict(zip((r for r in range(world) if splits[r]),
                       received.view(len(peers), len(partial))))
    total = torch.zeros_like(partial)
    for r in peers:  # shard order: the same additions on every shard
        total += by_rank[r]
    return total


def replicated_tables(tables: ShardedTables) -> list[ReplicatedEmbedding]:
    return [m for m in tables.modules.values() if isinstance(m, ReplicatedEmbedding)]
