"""ATen ops a composite op runs inside its CPU kernel, out of a dispatch mode's sight.

A layer's backward ops are counted by a dispatch mode (`ir.op_count.OpCounter`) on meta
tensors: it sees `aten._embedding_bag_backward` once, while on the CPU that op's kernel
calls sort, cumsum, index_select, index_add_ ... through the dispatcher (~20 distinct ops),
each run with its code out of the caches when the layer after ran none of them (issue 17:
dlrm's tables.3 backward -58%, embeddings' -20..-44%). `inner_ops` runs a small instance
of each such op's backward on the CPU under the profiler, once per process, and returns
the ATen names it sees beyond what a dispatch mode sees; `cold_inner_ops_bwd` counts those
of a layer's composites that the layer after's backward did not run. Forward composites
likewise (COMPOSITE_FORWARDS: a `mean` runs sum, fill_, div_ and a `to` inside), counted
by `cold_inner_ops_fwd` against the layers before's forwards.

    >>> sorted(inner_ops("aten.embedding_dense_backward.default"))[:2]
    ['aten::embedding_backward', 'aten::empty']
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch
import torch.nn.functional as F

from ir.op_count import cold_distinct_ops, cold_distinct_ops_bwd

# Sizes of the instances: small (a run costs microseconds), big enough that every path of
# the kernel runs (several indices per row, several bags, several classes)
ROWS, DIM, INDICES, BAGS = 64, 8, 32, 4


def _embedding() -> torch.Tensor:
    weight = torch.randn(ROWS, DIM, requires_grad=True)
    return F.embedding(torch.randint(0, ROWS, (INDICES,)), weight)


def _embedding_bag() -> torch.Tensor:
    weight = torch.randn(ROWS, DIM, requires_grad=True)
    offsets = torch.arange(0, INDICES, INDICES // BAGS)
    return F.embedding_bag(torch.randint(0, ROWS, (INDICES,)), weight, offsets, mode="sum")


def _cross_entropy() -> torch.Tensor:
    logits = torch.randn(BAGS, ROWS, requires_grad=True)
    return F.cross_entropy(logits, torch.randint(0, ROWS, (BAGS,)))


def _mean():
    # an adaptive average pool to 1 x 1 (cnn-small's head) dispatches `mean.dim`
    x = torch.randn(BAGS, DIM, DIM, DIM)
    return lambda: x.mean((-2, -1))


# Forward overloads whose CPU kernels call other ops (`mean` runs sum, fill_, div_ and a
# `to` inside: cnn-small's head paid its mean 31 us cold, gpt-tiny's cold ops 4-15,
# bench/bench_op_context.py), each with a call that runs it on an instance drawn before
COMPOSITE_FORWARDS = {"aten.mean.dim": _mean}
# Backward overloads (as `OpCounter.overload_names` writes them) whose CPU kernels call
# other ops, each with an instance whose backward runs it
COMPOSITE_BACKWARDS = {
    "aten.embedding_dense_backward.default": _embedding,
    "aten._embedding_bag_backward.default": _embedding_bag,
    "aten.nll_loss_backward.default": _cross_entropy,
    "aten._log_softmax_backward_data.default": _cross_entropy,
}


def packet_name(overload: str) -> str:
    """`aten.sort.stable` -> `aten::sort`: the profiler's name of an overload's op."""
    namespace, name = overload.split(".")[:2]
    return f"{namespace}::{name}"


def inner_ops(overload: str) -> frozenset[str]:
    """ATen ops (profiler names) the CPU runs in the backward of `overload`'s instance
    beyond those a dispatch mode sees there; empty for an op not in COMPOSITE_BACKWARDS,
    and (uncached) while a user's profiler runs: a nested session would end theirs."""
    if torch.autograd.profiler._is_profiler_enabled:
        return frozenset()
    return _inner_ops(overload)


@functools.cache
def _inner_ops(overload: str) -> frozenset[str]:
    from torch.profiler import ProfilerActivity, profile

    from ir.op_count import OpCounter

    forward = COMPOSITE_FORWARDS.get(overload)
    build = forward or COMPOSITE_BACKWARDS.get(overload)
    if build is None:
        return frozenset()
    counter = OpCounter()
    with torch.random.fork_rng():  # its random instance leaves the caller's draws alone
        if forward is not None:
            call = build()
            call()  # once unprofiled: the profile sees the op's calls, not a first call's
            with counter, _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
                call()
        else:
            out = build()
    if forward is None:
        seed = torch.ones_like(out)
        with counter, _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            torch.autograd.backward(out, seed)
    seen = {e.name for e in prof.events() if e.name.startswith("aten::")}
    return frozenset(seen - {packet_name(o) for o in counter.overload_names})


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto's C++ start/stop lines ("USDT: ... profiler_start") go to file descriptor 2 at
    every session: a trace would print them for each composite; sent to /dev/null here."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _ran(overloads: frozenset[str]) -> frozenset[str]:
    """What a backward with these overloads ran, as inner ops are named: their ops and the
    inner ops of their composites."""
    inner = frozenset().union(*(inner_ops(o) for o in overloads))
    return frozenset(packet_name(o) for o in overloads) | inner


def _cold_inner(own: frozenset[str], warm: frozenset[str]) -> int:
    """Inner ops of the composites among overloads `own` that neither `own` itself nor
    the overloads `warm` (their ops and their composites' inner ops) ran."""
    inner = frozenset().union(*(inner_ops(o) for o in own))
    if not inner:
        return 0
    mine = inner - {packet_name(o) for o in own}
    return len(mine - _ran(warm))


def cold_inner_ops_fwd(measured, before: frozenset[str] | None) -> int:
    """Inner ops of a layer's composite forward ops (`inner_ops` of its
    `measured.forward_overloads`) that the layers before it (`before`, their overloads)
    did not run, nor any of their composites; for the first layer (None), those its own
    backward did not run (`ir.op_count.cold_distinct_ops`'s order)."""
    warm = measured.backward_overloads if before is None else before
    return _cold_inner(measured.forward_overloads, warm)


def cold_inner_ops_bwd(measured, after: frozenset[str] | None) -> int:
    """Inner ops of a layer's composite backward ops (`inner_ops` of its
    `measured.backward_overloads`) that the layer after's backward (`after`, its
    overloads) did not run, nor any of its composites; for the last layer (None), those
    its own forward did not run (`ir.op_count.cold_distinct_ops_bwd`'s order)."""
    warm = measured.forward_overloads if after is None else after
    return _cold_inner(measured.backward_overloads, warm)


def cold_ops_fwd(measured, before: frozenset[str] | None) -> int:
    """A layer's cold forward ops against `before` (the ops warm when it starts): its
    distinct ops not among them (`cold_distinct_ops`) + the ops its composites run inside
    that they did not (`cold_inner_ops_fwd`), each run with its code cold and priced alike
    (`cost_models.host_dispatch.cold_entry_seconds`). The one count of both the trace
    (`ir.measure`) and a stage's placed passes (`cost_models.step_host.place_rank`)."""
    return cold_distinct_ops(measured, before) + cold_inner_ops_fwd(measured, before)


def cold_ops_bwd(measured, after: frozenset[str] | None) -> dict[str, int]:
    """A layer's cold backward ops against `after` (the ops warm when it starts), as the
    `Layer` fields that hold them (priced at their own figures: `cost_models.host_dispatch
    .backward_host_seconds`); for the trace and `place_rank`, as `cold_ops_fwd`."""
    return {"cold_distinct_ops_bwd": cold_distinct_ops_bwd(measured, after),
            "cold_inner_ops_bwd": cold_inner_ops_bwd(measured, after)}
