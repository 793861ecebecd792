"""Record a model's construction on the meta device, and replay any part of it on CPU
with the values a CPU build from the same seed has (deferred initialisation, after
torchdistX's `deferred_init`).

    with meta_init():            # torch.device("meta") plus the record
        torch.manual_seed(0)
        model = build()          # no memory: every tensor is meta
    values = record_of(model).replay([ref])   # one layer's tensors, bit-equal to a CPU build

record   Under `meta_init` a TorchDispatchMode logs every aten op that touches a meta
         tensor: the function, its arguments (a recorded tensor as its storage number and
         view geometry, `Ref`; a CPU tensor as a constant) and which storages it reads and
         writes (the schema's write annotations; a fresh output is a new storage).
         A random op (tagged `nondeterministic_seeded`) also runs AT ONCE on a scratch CPU
         tensor of the same layout, after its generator's state is saved: the generator
         advances exactly as in a CPU build (interleaved with any CPU draws the build
         makes), and every draw's starting state is known.
slice    The value of a storage depends on every op that wrote it and, transitively, on
         what those ops read (`InitRecord.slice`).
replay   The slice runs on CPU in recorded order; before each random op its generator is
         set to the saved state. Only the slice's storages are ever allocated.

Exact for any build whose tensors come from torch ops and torch generators: torch's
default init (`reset_parameters`), custom init passes (`model.apply(_init_weights)`,
scaled residual init), Hugging Face `post_init`, and buffers computed at construction
(RoPE inverse frequencies, causal masks, position ids). Refused with a PlannerError, never
guessed: a tensor of the model that no recorded op made (built before `meta_init`), an op
whose CPU result has another layout than its meta result, a generator not on the CPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from executors.host_memory import keep_freed_memory_off_heap, release_freed_memory
from ir.errors import PlannerError

META = torch.device("meta")
_RECORDS: list["InitRecord"] = []  # live records; `record_of` finds a model's, `forget` drops it


@dataclass(frozen=True, slots=True)
class Ref:
    """A recorded tensor: storage number and view geometry (elements of `dtype`)."""

    storage: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


@dataclass(slots=True)
class _Op:
    func: Any  # an aten OpOverload
    args: tuple  # Ref for recorded tensors, constants otherwise
    kwargs: dict
    outputs: tuple  # per output leaf: Ref (a tensor) or None
    reads: frozenset[int]
    writes: frozenset[int]
    generator: torch.Generator | None = None  # random ops: the generator and its state
    rng_state: torch.Tensor | None = None


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _generator_arg(func, args: tuple, kwargs: dict) -> torch.Generator:
    """The generator a random op draws from (the default CPU one unless given)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "generator":
            gen = kwargs.get("generator", args[i] if i < len(args) else None)
            if gen is None:
                return torch.default_generator
            if gen.device.type != "cpu":
                raise PlannerError(f"meta_init: {func} draws from a {gen.device} generator; "
                                   "a meta build replays CPU draws only")
            return gen
    return torch.default_generator


