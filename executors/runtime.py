"""`ParallelModel`: the applied plan on this rank, and its training step.

`train_step(inputs, target)` takes the GLOBAL batch on every rank and

  1. keeps this rank's rows (`executors.data`): the inputs in the first layer's layout,
     the target in the last layer's;
  2. runs forward and backward over `num_microbatches` micro-batches — a plain loop with
     gradient sync only on the last micro-batch when pp = 1, the pipelining schedule
     otherwise (every stage gets the inputs as keywords: `executors.pipeline`) — with
     each micro-batch's loss weighted so that the data-parallel SUM of gradients is the
     gradient of the mean loss over the global batch (below);
  3. sums the gradients of tied copies (and of replicated tables' sparse rows), clips
     them by their global norm when `max_grad_norm` is set (`executors.grad_clip`; the
     norm is kept as `last_grad_norm`), steps the optimizer (and the tables' row-sparse
     one), zeroes the gradients (fp16-mixed: the loss is scaled, the gradients unscaled
     before the clip, and a step that overflowed on any rank is skipped on all, unclipped:
     `executors.loss_scaling`; `steps` still counts it, since it is the data position);
  4. returns the global-batch mean loss, the same on every rank (one all-reduce of a
     scalar, started as soon as the loss is known — before the last backward without a
     pipeline, before the optimizer step with one — so that it runs alongside them).

The model's output goes through `ir.trace.model_output_tensor` (a HF ModelOutput's
`.logits`) before `loss_fn(output, target)`, as in the layer IR.

Loss weights. A mean loss averages over the targets it counts, and the micro-batches of
one step need not count the same number: cross-entropy skips targets equal to
`ignore_index` (-100), e.g. the ~85% unmasked positions of BERT's MLM labels. Micro-batch
m's mean loss is therefore weighted by count(m) / count(global batch), where `count` is
`loss_weight(target)` (or the `loss_weight` given to `apply`): then the sum over all
micro-batches of all replicas is exactly the single-device mean over the global batch.
Every rank holds the global batch, so the global count needs no communication, and the
counts stay on the device (no host sync). A micro-batch that counts nothing (all its
targets ignored; its cross-entropy is nan) contributes exactly zero loss and zero
gradient. A global batch that counts nothing gives what single-device training gives:
a nan loss and zero gradients (the optimizer still steps). A target that is not a tensor
with the global batch along dim 0 is not sharded; each micro-batch then weighs
1 / (dp x num_microbatches).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel as vocab_parallel_loss

from executors.data import shard_batch, split_microbatches
from executors.data_parallel import set_gradient_sync
from executors.grad_clip import clip_grad_norm
from executors.hybrid_step import all_gather_sparse
from executors.layout import Layout
from executors.loss_scaling import LossScaler
from executors.mesh import Meshes
from executors.optimizer import ShardedOptimizer, multiplied_params
from executors.pipeline import StageAnalysis, stage_inputs
from executors.sharded_embedding import ShardedTables
from executors.sparse_optimizer import SparseRowOptimizer, replicated_tables
from executors.tensor_parallel import reduce_partial_grads
from executors.tied import TiedGradients
from executors.watchdog import ensure_watchdog
from ir.plan import ParallelPlan
from ir.strategy import Precision
from ir.trace import model_output_tensor

IGNORE_INDEX = -100  # the target value torch's cross_entropy / nll_loss skip by default


def loss_weight(target: torch.Tensor) -> torch.Tensor:
    """How many elements a mean loss over `target` averages: for integer targets (class
    indices) the entries != IGNORE_INDEX, for any other target (regression values,
    probabilities) all of its elements. A 0-dim tensor on the target's device.

    Pass another count as `apply(..., loss_weight=fn)` for a loss that averages
    differently, e.g. `lambda t: t.shape[0]` for a mean over rows of per-row means; it
    must add up over rows (the global batch's count is the sum of its micro-batches')."""
    if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
        # a fill kernel: torch.tensor(n, device=cuda) copies n from pageable host memory,
        # which syncs the stream (Copy.cu memcpy_and_sync; pytorch/pytorch#120996: full
        # does not) once per micro-batch
        return torch.full((), target.numel(), dtype=torch.int64, device=target.device)
    return (target != IGNORE_INDEX).sum()


@dataclass
class ParallelModel:
    """What `executors.apply` returns on each rank."""

    plan: ParallelPlan
    module: nn.Module  # the model (pp=1), this rank's stage module, or a ModuleList of them
    stage_modules: list[tuple[int | None, nn.Module]]  # (stage index or None when pp=1, module)
    optimizer: Any
    loss_fn: Callable
    meshes: Meshes
    device: torch.device
    # how the inputs are sharded: layer 0's layout (pp > 1: that of this rank's stages'
    # first layers, whose glue runs from the inputs)
    input_layout: Layout
    output_layout: Layout  # the last layer's layout (full sequence): how the target is sharded
    tied: TiedGradients
    loss_parallel: bool = False  # the last layer's logits stay vocab-split (a DTensor)
    loss_weight_fn: Callable = loss_weight  # target -> the count its mean loss averages over
    schedule: Any = None  # torch.distributed.pipelining schedule when pp > 1
    pipeline_stages: list = field(default_factory=list)
    pipeline_analysis: StageAnalysis | None = None  # checks and records stages per input shape
    steps: int = 0
    # seconds a rank may stop making progress before the job exits (executors.watchdog);
    # None: PLANNER_STALL_LIMIT_S or its default
    stall_limit_s: float | None = None
    # fp16-mixed: the loss scale every rank agrees on (`executors.loss_scaling`); None
    # for fp32 and bf16-mixed, whose exponent range needs none
    loss_scaler: LossScaler | None = None
    # plan.embeddings: the sharded tables and their row-sparse optimizer (`optimizer` then
    # holds the dense parameters only)
    tables: ShardedTables | None = None
    sparse_optimizer: SparseRowOptimizer | None = None
    # clip the gradients to this global L2 norm before each step (None: no clipping), as
    # torch.nn.utils.clip_grad_norm_ on one device (`executors.grad_clip`)
    max_grad_norm: float | None = None
    # the last step's total gradient norm before clipping, on the device (`last_grad_norm`)
    _grad_norm: torch.Tensor | float | None = field(default=None, init=False, repr=False)
    # this step's count of the global target (None: not sharded by rows, uniform weights)
    _global_count: torch.Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.plan.precision is Precision.FP16_MIXED and self.loss_scaler is None:
            self.loss_scaler = LossScaler()

    @property
    def last_grad_norm(self) -> float | None:
        """The last step's total gradient norm before clipping, the same on every rank
        (None: no clipping asked or no step yet; inf: an fp16 step skipped for an
        overflow). Read to the host only here, when asked: the step itself never waits."""
        return None if self._grad_norm is None else float(self._grad_norm)

    # ------------------------------------------------------------------ weights

    def load_pretrained(self, path: str):
        """Fill the weights from a Hugging Face safetensors folder or a DCP checkpoint, each
        rank reading only its slices (a collective; `executors.pretrained`)."""
        from executors.pretrained import load_pretrained  # it imports this module
        return load_pretrained(self, path)

    def export_pretrained(self, directory: str, max_shard_bytes: int | None = None,
                          dtype: torch.dtype | None = None) -> str:
        """Write a Hugging Face safetensors folder, each rank its own tensors, nothing
        gathered on one rank (a collective; `executors.pretrained_export`)."""
        from executors.pretrained_export import DEFAULT_SHARD_BYTES, export_pretrained
        return export_pretrained(self, directory, max_shard_bytes or DEFAULT_SHARD_BYTES, dtype)

    # ------------------------------------------------------------------ data

    def _shard(self, inputs: dict, target, layout: Layout):
        coordinate = self.meshes.dims.coordinate(self.meshes.rank, layout.tp)
        return shard_batch(inputs, target, global_batch=self.plan.global_batch,
                           num_microbatches=self.plan.num_microbatches, dp=layout.dp,
                           dp_index=coordinate.dp_index)

    def local_batch(self, inputs: dict, target) -> tuple[dict, Any]:
        """This rank's rows: inputs in the input layout, target in the output layout."""
        inputs = {k: _to(v, self.device) for k, v in inputs.items()}
        target = _to(target, self.device)
        local_inputs, _ = self._shard(inputs, None, self.input_layout)
        _, local_target = self._shard({}, target, self.output_layout)
        return local_inputs, local_target

    def _count_global(self, target) -> None:
        """Set this step's global count (None: the target is not sharded by rows)."""
        batched = (isinstance(target, torch.Tensor) and target.dim() > 0
                   and target.shape[0] == self.plan.global_batch)
        self._global_count = (torch.as_tensor(self.loss_weight_fn(target), device=self.device)
                              if batched else None)

    def _weighted_loss(self, output, target) -> torch.Tensor:
        """Micro-batch loss x count(target) / count(global batch) (module docstring); the
        pipeline schedule calls it on the last stage with each micro-batch's target."""
        output = model_output_tensor(output)
        if self.loss_scaler is not None:  # fp16: the loss in fp32 (autocast's rule), or its
            output = output.float()       # scaled gradient overflows at the first cast back
        loss = self.loss_fn(output, target)
        if self._global_count is None:
            loss = loss / (self.output_layout.dp * self.plan.num_microbatches)
        else:
            count = torch.as_tensor(self.loss_weight_fn(target), device=self.device)
            # where, not a product: an all-ignored micro-batch's nan must give 0 and grad 0
            loss = torch.where(count > 0, loss, 0.0) * (count / self._global_count)
        return loss if self.loss_scaler is None else self.loss_scaler.scale(loss)

    def _loss_value(self, loss: torch.Tensor) -> torch.Tensor:
        """A micro-batch's weighted loss as a detached fp32 scalar, without the scale."""
        value = _value(loss)
        return value if self.loss_scaler is None else value / self.loss_scaler.scale_value

    # ------------------------------------------------------------------ step

    def forward_backward(self, inputs: dict, target) -> torch.Tensor:
        """Forward and backward on the global batch; this rank's share of the loss."""
        return self._forward_backward(inputs, target, reduce_early=False)[0]

    def _forward_backward(self, inputs: dict, target, reduce_early: bool):
        """(local loss, pending global-loss all-reduce or None). With `reduce_early` and
        no pipeline, the all-reduce starts once the last forward is done, so it runs
        alongside the last backward."""
        target = _to(target, self.device)
        self._count_global(target)
        local_inputs, local_target = self.local_batch(inputs, target)
        context = vocab_parallel_loss() if self.loss_parallel else contextlib.nullcontext()
        with context:  # forward AND backward of a vocab-parallel loss run inside it
            if self.schedule is None:
                out = self._accumulate(local_inputs, local_target, reduce_early)
            else:
                out = self._pipeline(local_inputs, local_target), None
        reduce_partial_grads(self.module.parameters())
        return out

    def _accumulate(self, inputs: dict, target, reduce_early: bool):
        n = self.plan.num_microbatches
        rows = self.plan.global_batch // self.input_layout.dp
        target_rows = self.plan.global_batch // self.output_layout.dp
        chunks = {k: split_microbatches(v, n, rows) for k, v in inputs.items()}
        targets = split_microbatches(target, n, target_rows)
        total = torch.zeros((), device=self.device)
        pending = None
        for m in range(n):
            set_gradient_sync(self.module, m == n - 1)
            output = self.module(**{k: v[m] for k, v in chunks.items()})
            loss = self._weighted_loss(output, targets[m])
            total += self._loss_value(loss)
            if reduce_early and m == n - 1:
                pending = self._start_loss_sum(total)
            loss.backward()
        return total, pending

    def _pipeline(self, inputs: dict, target) -> torch.Tensor:
        """Every pipeline rank passes the model inputs (in its stages' input layout) as
        keywords; the last stage also the target. The stages are checked under fake
        tensors first, on every rank alike, so a stage that cannot run fails here, before
        any rank waits on another."""
        n = self.plan.num_microbatches
        rows = self.plan.global_batch // self.input_layout.dp
        self.pipeline_analysis.prepare(
            {k: split_microbatches(v, n, rows)[0] for k, v in inputs.items()})
        last = any(stage.is_last for stage in self.pipeline_stages)
        losses: list[torch.Tensor] = []
        kwargs = {"target": target, "losses": losses} if last else {}
        self.schedule.step(return_outputs=False, **kwargs, **stage_inputs(inputs, rows))
        total = torch.zeros((), device=self.device)
        for loss in losses:
            total += self._loss_value(loss)
        return total

    def _reporting(self) -> bool:
        """Ranks whose loss counts once: last stage, first TP rank of the last layer."""
        coordinate = self.meshes.dims.coordinate(self.meshes.rank, self.output_layout.tp)
        last_pp_rank = (len(self.plan.stages) - 1) % self.plan.pp
        return coordinate.pp_rank == last_pp_rank and coordinate.tp_index == 0

    def _start_loss_sum(self, local_loss: torch.Tensor):
        """All-reduce the global mean loss in the background."""
        value = local_loss.clone() if self._reporting() else torch.zeros_like(local_loss)
        return value, dist.all_reduce(value, async_op=True)

    def _clip(self, multiplied: frozenset[int], multiplier: float) -> torch.Tensor:
        """Clip the gradients by their global norm (`executors.grad_clip`); the
        coefficient (a 0-dim tensor on the device), which the `multiplied` gradients,
        left as they are, still need."""
        tied = self.tied.copies()
        copies = self.meshes.dims.stage_copies
        self._grad_norm, coefficient = clip_grad_norm(
            self.module.named_parameters(), lambda p: copies(p.grad) * tied.get(id(p), 1),
            self.max_grad_norm, self.device, multiplied, multiplier, self.tables)
        return coefficient

    def train_step(self, inputs: dict, target) -> float:
        """One optimizer step on the GLOBAL batch; returns its mean loss."""
        watchdog = ensure_watchdog(self.stall_limit_s)  # heartbeat: no collective, no I/O
        if watchdog is not None:
            watchdog.step_started()
        local_loss, pending = self._forward_backward(inputs, target, reduce_early=True)
        value, work = pending or self._start_loss_sum(local_loss)
        self.tied.sync()
        if self.tables is not None:  # a replicated table's rows: every rank's, summed
            for module in replicated_tables(self.tables):
                all_gather_sparse(module.weight)
        scaler = self.loss_scaler
        # the gradients the optimizer reads times its multiplier (ZeRO-1's 16-bit ones):
        # neither the unscale nor the clip writes them
        multiplied = multiplied_params(self.optimizer)
        # fp16: every rank steps, or every rank skips (an overflow anywhere)
        if scaler is None or scaler.unscale_and_check(self.module.parameters(), self.device,
                                                      multiplied):
            # what the multiplied gradients, still scaled, are multiplied by in the step
            multiplier = 1.0 if scaler is None else 1.0 / scaler.scale_value
            if self.max_grad_norm is not None:
                multiplier = multiplier * self._clip(multiplied, multiplier)
            if isinstance(self.optimizer, ShardedOptimizer):
                self.optimizer.step(grad_multiplier=multiplier)
            else:
                self.optimizer.step()
        elif self.max_grad_norm is not None:
            self._grad_norm = math.inf  # overflowed: neither clipped nor stepped
        if scaler is not None:
            scaler.update()
        if self.sparse_optimizer is not None:  # fp16 plans have no tables (ParallelPlan)
            self.sparse_optimizer.step()
            self.sparse_optimizer.zero_grad()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        work.wait()
        if watchdog is not None:
            watchdog.step_finished(self.steps)
        return float(value)


def _value(loss: torch.Tensor) -> torch.Tensor:
    """A detached fp32 scalar (a loss-parallel loss is a replicated DTensor)."""
    loss = loss.detach()
    return (loss.to_local() if isinstance(loss, DTensor) else loss).float()


def _to(value, device: torch.device):
    return value.to(device) if isinstance(value, torch.Tensor) else value
