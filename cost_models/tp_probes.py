"""What a tensor-parallel module costs on the host beyond its collectives, measured on
the ranks of a TP group (`profile-cluster` runs it with the node's processes in groups).

    tp_module_seconds(mesh) -> seconds per module per forward+backward

Two stacks of TP_BLOCKS Megatron MLP pairs (column-parallel Linear, GELU, row-parallel
Linear; Shoeybi et al. 2019, sec. 3) at the same local widths, run alternately on every
rank of `mesh`, each run starting together on every rank (a barrier):
  DTensor   `parallelize_module` with ColwiseParallel / RowwiseParallel, as the executor
            runs a TP layer (`executors.tensor_parallel`);
  manual    plain Linears holding this rank's shards, with Megatron's f and g written as
            autograd functions around `dist.all_reduce` (g: all-reduce of the row-parallel
            output in forward; f: all-reduce of the column-parallel input's gradient in
            backward): the same collectives, on the same bytes, at the same points.
Their difference is what DTensor adds per module: dispatch through sharding propagation,
`from_local` / `to_local`, the async collectives' tensor subclass and the re-layouts'
bookkeeping. It holds no collective: the comm model prices every TP collective itself,
wait included (`comm.tp_comm_s` with `comm.blocking_s`), so a figure that held the
probe's all-reduces counted them twice (issue 17: 2.1 ms per module on 2 ranks where the
DTensor work was ~1 ms). Each run is timed on the calling thread's CPU clock
(`host_probes.probe_clock`): gloo runs a collective on its own threads while the caller
sleeps in the wait, so the clock leaves out the collectives' wire time and waits, which
on this shared host move by milliseconds between runs (the wall-clock difference of the
two stacks read 1.0-7.2 ms per module at load 14-20, the waits not cancelling), and
keeps the host work. Being CPU time, the figure is stretched by the core share where it
is used (`tp_host.tp_module_seconds`), as the per-op figures are.

    sp_group_seconds(mesh) -> the same per SP module group (a column- and a row-parallel
                              module) under sequence parallelism

The same pairs laid out as the executor runs an SP layer (`executors.tensor_parallel`):
the residual stream split along the sequence (tensor dim 1), each pair's input gathered
to Replicate by a pre-hook (`PrepareModuleInput(Shard(1) -> Replicate)`, the executor's
`_gather_sequence_hook`), the row-parallel output reduce-scattered back to Shard(1). The
reference is Megatron-SP written by hand (Korthikanti et al. 2022, sec. 4.2.2: g
all-gathers the sequence in forward and reduce-scatters in backward, g-bar the reverse)
with plain `dist.all_gather_single` / `dist.reduce_scatter_single` on a sequence-first
layout, the calls the comm model's fits time (`collective_probes._collective_calls`). SP
doubles the re-layouts with a collective per pair (2 each way instead of 1) and DTensor
gathers / scatters dim 1 by chunking and concatenating on the calling thread (issue 17:
gpt tp2+sp on 2 ranks read 35.7 ms of compute CPU per step where 20.3 ms was priced,
with per-module figures from the non-SP stack). Read by profile-cluster on 2026-11-25 at
load ~1: 1.68 ms per SP group on 2 ranks where the TP pair is 2 x 0.53 ms, 1.55 ms on 4
ranks in pairs (2 x 0.46 ms); `bench/bench_layer_cpu.py` then read each gpt tp2+sp
block's forward at 2.6-2.9 ms of thread CPU, priced 2.28 ms before and 2.90 ms after.

    selective_seconds(mesh) -> the same per TP module and per SP group under op-level
                               selective checkpointing (the executor's policy)

SAC adds to each stack what `_selective_added` says: (SAC'd DTensor - SAC'd plain) -
(DTensor - plain). Its recompute reruns the Python forward above the cached ATen ops, so
DTensor's sharding propagation and re-layouts run again while the collectives' outputs
come from the cache. `bench/bench_tp_selective.py` read the forward's share at 0-0.04 ms
and the recompute on 4 ranks in pairs at 0.14 ms per TP module and 0.50 per SP group, less
than the forward half of the figures above (0.24, 0.77) that a FULL recompute pays.
On a whole TP+SP block SAC reruns more than the Linear pairs hold (the norms' and the
attention core's re-layouts, the gather hooks): `block_probes.sp_block_selective_seconds`
times that block, and an SP layer prices its groups at its figure where the spec has one.
"""