class InitRecord(TorchDispatchMode):
    """The ops of one meta build, in order (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.ops: list[_Op] = []
        self._storage_ids: dict[int, int] = {}  # storage key -> storage number
        self._pinned: list[torch.Tensor] = []  # one tensor per storage: keys stay unique
        self.writers: dict[int, list[int]] = {}  # storage number -> op indices writing it
        self.foreign: set[int] = set()  # storages made outside the record

    # ------------------------------------------------------------------ recording

    def ref(self, t: torch.Tensor, *, new_ok: bool = False) -> Ref | None:
        """The Ref of meta tensor `t`; None when its storage was never recorded."""
        key = _key(t)
        number = self._storage_ids.get(key)
        if number is None:
            if not new_ok:
                return None
            number = len(self._pinned)
            self._storage_ids[key] = number
            self._pinned.append(t)
        return Ref(number, tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)

    def _input_ref(self, t: torch.Tensor) -> Ref:
        ref = self.ref(t)
        if ref is None:  # a meta tensor from before the record: replaying it would fail
            ref = self.ref(t, new_ok=True)
            self.foreign.add(ref.storage)
        return ref

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if any(a.name == "device" for a in func._schema.arguments) and not any(
                isinstance(x, torch.Tensor) and not x.is_meta for x in tree_flatten(args)[0]):
            # a factory (or a copy of a meta tensor): allocate on meta whatever device the
            # build names, so the build runs its CPU code path (Hugging Face skips its
            # init under a meta device context) yet allocates nothing
            kwargs["device"] = META
            if "pin_memory" in kwargs:
                kwargs["pin_memory"] = False
        out = func(*args, **kwargs)
        leaves_in, _ = tree_flatten((args, kwargs))
        leaves_out, _ = tree_flatten(out)
        if not any(isinstance(x, torch.Tensor) and x.is_meta for x in leaves_in + leaves_out):
            return out  # a real CPU op of the build (e.g. data for torch.tensor): not ours
        written = set()
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = kwargs.get(arg.name, args[i] if i < len(args) and not arg.kwarg_only
                                   else None)
                for leaf in tree_flatten(value)[0]:
                    if isinstance(leaf, torch.Tensor) and leaf.is_meta:
                        written.add(self._input_ref(leaf).storage)
        reads = set()

        def encode(x):
            if isinstance(x, torch.Tensor):
                if x.is_meta:
                    ref = self._input_ref(x)
                    reads.add(ref.storage)
                    return ref
                return x.detach().clone()  # a constant (its later changes are not ours)
            return x

        rec_args, rec_kwargs = tree_map(encode, args), tree_map(encode, kwargs)
        outputs = []
        for leaf in leaves_out:
            if isinstance(leaf, torch.Tensor) and leaf.is_meta:
                known = self.ref(leaf)
                if known is None:
                    known = self.ref(leaf, new_ok=True)
                    written.add(known.storage)
                outputs.append(known)
            else:
                outputs.append(None)
        op = _Op(func, rec_args, rec_kwargs, tuple(outputs), frozenset(reads),
                 frozenset(written))
        if torch.Tag.nondeterministic_seeded in func.tags:
            op.generator = _generator_arg(func, args, kwargs)
            op.rng_state = op.generator.get_state()
            self._advance(op)
        for storage in written:
            self.writers.setdefault(storage, []).append(len(self.ops))
        self.ops.append(op)
        return out

    def record_opaque(self, fn, tensor: torch.Tensor, args: tuple, kwargs: dict,
                      generator: torch.Generator | None, draws: bool) -> None:
        """Record `fn(tensor, *args, **kwargs)`, an init function that skips meta
        tensors (its result depends on the values it draws): replayed whole on CPU."""
        ref = self._input_ref(tensor)
        op = _Op(lambda t: fn(t, *args, generator=generator, **kwargs) if draws
                 else fn(t, *args, **kwargs), (ref,), {}, (None,),
                 frozenset({ref.storage}), frozenset({ref.storage}))
        if draws:
            op.generator = generator or torch.default_generator
            op.rng_state = op.generator.get_state()
            with _disable_current_modes():  # its CPU ops are not the build's
                self._advance(op)
        self.writers.setdefault(ref.storage, []).append(len(self.ops))
        self.ops.append(op)

    def _advance(self, op: _Op) -> None:
        """Run a random op on scratch CPU tensors: its generator moves as on CPU."""
        def scratch(x):
            if isinstance(x, Ref):
                return torch.empty_strided(x.size, x.stride, dtype=x.dtype)
            return torch.device("cpu") if x == META else x
        with torch.no_grad():
            op.func(*tree_map(scratch, op.args), **tree_map(scratch, op.kwargs))
        release_freed_memory()

    # ------------------------------------------------------------------ replay

    def slice(self, targets: list[Ref]) -> list[int]:
        """Indices, in order, of the ops the targets' final values depend on."""
        needed: set[int] = set()
        seen: set[int] = set()
        stack = [r.storage for r in targets]
        while stack:
            storage = stack.pop()
            if storage in seen:
                continue
            seen.add(storage)
            if storage in self.foreign:
                raise PlannerError("a tensor of the model comes from a meta tensor made "
                                   "before `meta_init()` was entered; build the whole model "
                                   "inside it")
            for i in self.writers.get(storage, ()):
                if i not in needed:
                    needed.add(i)
                    stack.extend(self.ops[i].reads)
        return sorted(needed)

    def replay(self, targets: list[Ref]) -> list[torch.Tensor]:
        """The final CPU values of `targets` (the CPU build's values; views of storages
        no one else holds)."""
        storages: dict[int, torch.UntypedStorage] = {}

        def view(ref: Ref) -> torch.Tensor:
            return torch.empty(0, dtype=ref.dtype).set_(storages[ref.storage], ref.offset,
                                                        ref.size, ref.stride)

        def real(x):
            if isinstance(x, Ref):
                return view(x)
            return torch.device("cpu") if x == META else x

        generators = {id(op.generator): op.generator for op in self.ops if op.generator}
        saved = {k: g.get_state() for k, g in generators.items()}
        try:
            with torch.no_grad():
                for i in self.slice(targets):
                    op = self.ops[i]
                    if op.generator is not None:
                        op.generator.set_state(op.rng_state)
                    out = op.func(*tree_map(real, op.args), **tree_map(real, op.kwargs))
                    for ref, leaf in zip(op.outputs, tree_flatten(out)[0]):
                        if ref is None or ref.storage in storages:
                            continue
                        got = (tuple(leaf.shape), tuple(leaf.stride()), leaf.storage_offset())
                        if got != (ref.size, ref.stride, ref.offset):
                            raise PlannerError(f"meta_init: {op.func} gives layout {got} on "
                                               f"CPU but {(ref.size, ref.stride, ref.offset)}"
                                               " on meta; this build cannot be replayed")
                        storages[ref.storage] = leaf.untyped_storage()
            return [view(r) for r in targets]  # each keeps only its own storage alive
        finally:  # the live generators stay where the build left them
            for k, g in generators.items():
                g.set_state(saved[k])

    def knows(self, t: torch.Tensor) -> bool:
        return t.is_meta and _key(t) in self._storage_ids and \
            self._storage_ids[_key(t)] not in self.foreign


