"""Which op outputs `Checkpoint.SELECTIVE` keeps: one definition for executor and cost model.

Op-level selective activation checkpointing (torchtitan's op-level SAC; Korthikanti et al.
2022 §5 widened to every cheap op): inside a checkpointed layer the outputs of the linear
layers' matrix multiplies and of collectives are saved; everything else (attention
scores, softmax, masks, activations, norms, casts) is recomputed in backward.

`executors/checkpointing.py` runs exactly this policy; the trace measures the bytes it
keeps and the ops it recomputes with the same predicate, so the estimate prices what runs.

    >>> import torch
    >>> saved_under_selective(torch.ops.aten.mm.default)
    True
    >>> saved_under_selective(torch.ops.aten._softmax.default)
    False
"""

from __future__ import annotations

from torch.utils.checkpoint import CheckpointPolicy

# ATen matmuls that implement nn.Linear / Conv1D (mm, addmm; bmm/baddbmm are the
# attention core, which selective recomputes).
SAVED_MATMUL_OPS = frozenset({"aten::mm", "aten::addmm"})
# Functional collectives (DTensor's redistributions): recomputing them would repeat the
# communication, so their outputs are kept.
SAVED_COLLECTIVE_OPS = frozenset({
    "_c10d_functional::all_reduce", "_c10d_functional::reduce_scatter_tensor",
    "_c10d_functional::all_gather_into_tensor", "_c10d_functional::wait_tensor"})
SAVED_UNDER_SELECTIVE = SAVED_MATMUL_OPS | SAVED_COLLECTIVE_OPS


def op_name(func) -> str:
    """"namespace::op" of an OpOverload (or OpOverloadPacket): `aten::mm` for aten.mm.default."""
    return func.name().split(".")[0] if hasattr(func, "name") else str(func)


def saved_under_selective(func) -> bool:
    """True when selective checkpointing keeps this op's output instead of recomputing it."""
    return op_name(func) in SAVED_UNDER_SELECTIVE


def selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """The policy `torch.utils.checkpoint.create_selective_checkpoint_contexts` runs:
    the executor's (`executors.checkpointing`) and the trace's (`ir.checkpoint_measure`)."""
    return (CheckpointPolicy.MUST_SAVE if saved_under_selective(op)
            else CheckpointPolicy.PREFER_RECOMPUTE)
