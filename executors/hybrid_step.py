"""One training step of a model with sharded tables: tables model parallel, the rest data
parallel (TorchRec's hybrid parallelism, DLRM's usual plan).

    trainer = HybridTrainer(model, tables, torch.optim.SGD(dense, lr), SparseRowOptimizer(...),
                            loss_fn)
    loss = trainer.step(local_inputs, local_target, global_batch=64)   # the global mean loss

Gradient scaling: each rank's loss is its local mean times local_batch / global_batch, so
the ranks' losses add up to the mean over the global batch. Then every gradient is a SUM
over ranks, with no division: the dense gradients by one all-reduce (one flat bucket,
as DDP's), a sharded table's rows already by the all-to-all that brings every rank's
pooled gradient to the holder, a replicated table's sparse rows by an all-gather of
(rows, values). The result is the single-process gradient of the global mean loss.

Clipping (`max_grad_norm`: single-device `torch.nn.utils.clip_grad_norm_` over all
parameters, the tables' gradients dense; TorchRec's fused tables step in the backward,
unclipped by its GradientClippingOptimizer): after those
collectives, `executors.grad_clip.clip_grad_norm` over the dense gradients (equal on
every rank: copies = world) and the tables' (coalesced) sparse ones, one scalar
all-reduce, then both optimizers step on the scaled gradients; `last_grad_norm` is the
norm before the clip, read to the host only when asked.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from executors.grad_clip import check_max_grad_norm, clip_grad_norm
from executors.sharded_embedding import ShardedTables
from executors.sparse_optimizer import SparseRowOptimizer, replicated_tables


def all_reduce_dense(params: list[nn.Parameter]) -> None:
    """SUM every dense gradient over the ranks, as one flat buffer (a missing grad is 0)."""
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def all_gather_sparse(weight: nn.Parameter) -> None:
    """Replace a replicated table's sparse gradient (this rank's ids) by the concatenation
    of every rank's, in rank order (equal on all ranks; the optimizer coalesces)."""
    world, dim = dist.get_world_size(), weight.shape[1]
    grad = weight.grad.coalesce() if weight.grad is not None else None
    rows = grad.indices()[0] if grad is not None else torch.empty(0, dtype=torch.int64)
    values = grad.values() if grad is not None else weight.new_empty((0, dim))
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([len(rows)]))
    most = int(max(c.item() for c in counts))
    padded_rows = torch.zeros(most, dtype=torch.int64)
    padded_rows[:len(rows)] = rows
    padded_values = weight.new_zeros((most, dim))
    padded_values[:len(rows)] = values
    all_rows = [torch.empty_like(padded_rows) for _ in range(world)]
    all_values = [torch.empty_like(padded_values) for _ in range(world)]
    dist.all_gather(all_rows, padded_rows)
    dist.all_gather(all_values, padded_values)
    keep = [int(c) for c in counts]
    rows = torch.cat([r[:k] for r, k in zip(all_rows, keep)])
    values = torch.cat([v[:k] for v, k in zip(all_values, keep)])
    weight.grad = torch.sparse_coo_tensor(rows[None], values, weight.shape,
                                          check_invariants=False)


def broadcast_from_rank0(tensors: list[torch.Tensor]) -> None:
    """Start every rank from rank 0's values (DDP does the same at construction)."""
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t, src=0)


class HybridTrainer:
    def __init__(self, model: nn.Module, tables: ShardedTables,
                 dense_optimizer: torch.optim.Optimizer, sparse_optimizer: SparseRowOptimizer,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 max_grad_norm: float | None = None):
        self.model, self.tables, self.loss_fn = model, tables, loss_fn
        # clip to this global L2 norm before each step (None: no clipping), module docstring
        self.max_grad_norm = check_max_grad_norm(max_grad_norm)
        self._grad_norm: torch.Tensor | None = None  # the last step's, on the device
        self.dense_optimizer, self.sparse_optimizer = dense_optimizer, sparse_optimizer
        self.dense_params = tables.dense_parameters(model)
        self.steps = 0
        broadcast_from_rank0([p.detach() for p in self.dense_params]
                             + [m.weight.detach() for m in replicated_tables(tables)])

    def step(self, inputs: dict[str, torch.Tensor], target: torch.Tensor,
             global_batch: int) -> float:
        """One optimizer step on this rank's share (`inputs`, `target`) of a global batch of
        `global_batch` samples; returns the global batch's mean loss."""
        self.dense_optimizer.zero_grad(set_to_none=True)
        self.sparse_optimizer.zero_grad()
        output = self.model(**inputs)
        loss = self.loss_fn(output, target) * (len(target) / global_batch)
        loss.backward()
        all_reduce_dense(self.dense_params)
        for module in replicated_tables(self.tables):
            all_gather_sparse(module.weight)
        if self.max_grad_norm is not None:
            world = dist.get_world_size()
            self._grad_norm, _ = clip_grad_norm(
                self.model.named_parameters(), lambda p: world,
                self.max_grad_norm, loss.device, tables=self.tables)
        self.sparse_optimizer.step()
        self.dense_optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        self.steps += 1
        return float(total)

    @property
    def last_grad_norm(self) -> float | None:
        """The last step's global gradient norm before clipping, the same on every rank
        (None: no clipping asked or no step yet); read to the host only here."""
        return None if self._grad_norm is None else float(self._grad_norm)
