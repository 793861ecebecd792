"""Probes of kernels whose cost counts items, not bytes (run by `planner profile-device`,
`cost_models.profile_device`): an embedding's forward (per call and per index) and its
backward's scatter-add (per index), an embedding bag's forward and backward (per call and
per index), F.embedding_bag's Python per call and a dropout mask's draw (per element).

    probe_embedding_forward("cpu", "float32")    # EmbeddingForwardCost # doctest: +SKIP
    probe_embedding_backward("cpu", "float32")   # seconds per index   # doctest: +SKIP
    probe_embedding_bag("cpu", "float32", 2e-6)   # EmbeddingBagCost   # doctest: +SKIP
    probe_random_element_s("cpu")                 # seconds per element # doctest: +SKIP
    probe_embedding_bag_python_s("cpu", 1.6e-6)   # seconds per call    # doctest: +SKIP
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# embedding_dense_backward per index: rows of a small model's width (gpt-tiny's 64, where
# the per-index work, not the row's bytes, dominates) into a table of 128 rows, at 512
# and 8192 indices (a zoo embedding's tokens at micro-batch 1 to 16 and past it).
EMBEDDING_PROBE_DIM, EMBEDDING_PROBE_ROWS, EMBEDDING_PROBE_INDICES = 64, 128, (512, 8192)
# Narrower rows cost less per index, not in proportion to their bytes: measured here (one
# thread, thread clock, fp32, 2026-11-26, load 3) 39 ns per index at 4- and 16-wide rows,
# 48 at 64-wide, where the copy table prices a 64-wide row's bytes at ~2 ns; so the
# backward is also probed at T5's relative-bias width (4: one column per head), the
# narrowest a zoo embedding has.
EMBEDDING_NARROW_PROBE_DIM = 4
# Embedding forward (`torch.embedding`: ATen's CompositeExplicitAutograd embedding runs a
# reshape, an index_select and a view inside, which no op count sees) at
# EMBEDDING_FORWARD_PROBE_INDICES ids (llama/gpt-tiny's 32 tokens at micro-batch 1, 512 at
# 16) on the backward probe's table. Measured here (one thread, thread clock, grad off,
# 2026-11-25): 1.92 us at 32 ids, 3.30 at 512, a tiny torch.neg 0.81; the probe, four runs
# at load 3-7: 0.5-0.9 us per call beyond a tiny add and 2.4-2.9 ns per index, where the
# copy table (255 GB/s at these sizes) prices a 64-wide row's read and write (512 B) at
# ~2.0 ns.
EMBEDDING_FORWARD_PROBE_INDICES = (32, 512)
# Each figure is the least of this many passes (a shared host only slows a call down).
EMBEDDING_FORWARD_PROBE_PASSES = 2
# EmbeddingBag (sum, dense gradient), as DLRM's tables run it (planner/zoo/dlrm.py:
# 16-wide rows, bags of 2 ids): a table of EMBEDDING_BAG_PROBE_ROWS rows, bags of
# EMBEDDING_BAG_PROBE_LOOKUPS ids, at EMBEDDING_BAG_PROBE_INDICES ids (dlrm-small's 2 to 32
# at micro-batch 1 to 16, and 512). The line through the two points prices a call: its
# intercept is the work every call does whatever its size (the backward's sort, cumsum,
# index_select, index_add_ and zero-fill each dispatched inside ATen; measured here, one
# thread, 2026-11-24: forward 6.8 us, backward 8.6 us at 8 ids against 2.1 us for one
# tiny op), its slope the work per id. The backward grows faster past the line (its sort):
# 498 us measured at 8192 ids where the line gives ~300. Both points hold several bags; a
# one-bag forward (dlrm-small at micro-batch 1) skips ATen's bag-size slices: the probe
# times the smaller count's ids once more as one bag, and the difference is the multi-bag
# figure. Measured here (one thread, thread clock, grad on, 2026-11-25, load 4-5): 5.1 us
# at 1 bag of 2 ids, 6.2-6.5 at 2 to 16 bags of 2, 5.0 at 1 bag of 8 or 32; the profiler
# lists 8 more calls inside at 2+ bags (3 x slice + as_strided, sub, copy_).
EMBEDDING_BAG_PROBE_ROWS, EMBEDDING_BAG_PROBE_DIM, EMBEDDING_BAG_PROBE_LOOKUPS = 128, 16, 2
EMBEDDING_BAG_PROBE_INDICES = (8, 512)
# A dropout mask is drawn as bernoulli_(keep), keep = 1 - p. On a CPU its cost depends on
# keep, peaking at 0.5 (likely a data-dependent branch per element, mispredicted about
# min(keep, 1 - keep) of the time): measured here, one thread, 256 Ki elements, best of
# 9, 2026-11-24: 13 ns per element at keep 0.5 (what `clusters.measure_random_element_s`
# draws), 9 at 0.3 and 0.7, 6 at 0.9, 3 at 0.99. Dropout trains at p = 0.1 in GPT-2,
# BERT and T5 (planner/zoo/gpt.py, bert.py; HF configs' defaults): keep 0.9.
DROPOUT_KEEP_PROBABILITY = 0.9
# A mask of this many elements (1 MiB of float32: a zoo block's activations at
# micro-batch 16), the median of RANDOM_DRAW_ROUNDS draws after one untimed.
RANDOM_DRAW_ELEMENTS = 1 << 18
RANDOM_DRAW_ROUNDS = 7


def probe_random_element_s(device: str) -> float:
    """Seconds per element of a dropout mask's draw (`bernoulli_` at
    DROPOUT_KEEP_PROBABILITY) on one thread."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    clock = probe_clock(device)  # the thread's CPU time on CPU: see probe_clock
    mask = torch.empty(RANDOM_DRAW_ELEMENTS, device=device)
    with _one_thread():
        mask.bernoulli_(DROPOUT_KEEP_PROBABILITY)  # warm-up
        rounds = []
        for _ in range(RANDOM_DRAW_ROUNDS):
            start = clock()
            mask.bernoulli_(DROPOUT_KEEP_PROBABILITY)
            rounds.append(clock() - start)
    return statistics.median(rounds) / RANDOM_DRAW_ELEMENTS


