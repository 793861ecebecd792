"""What the vocabulary-parallel ends of a tensor-parallel model cost on the host beyond
what the rest of the cost model prices, measured on the ranks of a TP group
(`profile-cluster` runs them beside `tp_probes`, the node's processes in groups):

    vocab_embedding_seconds(mesh) -> (forward, backward) seconds per vocab-parallel
                                     embedding
    loss_parallel_seconds(mesh)   -> (forward, backward) seconds per loss-parallel
                                     cross-entropy

The embedding runs as the executor runs a `TPStyle.VOCAB` candidate
(`executors.tensor_parallel.layer_tp_plan`: `RowwiseParallel(input_layouts=Replicate(),
output_layouts=Replicate())` on an `nn.Embedding`): DTensor's embedding rule shards the
table by rows and wraps the ids in a `_MaskPartial`, which masks the ids outside this
rank's rows, looks the rest up, zeroes the masked rows and all-reduces. The loss runs as
the executor runs a loss-parallel head's (`executors.runtime`: the logits a DTensor split
over the vocabulary, `F.cross_entropy` under `loss_parallel()`, forward and backward
inside it, then the micro-batch weighting `torch.where(count > 0, loss, 0) * (count /
global_count)` on the replicated DTensor loss): torch's handlers compute log-softmax and
the NLL by hand around three funcol all-reduces (the per-token max, the sum of
exponentials, the target logit: `comm.LOSS_PARALLEL_ALL_REDUCES`).

Each reference is what the rest of the model prices for the same call: the layer's own
ATen ops on plain tensors (the embedding lookup on this rank's rows; `F.cross_entropy` on
this rank's logits), plus the collectives the comm model prices (`comm.tp_comm_s`: one
all-reduce of the embedding's output; three of per-token scalars for the loss), issued as
plain `dist.all_reduce` calls. The difference (`tp_probes._added_cpu_s`, the calling
thread's CPU clock, so the collectives' wire time and waits fall out) is what the
executor's form adds: DTensor dispatch and sharding propagation, the masks, the
handlers' hand-written softmax, `from_local` / `to_local`, the funcol tensor subclass.
The forward is timed alone and the backward is the forward+backward run's figure less it:
the two are far from even (read at load ~5, 2 ranks: the embedding's forward 0.57-0.65 of
0.87-0.90 ms, the loss's 1.8-1.9 of 1.8-2.1 ms), so they are not split in half as the TP
modules' are.
The embedding's forward run uses its output once (`_forward_then_used`), as the layer's
next op does, so the async all-reduce's wait and unwrapping fall in the forward (0.09-0.14
ms a call; the 2-rank forward figure read 0.39 ms at load 5-8 with it, 0.29-0.33 without).
The rest of what bench_layer_cpu reads beyond the price (1.31 ms against 0.51 on gpt tp2
dp1, load 6) is the calling thread's CPU while the funcol all-reduce waits for a late
peer, not DTensor work: the executor's embed forward read 0.55-0.94 ms with the ranks
started together, 0.65 with one peer 2 ms late and 1.3-1.5 with it 10 ms late (~9% of the
wait burnt on the caller; a plain `dist.all_reduce` 0.03 -> 0.08 ms), and the embedding is
the step's first collective, where the ranks arrive apart. That wait's time is the comm
model's (`comm.tp_comm_s`, the DTensor-form wait), so it is not priced here again.
Issue 17 read, on gpt tp2+sp (bench_layer_cpu), the embedding at 0.65-0.7 ms of thread
CPU where 0.38 was priced (one TP module figure) and the loss at 1.0 ms forward where
nothing was priced beyond the head's plain ops.
"""

from __future__ import annotations

from functools import partial

from cost_models.tp_probes import _added_by_pass, _forward, _forward_backward, megatron_f_g

VOCAB_PROBE_ROWS_PER_RANK = 8  # table rows (vocabulary entries) per rank
VOCAB_PROBE_WIDTH = 8  # embedding width / the loss's tokens' logits per rank (host-bound sizes)
VOCAB_PROBE_TOKENS = 4  # ids looked up / tokens scored per call (batch 1)
IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index, as the zoo's LM losses pass it


def vocab_embedding_seconds(mesh) -> tuple[float, float]:
    """(forward, backward) seconds per vocab-parallel embedding that the executor's
    DTensor form adds over a plain lookup on this rank's rows plus one plain all-reduce
    of its output, all ranks of `mesh` running together (see the module docstring)."""
    import torch

    from cost_models.clusters import _one_thread

    n = mesh.size()
    # (batch, tokens) ids over the whole vocabulary
    ids = torch.randint(0, VOCAB_PROBE_ROWS_PER_RANK * n, (1, VOCAB_PROBE_TOKENS))
    with _one_thread():
        return _added_by_pass(_manual_embedding(mesh), _dtensor_embedding(mesh), ids,
                              _forward_then_used, _forward_backward)


