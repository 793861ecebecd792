"""FSDP2's all-gather and reduce-scatter for gloo (host-memory) units, without the
full-size scratch copies that gloo's own collectives and FSDP2's stream bookkeeping keep.

Measured on 4 gloo ranks, torch 2.13, a 400 MB fp32 buffer (bench/bench_meta_build.py's
diagnosis, issue 15): `reduce_scatter_tensor` and `all_gather_into_tensor` each peak one
full-size buffer above their inputs and outputs (gloo stages the whole tensor), while an
in-place `all_reduce` peaks at nothing extra. FSDP2 then keeps, for overlap with CUDA
streams that a CPU run does not have:
  - the previous unit's reduce-scatter input (a full-size copy of its gradients) until the
    next unit's reduce (`FSDPCommContext.reduce_scatter_states`);
  - in forward, the previous unit's flat all-gather output until the next unit's
    copy-out (`FSDPCommContext.all_gather_state`, kept only for a synchronous all-gather);
  - in backward, the next unit gathered while this one runs (implicit backward prefetch).
On a GPT with a 50304 x 2048 vocabulary each is a 0.4 GB embedding or LM head: with
layers=4 (0.3B parameters, 1.14 GiB) under ZeRO-3 over 4 ranks, a rank's step peaked at
2.23 GiB with them and 1.88 GiB without (glibc's heap already kept off,
`executors.host_memory`); the floor is 0.37 GiB of interpreter, 0.76 GiB of parameter
and gradient shards and the embedding's gathered gradient plus its reduce-scatter copy.

Here both collectives run as rings of point-to-point messages inside FSDP2's own buffers
(the ring algorithms of Patarasuk & Yuan 2009, the ones NCCL runs: each rank sends and
receives (n-1)/n of the buffer, as gloo's collectives do):
  RingAllGather       fills the flat output in place (its own chunk is already there:
                      FSDP2's copy-in writes the input into it) and returns a completed
                      Work, so FSDP2 frees the flat output right after the copy-out;
  RingReduceScatter   accumulates in place in FSDP2's copy-in buffer (a scratch tensor
                      it never reads again, `foreach_reduce`), one chunk of scratch at a
                      time, copies this rank's chunk out, then frees that buffer's storage.
`use_host_collectives(unit)` installs both and turns backward prefetch off: these
collectives are synchronous, so a prefetch overlaps nothing and only holds a second unit.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from ir.errors import PlannerError


def _ring(group: dist.ProcessGroup) -> tuple[int, int, int, int]:
    """(size, this rank, next rank, previous rank), ranks within `group`."""
    n, r = group.size(), group.rank()
    return n, r, (r + 1) % n, (r - 1) % n


def _exchange(send: torch.Tensor, recv: torch.Tensor, group: dist.ProcessGroup,
              to: int, frm: int) -> None:
    """Send `send` to group rank `to` while receiving `recv` from `frm`; waits for both."""
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, group=group, group_peer=to),
                                    dist.P2POp(dist.irecv, recv, group=group, group_peer=frm)])
    for work in works:
        work.wait()


class _Done(dist.Work):
    """A finished collective's handle (a gloo p2p Work hangs when waited on twice)."""

    def wait(self, timeout=None) -> bool:
        return True


def _chunks(flat: torch.Tensor, n: int, what: str) -> torch.Tensor:
    if flat.dim() != 1 or not flat.is_contiguous() or flat.numel() % n:
        raise PlannerError(f"host {what}: needs a contiguous 1-D buffer divisible by the "
                           f"group size {n}, got shape {list(flat.shape)}; this is FSDP2's "
                           "flat buffer layout, so the installed torch changed it")
    return flat.view(n, -1)  # (n, numel / n): chunk i belongs to group rank i


class RingAllGather(AllGather):
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> dist.Work:
        n, r, nxt, prev = _ring(group)
        chunks = _chunks(output_tensor, n, "all-gather")
        if chunks[r].data_ptr() != input_tensor.data_ptr():
            chunks[r].copy_(input_tensor.reshape(-1))
        for step in range(n - 1):  # step s: pass on the chunk received at s - 1
            _exchange(chunks[(r - step) % n], chunks[(r - step - 1) % n], group, nxt, prev)
        # done already; but FSDP2 treats a returned Work as asynchronous, "waits" on it
        # and frees the flat output after the copy-out instead of keeping it a unit longer
        return _Done()


class RingReduceScatter(ReduceScatter):
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op=dist.ReduceOp.SUM,
                 async_op: bool = False) -> None:
        if op != dist.ReduceOp.SUM:  # data_parallel forces SUM on gloo
            raise PlannerError(f"host reduce-scatter sums only, got {op}; call "
                               "set_force_sum_reduction_for_comms(True) on the unit")
        n, r, nxt, prev = _ring(group)
        chunks = _chunks(input_tensor, n, "reduce-scatter")
        received = torch.empty_like(chunks[0])
        for step in range(n - 1):  # step s: send the partial sum of chunk r-s-1
            _exchange(chunks[(r - step - 1) % n], received, group, nxt, prev)
            chunks[(r - step - 2) % n].add_(received)
        output_tensor.copy_(chunks[r].view_as(output_tensor))  # summed over all n ranks
        # FSDP2's copy-in buffer: `foreach_reduce` keeps a reference for CUDA streams only
        # and never reads it again; free it now rather than one unit later
        input_tensor.untyped_storage().resize_(0)


def use_host_collectives(unit: FSDPModule) -> None:
    """Install the ring collectives on a fully_shard unit of a gloo mesh and stop its
    backward prefetch (naming the unit itself as what to prefetch: it is gathered
    already, and an explicit list replaces FSDP2's default of the next unit)."""
    unit.set_custom_all_gather(RingAllGather())
    unit.set_custom_reduce_scatter(RingReduceScatter())
    unit.set_modules_to_backward_prefetch([unit])
