"""The all-gather and reduce-scatter a ZeRO-2/3 unit on gloo runs: one definition that
the executor installs (`executors.data_parallel.apply_dp`, through FSDP2's
`set_custom_all_gather` / `set_custom_reduce_scatter`) and the calibration kit both times
(`cost_models.dp_unit_probe.dp_unit_seconds` installs `use_gloo_collectives` on its units,
`cost_models.collective_probes` times `reduce_scatter_in_place` and `all_gather_chunks`),
so the fitted figures price the path the step takes. `sum_reduction`, the executor's
gradient reduction settings (any backend), lives here for the same reason.

gloo has no reduce-scatter of its own: ProcessGroupGloo::reduce_scatter_tensor_coalesced
(torch 2.13) clones the whole input, all-reduces the clone on a gloo worker thread and
copies this rank's chunk out of it. Here the same all-reduce runs in place in the flat
input (FSDP2's copy-in buffer, a scratch tensor it never reads again) and this rank's
chunk is copied out: the same sums in the same order, one full-size clone less.

gloo's worker thread drops its references to the tensors it worked on only after it has
woken the rank, when it next runs (on a loaded machine, after the rank's next unit). So
both collectives hand gloo `storage_alias`es of FSDP2's buffers, emptied (`.set_()`) once
the collective is waited on: FSDP2 then frees its buffers on the rank's thread. gloo's
worker has finished with the memory by then: ProcessGroupGloo::AsyncWork::execute (torch
2.13) runs the whole collective, copies out included, before it completes the work and
wakes the rank, and afterwards only drops its references. An alias gloo holds keeps the
memory alive until then, so a wait that throws (the aliases left as they are) frees
nothing under it either.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from ir.errors import PlannerError


def on_gloo(mesh) -> bool:
    """Whether a 1-D device mesh's collectives run on gloo (these collectives' backend)."""
    return dist.get_backend(mesh.get_group()) == "gloo"


def sum_reduction(unit: FSDPModule, mesh) -> None:
    """The executor's gradient reduction on a data-parallel unit (`executors.data_parallel
    .apply_dp`; the DP-unit probe sets its units the same): gradients summed (divide
    factor 1: the executor scales the loss instead), and on gloo, which has neither AVG
    nor PREMUL_SUM, only SUM reductions."""
    unit.set_gradient_divide_factor(1.0)
    if on_gloo(mesh):
        unit.set_force_sum_reduction_for_comms(True)


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


def all_gather_chunks(chunks: list[torch.Tensor], input_tensor: torch.Tensor,
                      group: dist.ProcessGroup | None, async_op: bool = False
                      ) -> dist.Work | None:
    """gloo's allgather of `input_tensor` over `group` (None: the whole world) into
    `chunks`, one tensor per group rank in rank order: the one gloo call `GlooAllGather`
    makes, which the collective probe times and the DP-unit probe leaves out of a unit's
    figure (as `dist.all_gather`, looked up at call time)."""
    return dist.all_gather(chunks, input_tensor, group=group, async_op=async_op)


def storage_alias(t: torch.Tensor) -> torch.Tensor:
    """`t`'s memory under a tensor that is no view (no `_base`) to hand to a gloo
    collective, to be emptied (`.set_()`) once it is waited on. gloo's worker thread drops
    its reference to the tensors it worked on only after it has woken the rank, when it
    next runs (on a loaded machine, after the rank's next unit); a view there keeps its
    whole base alive, `.set_()` or not: FSDP2's copy-in buffer, read live after backward
    in 14 of 400 reads (2 ranks, load 15; 60 of 400 at load 5)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


class Done(dist.Work):
    """A finished collective's handle (a gloo p2p Work hangs when waited on twice)."""

    def wait(self, timeout=None) -> bool:
        return True


class GlooReduceScatter(ReduceScatter):
    """gloo's own reduce-scatter arithmetic, without its lingering copy
    (`reduce_scatter_in_place`). gloo's clone is one full-size copy of the unit's
    gradients in the reduce dtype, and once the rank has its chunk its last reference is
    the all-reduce's work, which the worker thread drops late: on a loaded machine it was
    seen alive through most of the next unit's backward (llama-tiny, ZeRO-2 x 4 ranks,
    full checkpointing: some ranks' peaks 1.4-8.9% above the others', run to run;
    issue 17). FSDP2 frees the copy-in buffer, on the rank's thread, at the next unit's
    reduction (`FSDPCommContext.reduce_scatter_states`) or the end of backward."""

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op=dist.ReduceOp.SUM,
                 async_op: bool = False) -> dist.Work | None:
        reduce_scatter_in_place(output_tensor, input_tensor, group, op)
        return Done() if async_op else None  # finished either way


class GlooAllGather(AllGather):
    """FSDP2's own all-gather on gloo (`all_gather_single`, which gloo runs as its
    allgather into the output's chunks), its buffers freed on the rank's thread.

    gloo's worker thread holds the chunks (views of FSDP2's flat output) until after it
    has woken the rank: on 2 ranks at load 10-16 the backward all-gather's output was
    still live at 2 of 2000 reads after backward once the reduce-scatter no longer held
    its input. Here gloo gathers into aliases of the chunks (`storage_alias`), emptied
    once the collective is waited on: the same gloo allgather, the same copies."""

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> dist.Work | None:
        chunks = [storage_alias(c) for c in flat_chunks(output_tensor, group.size(),
                                                        "all-gather")]
        held = [*chunks, storage_alias(input_tensor)]
        work = all_gather_chunks(chunks, held[-1], group, async_op)
        if not async_op:
            _release(held)
            return None
        return _ReleasingWork(work, held)


class _ReleasingWork(dist.Work):
    """An asynchronous collective's handle that empties its aliases once waited on."""

    def __init__(self, work: dist.Work, aliases: list[torch.Tensor]) -> None:
        super().__init__()
        self._work, self._aliases = work, aliases

    def wait(self, timeout=None) -> bool:
        if self._aliases:
            self._work.wait()
            _release(self._aliases)
            self._aliases = []
        return True


def _release(aliases: list[torch.Tensor]) -> None:
    for alias in aliases:
        alias.set_()


def use_gloo_collectives(unit: FSDPModule) -> None:
    """A fully_shard unit of a gloo mesh off the lean path: FSDP2's all-gather
    (`GlooAllGather`), and gloo's reduce-scatter arithmetic without its full-size clone
    (`GlooReduceScatter`), each freeing FSDP2's buffers on the rank's thread. The
    executor's ZeRO-2/3 units and the DP-unit probe's both call this."""
    unit.set_custom_all_gather(GlooAllGather())
    unit.set_custom_reduce_scatter(GlooReduceScatter())