def loss_parallel_seconds(mesh) -> tuple[float, float]:
    """(forward, backward) seconds per loss-parallel cross-entropy (with the executor's
    micro-batch weighting) that DTensor's form adds over `F.cross_entropy` on this rank's
    logits plus three plain all-reduces of per-token scalars, all ranks of `mesh` running
    together (see the module docstring)."""
    import torch

    from cost_models.clusters import _one_thread

    n = mesh.size()
    # (batch, tokens, this rank's vocabulary share): the head's local logits
    logits = torch.randn(1, VOCAB_PROBE_TOKENS, VOCAB_PROBE_ROWS_PER_RANK, requires_grad=True)
    labels = torch.randint(0, VOCAB_PROBE_ROWS_PER_RANK * n, (1, VOCAB_PROBE_TOKENS))
    with _one_thread():
        return _added_by_pass(_ManualLoss(mesh, labels), _DTensorLoss(mesh, labels), logits,
                              partial(_in_loss_parallel, _forward),
                              partial(_in_loss_parallel, _forward_backward))


def _forward_then_used(model, ids) -> None:
    """The forward, then one op on its output, as the layer's next op (the zoo's `tok(ids) +
    pos(positions)`): DTensor hands the embedding's output back before its all-reduce
    ends (an `AsyncCollectiveTensor`), and that first op waits on it and unwraps it inside
    the layer's forward; a forward that leaves the output unused moves that work into the
    next run's backward (read 0.09-0.12 ms a call, 2 ranks, load 7-8)."""
    model(ids).add(0.0)


def _in_loss_parallel(run, model, logits) -> None:
    """`run` inside `loss_parallel()` for the DTensor loss (the executor runs both passes
    of a loss-parallel loss inside it: `executors.runtime`), as is for the plain one."""
    import contextlib

    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel() if isinstance(model, _DTensorLoss) else contextlib.nullcontext():
        run(model, logits)


def _dtensor_embedding(mesh):
    from torch import nn
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    table = nn.Embedding(VOCAB_PROBE_ROWS_PER_RANK * mesh.size(), VOCAB_PROBE_WIDTH)
    parallelize_module(table, mesh, RowwiseParallel(input_layouts=Replicate(),
                                                    output_layouts=Replicate()))
    return table


def _manual_embedding(mesh):
    """This rank's rows as a plain table, looked up with ids folded into them (what the
    layer's traced ops price), then Megatron's g: an all-reduce of the output."""
    from torch import nn

    _, ReduceOutput = megatron_f_g(mesh.get_group())

    class Lookup(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(VOCAB_PROBE_ROWS_PER_RANK, VOCAB_PROBE_WIDTH)

        def forward(self, ids):
            return ReduceOutput.apply(self.table(ids % VOCAB_PROBE_ROWS_PER_RANK))

    return Lookup()


class _DTensorLoss:
    """The executor's loss-parallel loss: the logits a DTensor split over the vocabulary,
    the zoo's mean token cross-entropy, the micro-batch weighting (`executors.runtime`)."""

    def __init__(self, mesh, labels):
        self.mesh, self.labels = mesh, labels

    def __call__(self, local_logits):
        import torch
        import torch.nn.functional as F
        from torch.distributed.tensor import DTensor, Shard

        logits = DTensor.from_local(local_logits, self.mesh, [Shard(-1)], run_check=False)
        vocab = logits.shape[-1]
        loss = F.cross_entropy(logits.reshape(-1, vocab), self.labels.reshape(-1),
                               ignore_index=IGNORE_INDEX)  # (B*T, V), (B*T,)
        return _weighted(torch, loss, self.labels)


class _ManualLoss:
    """`F.cross_entropy` on this rank's logits with the same weighting, and the three
    all-reduces of per-token scalars the comm model prices (`comm.tp_comm_s`)."""

    def __init__(self, mesh, labels):
        self.group = mesh.get_group()
        self.labels = labels % VOCAB_PROBE_ROWS_PER_RANK  # ids in this rank's share

    def __call__(self, local_logits):
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        from cost_models.comm import LOSS_PARALLEL_ALL_REDUCES

        for _ in range(LOSS_PARALLEL_ALL_REDUCES):  # (B*T,) per-token scalars
            dist.all_reduce(local_logits.new_zeros(local_logits.shape[:-1]).view(-1),
                            group=self.group)
        vocab = local_logits.shape[-1]
        loss = F.cross_entropy(local_logits.reshape(-1, vocab), self.labels.reshape(-1),
                               ignore_index=IGNORE_INDEX)
        return _weighted(torch, loss, self.labels)


def _weighted(torch, loss, labels):
    """`executors.runtime.Runtime._weighted_loss`'s weighting, the global count twice the
    micro-batch's (two micro-batches)."""
    count = (labels != IGNORE_INDEX).sum()
    return torch.where(count > 0, loss, 0.0) * (count / (2 * count))
