"""What a layer's forward pays the host for running its distinct ATen ops one after
another, over what the same ops cost each in a tight loop; one thread, the probe clock.

Every host probe (`cost_models.host_probes`, `cost_models.host_excess`) times a chain of
one call repeated: its code and data stay in the caches. A layer runs its ops in turn,
each distinct op (`aten.add.Tensor`, `aten.view.default`) with its own dispatch path,
kernel and binding, and once more distinct ops run than the caches hold, each op pays for
the others' evictions. The probe times chains of SEQUENCE_CALLS Python calls made of k
distinct ones (`sequence_pool`: elementwise, reductions, views, GEMMs, casts, factories,
indexing; float32, bfloat16, int64, bool; Python numbers, lists, keywords) in order and
each distinct call in a tight loop, grad mode on (a layer's forward records autograd
nodes), and fits extra seconds per op = `op_s` x max(0, distinct ops - knee)
(`in_sequence_cost`): distinct ops are counted by the same `ir.op_count.OpCounter` that
counts a layer's (`Layer.distinct_ops_fwd`), so probe and layer share one measure.

On this CPU (torch 2.13, 2026-11-25, load 2.6-4 on 2 shared cores) the extra per op
was 0-250 ns up to 23 distinct ops, then ~45-50 ns more per distinct op (29: ~550-700
ns, 45: ~1,300-1,500 ns): a function of the distinct ops, not of the chain's length (48
calls of 8 distinct cost 1.03-1.08x their loops, 48 of 48 distinct 2.0-2.1x, 96 of 16
distinct 1.06-1.12x, 96 of 48 distinct 2.0x). Six fits: 42.9-55.3 ns per op per distinct
op beyond a knee of 16-17 (grad off: 24-28 ns beyond 12-15); the median fit predicted
nine chains it was not fitted on (16-96 calls, other draws of the pool) within 9%
(bench/bench_in_sequence.py).

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
    >>> cost.op_s, cost.knee_distinct_ops                               # ~5e-8, ~16
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


# A chain is SEQUENCE_CALLS calls made of k distinct ones from `sequence_pool` repeated in
# turn, for k in SEQUENCE_DISTINCT; per round it runs SEQUENCE_RUNS times in order, then
# each distinct call SEQUENCE_RUNS times alone; each chain's figure is the median over
# SEQUENCE_ROUNDS rounds after SEQUENCE_WARMUP_RUNS untimed runs (tens of milliseconds a
# round).
SEQUENCE_CALLS = 48  # a transformer block's forward makes 30-60 Python calls
SEQUENCE_DISTINCT = (8, 16, 24, 32, 40, 48)
SEQUENCE_RUNS = 40
SEQUENCE_ROUNDS = 9
SEQUENCE_WARMUP_RUNS = 10
SEQUENCE_SEED = 0  # the pool's order: which calls a k-distinct chain takes


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


def in_sequence_extra_per_op_s(op_s: float, knee_distinct_ops: float,
                               distinct_ops: float) -> float:
    """Host seconds an op run in order pays over its tight loop among `distinct_ops`
    distinct ones: `op_s` per distinct op beyond the knee (`in_sequence_cost`'s fit)."""
    return op_s * max(0.0, distinct_ops - knee_distinct_ops)


@dataclass(frozen=True, slots=True)
class InSequenceCost:
    """Extra host seconds per ATen op of a run in order over tight loops, per distinct
    op beyond the `knee_distinct_ops` a run keeps in cache: extra per op =
    `op_s` x max(0, distinct ops - knee), fitted to the chains (`in_sequence_cost`)."""

    op_s: float
    knee_distinct_ops: float
    residual_s: float  # the fit's root-mean-square miss per op, for the record

    def calibration_fields(self) -> dict:
        """The `KernelCalibration` fields these figures fill."""
        return dict(in_sequence_op_host_s=self.op_s,
                    in_sequence_knee_distinct_ops=self.knee_distinct_ops)


def in_sequence_cost(chains: list[SequenceChain]) -> InSequenceCost:
    """Least squares of extra_s / ops = slope x max(0, distinct ops - knee) over `chains`,
    the knee tried at every whole number of distinct ops below the chains' most (a cache
    holds so many ops' code and data; beyond it each more evicts in proportion)."""
    per_op = [(c.distinct_ops, c.extra_s / c.ops) for c in chains]
    best = None
    for knee in range(max(d for d, _ in per_op)):
        xs = [in_sequence_extra_per_op_s(1.0, knee, d) for d, _ in per_op]
        slope = max(0.0, sum(x * e for x, (_, e) in zip(xs, per_op)) / sum(x * x for x in xs))
        sse = sum((slope * x - e) ** 2 for x, (_, e) in zip(xs, per_op))
        if best is None or sse < best[0]:
            best = (sse, slope, knee)
    sse, slope, knee = best
    return InSequenceCost(slope, float(knee), (sse / len(per_op)) ** 0.5)


def in_sequence_chains(device: str = "cpu", grad: bool = True) -> list[SequenceChain]:
    """The SEQUENCE_DISTINCT chains of SEQUENCE_CALLS calls, grad mode `grad` (on: as a
    training forward runs; ~1 s on this CPU)."""
    pool = sequence_pool(device, grad)
    return [sequence_chain(pool, k, device=device, grad=grad) for k in SEQUENCE_DISTINCT]


@dataclass(frozen=True, slots=True)
class ColdChain:
    """A probe chain's cold ops (its distinct ATen overloads the work run before it did
    not run: `ir.op_count.cold_distinct_ops`, as a layer's are counted) and its seconds
    run once after that work (`cold_s`) and right after itself (`warm_s`):
    `cold_entry_probes`' records."""

    cold_ops: int
    cold_s: float
    warm_s: float


def _overloads(fn) -> frozenset[str]:
    """The distinct ATen overloads `fn()` dispatches, as a layer's are recorded
    (`ir.op_count.OpCounter.overload_names`)."""
    from ir.op_count import OpCounter

    counter = OpCounter()
    with counter:
        fn()
    return counter.overload_names