# torch.nn.init functions that return at once on a meta tensor (rejection sampling, QR,
# scatter by index: their ops depend on drawn values): (name, draws random numbers).
OPAQUE_INITS = (("_no_grad_trunc_normal_", True), ("orthogonal_", True), ("sparse_", True),
                ("dirac_", False))


@contextlib.contextmanager
def _opaque_inits(record: InitRecord) -> Iterator[None]:
    """Route torch.nn.init's meta-skipping functions into `record` (as whole calls);
    also in transformers' table of torch's init functions, which holds its own references."""
    import sys

    import torch.nn.init as init

    tables = [init.__dict__]
    hf = sys.modules.get("transformers.initialization")
    if hf is not None and isinstance(getattr(hf, "TORCH_INIT_FUNCTIONS", None), dict):
        tables.append(hf.TORCH_INIT_FUNCTIONS)
    saved = []
    for name, draws in OPAQUE_INITS:
        original = init.__dict__[name]

        def wrapper(tensor, *args, _fn=original, _draws=draws, generator=None, **kwargs):
            if not tensor.is_meta:
                return (_fn(tensor, *args, generator=generator, **kwargs) if _draws
                        else _fn(tensor, *args, **kwargs))
            record.record_opaque(_fn, tensor, args, kwargs, generator, _draws)
            return tensor

        for table in tables:
            for key, value in list(table.items()):
                if value is original:
                    saved.append((table, key, value))
                    table[key] = wrapper
    try:
        yield
    finally:
        for table, key, value in reversed(saved):
            table[key] = value


@contextlib.contextmanager
def meta_init() -> Iterator[InitRecord]:
    """Build on the meta device and record how (see the module docstring). Freed host
    memory leaves the resident set from here on (`executors.host_memory`): the record's
    random draws run on whole-size scratch tensors."""
    keep_freed_memory_off_heap()
    record = InitRecord()
    with record, _opaque_inits(record):
        yield record
    _RECORDS.append(record)


def record_of(model: torch.nn.Module) -> InitRecord | None:
    """The record of the meta build `model` comes from (the one knowing most of its
    tensors; the caller names any it does not know), or None."""
    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.is_meta]
    known = [(sum(record.knows(t) for t in tensors), i) for i, record in enumerate(_RECORDS)]
    count, best = max(known, default=(0, -1))
    return _RECORDS[best] if count else None


def forget(record: InitRecord) -> None:
    """Drop a record once its model is materialized (its log holds the meta tensors)."""
    if record in _RECORDS:
        _RECORDS.remove(record)