def probe_embedding_backward(device: str, dtype: str, dim: int = EMBEDDING_PROBE_DIM) -> float:
    """Seconds per index of `embedding_dense_backward` (a scatter-add of one gradient row
    per index into a zeroed table) with rows `dim` wide: the slope between
    EMBEDDING_PROBE_INDICES counts on one small table (what does not grow with the
    indices, the table's zero-fill and the dispatch, cancels). The table's fill is priced
    apart as a copy."""
    import torch

    from cost_models.profile_device import _random, seconds_per_call

    few, many = EMBEDDING_PROBE_INDICES
    seconds = []
    for count in (few, many):
        grad = _random((count, dim), dtype, device)
        index = torch.randint(0, EMBEDDING_PROBE_ROWS, (count,), device=device)
        seconds.append(seconds_per_call(lambda i: torch.ops.aten.embedding_dense_backward(
            grad, index, EMBEDDING_PROBE_ROWS, -1, False), device))
    return max(0.0, (seconds[1] - seconds[0]) / (many - few))


@dataclass(frozen=True, slots=True)
class EmbeddingForwardCost:
    """Device seconds of an embedding's forward: per call beyond one tiny op's dispatch
    (which the host model charges per op) and per index (a row of EMBEDDING_PROBE_DIM)."""

    call_s: float
    index_s: float


def probe_embedding_forward(device: str, dtype: str) -> EmbeddingForwardCost:
    """`torch.embedding` (the C-bound call `F.embedding` makes), grad off, at the
    EMBEDDING_FORWARD_PROBE_INDICES counts: slope per index; intercept less a tiny
    `torch.add` timed alike (on a CPU: its dispatch, output allocation and TensorIterator
    set-up, what the host model's per-op figure prices; on a GPU the device events time
    kernels, nothing is taken out), never below `conv_probes.MIN_DEVICE_SHARE` of the
    smaller call."""
    import torch

    from cost_models.conv_probes import MIN_DEVICE_SHARE
    from cost_models.profile_device import _random, seconds_per_call

    weight = _random((EMBEDDING_PROBE_ROWS, EMBEDDING_PROBE_DIM), dtype, device)
    indices = [torch.randint(0, EMBEDDING_PROBE_ROWS, (count,), device=device)
               for count in EMBEDDING_FORWARD_PROBE_INDICES]
    x, y = _random((2, 8), dtype, device), _random((2, 8), dtype, device)
    with torch.no_grad():
        passes = [[seconds_per_call(lambda i, index=index: torch.embedding(weight, index),
                                    device) for index in indices]
                  + [seconds_per_call(lambda i: torch.add(x, y), device)]
                  for _ in range(EMBEDDING_FORWARD_PROBE_PASSES)]
    few_s, many_s, add_s = (min(column) for column in zip(*passes))
    few, many = EMBEDDING_FORWARD_PROBE_INDICES
    slope = max(0.0, (many_s - few_s) / (many - few))
    reference_s = add_s if device == "cpu" else 0.0
    return EmbeddingForwardCost(max(few_s - slope * few - reference_s,
                                    MIN_DEVICE_SHARE * few_s), slope)


