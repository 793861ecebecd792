"""Each data-parallel rank's share of every global batch.

Every rank is handed the same GLOBAL batch (same seed, or the same rows of a dataset) and
keeps its share: the global batch is cut into `num_microbatches` consecutive
micro-batches, and data-parallel index c of dp keeps the c-th of dp contiguous blocks of
each. Over the dp replicas every sample is used exactly once per step (DistributedSampler
semantics), the tensor-parallel ranks of one replica keep the same rows, and the order
agrees with `executors.layout` (a block of dp=a is the concatenation of f blocks of dp=a·f).

Tensors whose dim 0 is not the global batch (e.g. shared position ids) are passed whole.

    >>> rows = local_rows(global_batch=8, num_microbatches=2, dp=2, dp_index=1)
    >>> rows.tolist()  # micro-batch 0 is rows 0-3, micro-batch 1 rows 4-7
    [2, 3, 6, 7]

`global_batch_indices` walks a dataset in global batches (every rank draws the same
permutation from the same seed); index a dataset with them, then `shard_batch`.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from ir.errors import PlannerError


def local_rows(global_batch: int, num_microbatches: int, dp: int, dp_index: int) -> torch.Tensor:
    """Row indices of the global batch this data-parallel index keeps, micro-batch-major."""
    if global_batch % (num_microbatches * dp):
        raise PlannerError(f"global batch {global_batch} is not divisible by "
                           f"num_microbatches {num_microbatches} x dp {dp}")
    micro = global_batch // num_microbatches  # rows per global micro-batch
    block = micro // dp  # rows per micro-batch on one replica
    rows = [m * micro + dp_index * block + r for m in range(num_microbatches) for r in range(block)]
    return torch.tensor(rows, dtype=torch.long)


def shard_tensor(t: Any, rows: torch.Tensor, global_batch: int) -> Any:
    if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == global_batch:
        return t.index_select(0, rows.to(t.device))
    return t


def shard_batch(inputs: dict[str, Any], target: Any, *, global_batch: int,
                num_microbatches: int, dp: int, dp_index: int) -> tuple[dict[str, Any], Any]:
    """(inputs, target) of the global batch -> this replica's rows of both."""
    rows = local_rows(global_batch, num_microbatches, dp, dp_index)
    local = {k: shard_tensor(v, rows, global_batch) for k, v in inputs.items()}
    return local, shard_tensor(target, rows, global_batch)


def global_batch_indices(num_samples: int, global_batch: int, *, epoch: int = 0,
                         seed: int = 0, shuffle: bool = True,
                         drop_last: bool = True) -> Iterator[torch.Tensor]:
    """Dataset indices of each global batch of one epoch, the same on every rank."""
    if shuffle:
        order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch))
    else:
        order = torch.arange(num_samples)
    stop = num_samples - num_samples % global_batch if drop_last else num_samples
    for start in range(0, stop, global_batch):
        yield order[start:start + global_batch]


def split_microbatches(t: Any, num_microbatches: int, local_batch: int) -> list[Any]:
    """A local batch cut into micro-batches along dim 0 (a non-batch tensor is repeated)."""
    if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == local_batch:
        return list(t.chunk(num_microbatches))
    return [t] * num_microbatches
