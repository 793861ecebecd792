"""What op-level selective checkpointing adds on the host to a whole sequence-parallel
transformer block beyond what it adds to the same block's plain ops, measured on the
ranks of a TP group (`profile-cluster` runs it beside `tp_probes`):

    sp_block_selective_seconds(mesh) -> (forward+backward, forward) seconds per SP module
                                        group

`tp_probes.selective_seconds` times SAC on stacks of Linear pairs; on a real TP+SP block
it priced 0.6 ms forward and 2.3 ms backward+recompute where `bench/bench_layer_cpu.py`
read 1.9 and 4.6 (gpt tp2+sp, 2 ranks, load 4-7): the recompute reruns the attention
core's re-layouts, the norms' SequenceParallel hooks and the gather pre-hook's
`redistribute`, which a Linear pair has none of (torch.profiler: 33 `Redistribute` and
~984 SAC dispatch calls a step). This probe runs a GPT-2 block (pre-LN: LayerNorm,
q/k/v, causal softmax attention with dropout, projection, residual dropout; LayerNorm,
MLP with GELU and dropout; Radford et al. 2019) laid out as the executor lays out a
`tp+sp` block (`executors.tensor_parallel.layer_tp_plan` and `_gather_sequence_hook`,
`executors.checkpointing.apply_ac`): norms `SequenceParallel` on the sequence chunk,
each sublayer's input gathered to Replicate by a pre-hook, q/k/v and fc1 column-
parallel, proj and fc2 row-parallel with Shard(1) outputs, the heads localised. The
package arrows (`tests/test_imports.py`) keep cost_models from importing the executor,
so the layout is written here with the same torch styles; `bench/bench_tp_selective.py`
times the executor's own gpt-tiny block beside this one.

The figure is (SAC'd DTensor block - DTensor block) - (SAC'd plain block - plain block):
the plain block (the same module unsplit, the whole sequence on each rank: the split
block's local ops without DTensor) is SAC on the layer's own ops, which the cost model
prices from them (`checkpoint_probes`). Per SP group: the block holds SP_BLOCK_GROUPS.
The forward is timed apart too (the output summed, no backward): unlike the Linear pairs'
(`tp_probes.selective_seconds`: 0-0.04 ms), the block's SAC forward adds a share (read
0.27 of 1.33 ms per group, 2 ranks, load 5), which the cost model prices in the forward.
"""

from __future__ import annotations

import math
import statistics

from cost_models.host_probes import probe_clock
from cost_models.tp_probes import (MLP_EXPANSION, SP_PROBE_LOCAL_TOKENS, SP_SEQUENCE_DIM,
                                   TP_PROBE_STEPS, TP_PROBE_WARMUP, _selectively_checkpointed)

SP_BLOCK_HEAD_WIDTH = 4  # per-head width of the probe block (host-bound sizes)
SP_BLOCK_HEADS_PER_RANK = 2  # attention heads per rank (the width splits by heads)
SP_BLOCK_GROUPS = 2  # SP module groups in the block: attention (q/k/v, proj), MLP (fc1, fc2)
SP_BLOCK_MODULES = 6  # its TP modules: q, k, v, proj, fc1, fc2 (the groups' 4 and k, v)
SP_BLOCK_DROPOUT = 0.1  # GPT-2's dropout: three masks per block, as the zoo's gpt


def sp_block_selective_seconds(mesh) -> tuple[float, float]:
    """(forward+backward, forward) seconds per SP module group that SAC adds to a TP+SP
    block on DTensors beyond what it adds to the same block's plain ops, all ranks of
    `mesh` running together (see the module docstring)."""
    import torch

    from cost_models.clusters import _one_thread

    n = mesh.size()
    width = SP_BLOCK_HEAD_WIDTH * SP_BLOCK_HEADS_PER_RANK * n
    x_local = torch.randn(1, SP_PROBE_LOCAL_TOKENS, width)  # (batch, this rank's tokens, h)
    x_full = torch.randn(1, SP_PROBE_LOCAL_TOKENS * n, width)  # the plain block's whole sequence
    with _one_thread():
        plain, split = _Block(width, n), _sp_block(mesh, width)
        added = _median_added({
            "sac_split": (_selectively_checkpointed([split])[0], x_local),
            "split": (split, x_local),
            "sac_plain": (_selectively_checkpointed([plain])[0], x_full),
            "plain": (plain, x_full)})
    both_s, forward_s = (max(s, 0.0) for s in added)
    return both_s / SP_BLOCK_GROUPS, min(forward_s, both_s) / SP_BLOCK_GROUPS


