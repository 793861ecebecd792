"""Rank walks kept by what they read, so that equal ranks are walked once.

`memory_walk.walk_rank` reads only its chunks (`ChunkMemory`: plain, frozen figures), the
rank's passes and a few step settings; the rank's index only labels the result. Two ranks
whose figures are equal (the middle ranks of one plan, the same rank of two candidates,
a re-solve that moved a cut elsewhere, a least-memory plan walked by several searches)
have the same peak, so `walk_rank_once` keeps each walk under that content in the
caller's cache dict (the search's `memory_cache`, the baselines' `layer_cache`).

A walk stopped early (`stop_above_bytes`, `memory_walk.OverLimit`) is kept as what it
proved: the peak is above the live bytes it had seen. A later call whose limit is below
that stops at once; one whose limit is above walks again. A whole walk answers any limit,
since a stopped walk records the same totals up to the one that passes its limit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from cost_models.memory_walk import (ChunkMemory, OverLimit, StageMemory, live_limit_bytes,
                                     walk_rank_live)
from cost_models.pipeline_ops import PassOp


def walk_rank_once(cache: dict | None, chunks: Sequence[ChunkMemory], ops: tuple[PassOp, ...],
                   *, stage: int, num_microbatches: int, pipelined: bool, overhead_bytes: int,
                   optimizer: str, implementation: str,
                   stop_above_bytes: float = math.inf) -> StageMemory:
    """`memory_walk.walk_rank(chunks, ops, ...)`, walked once per content in `cache`
    (None: walked every time). Raises OverLimit as `walk_rank` does."""
    settings = dict(num_microbatches=num_microbatches, pipelined=pipelined,
                    overhead_bytes=overhead_bytes, optimizer=optimizer,
                    implementation=implementation, stop_above_bytes=stop_above_bytes)
    if cache is None:
        return walk_rank_live(chunks, ops, stage=stage, **settings)[0]
    key = ("walk", tuple(chunks), ops, num_microbatches, pipelined, overhead_bytes,
           optimizer, implementation)
    limit = live_limit_bytes(stop_above_bytes, overhead_bytes)
    kept = cache.get(key)
    if kept is not None:
        memory, live_bytes = kept  # memory None: a stopped walk, its peak above live_bytes
        if live_bytes > limit:
            raise OverLimit(live_bytes)
        if memory is not None:
            return memory if memory.stage == stage else dataclasses.replace(memory,
                                                                             stage=stage)
    try:
        memory, live_bytes = walk_rank_live(chunks, ops, stage=stage, **settings)
    except OverLimit as over:
        cache[key] = (None, over.live_bytes)
        raise
    cache[key] = (memory, live_bytes)
    return memory