from __future__ import annotations

import statistics

from cost_models.dp_unit_probe import DP_UNIT_STEPS, DP_UNIT_WARMUP
from cost_models.host_probes import probe_clock

OP_OVERHEAD_WIDTH_TP = 8  # TP measurement width per rank (the width must split evenly)
TP_BLOCKS = 4  # column-parallel + row-parallel pairs in the TP measurement
MLP_EXPANSION = 4  # the pair's inner width over its outer one (a transformer MLP's)
# Pairs of runs timed, after untimed ones: as many as the DP-unit probe's
# (`dp_unit_probe.DP_UNIT_STEPS`, `DP_UNIT_WARMUP`), its sibling on the same ranks.
TP_PROBE_STEPS = DP_UNIT_STEPS
TP_PROBE_WARMUP = DP_UNIT_WARMUP
SP_SEQUENCE_DIM = 1  # executors.layout.SEQ_DIM: (batch, sequence, hidden)
SP_PROBE_LOCAL_TOKENS = 2  # sequence positions per rank in the SP measurement (as TP's 2 rows)


def tp_module_seconds(mesh) -> float:
    """Seconds per tensor-parallel module per forward+backward that DTensor adds over the
    same split stack with the same collectives on plain tensors, all ranks of `mesh`
    running together (see the module docstring)."""
    import torch

    from cost_models.clusters import _one_thread

    width = OP_OVERHEAD_WIDTH_TP * mesh.size()
    x = torch.randn(2, width)  # (tokens, width): every rank holds the whole input
    with _one_thread():
        added = _added_cpu_s(_manual_stack(mesh, width), _dtensor_stack(mesh, width), x)
    return max(added, 0.0) / (2 * TP_BLOCKS)


def sp_group_seconds(mesh) -> float:
    """Seconds per SP module group (column-parallel Linear, GELU, row-parallel Linear; the
    sequence gathered before, reduce-scattered after) per forward+backward that DTensor
    adds over Megatron-SP on plain tensors with the same collectives, all ranks of `mesh`
    running together (see the module docstring)."""
    import torch

    from cost_models.clusters import _one_thread

    width = OP_OVERHEAD_WIDTH_TP * mesh.size()
    x = torch.randn(1, SP_PROBE_LOCAL_TOKENS, width)  # (batch, this rank's tokens, width)
    with _one_thread():
        added = _added_cpu_s(_manual_sp_stack(mesh, width), _dtensor_sp_stack(mesh, width), x)
    return max(added, 0.0) / TP_BLOCKS


def selective_seconds(mesh, by_pass: bool = False):
    """(per TP module, per SP module group) seconds per forward+backward that op-level
    selective checkpointing adds on DTensors beyond what it adds to the same stack on
    plain tensors (`_selective_added`), all ranks of `mesh` running together; each a
    (forward, backward) pair with `by_pass` (`bench/bench_tp_selective.py`: the forward's
    share read 0-0.04 ms, so profile-cluster times both passes together and the cost
    model prices the figure in the recompute)."""
    import torch

    from cost_models.clusters import _one_thread

    width = OP_OVERHEAD_WIDTH_TP * mesh.size()
    x = torch.randn(2, width)  # (tokens, width), as tp_module_seconds
    x_sp = torch.randn(1, SP_PROBE_LOCAL_TOKENS, width)  # as sp_group_seconds
    with _one_thread():
        tp = _selective_added(_manual_stack(mesh, width), _dtensor_stack(mesh, width), x,
                              by_pass)
        sp = _selective_added(_manual_sp_stack(mesh, width), _dtensor_sp_stack(mesh, width),
                              x_sp, by_pass)
    if by_pass:
        return (tuple(s / (2 * TP_BLOCKS) for s in tp), tuple(s / TP_BLOCKS for s in sp))
    return max(tp, 0.0) / (2 * TP_BLOCKS), max(sp, 0.0) / TP_BLOCKS


