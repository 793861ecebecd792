"""Answers kept by the identity of frozen objects: the one cache the cost models share.

The search asks pure functions of frozen objects (a layer, a cluster spec, a kernel
calibration, a layer's kernel records) the same question thousands of times, and such an
object's hash reads all of it (a calibration's tables, a layer's records), so the memos
key on its `id` instead, beside any plain values (sizes, dtypes, a step's shape). An id
names an object only while the object lives, so each entry keeps what its key names
alive: its id cannot be reused, and a hit is the same object's answer. Past
`max_entries` the memo starts again.

    >>> memo = IdMemo(max_entries=2)
    >>> point = (1024, 1024)
    >>> memo.get((id(point), "bf16"), point, sum, point)
    2048
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

V = TypeVar("V")


class IdMemo:
    """Values by key; each entry holds the objects whose ids its key carries."""

    __slots__ = ("_entries", "max_entries")

    def __init__(self, max_entries: int) -> None:
        self._entries: dict[Hashable, tuple[object, object]] = {}
        self.max_entries = max_entries

    def get(self, key: Hashable, held: object, make: Callable[..., V], *args) -> V:
        """The value kept under `key`, else `make(*args)`, kept with `held` (the objects
        whose ids `key` carries) alive beside it."""
        hit = self._entries.get(key)
        if hit is not None:
            return hit[1]
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        value = make(*args)
        self._entries[key] = (held, value)
        return value

    def __len__(self) -> int:
        return len(self._entries)
