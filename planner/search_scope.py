"""What holds while a search runs: Python's cyclic garbage collector paused, and
per-layer figures memoised (`cost_models.layer_memo.memo_scope`)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from cost_models.layer_memo import memo_scope


@contextlib.contextmanager
def search_scope() -> Iterator[None]:
    """The search makes some 10^6 small acyclic objects (tables, program nodes, front
    entries, walk keys), and each collection they trigger re-scans the whole heap, the
    traced model's objects included, for nothing (a fifth of gpt3-175b's search; issue
    19): the collector is paused, and resumes afterwards where it ran before. The cost
    models price each unique layer under thousands of strategies: what reads only the
    layer is computed once per layer (`cost_models.layer_memo`)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        with memo_scope():
            yield
    finally:
        if paused:
            gc.enable()