def _selective_added(plain, wrapped, x, by_pass: bool):
    """Seconds SAC adds to `wrapped` beyond what it adds to `plain`: (SAC'd wrapped - SAC'd
    plain) - (wrapped - plain), per pass with `by_pass`. Under SAC the forward's ops go
    through its caching mode, DTensor's own ATen ops (re-layouts, funcol calls) too, and
    the recompute reruns the Python forward above the cached ops, DTensor's sharding
    propagation and re-layouts included, while the collectives' outputs come from the
    cache (`ir.checkpoint_policy`) and their funcol calls do not run again; the plain
    stack's share of both is what the cost model prices from the layer's own ops
    (`checkpoint_probes`)."""
    sac_plain, sac_wrapped = _selectively_checkpointed(plain), _selectively_checkpointed(wrapped)
    if not by_pass:
        return _added_cpu_s(sac_plain, sac_wrapped, x) - _added_cpu_s(plain, wrapped, x)
    sac = _added_by_pass(sac_plain, sac_wrapped, x, _forward, _forward_backward)
    bare = _added_by_pass(plain, wrapped, x, _forward, _forward_backward)
    forward_s = max(sac[0] - bare[0], 0.0)
    return forward_s, max(sum(sac) - sum(bare) - forward_s, 0.0)


def _selectively_checkpointed(stack):
    """Each block of `stack` (a layer's worth: one pair) under non-reentrant checkpoint with
    the selective policy, as `executors.checkpointing.apply_ac` runs a layer."""
    import functools

    from torch import nn
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from ir.checkpoint_policy import selective_policy

    context_fn = functools.partial(create_selective_checkpoint_contexts, selective_policy)

    class Checkpointed(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False, context_fn=context_fn)

    blocks = getattr(stack, "pairs", stack)  # the SP reference wraps its pairs
    wrapped = nn.Sequential(*[Checkpointed(block) for block in blocks])
    if blocks is stack:
        return wrapped
    return lambda x: wrapped(x.transpose(0, 1)).transpose(0, 1)  # SequenceFirst's layout


def _added_by_pass(plain, wrapped, x, forward, forward_backward) -> tuple[float, float]:
    """(forward, backward) thread CPU seconds `wrapped` adds over `plain`: the forward run
    alone, and the forward+backward run less it (each floored at 0: a figure below the
    probe's noise is none)."""
    forward_s = _added_cpu_s(plain, wrapped, x, run=forward)
    both_s = _added_cpu_s(plain, wrapped, x, run=forward_backward)
    return max(forward_s, 0.0), max(both_s - max(forward_s, 0.0), 0.0)


def _forward(model, x) -> None:
    model(x)


def _forward_backward(model, x) -> None:
    model(x).sum().backward()


def _added_cpu_s(plain, wrapped, x, run=_forward_backward) -> float:
    """Median over pairs of runs of how much more of this thread's CPU time
    `run(wrapped, x)` (forward, then backward of the output's sum) takes than the same on
    `plain`, every rank starting each run together."""
    import torch.distributed as dist

    clock = probe_clock("cpu")

    def timed(model) -> float:
        dist.barrier()
        start = clock()
        run(model, x)
        return clock() - start

    pairs = [timed(wrapped) - timed(plain) for _ in range(TP_PROBE_WARMUP + TP_PROBE_STEPS)]
    return statistics.median(pairs[TP_PROBE_WARMUP:])


