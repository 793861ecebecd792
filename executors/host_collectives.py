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

Two more full-size copies remained at the end of backward, where every gradient shard
and AdamW's moments are alive (0.71B GPT, 4 ranks: 4.14 GiB against a 3.90 target):
  - FSDP2 gathers a unit again in backward, though an embedding's backward reads only the
    ids (`embedding_dense_backward` takes the weight's row count, not its values): a
    unit made of nn.Embeddings is not gathered in backward (`set_unshard_in_backward`,
    FSDP2's switch for exactly this case; `ir.lean_host.weightless_backward`);
  - FSDP2 copies the gradients into its reduce-scatter input (`chunk_cat`, rank-major
    rows) before reducing them. For a unit of one parameter whose dim 0 splits evenly
    that layout IS the gradient's own, so the ring's input takes the gradient's storage
    instead of a copy (`_alias_copy_in`; chunk_cat refuses an output that overlaps its
    input) and the reduction runs in the gradient. `apply_dp` makes each embedding table
    of a lean layer its own unit so that its gradient is reduced this way.
The ring moves each chunk in pieces of at most RING_PIECE_BYTES, so its receive scratch
is one piece, not a chunk (a 50304 x 2048 table's chunk over 4 ranks is 0.1 GB). Every
element is summed in the same order as before: results are bit-identical.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard import _fsdp_collectives
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from ir.errors import PlannerError
from ir.gloo_collectives import Done, flat_chunks
from ir.lean_host import LEAN_BACKWARD_PREFETCH, RING_PIECE_BYTES, weightless_backward


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


class RingAllGather(AllGather):
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> dist.Work:
        n, r, nxt, prev = _ring(group)
        chunks = flat_chunks(output_tensor, n, "all-gather")
        if chunks[r].data_ptr() != input_tensor.data_ptr():
            chunks[r].copy_(input_tensor.reshape(-1))
        for step in range(n - 1):  # step s: pass on the chunk received at s - 1
            _exchange(chunks[(r - step) % n], chunks[(r - step - 1) % n], group, nxt, prev)
        # done already; but FSDP2 treats a returned Work as asynchronous, "waits" on it
        # and frees the flat output after the copy-out instead of keeping it a unit longer
        return Done()


class RingReduceScatter(ReduceScatter):
    def allocate(self, size: Sequence[int], *, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
        # No storage yet: the copy-in gives it a gradient's (`_alias_copy_in`) or its own
        # (`_materialize`), the ring its output's. A whole empty buffer here was a live
        # tensor beside the gradient (16 MiB of a 4-rank GPT's 72 MiB tracked peak) though
        # never resident (`ir.lean_host`: the cost model prices none).
        buffer = torch.empty(0, dtype=dtype, device=device)
        buffer._host_ring_input = True
        buffer._host_ring_numel = math.prod(size)
        return buffer

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, op=dist.ReduceOp.SUM,
                 async_op: bool = False) -> None:
        if op != dist.ReduceOp.SUM:  # data_parallel forces SUM on gloo
            raise PlannerError(f"host reduce-scatter sums only, got {op}; call "
                               "set_force_sum_reduction_for_comms(True) on the unit")
        _materialize(output_tensor)
        n, r, nxt, prev = _ring(group)
        chunks = flat_chunks(input_tensor, n, "reduce-scatter")
        piece = max(1, RING_PIECE_BYTES // chunks.element_size())
        # the receive scratch the cost model prices (`ir.lean_host.ring_scratch_bytes`)
        received = torch.empty(min(piece, chunks.shape[1]), dtype=chunks.dtype)
        for step in range(n - 1):  # step s: send the partial sum of chunk r-s-1
            send, into = chunks[(r - step - 1) % n], chunks[(r - step - 2) % n]
            for start in range(0, chunks.shape[1], piece):  # the same sums, piece by piece
                part = received[:min(piece, chunks.shape[1] - start)]
                _exchange(send[start:start + piece], part, group, nxt, prev)
                into[start:start + piece].add_(part)
        output_tensor.copy_(chunks[r].view_as(output_tensor))  # summed over all n ranks
        # FSDP2's copy-in buffer (or the gradient itself, `_alias_copy_in`):
        # `foreach_reduce` keeps a reference for CUDA streams only and never reads it
        # again; let go of its storage now rather than one unit later (freed with its
        # last reference: a gradient that is a view of a larger buffer frees that with it)
        input_tensor.set_(torch.empty(0, dtype=input_tensor.dtype, device=input_tensor.device))


def _materialize(buffer: torch.Tensor) -> None:
    """Give a buffer `RingReduceScatter.allocate` made empty its whole storage."""
    numel = getattr(buffer, "_host_ring_numel", None)
    if numel is not None and buffer.numel() != numel:
        buffer.resize_(numel)


def _alias_copy_in(unsharded_grads: list[torch.Tensor], reduce_scatter_input: torch.Tensor,
                   world_size: int) -> bool:
    """Give a ring's reduce-scatter input the gradient's own memory when that is its
    layout already (module docstring): one contiguous gradient of the input's dtype and
    size (no padding: dim 0 divides by the group); it may be a view into a larger buffer
    (a vocabulary-parallel embedding's local gradient is rows of one). FSDP2 never reads
    the gradient after its copy-in, so the ring may sum in it. False: copy as FSDP2 does."""
    if not getattr(reduce_scatter_input, "_host_ring_input", False) or len(unsharded_grads) != 1:
        return False
    grad = unsharded_grads[0]
    if (not grad.is_contiguous() or grad.dtype != reduce_scatter_input.dtype
            or grad.device != reduce_scatter_input.device
            or grad.numel() != reduce_scatter_input._host_ring_numel):
        return False
    reduce_scatter_input.set_(grad.untyped_storage(), grad.storage_offset(), (grad.numel(),),
                              (1,))
    return True


def _install_alias_copy_in() -> None:
    """Route FSDP2's reduce-scatter copy-in through `_alias_copy_in` (once per process;
    buffers that no ring allocated are copied by FSDP2's own function, unchanged)."""
    original = getattr(_fsdp_collectives, "foreach_reduce_scatter_copy_in", None)
    if original is None:
        raise PlannerError("host reduce-scatter: torch.distributed.fsdp has no "
                           "foreach_reduce_scatter_copy_in; the installed torch changed "
                           "FSDP2's reduction, so executors.host_collectives needs updating")
    if getattr(original, "host_alias", False):
        return

    def copy_in(unsharded_grads, reduce_scatter_input, world_size):
        if not _alias_copy_in(unsharded_grads, reduce_scatter_input, world_size):
            _materialize(reduce_scatter_input)
            original(unsharded_grads, reduce_scatter_input, world_size)
    copy_in.host_alias = True
    _fsdp_collectives.foreach_reduce_scatter_copy_in = copy_in


def use_host_collectives(unit: FSDPModule) -> None:
    """Install the ring collectives on a fully_shard unit of a gloo mesh and stop its
    backward prefetch (naming the unit itself as what to prefetch: it is gathered
    already, and an explicit list replaces FSDP2's default of the next unit); a unit of
    embeddings is not gathered again in backward."""
    _install_alias_copy_in()
    unit.set_custom_all_gather(RingAllGather())
    unit.set_custom_reduce_scatter(RingReduceScatter())
    if not LEAN_BACKWARD_PREFETCH:
        unit.set_modules_to_backward_prefetch([unit])
    if weightless_backward(unit):
        unit.set_unshard_in_backward(False)
