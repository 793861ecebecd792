"""The reduce-scatter a ZeRO-2/3 unit on gloo runs: one definition that the executor
installs (`executors.host_collectives.GlooReduceScatter`, through FSDP2's
`set_custom_reduce_scatter`) and `profile-cluster` times (`cost_models.collective_probes`),
so the fitted reduce-scatter prices the path the step takes.

gloo has no reduce-scatter of its own: ProcessGroupGloo::reduce_scatter_tensor_coalesced
(torch 2.13) clones the whole input, all-reduces the clone on a gloo worker thread and
copies this rank's chunk out of it. Here the same all-reduce runs in place in the flat
input (FSDP2's copy-in buffer, a scratch tensor it never reads again) and this rank's
chunk is copied out: the same sums in the same order, one full-size clone less. gloo
holds only a `storage_alias` of it, emptied after the wait, so the input is freed when
FSDP2 lets go of it, on the rank's thread.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ir.errors import PlannerError


def flat_chunks(flat: torch.Tensor, n: int, what: str) -> torch.Tensor:
    """`flat` as (n, numel / n): chunk i belongs to group rank i (FSDP2's flat layout)."""
    if flat.dim() != 1 or not flat.is_contiguous() or flat.numel() % n:
        raise PlannerError(f"host {what}: needs a contiguous 1-D buffer divisible by the "
                           f"group size {n}, got shape {list(flat.shape)}; this is FSDP2's "
                           "flat buffer layout, so the installed torch changed it")
    return flat.view(n, -1)


def reduce_scatter_in_place(output: torch.Tensor, flat_input: torch.Tensor,
                            group: dist.ProcessGroup, op=dist.ReduceOp.SUM) -> None:
    """This rank's chunk of the reduction of `flat_input` over `group` into `output`,
    summing in `flat_input` itself (it is overwritten)."""
    chunks = storage_alias(flat_chunks(flat_input, group.size(), "reduce-scatter"))
    dist.all_reduce(chunks, op=op, group=group)
    output.copy_(chunks[group.rank()].view_as(output))
    chunks.set_()  # what gloo's worker still holds now holds nothing (`storage_alias`)


def storage_alias(t: torch.Tensor) -> torch.Tensor:
    """`t`'s memory under a tensor that is no view (no `_base`) to hand to a gloo
    collective, to be emptied (`.set_()`) once it is waited on. gloo's worker thread drops
    its reference to the tensors it worked on only after it has woken the rank, when it
    next runs (on a loaded machine, after the rank's next unit); a view there keeps its
    whole base alive, `.set_()` or not: FSDP2's copy-in buffer, read live after backward
    in 14 of 400 reads (2 ranks, load 15; 60 of 400 at load 5)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.shape, t.stride())