def _dtensor_stack(mesh, width: int):
    from torch import nn
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(width, MLP_EXPANSION * width), nn.GELU(),
                                           nn.Linear(MLP_EXPANSION * width, width))
                             for _ in range(TP_BLOCKS)])
    for block in blocks:
        parallelize_module(block, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return blocks


def megatron_f_g(group):
    """Megatron-LM's f (identity forward, all-reduce of the gradient) and g (all-reduce of
    the output, identity backward) over `group`, as autograd functions (Shoeybi et al.
    2019, Fig. 3): the plain-tensor TP the probes price DTensor's overhead against."""
    import torch
    import torch.distributed as dist

    class ReduceGradient(torch.autograd.Function):  # Megatron's f
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous()
            dist.all_reduce(grad, group=group)
            return grad

    class ReduceOutput(torch.autograd.Function):  # Megatron's g
        @staticmethod
        def forward(ctx, x):
            x = x.contiguous()
            dist.all_reduce(x, group=group)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    return ReduceGradient, ReduceOutput


def _manual_stack(mesh, width: int):
    """The DTensor stack's local shards as plain Linears, with Megatron's f before each
    column-parallel Linear and g (then the replicated bias) after each row-parallel one."""
    import torch
    from torch import nn

    group = mesh.get_group()
    inner = MLP_EXPANSION * width // mesh.size()  # this rank's share of the inner width

    ReduceGradient, ReduceOutput = megatron_f_g(group)

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.colwise = nn.Linear(width, inner)
            self.act = nn.GELU()
            self.rowwise = nn.Linear(inner, width, bias=False)
            self.bias = nn.Parameter(torch.zeros(width))  # replicated: added once reduced

        def forward(self, x):
            h = self.act(self.colwise(ReduceGradient.apply(x)))
            return ReduceOutput.apply(self.rowwise(h)) + self.bias

    return nn.Sequential(*[Pair() for _ in range(TP_BLOCKS)])


def _dtensor_sp_stack(mesh, width: int):
    """`_dtensor_stack`'s pairs as an SP layer runs them: input gathered along the
    sequence by a pre-hook, output reduce-scattered back (`executors.tensor_parallel`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, parallelize_module)
    from torch import nn

    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(width, MLP_EXPANSION * width), nn.GELU(),
                                           nn.Linear(MLP_EXPANSION * width, width))
                             for _ in range(TP_BLOCKS)])
    for block in blocks:
        parallelize_module(block, mesh, PrepareModuleInput(
            input_layouts=(Shard(SP_SEQUENCE_DIM),), desired_input_layouts=(Replicate(),)))
        parallelize_module(block, mesh, {
            "0": ColwiseParallel(),
            "2": RowwiseParallel(output_layouts=Shard(SP_SEQUENCE_DIM))})
    return blocks


def _manual_sp_stack(mesh, width: int):
    """The SP stack's local shards as plain Linears on a sequence-first copy of the input,
    with Megatron-SP's g (all-gather the sequence; reduce-scatter the gradient) before
    each column-parallel Linear and g-bar (reduce-scatter; all-gather the gradient) after
    each row-parallel one, then the replicated bias."""
    import torch
    import torch.distributed as dist
    from torch import nn

    group, n = mesh.get_group(), mesh.size()
    inner = MLP_EXPANSION * width // n  # this rank's share of the inner width

    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def gather(x):  # (tokens, ...) -> (n * tokens, ...), dim 0: the plain call's layout
        out = x.new_empty((n * x.shape[0], *x.shape[1:]))
        all_gather(out, x.contiguous(), group=group)
        return out

    def scatter(x):  # (n * tokens, ...) -> (tokens, ...), summed over the group
        out = x.new_empty((x.shape[0] // n, *x.shape[1:]))
        reduce_scatter(out, x.contiguous(), group=group)
        return out

    class GatherSequence(torch.autograd.Function):  # Megatron-SP's g
        @staticmethod
        def forward(ctx, x):
            return gather(x)

        @staticmethod
        def backward(ctx, grad):
            return scatter(grad)

    class ScatterSequence(torch.autograd.Function):  # Megatron-SP's g-bar
        @staticmethod
        def forward(ctx, x):
            return scatter(x)

        @staticmethod
        def backward(ctx, grad):
            return gather(grad)

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.colwise = nn.Linear(width, inner)
            self.act = nn.GELU()
            self.rowwise = nn.Linear(inner, width, bias=False)
            self.bias = nn.Parameter(torch.zeros(width))  # replicated: added once reduced

        def forward(self, x):  # x: (this rank's tokens, batch, width), sequence first
            h = self.act(self.colwise(GatherSequence.apply(x)))
            return ScatterSequence.apply(self.rowwise(h)) + self.bias

    class SequenceFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.pairs = nn.Sequential(*[Pair() for _ in range(TP_BLOCKS)])

        def forward(self, x):  # (batch, tokens, width) in and out, as the DTensor stack's
            return self.pairs(x.transpose(0, 1)).transpose(0, 1)

    return SequenceFirst()
