"""What autograd keeps for backward while a layer's forward runs, counted by storage.

`SavedTensorLog.pack` is a `saved_tensors_hooks` pack hook: every tensor saved is
counted once per storage (views of one buffer are one allocation), parameters excluded,
and tagged TP-sharded, attention-score-like or dropout mask. `TPRegion` tells the log
whether the node being run sits inside a Megatron parallel region. `RMSNormCalls` tells
it which saves an RMSNorm call made, and what CUDA's fused kernel keeps instead.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


def storage_key(t: torch.Tensor):
    """One key per storage (meta tensors have storages too); `id` where there is none."""
    try:
        return StorageWeakRef(t.untyped_storage()).cdata
    except (RuntimeError, NotImplementedError):
        return id(t)


def storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return t.numel() * t.element_size()


def tensor_leaves(value) -> list[torch.Tensor]:
    """The tensors in a (nested) tuple / list / dict value, in order."""
    out = []
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            out.extend(tensor_leaves(v))
    elif isinstance(value, dict):
        for v in value.values():
            out.extend(tensor_leaves(v))
    return out


def value_nbytes(value) -> int:
    """Bytes of the tensors in `value`, each storage once."""
    seen, total = set(), 0
    for t in tensor_leaves(value):
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


class SavedTensorLog:
    """Records tensors saved for backward while a layer's forward runs.

    A tensor is TP-sharded when it is saved between a column-parallel module's output and
    the end of the next row-parallel module (the row-parallel module's own input is
    sharded; the column-parallel module's input is not) — Korthikanti et al. 2022 §4.
    It is attention-score-like when it has as many elements as a softmax output in this
    layer and the same last dimension (bmm saves 3-D views of the 4-D scores).
    Tensors saved by a dropout op are its mask: on CPU and meta the unfused dropout keeps
    it in the activation dtype, where CUDA's fused kernel keeps one byte per element.
    """

    def __init__(self, exclude_keys: set, score_keys: set):
        self.exclude = exclude_keys
        self.score_keys = score_keys
        self.seen: dict = {}  # storage key -> bytes
        self.total = self.sharded = self.scores = self.dropout_masks = 0
        # What RMSNorm calls saved here (CPU/meta's decomposition: `RMSNormCalls`) less
        # what CUDA's fused kernel saves for them: all, and the TP-sharded part
        self.rms_norm_excess = self.rms_norm_sharded_excess = 0
        self.calls = 0  # pack calls: every tensor saved, parameters and repeats included
        # Saves of tensors that require grad: a checkpoint's recompute detaches each, one
        # more op dispatched (`torch.utils.checkpoint._recomputation_hook`'s pack hook)
        self.grad_calls = 0
        # Ops dispatched (with `ops` entered around the forward) and their count at the
        # last save: a non-reentrant checkpoint's recompute stops there (early stop)
        self.ops = _DispatchCount()
        self.ops_at_last_save = 0
        self.tp_sharded_now = False
        self.in_dropout_now = False
        self.in_rms_norm_now = False
        self.norms = RMSNormCalls(self)

    def pack(self, t: torch.Tensor):
        self.calls += 1
        self.grad_calls += int(t.requires_grad)
        self.ops_at_last_save = self.ops.count  # an input is saved before its op dispatches
        key = storage_key(t)
        if key not in self.exclude and key not in self.seen:
            nbytes = storage_bytes(t)
            self.seen[key] = nbytes
            self.total += nbytes
            if self.tp_sharded_now:
                self.sharded += nbytes
            if t.dim() and (t.numel(), t.shape[-1]) in self.score_keys:
                self.scores += nbytes
            if self.in_dropout_now:
                self.dropout_masks += nbytes
            if self.in_rms_norm_now:
                self.rms_norm_excess += nbytes
                self.rms_norm_sharded_excess += nbytes * self.tp_sharded_now
        return t

    @property
    def ops_after_last_save(self) -> int:
        """Ops from the last save on (the op that saved an input included: inputs are
        saved before the op dispatches): a checkpoint's recompute does not rerun them."""
        return self.ops.count - self.ops_at_last_save if self.calls else 0

    @staticmethod
    def unpack(t):
        return t


# torch.rms_norm and its aliases. torch >= 2.8's rms_norm_symint (aten/src/ATen/native/
# layer_norm.cpp) calls `_fused_rms_norm` on every device (not for complex, channels-last
# inputs or a weight of another dtype); CPU and meta run its CompositeImplicitAutograd
# decomposition (fp32 upcast, pow, mean, rsqrt, two muls: the upcast input and the
# normalized fp32 output saved, 8h + 4 bytes a bf16 token), CUDA its kernel, whose
# derivatives.yaml entry saves the input, the weight and result1 (rstd, fp32 for
# 16-bit inputs): 2h + 4 bytes a bf16 token.
RMS_NORM_CALLS = frozenset({F.rms_norm, torch.rms_norm, torch.ops.aten.rms_norm.default,
                            torch._fused_rms_norm, torch.ops.aten._fused_rms_norm.default})


class RMSNormCalls(TorchFunctionMode):
    """Marks `log`'s saves made inside an RMSNorm call and takes off what CUDA's fused
    kernel would save for it (the input, if nothing saved it before, and rstd), so
    `log.rms_norm_excess` is what the decomposition saves beyond the fused kernel."""

    def __init__(self, log: SavedTensorLog):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in RMS_NORM_CALLS or self.log.in_rms_norm_now:
            return func(*args, **kwargs)
        x, shape = args[0], args[1] if len(args) > 1 else kwargs["normalized_shape"]
        weight = args[2] if len(args) > 2 else kwargs.get("weight")
        if not cuda_fuses_rms_norm(x, weight):  # CUDA saves what this run saves
            return func(*args, **kwargs)
        fused = fused_rms_norm_saved_bytes(self.log, x, shape, weight)
        self.log.in_rms_norm_now = True
        try:
            return func(*args, **kwargs)
        finally:
            self.log.in_rms_norm_now = False
            self.log.rms_norm_excess -= fused
            self.log.rms_norm_sharded_excess -= fused * self.log.tp_sharded_now


def cuda_fuses_rms_norm(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether CUDA runs `_fused_rms_norm` for this call (`RMS_NORM_CALLS`): not for
    complex inputs or a weight of another dtype, where it decomposes as CPU does."""
    return not x.is_complex() and (weight is None or weight.dtype == x.dtype)


def fused_rms_norm_saved_bytes(log: SavedTensorLog, x: torch.Tensor, shape,
                               weight: torch.Tensor | None) -> int:
    """Bytes CUDA's `_fused_rms_norm` saves for backward that `log` has not seen: its
    input (unless a parameter or already saved) and rstd, one value per normalized row
    in the computation dtype (`RMS_NORM_CALLS`); 0 where nothing needs a gradient."""
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or (weight is not None and weight.requires_grad))
    if not needs_grad:
        return 0
    key = storage_key(x)
    saved_input = 0 if key in log.exclude or key in log.seen else storage_bytes(x)
    rows = x.numel() // max(1, math.prod([shape] if isinstance(shape, int) else shape))
    rstd_bytes = 8 if x.dtype == torch.float64 else 4
    return saved_input + rows * rstd_bytes


class _DispatchCount(TorchDispatchMode):
    """Counts ATen ops dispatched, as `ir.op_count.OpCounter` does, without recording."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class TPRegion:
    """Tracks whether the node being run sits inside a Megatron parallel region."""

    def __init__(self, colwise: tuple[str, ...], rowwise: tuple[str, ...]):
        self.colwise, self.rowwise = colwise, rowwise
        self.state = "closed"

    @staticmethod
    def _inside(path: str | None, modules: tuple[str, ...]) -> bool:
        return path is not None and any(path == m or path.startswith(m + ".") for m in modules)

    def enter(self, path: str | None) -> bool:
        """Advance to the next node; True if what it saves is TP-sharded."""
        if self._inside(path, self.colwise):
            self.state = "open_after"
            return False
        if self._inside(path, self.rowwise):
            self.state = "close_after"
            return True
        self.state = "open" if self.state in ("open_after", "open") else "closed"
        return self.state == "open"
