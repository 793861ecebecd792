"""Which of a layer's forward TP reductions a full recompute issues again, found while the
layer is measured on meta.

The executor checkpoints a layer with torch's non-reentrant checkpoint, which stops the
recompute once it has rebuilt the last tensor the forward saved (early stop,
`torch.utils.checkpoint`). A row-parallel module reduces its output (all-reduce, or
reduce-scatter under SP) when the module returns, so the recompute issues that reduction
again only if the forward saved something after it: in a llama block the attention
output projection's (mlp_norm saves after it), not the MLP down projection's (the
residual add after it saves nothing); a vocab-parallel embedding's only if a dropout
mask is saved after it (gpt's, not llama's). Under SP the all-gather before the
column-parallel modules is always followed by their saved input, so it is issued again;
the loss-parallel head's reductions run in the loss, outside any checkpoint. torch.profiler
per step, 2 ranks, one micro-batch (2026-11-25): llama-tiny tp 2 issued 33
`_c10d_functional::all_reduce` plain, 37 with full (+1 per block; re-issuing every
forward one would make 45); gpt-tiny tp 2 SP issued 17 all-gathers, 16 reduce-scatters
and 5 all-reduces plain, 25, 24 and 6 with full (+2 and +2 per block, +1 embedding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ir.layer import TPStyle

# The TP styles whose module reduces its output over the group in forward (Megatron's g,
# Shoeybi et al. 2019, sec. 3): row-parallel (all-reduce, or reduce-scatter under SP) and
# the vocab-parallel embedding (all-reduce).
TP_REDUCING_STYLES = (TPStyle.ROWWISE, TPStyle.VOCAB)


class ReductionsBeforeLastSave:
    """Counts calls of the reducing modules (TP_REDUCING_STYLES) that end before the
    forward's last save.
    `enter(path)` before each fx node of the forward; `wrap(pack)` the saved-tensor pack
    hook, so each save is seen; `count` afterwards."""

    def __init__(self, reducing: Iterable[str]):
        self.reducing = tuple(reducing)  # full module paths
        self.inside: str | None = None  # the reducing module running now
        self.ended = 0  # reducing calls ended so far (their reduction issued)
        self.count = 0  # of those, ended before the latest save

    def enter(self, path: str | None) -> None:
        now = next((m for m in self.reducing if path is not None
                    and (path == m or path.startswith(m + "."))), None)
        if self.inside is not None and now != self.inside:
            self.ended += 1
        self.inside = now

    def wrap(self, pack: Callable) -> Callable:
        def saving(tensor):
            self.count = self.ended
            return pack(tensor)

        return saving
