"""What a layer's forward pays the host for running its distinct ATen ops one after
another, over what the same ops cost each in a tight loop; one thread, the probe clock.

Every host probe (`cost_models.host_probes`, `cost_models.host_excess`) times a chain of
one call repeated: its code and data stay in the caches. A layer runs its ops in turn,
each distinct op (`aten.add.Tensor`, `aten.view.default`) with its own dispatch path,
kernel and binding, and each op pays for what the others evicted, from the second
distinct op on. The probe times chains of SEQUENCE_CALLS Python calls made of k
distinct ones (`sequence_pool`: elementwise, reductions, views, GEMMs, casts, factories,
indexing; float32, bfloat16, int64, bool; Python numbers, lists, keywords) in order and
each distinct call in a tight loop, grad mode on (a layer's forward records autograd
nodes), k from 2 (a Linear then a ReLU runs 3 distinct ops, the host probe chain 5) to
48, and fits extra seconds per op = `low_op_s` x (min(distinct ops, knee) - 1) +
`op_s` x max(0, distinct ops - knee) (`in_sequence_cost`): 0 at one distinct op (a
chain of one call is its tight loop), continuous at the knee. Distinct ops are counted
by the same `ir.op_count.OpCounter` that counts a layer's (`Layer.distinct_ops_fwd`), so
probe and layer share one measure.

Why two segments (the likely reading; no hardware counters were read): in a tight loop
one call's whole host path (Python argument parsing, the dispatcher's key set, autograd's
wrapper, the kernel's set-up, the allocator handing back the block it just freed) repeats
the same code and branches, so it runs from the L1 instruction cache with its branches
predicted. One op's path is tens of KB of code and hundreds of branches: two or three
alternating ones already overflow the 32 KB L1i and share the predictor's tables, hence a
steep first segment; beyond it each more op adds its code and data to what L2 must hold,
a shallower slope. Read 2026-11-26 (thread clock, 2 shared cores), extra ns per op (in
order / loops) on the pool's first draw at distinct ops 2: 260-500 (1.08-1.14x), 3:
580-940 (1.24-1.35x), 6: 880-1,150 (1.42-1.50x; the host probe chain's own lin-ln-gelu-lin
ran 1.53x: bench/bench_chain_premium.py), 11: 760-1,250, 18: 1,190-2,230, 29:
2,680-3,220, 45: 3,240-4,290 (load 3.3-3.6); on a quiet spell (load 0.6) that draw's
fits read 255-327 ns up to a knee of 3-4, 42-44 beyond. Other draws at the same count
differ as much as counts do (2 distinct: -7 to 360 ns; 16 calls: ~500 to ~1,300), so
the fit takes SEQUENCE_SEEDS' three draws: three fits at load 2.2 (14:27 UTC) read
111-163 ns up to a knee of 3-4, 33-43 beyond; what a layer pays over the host probe
chain's 5 (`host_dispatch.forward_host_seconds`) at 2 distinct ops -218..-254 ns an op,
at 10 +164..+213, at 30 +818..+1,064; twelve held-out chains (draws 3-5, 16-96 calls,
2-48 distinct) within 12% (bench/bench_in_sequence.py). One draw alone read knees of
2-15 and missed held-out chains by up to 38%; the one-segment line fitted on one draw's
8-48 distinct calls read its knee at 0 (44-87 ns) or 16-17 (2026-11-25, 43-55 ns; 48
calls of 8 distinct then cost 1.03-1.08x their loops), missed held-out chains by up to
27% today, and with a knee of 16 credits the chain's 5 with nothing.

Cold: a step runs each layer after the layer before it, so the distinct ops that layer
did not run start with their code and data out of the caches (`Layer
.cold_distinct_ops_fwd`; in backward, those the layers whose backward ran just before did
not run: `cold_distinct_ops_bwd`). Their figures come from probes of layers in a step's
order: `cost_models.cold_entry_probes` (forward) and `cost_models.cold_backward_probes`
(backward). This module keeps what those share: `ColdChain`, a probe chain's record,
and `_overloads`, its ops counted as a layer's are. (The earlier chains of bare calls,
`cold_chains` after the pool's other calls and `cold_backward_chains` in one engine call,
read a curved line and ~2x what the layers miss; their readings are in
bench/bench_small_layers.py's and bench/bench_small_backward.py's docstrings.)

    >>> cost = in_sequence_cost(in_sequence_chains("cpu", grad=True))  # doctest: +SKIP
    >>> cost.low_op_s, cost.knee_distinct_ops, cost.op_s                 # ~1.5e-7, ~3, ~4e-8
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ir.errors import PlannerError


# A chain is SEQUENCE_CALLS calls made of k distinct ones from `sequence_pool` repeated in
# turn, for k in SEQUENCE_DISTINCT; per round it runs SEQUENCE_RUNS times in order, then
# each distinct call SEQUENCE_RUNS times alone; each chain's figure is the median over
# SEQUENCE_ROUNDS rounds after SEQUENCE_WARMUP_RUNS untimed runs (tens of milliseconds a
# round).
SEQUENCE_CALLS = 48  # a transformer block's forward makes 30-60 Python calls
# from a Linear + ReLU's few to a block's tens; the low ones read the first segment
SEQUENCE_DISTINCT = (2, 3, 5, 8, 12, 16, 24, 32, 40, 48)
SEQUENCE_RUNS = 40
SEQUENCE_ROUNDS = 9
SEQUENCE_WARMUP_RUNS = 10
# The pool's orders (which calls a k-distinct chain takes): one chain per count per order;
# at 16 distinct calls one draw read ~500 ns an op, another ~1,300 (2026-11-26), so the
# fit reads several and the held-out check (bench/bench_in_sequence.py) others.
SEQUENCE_SEEDS = (0, 1, 2)
SEQUENCE_SEED = SEQUENCE_SEEDS[0]


def sequence_pool(device: str, grad: bool = False) -> list:
    """One zero-argument callable per distinct torch call path (one Python call each):
    elementwise, reductions, views, GEMMs, casts, factories, indexing; float32, bfloat16,
    int64, bool; Python numbers, lists, keywords. `grad`: the float tensors need a
    gradient (run under grad mode, the ops record autograd nodes, as a layer's do)."""
    import torch
    import torch.nn.functional as F

    def randn(*shape):
        return torch.randn(*shape, device=device, requires_grad=grad)

    x, y, w, v = randn(2, 4, 8), randn(2, 4, 8), randn(8, 8), randn(8)
    xb, xi = x.to(torch.bfloat16), torch.arange(16, device=device).view(2, 8)
    mask, idx = x > 0, torch.tensor([[1, 3], [0, 2]], device=device)
    ones = torch.ones(2, 8, 3, device=device)
    return [
        lambda: torch.add(x, y), lambda: x * 0.5, lambda: x.sub(y, alpha=2),
        lambda: torch.tanh(x), lambda: torch.sigmoid(x), lambda: F.relu(x),
        lambda: F.gelu(x), lambda: F.silu(x), lambda: torch.exp(x),
        lambda: x.transpose(1, 2), lambda: x.view(8, 8), lambda: x.reshape(-1),
        lambda: x.permute(2, 0, 1), lambda: x.unsqueeze(0), lambda: torch.cat([x, y], -1),
        lambda: torch.stack([x, y]), lambda: x.sum(-1), lambda: x.mean(-1, keepdim=True),
        lambda: x.pow(2), lambda: torch.rsqrt(y), lambda: F.softmax(x, dim=-1),
        lambda: F.layer_norm(x, (8,)), lambda: F.linear(x, w, v), lambda: torch.matmul(x, w),
        lambda: torch.where(mask, x, y), lambda: x.masked_fill(mask, 0.0), lambda: xi + 1,
        lambda: xi.float(), lambda: x.to(torch.bfloat16), lambda: xb * xb,
        lambda: torch.arange(8, device=device), lambda: torch.zeros(2, 8, device=device),
        lambda: torch.ones_like(x), lambda: F.embedding(idx, w), lambda: x.clamp(min=0.0),
        lambda: x.expand(3, 2, 4, 8), lambda: x[:, 0], lambda: x[..., :4],
        lambda: x.amax(-1), lambda: x.argmax(-1), lambda: torch.outer(v, v),
        lambda: torch.triu(w), lambda: x.chunk(2, -1), lambda: torch.erf(x),
        lambda: torch.cumsum(x, -1), lambda: x.flatten(1), lambda: F.pad(x, (0, 1)),
        lambda: torch.bmm(x, ones),
    ]


@dataclass(frozen=True, slots=True)
class SequenceChain:
    """One chain's reading: its calls, distinct calls, ATen ops, distinct ATen overloads
    (`ir.op_count.OpCounter.distinct_ops`), seconds in order and as tight loops."""

    calls: int
    distinct_calls: int
    ops: int
    distinct_ops: int
    in_order_s: float
    tight_loops_s: float

    @property
    def extra_s(self) -> float:
        return self.in_order_s - self.tight_loops_s


def sequence_chain(pool: list, distinct: int, calls: int = SEQUENCE_CALLS,
                   device: str = "cpu", grad: bool = False,
                   seed: int = SEQUENCE_SEED) -> SequenceChain:
    """`calls` calls made of the first `distinct` of `pool` shuffled by `seed`,
    repeated in turn, timed in order and each distinct call in a tight loop (one thread,
    grad mode `grad`, the probe clock; both in each round: a slow spell hits both)."""
    import random

    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock
    from ir.op_count import OpCounter

    shuffled = list(pool)
    random.Random(seed).shuffle(shuffled)
    kinds = shuffled[:distinct]
    chain = (kinds * (calls // distinct + 1))[:calls]
    clock = probe_clock(device)
    with _one_thread(), torch.set_grad_enabled(grad):
        def in_order():
            for call in chain:
                call()

        counter = OpCounter()
        with counter:
            in_order()
        for _ in range(SEQUENCE_WARMUP_RUNS):
            in_order()
        order, loops = [], []
        for _ in range(SEQUENCE_ROUNDS):
            start = clock()
            for _ in range(SEQUENCE_RUNS):
                in_order()
            order.append((clock() - start) / SEQUENCE_RUNS)
            loop_s = 0.0
            for call in kinds:
                call()  # its code and data back in cache, as in every host probe
                start = clock()
                for _ in range(SEQUENCE_RUNS):
                    call()
                loop_s += (clock() - start) / SEQUENCE_RUNS * chain.count(call)
            loops.append(loop_s)
    return SequenceChain(calls, distinct, counter.count, counter.distinct_ops,
                         statistics.median(order), statistics.median(loops))


def in_sequence_extra_per_op_s(op_s: float, knee_distinct_ops: float, distinct_ops: float,
                               low_op_s: float = 0.0) -> float:
    """Host seconds an op run in order pays over its tight loop among `distinct_ops`
    distinct ones (`in_sequence_cost`'s fit): `low_op_s` per distinct op from 1 (one
    distinct op is its own tight loop) up to the knee, `op_s` per one beyond it."""
    low = max(0.0, min(distinct_ops, knee_distinct_ops) - 1.0)
    return low_op_s * low + op_s * max(0.0, distinct_ops - knee_distinct_ops)


@dataclass(frozen=True, slots=True)
class InSequenceCost:
    """Extra host seconds per ATen op of a run in order over tight loops: `low_op_s` per
    distinct op from 1 up to `knee_distinct_ops`, `op_s` per one beyond it, fitted to
    the chains (`in_sequence_cost`)."""

    op_s: float
    knee_distinct_ops: float
    residual_s: float  # the fit's root-mean-square miss per op, for the record
    low_op_s: float = 0.0

    def calibration_fields(self) -> dict:
        """The `KernelCalibration` fields these figures fill."""
        return dict(in_sequence_low_op_host_s=self.low_op_s, in_sequence_op_host_s=self.op_s,
                    in_sequence_knee_distinct_ops=self.knee_distinct_ops)


def _two_slopes(xs: list[tuple[float, float]], ys: list[float]) -> tuple[float, float, float]:
    """Least squares of ys = a x0 + b x1 with a, b >= 0 (the better of the free fit, where
    both come out >= 0, and each slope alone): (a, b, sum of squared misses)."""
    s00 = sum(x0 * x0 for x0, _ in xs)
    s11 = sum(x1 * x1 for _, x1 in xs)
    s01 = sum(x0 * x1 for x0, x1 in xs)
    t0 = sum(x0 * y for (x0, _), y in zip(xs, ys))
    t1 = sum(x1 * y for (_, x1), y in zip(xs, ys))
    tries = [(max(0.0, t0 / s00) if s00 else 0.0, 0.0), (0.0, max(0.0, t1 / s11) if s11 else 0.0)]
    det = s00 * s11 - s01 * s01
    if det > 1e-12 * max(1.0, s00 * s11):
        a, b = (t0 * s11 - t1 * s01) / det, (t1 * s00 - t0 * s01) / det
        if a >= 0 and b >= 0:
            tries.append((a, b))
    sse = lambda a, b: sum((a * x0 + b * x1 - y) ** 2 for (x0, x1), y in zip(xs, ys))  # noqa: E731
    return min(((a, b, sse(a, b)) for a, b in tries), key=lambda t: t[2])


def in_sequence_cost(chains: list[SequenceChain]) -> InSequenceCost:
    """Least squares of extra_s / ops = low x (min(distinct ops, knee) - 1) + slope x
    max(0, distinct ops - knee), both >= 0, over `chains`, the knee tried at every whole
    number of distinct ops from 1 to below the chains' second most (two counts at least
    carry the slope beyond it; the line is continuous and 0 at one distinct op: a chain
    of one call is its tight loop). Chains of fewer than 3 distinct-op counts fit no
    knee: refused."""
    per_op = [(c.distinct_ops, c.extra_s / c.ops) for c in chains]
    counts = sorted({d for d, _ in per_op})
    if len(counts) < 3 or counts[-2] < 2:
        raise PlannerError(f"in-sequence fit: chains of {counts} distinct ops; it needs 3 "
                           "counts or more, 2 of them above 1 (SEQUENCE_DISTINCT)")
    ys = [e for _, e in per_op]
    best = None
    for knee in range(1, int(counts[-2])):
        xs = [(in_sequence_extra_per_op_s(0.0, knee, d, 1.0),
               in_sequence_extra_per_op_s(1.0, knee, d)) for d, _ in per_op]
        low, slope, sse = _two_slopes(xs, ys)
        if best is None or sse < best[0] - 1e-30:
            best = (sse, low, slope, knee)
    sse, low, slope, knee = best
    return InSequenceCost(slope, float(knee), (sse / len(per_op)) ** 0.5, low)


def in_sequence_chains(device: str = "cpu", grad: bool = True) -> list[SequenceChain]:
    """The SEQUENCE_DISTINCT chains of SEQUENCE_CALLS calls on each of SEQUENCE_SEEDS'
    draws of the pool, grad mode `grad` (on: as a training forward runs; ~5 s here)."""
    pool = sequence_pool(device, grad)
    return [sequence_chain(pool, k, device=device, grad=grad, seed=seed)
            for seed in SEQUENCE_SEEDS for k in SEQUENCE_DISTINCT]


@dataclass(frozen=True, slots=True)
class ColdChain:
    """A probe chain's cold ops (its distinct ATen overloads the work run before it did
    not run: `ir.op_count.cold_distinct_ops` forward, `cold_distinct_ops_bwd` backward, as
    a layer's are counted), its cold inner ops (backward only: the ops its composites run
    inside, `ir.composite_ops.cold_inner_ops_bwd`), and its seconds run once after that
    work (`cold_s`) and right after a copy of itself (`warm_s`): `cold_entry_probes`' and
    `cold_backward_probes`' records."""

    cold_ops: int
    cold_s: float
    warm_s: float
    cold_inner_ops: int = 0

    @property
    def extra_s(self) -> float:
        return self.cold_s - self.warm_s


def _overloads(fn) -> frozenset[str]:
    """The distinct ATen overloads `fn()` dispatches, as a layer's are recorded
    (`ir.op_count.OpCounter.overload_names`)."""
    from ir.op_count import OpCounter

    counter = OpCounter()
    with counter:
        fn()
    return counter.overload_names
