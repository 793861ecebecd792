"""Which torch param group a parameter steps in: one vocabulary for the executor, which
makes the groups (`executors.optimizer.param_groups`, ZeRO-1's `ShardedOptimizer`), and
the memory model, which prices each group's step temporaries
(`cost_models.step_temporaries`).

The executor splits its parameters into consecutive runs of one kind: torch's list
kernels (foreach, fused) refuse a list mixing DTensors with plain tensors, and offloaded
shards step on the host with their own implementation. ZeRO-1's flat shards are plain
tensors stepped after every other parameter.
"""

from __future__ import annotations

from enum import Enum

import torch


class StepGroup(Enum):
    ANY = "any"  # the model's only: no parameters, or TP'd DTensors beside plain ones
    PLAIN = "plain"  # plain tensors
    DTENSOR = "dtensor"  # DTensors: FSDP2's shards, TP's splits
    FLAT = "flat"  # ZeRO-1's flat shards: plain tensors, stepped after all the others
    HOST = "host"  # offloaded shards (ZeRO-Offload), stepped on the host

    def __str__(self) -> str:
        return self.value

    @property
    def list_kind(self) -> StepGroup:
        """The kind torch's list kernels see: a flat shard is a plain tensor."""
        return StepGroup.PLAIN if self is StepGroup.FLAT else self

    @staticmethod
    def of_tensor(tensor: torch.Tensor) -> StepGroup:
        """DTENSOR or PLAIN: what one parameter is to torch's list kernels."""
        from torch.distributed.tensor import DTensor

        return StepGroup.DTENSOR if isinstance(tensor, DTensor) else StepGroup.PLAIN
