"""Measure the peak of live tensor bytes of real (CPU) work: the memory model's yardstick.

`LiveTensorTracker` is a `TorchDispatchMode`: every tensor an ATen op returns is looked
at once, its storage counted from the moment it appears until the storage is freed. A
storage is keyed by its C++ StorageImpl and released by a `weakref.finalize` on the
Python storage object, which PyTorch keeps alive exactly as long as the StorageImpl
(PyObject preservation), so views, `.detach()`, saved tensors and parameters that
share a storage count once, and a tensor kept only by autograd's graph still counts.

What it sees is what the dispatcher sees: outputs of ATen ops, in forward, in backward
(the autograd engine runs CPU work on the calling thread, inside the mode) and in the
optimizer step. Scratch memory a kernel allocates and frees internally is not a tensor
and is not seen; neither is allocator slack. Tensors created before the mode was
entered can be registered with `track()`.

    >>> with LiveTensorTracker() as mem:          # doctest: +SKIP
    ...     model = build(); opt = torch.optim.AdamW(model.parameters())
    ...     with mem.phase("forward"):
    ...         loss = loss_fn(model(x), y)
    ...     with mem.phase("backward"):
    ...         loss.backward()
    >>> mem.peak_bytes, mem.peak_by_phase         # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveTensorTracker(TorchDispatchMode):
    """Live and peak bytes of tensor storages created while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_by_phase: dict[str, int] = {}
        self._phase: str | None = None
        self._sizes: dict[int, int] = {}  # StorageImpl address -> bytes counted

    # ---- public ---------------------------------------------------------------------------

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors that existed before the mode started (e.g. a model built outside)."""
        for t in tensors:
            self._see(t)

    def reset_peak(self) -> None:
        """Start a new peak from what is live now (e.g. after a warm-up step)."""
        self.peak_bytes = self.live_bytes
        self.peak_by_phase.clear()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute peaks reached inside the block to `name` (peak_by_phase)."""
        previous, self._phase = self._phase, name
        self.peak_by_phase[name] = max(self.peak_by_phase.get(name, 0), self.live_bytes)
        try:
            yield
        finally:
            self._phase = previous

    # ---- dispatch -------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t)
        # In-place ops may grow a storage (resize_, out= variants): re-read their sizes.
        if func._schema.is_mutable:
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    self._see(t)
        return out

    def _see(self, t: torch.Tensor) -> None:
        if t.device.type == "meta":
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse or other storage-less tensors
            return
        key = storage._cdata
        nbytes = storage.nbytes()
        known = self._sizes.get(key)
        if known is None:
            self._sizes[key] = nbytes
            weakref.finalize(storage, self._release, key)
            self._grow(nbytes)
        elif known != nbytes:
            self._sizes[key] = nbytes
            self._grow(nbytes - known)

    def _grow(self, delta: int) -> None:
        self.live_bytes += delta
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
        if self._phase is not None and self.live_bytes > self.peak_by_phase.get(self._phase, 0):
            self.peak_by_phase[self._phase] = self.live_bytes

    def _release(self, key: int) -> None:
        nbytes = self._sizes.pop(key, 0)
        self.live_bytes -= nbytes


# ---- a measured training step ----------------------------------------------------------

# Steps run before the peak is taken: the first step allocates the optimizer's states.
WARMUP_STEPS = 1


def checkpoint_modules(root: torch.nn.Module, names: Iterable[str]) -> None:
    """Wrap each named submodule's forward in torch.utils.checkpoint (non-reentrant)."""
    from torch.utils.checkpoint import checkpoint

    for name in names:
        module = root.get_submodule(name)
        forward = module.forward

        def wrapped(*args, _forward=forward, **kwargs):
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        module.forward = wrapped


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    if name in ("adamw", "adam"):
        return (torch.optim.AdamW if name == "adamw" else torch.optim.Adam)(params, lr=1e-4)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    return torch.optim.SGD(params, lr=1e-3)


def measure_training_peak(build, *, steps: int = 3, optimizer: str = "adamw",
                          checkpoint: Iterable[str] = ()) -> LiveTensorTracker:
    """Peak live tensor bytes of real training steps (forward, backward, optimizer step).

    `build()` returns (module, inputs: dict, target, loss_fn) with real CPU tensors; it is
    called inside the tracker so parameters and inputs count. The peak is taken over the
    steps after the first (optimizer states exist), with zero_grad(set_to_none=True).
    """
    with LiveTensorTracker() as mem:
        module, inputs, target, loss_fn = build()
        module.train()
        checkpoint_modules(module, checkpoint)
        opt = make_optimizer(optimizer, module.parameters())
        for step in range(steps):
            if step == WARMUP_STEPS:
                mem.reset_peak()
            opt.zero_grad(set_to_none=True)
            with mem.phase("forward"):
                loss = loss_fn(module(**inputs), target)
            with mem.phase("backward"):
                loss.backward()
            del loss
            with mem.phase("optimizer"):
                opt.step()
    return mem
