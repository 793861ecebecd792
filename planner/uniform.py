"""Uniform plans: the layer tables restricted to one strategy family on every layer
(`uniform_groups`, what the uniform baselines and `--uniform` search), and contiguous
chunks of about equal compute (`even_chunks`, the interleaved schedule's stages and the
baselines' least-memory plans).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ir.layer import Layer, LayerGraph
from ir.legality import sequence_parallel_applies
from ir.strategy import LayerStrategy
from planner.layer_tables import LayerTable, select, unique


def _sp_moot(layer: Layer, s: LayerStrategy) -> bool:
    """Whether `s` runs the same on `layer` with its SP flag flipped."""
    return s.tp > 1 and sequence_parallel_applies(layer, s) == sequence_parallel_applies(
        layer, dataclasses.replace(s, sequence_parallel=not s.sequence_parallel))


def uniform_groups(graph: LayerGraph, tables: list[LayerTable],
                   cache: dict | None = None) -> list[list[LayerTable]]:
    """The tables restricted to each uniform strategy: the same tp, DP mode, checkpointing
    and offload on every layer, and sequence parallelism on every layer where it applies
    (`ir.legality.sequence_parallel_applies`; an embedding, a norm or a head runs one way).
    `cache` (one dict per graph) keeps `_sp_moot` by (layer, strategy) across calls."""
    cache = {} if cache is None else cache
    # Per unique table, its strategies' indices by the uniform keys they may serve: a
    # strategy serves its own SP flag, and the other one where SP does not apply.
    buckets: dict[int, dict[tuple, list[int]]] = {}
    for j, (layer, t) in enumerate(zip(graph.layers, tables)):
        if id(t) in buckets:
            continue
        by_key: dict[tuple, list[int]] = {}
        for i, s in enumerate(t.strategies):
            moot = cache.get(("sp-moot", j, s))
            if moot is None:
                moot = cache[("sp-moot", j, s)] = _sp_moot(layer, s)
            serves = (s.sequence_parallel, not s.sequence_parallel) if moot \
                else (s.sequence_parallel,)
            for sp in serves:
                by_key.setdefault((s.tp, s.dp_mode, sp, s.checkpoint, s.offload), []).append(i)
        buckets[id(t)] = by_key
    keys = {(s.tp, s.dp_mode, s.sequence_parallel, s.checkpoint, s.offload)
            for t in unique(tables) for s in t.strategies}  # the uniform strategies offered
    groups = []
    for key in sorted(keys, key=str):
        chosen: dict[int, LayerTable | None] = {}  # identical layers keep sharing one table
        group = []
        for t in tables:
            if id(t) not in chosen:
                chosen[id(t)] = select(t, buckets[id(t)].get(key, []))
            if chosen[id(t)] is None:
                break
            group.append(chosen[id(t)])
        else:
            groups.append(group)
    return groups


def even_chunks(graph: LayerGraph, tables: list[LayerTable], chunks: int) -> list[tuple[int, int]] | None:
    """Contiguous chunks of about equal fastest compute, cut only at cut points."""
    fastest = {id(t): float(t.time_s.min()) for t in unique(tables)}
    weight = np.array([fastest[id(t)] for t in tables])
    total = weight.sum()
    cuts = np.array(sorted(set(graph.cut_points)), dtype=np.int64)
    at_cut, chosen = np.cumsum(weight)[cuts], []  # the compute up to each cut
    first = 0  # the cuts after the last chosen one
    for k in range(1, chunks):
        target = total * k / chunks
        if first >= len(cuts):
            return None
        # the nearest cut to the target; the first of equals (np.argmin, as min() picks)
        near = first + int(np.abs(at_cut[first:] - target).argmin())
        chosen.append(int(cuts[near]))
        first = near + 1
    bounds = [0] + [c + 1 for c in chosen] + [len(tables)]
    pieces = [(bounds[i], bounds[i + 1] - 1) for i in range(chunks)]
    return pieces if all(a <= b for a, b in pieces) else None