def _median_added(runs: dict) -> tuple[float, float]:
    """Medians over rounds of (sac_split - split) - (sac_plain - plain), (forward and
    backward of the output's sum, the forward and the sum alone), on this thread's CPU
    clock, every rank starting each run together (`tp_probes._added_cpu_s`' clock and
    counts)."""
    import torch.distributed as dist

    clock = probe_clock("cpu")

    def timed(model, x, backward: bool) -> float:
        dist.barrier()
        start = clock()
        out = model(x).sum()
        if backward:
            out.backward()
        return clock() - start

    def added(t: dict) -> float:
        return (t["sac_split"] - t["split"]) - (t["sac_plain"] - t["plain"])

    both, forward = [], []
    for _ in range(TP_PROBE_WARMUP + TP_PROBE_STEPS):
        both.append(added({name: timed(*run, True) for name, run in runs.items()}))
        forward.append(added({name: timed(*run, False) for name, run in runs.items()}))
    return (statistics.median(both[TP_PROBE_WARMUP:]),
            statistics.median(forward[TP_PROBE_WARMUP:]))


def _module_classes():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, width: int, heads: int):
            super().__init__()
            self.heads, self.head_dim = heads, width // heads
            self.q, self.k, self.v, self.proj = (nn.Linear(width, width) for _ in range(4))
            self.attn_drop, self.resid_drop = nn.Dropout(SP_BLOCK_DROPOUT), nn.Dropout(SP_BLOCK_DROPOUT)

        def forward(self, x):
            B, T = x.shape[0], x.shape[1]
            q, k, v = (m(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
                       for m in (self.q, self.k, self.v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, T, T)
            causal = torch.ones(T, T, dtype=torch.bool).triu(1)
            att = self.attn_drop(F.softmax(att.masked_fill(causal, float("-inf")), dim=-1))
            y = (att @ v).transpose(1, 2).reshape(B, T, -1)  # (B, T, nh*hd)
            return self.resid_drop(self.proj(y))

    class Block(nn.Module):
        def __init__(self, width: int, n: int):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = Attention(width, SP_BLOCK_HEADS_PER_RANK * n)
            self.mlp = nn.Sequential(nn.Linear(width, MLP_EXPANSION * width), nn.GELU(),
                                     nn.Linear(MLP_EXPANSION * width, width),
                                     nn.Dropout(SP_BLOCK_DROPOUT))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    return Block


def _Block(width: int, n: int):
    return _module_classes()(width, n)


def _sp_block(mesh, width: int):
    """The block split as the executor splits a `tp+sp` gpt block (module docstring)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    block = _Block(width, mesh.size())
    parallelize_module(block, mesh, {
        "ln1": SequenceParallel(sequence_dim=SP_SEQUENCE_DIM, use_local_output=True),
        "ln2": SequenceParallel(sequence_dim=SP_SEQUENCE_DIM, use_local_output=True),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=Shard(SP_SEQUENCE_DIM)),
        "mlp.0": ColwiseParallel(),
        "mlp.2": RowwiseParallel(output_layouts=Shard(SP_SEQUENCE_DIM))},
        src_data_rank=None)
    block.attn.heads = SP_BLOCK_HEADS_PER_RANK  # localize_heads: this rank's heads

    def gather(_module, args):  # _gather_sequence_hook: the chunk -> the whole sequence
        x = args[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, (Shard(SP_SEQUENCE_DIM),), run_check=False)
        return (x.redistribute(mesh, (Replicate(),)),)

    def own_output(_module, _args, output):  # _own_output: a row-parallel output copied
        return output.clone() if output._base is not None else output

    block.attn.register_forward_pre_hook(gather)
    block.mlp.register_forward_pre_hook(gather)
    block.attn.proj.register_forward_hook(own_output)
    block.mlp[2].register_forward_hook(own_output)
    return block
