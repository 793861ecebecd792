"""Activation checkpointing of one layer (`Checkpoint.FULL` / `Checkpoint.SELECTIVE`).

The layer's `forward` is replaced on the instance by one that runs the original under
non-reentrant `torch.utils.checkpoint.checkpoint`. Unlike `checkpoint_wrapper`, this keeps
every parameter's fully qualified name (plans, the layer IR and state dicts keep
matching), and hooks registered on the module (layout re-layouts, FSDP's all-gather) stay
outside the recomputed region; FSDP2's pre-backward hook re-gathers parameters before the
recomputation needs them.

    FULL       keep only the layer's inputs; recompute the whole layer in backward.
    SELECTIVE  op-level selective checkpointing (`ir.checkpoint_policy`): keep the outputs of the linear layers'
               matrix multiplies (and of collectives, which would otherwise be repeated),
               recompute everything else — attention scores, softmax, masks, activations,
               norms. This is Korthikanti et al. 2022's selective recomputation (the
               attention core, 5·a·s²·b bytes, is recomputed) widened to the cheap
               pointwise ops, as torchtitan's op-level SAC does.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from ir.checkpoint_policy import selective_policy
from ir.strategy import Checkpoint


def apply_ac(module: nn.Module, mode: Checkpoint) -> None:
    """Checkpoint `module`'s forward in place (a no-op for `Checkpoint.NONE`)."""
    if mode is Checkpoint.NONE:
        return
    inner = module.forward
    if mode is Checkpoint.FULL:
        context_fn = None
    else:
        context_fn = functools.partial(create_selective_checkpoint_contexts,
                                       selective_policy)

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        if context_fn is None:
            return checkpoint(inner, *args, use_reentrant=False, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    module.forward = forward
