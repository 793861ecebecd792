"""What autograd keeps for backward while a layer's forward runs, counted by storage.

`SavedTensorLog.pack` is a `saved_tensors_hooks` pack hook: every tensor saved is
counted once per storage (views of one buffer are one allocation), parameters excluded,
and tagged TP-sharded, attention-score-like or dropout mask. `TPRegion` tells the log
whether the node being run sits inside a Megatron parallel region.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
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
        return t

    @property
    def ops_after_last_save(self) -> int:
        """Ops from the last save on (the op that saved an input included: inputs are
        saved before the op dispatches): a checkpoint's recompute does not rerun them."""
        return self.ops.count - self.ops_at_last_save if self.calls else 0

    @staticmethod
    def unpack(t):
        return t


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