@dataclass(frozen=True, slots=True)
class EmbeddingBagCost:
    """Device seconds of an embedding bag's forward and backward: per call (beyond one
    op's dispatch, which the host model charges) and per index; and what a forward of
    several bags pays beyond one bag of the same ids (`multi_bag_s`)."""

    call_s: float
    index_s: float
    backward_call_s: float
    backward_index_s: float
    multi_bag_s: float


def probe_embedding_bag(device: str, dtype: str, dispatch_s: float) -> EmbeddingBagCost:
    """`_embedding_bag` and `_embedding_bag_backward` (sum mode, dense gradient) at the
    EMBEDDING_BAG_PROBE_INDICES counts: slope per index, intercept less `dispatch_s` (one
    tiny op's host dispatch, `profile_device.probe_launch`; 0 on a GPU, whose events time
    the device), never below `conv_probes.MIN_DEVICE_SHARE` of the smaller call; then the
    smaller count's forward as one bag: `multi_bag_s` = its line point less that, >= 0.
    On a CPU the backward is timed as its formula calls it, from C++, less a tiny add
    timed alike (`cpp_calls`: through `torch.ops` from Python it read ~2.5 us a call of
    Python argument parsing more than `dispatch_s` takes out)."""
    import torch

    from cost_models import cpp_calls
    from cost_models.conv_probes import MIN_DEVICE_SHARE
    from cost_models.profile_device import _random, seconds_per_call

    aten = torch.ops.aten
    rows = EMBEDDING_BAG_PROBE_ROWS
    forward_s, backward_s, backward_dispatch_s = [], [], []
    for count in EMBEDDING_BAG_PROBE_INDICES:
        weight = _random((rows, EMBEDDING_BAG_PROBE_DIM), dtype, device)
        index = torch.randint(0, rows, (count,), device=device)
        offsets = torch.arange(0, count, EMBEDDING_BAG_PROBE_LOOKUPS, device=device)
        # _embedding_bag(weight, indices, offsets, scale_grad_by_freq, mode (0: sum), sparse,
        # per_sample_weights, include_last_offset, padding_idx)
        bag_args = (weight, index, offsets, False, 0, False, None, False, -1)
        out, offset2bag, bag_size, max_indices = aten._embedding_bag(*bag_args)
        grad = _random(tuple(out.shape), dtype, device)
        forward_s.append(seconds_per_call(lambda i: aten._embedding_bag(*bag_args), device))
        if device == "cpu":  # from C++, as autograd's engine calls it
            timed = cpp_calls.seconds_per_cpp_call(cpp_calls.bag_backward_loops(
                grad, index, offsets, offset2bag, bag_size, max_indices, rows))
            backward_s.append(timed["op"])
            backward_dispatch_s.append(timed["reference"])
            continue
        backward_s.append(seconds_per_call(lambda i: aten._embedding_bag_backward(
            grad, index, offsets, offset2bag, bag_size, max_indices, rows, False, 0, False,
            None, -1), device))
    few, many = EMBEDDING_BAG_PROBE_INDICES

    def line(seconds: list[float], dispatch: float) -> tuple[float, float]:
        slope = max(0.0, (seconds[1] - seconds[0]) / (many - few))
        intercept = seconds[0] - slope * few
        return max(intercept - dispatch, MIN_DEVICE_SHARE * seconds[0]), slope

    # the smaller count's ids as one bag (offsets [0]): ATen skips the bag-size slices
    index = torch.randint(0, rows, (few,), device=device)
    one_bag = (weight, index, torch.zeros(1, dtype=torch.int64, device=device), False, 0,
               False, None, False, -1)
    one_bag_s = seconds_per_call(lambda i: aten._embedding_bag(*one_bag), device)
    # the backward's dispatch: the C++ add's beside the smaller count, else the forward's
    return EmbeddingBagCost(*line(forward_s, dispatch_s),
                            *line(backward_s, backward_dispatch_s[0] if backward_dispatch_s
                                  else dispatch_s),
                            max(0.0, forward_s[0] - one_bag_s))


