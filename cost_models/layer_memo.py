"""Per-layer figures memoised for the length of one search (`memo_scope`).

The search prices each unique layer under every strategy, micro-batch and pipeline
candidate (some 5,000 rows for gpt3-175b on 1,024 A100s), and the memory walk and the
estimate price each layer of each plan again; a figure that reads only the layer (and
the cluster, a step config, a kernel calibration) is the same every time. `per_layer`
wraps such a pure function so that, inside a `memo_scope`, it runs once per argument
identity; outside one it is the plain function, so tests and callers that price once
see no cache at all.

Keys are the arguments' ids; each entry keeps its arguments alive, so an id is not
reused while its entry stands (`cost_models.id_memo`). Only functions whose arguments
are frozen objects (Layer, ClusterSpec, StepConfig, KernelCalibration, a strategy's
`layout_view`, enum members, None) and whose results are immutable may be wrapped.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

from cost_models.id_memo import IdMemo
from ir.strategy import Checkpoint, LayerStrategy

# Entries one scope holds per function before it starts afresh: a search sees a few
# hundred distinct layer objects (the placed copies of `cost_models.step_host` included).
MAX_ENTRIES = 4096

_scope: dict[Callable, IdMemo] | None = None  # function -> its memo while a scope is open


@contextlib.contextmanager
def memo_scope() -> Iterator[None]:
    """Memoise `per_layer` functions until the block ends; a nested scope shares the
    outer one's entries (the baselines' searches run inside the search)."""
    global _scope
    if _scope is not None:
        yield
        return
    _scope = {}
    try:
        yield
    finally:
        _scope = None


def per_layer(fn: Callable) -> Callable:
    """`fn`, memoised by its arguments' identity inside a `memo_scope`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _scope is None or kwargs:  # keywords: the plain function (keys are positional)
            return fn(*args, **kwargs)
        memo = _scope.get(fn)
        if memo is None:
            memo = _scope[fn] = IdMemo(MAX_ENTRIES)
        return memo.get(tuple(map(id, args)), args, fn, *args)

    wrapper.uncached = fn
    return wrapper


def layout_view(strategy: LayerStrategy) -> LayerStrategy:
    """`strategy`'s TP degree, SP flag and checkpoint mode alone, as one object per triple:
    a `per_layer` function that reads no more of a strategy than these is called with it
    and so shares its entry across the strategies' DP degrees and modes (`_view`)."""
    return _view(strategy.tp, strategy.sequence_parallel, strategy.checkpoint)


@functools.cache
def _view(tp: int, sequence_parallel: bool, checkpoint: Checkpoint) -> LayerStrategy:
    return LayerStrategy(tp=tp, sequence_parallel=sequence_parallel, checkpoint=checkpoint)
