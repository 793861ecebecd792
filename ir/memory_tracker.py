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
entered can be registered with `track()`. Two things the dispatcher does not show
directly are handled here:

  - a tensor subclass that wraps others (a DTensor and its local shard, the
    AsyncCollectiveTensor a functional collective returns) counts by the tensors it
    wraps: its own storage has a size but no data (`_make_wrapper_subclass`), and the
    wrapped tensors may be made below this mode (inside DTensor's dispatch);
  - FSDP2 frees and re-allocates each unsharded parameter by resizing its storage
    (`UntypedStorage.resize_`, not an ATen op); the tracker wraps FSDP2's
    `alloc_storage` / `free_storage` and re-reads the size after each resize, else a
    resharded unit would stay counted at its gathered size.

With `record=True` it also keeps every storage's lifetime, so `live_at_peak()` can say
which tensors made the peak (the op that made each, its shape and the phase) and
`live_now()` what is alive. With `meta=True` it counts meta tensors' storages too (their
sizes, no data): the IR measures one layer's checkpointed forward and backward that way
(`ir.checkpoint_measure`); a real run leaves it off, as stand-ins made on meta are no
memory, and neither are fake tensors (a `FakeTensorMode` run inside the mode, such as
the pipeline's `executors.pipeline.StageAnalysis`, whose fake parameters live all run).

A whole step run by the executor is measured by `planner.trial` (spawned ranks, or
`measure_one_process` on one device).

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
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves


@dataclass(frozen=True, slots=True)
class LiveStorage:
    """One storage live at the peak (`LiveTensorTracker.live_at_peak`)."""

    nbytes: int
    made_by: str  # the ATen op that returned it first, "track" or "fsdp"
    shape: tuple[int, ...]
    dtype: str
    phase: str | None
    key: int = 0  # the StorageImpl's address (`ir.saved_tensors.storage_key`)

    def __str__(self) -> str:
        return (f"{self.nbytes:>10,} B  {self.made_by} {list(self.shape)} {self.dtype}"
                f"{f' ({self.phase})' if self.phase else ''}")


class LiveTensorTracker(TorchDispatchMode):
    """Live and peak bytes of tensor storages created while the mode is active."""

    def __init__(self, *, record: bool = False, meta: bool = False) -> None:
        super().__init__()
        self._meta = meta
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_by_phase: dict[str, int] = {}
        self._phase: str | None = None
        self._sizes: dict[int, int] = {}  # StorageImpl address -> bytes counted
        # record=True: per storage lifetime [birth, death) on a clock of size changes.
        self._record = record
        self._clock = 0
        self._peak_clock = 0
        self._lives: list[list] = []  # [birth, death or None, LiveStorage]
        self._open: dict[int, int] = {}  # StorageImpl address -> index into _lives
        self._patched: list = []

    # ---- public ---------------------------------------------------------------------------

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors that existed before the mode started (e.g. a model built outside)."""
        for t in tensors:
            self._see(t, "track")

    @property
    def clock(self) -> int:
        """A count of the size changes seen so far: the time `lifetimes` are on."""
        return self._clock

    def lifetimes(self) -> list[tuple[int, int | None, LiveStorage]]:
        """Every storage seen: (birth, death or None while alive, what it is), on `clock`;
        a storage is live at time t when birth <= t < death (needs record=True)."""
        if not self._record:
            raise RuntimeError("LiveTensorTracker(record=True) keeps what lifetimes needs")
        return [(birth, death, s) for birth, death, s in self._lives]

    def live_now(self) -> list[LiveStorage]:
        """The storages alive now, in order of birth (needs record=True)."""
        if not self._record:
            raise RuntimeError("LiveTensorTracker(record=True) keeps what live_now needs")
        return [s for _, death, s in self._lives if death is None]

    def reset_peak(self) -> None:
        """Start a new peak from what is live now (e.g. after a warm-up step)."""
        self.peak_bytes = self.live_bytes
        self._peak_clock = self._clock
        self.peak_by_phase.clear()

    def live_at_peak(self, top: int | None = None) -> list[LiveStorage]:
        """The storages live when the peak was reached, largest first (needs record=True).
        Their bytes add up to `peak_bytes`."""
        if not self._record:
            raise RuntimeError("LiveTensorTracker(record=True) keeps what live_at_peak needs")
        t = self._peak_clock
        live = [s for birth, death, s in self._lives
                if birth <= t and (death is None or death > t)]
        live.sort(key=lambda s: -s.nbytes)
        return live[:top] if top is not None else live

    def set_phase(self, name: str | None) -> None:
        """Attribute what follows to `name` (for code that cannot be wrapped in `phase`,
        e.g. from module hooks)."""
        self._phase = name
        if name is not None:
            self.peak_by_phase[name] = max(self.peak_by_phase.get(name, 0), self.live_bytes)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute peaks reached inside the block to `name` (peak_by_phase)."""
        previous, self._phase = self._phase, name
        self.peak_by_phase[name] = max(self.peak_by_phase.get(name, 0), self.live_bytes)
        try:
            yield
        finally:
            self._phase = previous

    def __enter__(self):
        self._patched = _watch_fsdp_storage(self)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for module, name, original in self._patched:
                setattr(module, name, original)
            self._patched = []

    # ---- dispatch -------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t, func)
        # In-place ops may grow a storage (resize_, out= variants): re-read their sizes.
        if func._schema.is_mutable:
            for t in tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    self._see(t, func)
        return out

    def _see(self, t: torch.Tensor, made_by=None) -> None:
        if is_traceable_wrapper_subclass(t):  # no data of its own: count what it wraps
            names, _ = t.__tensor_flatten__()
            for name in names:
                inner = getattr(t, name)
                if isinstance(inner, torch.Tensor):
                    self._see(inner, made_by)
            return
        if (t.device.type == "meta" or isinstance(t, FakeTensor)) and not self._meta:
            return  # no data: a FakeTensor reports its fake device but holds a meta storage
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
            self._born(key, nbytes, t, made_by)
            self._grow(nbytes)
        elif known != nbytes:
            self._sizes[key] = nbytes
            self._died(key)
            self._born(key, nbytes, t, made_by)
            self._grow(nbytes - known)

    def _born(self, key: int, nbytes: int, t: torch.Tensor, made_by) -> None:
        if not self._record:
            return
        name = made_by if isinstance(made_by, str) else getattr(made_by, "__name__",
                                                                 str(made_by))
        self._open[key] = len(self._lives)
        self._lives.append([self._clock + 1, None, LiveStorage(
            nbytes, name, tuple(t.shape), str(t.dtype).removeprefix("torch."), self._phase,
            key)])

    def _died(self, key: int) -> None:
        if self._record and key in self._open:
            self._lives[self._open.pop(key)][1] = self._clock + 1

    def _grow(self, delta: int) -> None:
        self._clock += 1
        self.live_bytes += delta
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self._peak_clock = self._clock
        if self._phase is not None and self.live_bytes > self.peak_by_phase.get(self._phase, 0):
            self.peak_by_phase[self._phase] = self.live_bytes

    def _release(self, key: int) -> None:
        nbytes = self._sizes.pop(key, 0)
        self._died(key)
        self._grow(-nbytes)


def _watch_fsdp_storage(tracker: LiveTensorTracker) -> list:
    """Wrap FSDP2's alloc_storage / free_storage (where its modules look them up) so the
    tracker re-reads the storage size after each resize; returns what to restore."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:
        return []
    patched = []
    for module in (_fsdp_param, _fsdp_param_group):
        for name in ("alloc_storage", "free_storage"):
            original = getattr(module, name, None)
            if original is None:
                continue

            def wrapped(tensor, _original=original):
                _original(tensor)
                tracker._see(tensor, "fsdp")

            setattr(module, name, wrapped)
            patched.append((module, name, original))
    return patched
