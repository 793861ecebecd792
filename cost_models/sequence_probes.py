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
.cold_distinct_ops_fwd`; in backward, those the layer after's backward did not run:
`cold_distinct_ops_bwd`). `cold_chains` times chains of 1-32 distinct calls run once
right after the pool's other calls (a layer's worth of other ops) and right after
themselves, `cold_backward_chains` chains' backwards after another chain's backward;
`cold_op_cost` takes the median extra per cold op (a distinct op the calls before did
not run). On this CPU (2026-11-25, load 5-8), forward: 5.2-5.4, 3.6, 2.1, 1.9-2.0,
0.9-1.0 us per cold op at 1, 2, 7, 13, 26 cold ops, median 2.1 us (one call whose ops
the others all ran, 0 cold, still paid 2 us); backward: 1.9-2.1, 1.0, 0.6-0.9, 0.7-0.8,
0.6 us at 1, 2, 4, 5, 11, median 0.7-0.9 us. After a backward instead of a forward (what
the first layer's forward follows in a step) the forward figure was 7-13 us at 1-4
distinct ops, 2.3-4.5 at 11-29: not priced apart. profile-device writes the forward's
cold figures from `cost_models.cold_entry_probes` instead (an entry per layer + a slope
per cold op, after a layer's work with module calls: this median read a curved line and
a neighbour of bare calls); `cold_op_cost` stays for the backward chains.

    >>> cost = in_sequence_cost(in_sequence_chains("cpu", grad=True))  # doctest: +SKIP
    >>> cost.op_s, cost.knee_distinct_ops                               # ~5e-8, ~16
    >>> cold_op_cost(cold_chains("cpu"))                                # ~2e-6
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


# Cold: chains of COLD_DISTINCT distinct calls (seed 0's order, grad on) each run once after
# the pool's other calls (a layer's worth of other ops: what a step's layer before runs),
# and once right after itself; medians of COLD_RUNS (~0.3 s on this CPU).
COLD_DISTINCT = (1, 2, 4, 8, 16, 32)  # a layer's cold ops: 1 (an embedding) to ~30 (a block)
COLD_RUNS = 30


@dataclass(frozen=True, slots=True)
class ColdChain:
    """A chain's cold ops (its distinct ATen overloads the calls run before it did not
    run: `ir.op_count.cold_distinct_ops`, as a layer's are counted) and its seconds run
    once after those calls (`cold_s`) and right after itself (`warm_s`)."""

    cold_ops: int
    cold_s: float
    warm_s: float

    @property
    def cold_op_s(self) -> float:
        return (self.cold_s - self.warm_s) / self.cold_ops


def _overloads(fn) -> frozenset[str]:
    from ir.op_count import OpCounter

    counter = OpCounter()
    with counter:
        fn()
    return counter.overload_names


def cold_chains(device: str = "cpu") -> list[ColdChain]:
    """The COLD_DISTINCT chains, each timed cold and warm (one thread, grad mode on, the
    probe clock; alternating, so that a slow spell hits both)."""
    import random

    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    pool = sequence_pool(device, grad=True)
    random.Random(SEQUENCE_SEED).shuffle(pool)
    clock = probe_clock(device)
    chains = []
    with _one_thread(), torch.set_grad_enabled(True):
        for k in COLD_DISTINCT:
            chain, others = pool[:k], pool[k:]

            def run(calls):
                for call in calls:
                    call()

            cold_ops = len(_overloads(lambda: run(chain)) - _overloads(lambda: run(others)))
            cold, warm = [], []
            for _ in range(COLD_RUNS):
                for runs, before in ((cold, others), (warm, chain)):
                    run(before)
                    start = clock()
                    run(chain)
                    runs.append(clock() - start)
            chains.append(ColdChain(cold_ops, statistics.median(cold), statistics.median(warm)))
    return chains


def cold_op_cost(chains: list[ColdChain]) -> float:
    """Host seconds a distinct op pays run once after other code over run right after
    itself: the median over `chains` of (cold - warm) / cold ops (`Layer
    .cold_distinct_ops_fwd`, `cold_distinct_ops_bwd` count a layer's so); chains with
    none are left out."""
    return max(0.0, statistics.median(c.cold_op_s for c in chains if c.cold_ops))


def chained_calls(device: str) -> list:
    """Differentiable calls from a 2 x 8 x 8 float32 tensor to one of the same shape, one
    Python call each (a chain of them records one autograd node, or a few, per call)."""
    import torch
    import torch.nn.functional as F

    y = torch.randn(2, 8, 8, device=device)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    v = torch.randn(8, device=device, requires_grad=True)
    mask = y > 0
    return [
        torch.tanh, torch.sigmoid, F.relu, F.gelu, F.silu, torch.exp, lambda x: x * 0.5,
        lambda x: x + 1, lambda x: x.pow(2), lambda x: F.softmax(x, -1),
        lambda x: F.layer_norm(x, (8,)), lambda x: F.linear(x, w, v),
        lambda x: torch.matmul(x, w), lambda x: x.transpose(1, 2),
        lambda x: x.clamp(min=-1.0), torch.erf, lambda x: torch.cumsum(x, -1), torch.neg,
        torch.sin, torch.cos, lambda x: F.log_softmax(x, -1), lambda x: x * y,
        lambda x: x + y, lambda x: torch.where(mask, x, y),
        lambda x: x.masked_fill(mask, 0.0), lambda x: x.reshape(2, 64).view(2, 8, 8),
        lambda x: x.sum(-1, keepdim=True).expand(2, 8, 8), lambda x: x - y,
    ]


# Backward: chains of the first COLD_BACKWARD_CALLS `chained_calls`, each after the
# backward of the last COLD_BACKWARD_OTHERS (half of them: a small layer's worth).
COLD_BACKWARD_CALLS = (1, 2, 4, 8, 14)
COLD_BACKWARD_OTHERS = 14


def cold_backward_chains(device: str = "cpu") -> list[ColdChain]:
    """(Superseded for pricing by `cost_models.cold_backward_probes`, which profile-device
    writes: this one read ~2x what the layers miss; kept for bench/bench_host_ab.py's
    what-ifs.) The backward nodes of chains of COLD_BACKWARD_CALLS `chained_calls`, each run inside
    ONE engine call, as a step runs a layer's nodes after the layer after's: after the
    nodes of the others' chain (`cold_s`: that call less the others' alone; cold ops: the
    backward overloads the others did not run) and after a copy of its own (`warm_s`: that
    call less the copy's alone). The engine runs the nodes of the part built last first
    (its ready queue takes the highest sequence number). One thread, the probe clock,
    medians of COLD_RUNS. Each of the chain's backward timed as its own call instead (as
    before 2026-11-25) also paid that call's start run cold, a per-call cost a step pays
    once, not per layer (bench/bench_small_backward.py --calls: a multiply's node 11 us
    dearer as its own call after a 28-op chain's backward than warm, ~0 inside its call)."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    calls, clock = chained_calls(device), probe_clock(device)
    others_calls = calls[-COLD_BACKWARD_OTHERS:]

    def built(chain):
        z = torch.randn(2, 8, 8, device=device, requires_grad=True)
        for call in chain:
            z = call(z)
        return z

    def call_s(*chains) -> float:
        """One backward call through `chains`, built in order (the last one's nodes run
        first); its seconds on the probe clock."""
        parts = [built(chain).sum() for chain in chains]
        root = parts[0]
        for part in parts[1:]:
            root = root + part
        start = clock()
        root.backward()
        return clock() - start

    def overloads_bwd(chain) -> frozenset[str]:
        z = built(chain)
        return _overloads(lambda: torch.autograd.backward(z, torch.ones_like(z)))

    results = []
    with _one_thread():
        others_ran = overloads_bwd(others_calls)
        for k in COLD_BACKWARD_CALLS:
            chain = calls[:k]
            cold_ops = len(overloads_bwd(chain) - others_ran)
            runs = {"others": [], "cold": [], "copy": [], "warm": []}
            for _ in range(COLD_RUNS):
                runs["others"].append(call_s(others_calls))
                runs["cold"].append(call_s(chain, others_calls))
                runs["copy"].append(call_s(chain))
                runs["warm"].append(call_s(chain, chain))
            med = {key: statistics.median(v) for key, v in runs.items()}
            results.append(ColdChain(cold_ops, med["cold"] - med["others"],
                                     med["warm"] - med["copy"]))
    return results
