"""Layer graphs that several tests only read, traced once per pytest session.

    graph = layer_graph("gpt3-175b")   # load_layer_graph("gpt3-175b"), shared

A trace is 0.2-2.5 s of CPU here (gpt3-175b's ~2.3 s, llama3-8b's ~0.9 s), and the same
graphs were traced in several files (gpt3-175b three times, llama3-8b five, gpt3-350m
three) or once per test (gpt-tiny in test_optimizer_impl, seven times). The cache is keyed
by every argument the graph depends on; a LayerGraph is frozen (ir.layer: frozen
dataclasses holding tuples), so sharing it cannot leak one test's changes into another.
For zoo presets and configs (data) only: a factory spec names code a test may change.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from ir.layer import LayerGraph
from planner.models import is_factory_spec, load_layer_graph


@functools.lru_cache(maxsize=None)
def layer_graph(spec: str, micro_batch: int = 1, seq_len: int | None = None,
                dtype: torch.dtype = torch.bfloat16) -> LayerGraph:
    """`load_layer_graph(spec, micro_batch, seq_len, dtype)`, once per session."""
    assert not is_factory_spec(spec), f"{spec} is code: trace it in the test"
    return load_layer_graph(spec, micro_batch, seq_len, dtype)


@contextlib.contextmanager
def commands_trace_once():
    """Inside: `planner.models.load_layer_graph` (what every command calls) traces each
    (spec, micro-batch, sequence length, other arguments) once and hands the same frozen
    graph back after. Not keyed by `progress`, which only draws a terminal's progress
    line and which each command makes anew. Zoo specs only: a factory spec names code and
    an `hf:` spec a file, either of which a test may change between commands. For files
    that run many commands on the same model (a gpt-tiny trace: ~0.25 s of CPU)."""
    import planner.models as models

    traced = {}
    original = models.load_layer_graph

    def cached(spec, micro_batch=1, seq_len=None, *args, progress=None, **kwargs):
        if is_factory_spec(spec) or spec.startswith("hf:"):
            return original(spec, micro_batch, seq_len, *args, progress=progress, **kwargs)
        key = (spec, micro_batch, seq_len, args, tuple(sorted(kwargs.items(), key=str)))
        if key not in traced:
            traced[key] = original(spec, micro_batch, seq_len, *args, progress=progress,
                                   **kwargs)
        return traced[key]

    models.load_layer_graph = cached
    try:
        yield traced
    finally:
        models.load_layer_graph = original