# F.embedding_bag's Python (its argument checks and the 2-D ids' handling, written in
# Python), which no op count sees: 2-D ids of EMBEDDING_BAG_PROBE_LOOKUPS per bag, as
# nn.EmbeddingBag calls it in DLRM, timed against `torch.embedding_bag` called alike from
# Python, EMBEDDING_BAG_PYTHON_ROUNDS rounds of EMBEDDING_BAG_PYTHON_CALLS calls each.
# Measured here (one thread, thread clock, grad on, 2026-11-25, load 4): F.embedding_bag
# 15.9 us = torch.embedding_bag 8.6 + the offsets' arange 2.2 + the ids' reshape 1.8 + 3.3.
EMBEDDING_BAG_PYTHON_ROUNDS, EMBEDDING_BAG_PYTHON_CALLS = 9, 200


def bag_python_excess(device: str, priced_calls_s: float) -> dict[str, float]:
    """The forward host excess `F.embedding_bag`'s Python adds, keyed by the op it calls
    (`priced_calls_s`: `probe_embedding_bag_python_s`')."""
    return {"aten::_embedding_bag": probe_embedding_bag_python_s(device, priced_calls_s)}


def probe_embedding_bag_python_s(device: str, priced_calls_s: float) -> float:
    """Host seconds per `F.embedding_bag` call (2-D ids, sum, grad on) beyond
    `torch.embedding_bag` on the flat ids and offsets (the layer's `_embedding_bag`, its
    measured call standing for its price: 5.8 us measured, 5.7 priced, dlrm-small,
    bench/bench_small_pass_terms.py, 2026-11-26) and `priced_calls_s`, what the layer's
    records price the offsets' `arange`, the ids' `clone` and `_unsafe_view` at (two
    function ops and a view, `host_probes.host_op_seconds_by_pass`'): not their own
    time, which is more from Python (1.27 + 1.48 us measured where they price 1.61 in all,
    2026-11-26, load 0.4), so that time went unpriced. The median over rounds, each
    timing both in turn on the probe clock, >= 0. Charged per forward `_embedding_bag`
    call as its excess (`KernelCalibration.host_excess_s`)."""
    import torch
    import torch.nn.functional as F

    from cost_models.host_probes import probe_clock

    clock = probe_clock(device)
    weight = torch.randn(EMBEDDING_BAG_PROBE_ROWS, EMBEDDING_BAG_PROBE_DIM, device=device,
                         requires_grad=True)
    few = EMBEDDING_BAG_PROBE_INDICES[0]
    ids = torch.randint(0, EMBEDDING_BAG_PROBE_ROWS, (few // EMBEDDING_BAG_PROBE_LOOKUPS,
                                                      EMBEDDING_BAG_PROBE_LOOKUPS), device=device)
    flat = ids.reshape(-1)
    offsets = torch.arange(0, few, EMBEDDING_BAG_PROBE_LOOKUPS, device=device)
    calls = (lambda: F.embedding_bag(ids, weight, mode="sum"),
             lambda: torch.embedding_bag(weight, flat, offsets, False, 0))
    rounds = []
    for _ in range(EMBEDDING_BAG_PYTHON_ROUNDS):
        per_call = []
        for call in calls:
            call()  # its code warm, as the round's other calls left it
            start = clock()
            for _ in range(EMBEDDING_BAG_PYTHON_CALLS):
                call()
            per_call.append((clock() - start) / EMBEDDING_BAG_PYTHON_CALLS)
        rounds.append(per_call[0] - per_call[1] - priced_calls_s)
    return max(0.0, statistics.median(rounds))
