"""The autograd engine's start: what one `torch.autograd.backward` call costs beyond the
nodes it runs (graph task, ready queue, hand-off to the device's thread).

A training step pays it once per micro-batch and stage (`step_host`, from
`measure_engine_start`). `layer_profile.time_layer` times a layer's nodes inside one call
(`NodeSpan`), so it pays no start; the same fit over spans (`EngineSampler(nodes_only=
True)`) gives the span's own cost, which it takes out instead. It is the intercept
of backward seconds against graph size: graphs of ENGINE_PROBE_OPS multiplies on a small
leaf are timed in alternating order (a slow spell of a shared host hits every size),
each size's median taken, and a least-squares line drawn through the medians (Legendre
1805); its intercept is the start, its slope one node's cost. The old figure, a one-op
graph less the one-to-two-op difference (t1 - (t2 - t1)), rests on two points whose
noise it doubles: at load it came out above a small layer's whole backward, which the
profile then clamped to 0 (issue 17: "worst inf%" in 2 of ~10 bench runs).

    fit = measure_engine_start("cpu")   # EngineStart(seconds=9.1e-06, ...)  # doctest: +SKIP

The start's intercept includes one leaf's gradient hand-over (the probe's leaf is stolen
into `.grad`, as a layer's parameters are), as the old figure did. A span's does not: its
chain starts at a layer input's stand-in (`ir.stand_in.StepInput`), whose node runs after
the span's end, as a profiled layer's inputs' do (a step hands a layer's input gradient to
the layer before, accumulating nothing).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from ir.errors import PlannerError

# Multiplies per probe graph: spans a small layer's backward nodes (mlp-small's block: ~8)
# so the line is drawn where layers are, and the intercept is not extrapolated far.
ENGINE_PROBE_OPS = (1, 2, 4, 8)
# Elements of the probe's leaf: small enough that each node's work is dispatch only.
ENGINE_PROBE_ELEMENTS = 4
# Rounds (one backward of every size each) of the stand-alone probe, after
# ENGINE_PROBE_WARMUP untimed; split into ENGINE_PROBE_BLOCKS blocks, each block's own fit
# gives the spread. One round took ~0.12 ms here (one thread, 2026-11-25): ~40 ms in all.
ENGINE_PROBE_ROUNDS = 300
ENGINE_PROBE_WARMUP = 10
ENGINE_PROBE_BLOCKS = 5


@dataclass(frozen=True, slots=True)
class EngineStart:
    """The fitted line: `seconds` (intercept: the start), `per_op_s` (slope: one probe
    node), `spread` ((max - min) / median of the blocks' intercepts: how steady the host
    was) and the rounds behind them."""

    seconds: float
    per_op_s: float
    spread: float
    rounds: int


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys) (Legendre 1805)."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError(f"fit_line needs two distinct x values, got {xs!r}")
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
             / sum((x - mean_x) ** 2 for x in xs))
    return mean_y - slope * mean_x, slope


class EngineSampler:
    """Times the probe graphs' backwards, one round at a time, so a caller can interleave
    them with its own work (`layer_profile.time_layer` does, on its own clock). With
    `nodes_only`, each graph's nodes are timed by a `NodeSpan`, as `time_layer` times a
    layer's: the intercept is then the two stamps' own cost, not the engine's start.""" 

    def __init__(self, device: str, clock: Callable[[], float], nodes_only: bool = False):
        import torch

        self.clock, self.nodes_only = clock, nodes_only
        self.sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.leaf = torch.randn(ENGINE_PROBE_ELEMENTS, device=device, requires_grad=True)
        self.seed = torch.ones(ENGINE_PROBE_ELEMENTS, device=device)
        self.samples: dict[int, list[float]] = {ops: [] for ops in ENGINE_PROBE_OPS}
        self._rounds = 0

    def sample(self, keep: bool = True) -> None:
        """One backward of each probe graph, in an order that reverses every round."""
        import torch

        from ir.stand_in import step_input

        order = ENGINE_PROBE_OPS[::-1] if self._rounds % 2 else ENGINE_PROBE_OPS
        self._rounds += 1
        for ops in order:
            # a span's chain starts at a layer input's stand-in, made before the span
            y = step_input(self.leaf) if self.nodes_only else self.leaf
            span = NodeSpan(self.leaf.device.type, self.clock, self.sync) if self.nodes_only else None
            for _ in range(ops):
                y = y * 1.0001
            roots = [y, span.root] if span and span.arm([y]) else [y]
            seeds = [self.seed] * len(roots)
            self.sync()
            start = self.clock()
            torch.autograd.backward(roots, seeds)
            self.sync()
            seconds = span.seconds() if span else self.clock() - start
            if not self.nodes_only:  # a StepInput hands the leaf no gradient
                self.leaf.grad = None  # stolen next time, as a step's first micro-batch does
            if keep:
                self.samples[ops].append(seconds)

    def fit(self, first: int = 0, last: int | None = None) -> tuple[float, float]:
        """(intercept, slope) through each size's median over rounds [first, last)."""
        medians = [statistics.median(self.samples[ops][first:last]) for ops in ENGINE_PROBE_OPS]
        return fit_line([float(ops) for ops in ENGINE_PROBE_OPS], medians)

    def result(self, blocks: int = 1) -> EngineStart:
        """The fit over every kept round; the spread over `blocks` equal runs of rounds."""
        rounds = len(self.samples[ENGINE_PROBE_OPS[0]])
        if rounds == 0:
            raise ValueError("EngineSampler.result: no round was kept")
        intercept, slope = self.fit()
        size = max(1, rounds // max(1, blocks))
        parts = [self.fit(i, i + size)[0] for i in range(0, rounds - size + 1, size)]
        middle = statistics.median(parts)
        spread = (max(parts) - min(parts)) / middle if middle > 0 and len(parts) > 1 else 0.0
        return EngineStart(intercept, slope, spread, rounds)


class NodeSpan:
    """Times a set of nodes inside a larger engine call, as a step runs them: from a
    pre-hook on their first node (of `roots`, the one of highest sequence number, which a
    single thread's ready queue runs first of theirs, after every node made later) to a
    pre-hook on a marker made BEFORE them (this object: one multiply on its own leaf; its
    node, of lower sequence number, runs after theirs and their parameters' accumulations,
    as the layer before's first node does in a step; made after their inputs' stand-ins,
    `ir.stand_in.StepInput`, whose nodes then run after it). Not to the call's end: the engine's
    end after a window of layers ran 20 us here where the nodes' own call's ran 5-11
    (t5-tiny's encoder_norm, per-node stamps, bench/bench_backward_call.py, load 4,
    2026-11-25). Each stamp reads the clock after `sync` (work queued before it done).
    Make it, then the roots' graph; `arm(roots)`, then run the backward over
    `roots + [self.root]`; `seconds()` after."""

    def __init__(self, device: str, clock: Callable[[], float], sync: Callable[[], None]):
        import torch

        self.clock, self.sync = clock, sync
        self.leaf = torch.ones(ENGINE_PROBE_ELEMENTS, device=device, requires_grad=True)
        self.root = self.leaf * 1.0  # made first: lowest sequence number
        self.marks: dict[str, float] = {}

    def _stamp(self, key: str):
        def stamp(grad_outputs):
            self.sync()
            self.marks.setdefault(key, self.clock())
        return stamp

    def arm(self, roots: list) -> bool:
        """Hooks the first of `roots`' nodes and the marker's; False if no root has a node
        (left on the nodes: the graph, released by the call, drops them)."""
        nodes = [t.grad_fn for t in roots if t.grad_fn is not None]
        if not nodes:
            return False
        max(nodes, key=lambda n: n._sequence_nr()).register_prehook(self._stamp("first"))
        self.root.grad_fn.register_prehook(self._stamp("after"))
        return True

    def seconds(self) -> float:
        return self.marks["after"] - self.marks["first"]


def measure_engine_start(device: str = "cpu", nodes_only: bool = False) -> EngineStart:
    """The engine's start on `device` (with `nodes_only`: a `NodeSpan`'s own cost), one
    thread, on the probe clock (`host_probes.probe_clock`: the thread's CPU time on CPU)."""
    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    with _one_thread():
        sampler = EngineSampler(device, probe_clock(device), nodes_only)
        for rep in range(ENGINE_PROBE_WARMUP + ENGINE_PROBE_ROUNDS):
            sampler.sample(keep=rep >= ENGINE_PROBE_WARMUP)
    return checked(sampler.result(ENGINE_PROBE_BLOCKS), device)


def checked(engine: EngineStart, where: str) -> EngineStart:
    """`engine` if its start is above 0; else a PlannerError (a line whose intercept is at
    or below 0 was drawn through noise, and taking it out would add time, not remove it)."""
    if engine.seconds <= 0:
        raise PlannerError(
            f"{where}: the probe's fixed cost (engine start or span) fitted at "
            f"{engine.seconds * 1e6:.2f} us "
            f"(slope {engine.per_op_s * 1e6:.2f} us per op, {engine.rounds} rounds, spread "
            f"{engine.spread:.0%}); the host is too busy to measure it: re-run on a quieter "
            f"machine")
    return engine


def net_backward_seconds(raw_s: list[float], engine: EngineStart, layer: str) -> float:
    """A layer's backward without the fixed cost `engine` fitted (the engine's start, or a
    `NodeSpan`'s own): the median of its timed backwards less it (above 0: `checked`). A result at or below 0 is no measurement
    (the host was too busy, or the fit too noisy, to tell the two apart): a PlannerError
    names the layer and the figures, never a silent 0."""
    whole_s = statistics.median(raw_s)
    net_s = whole_s - checked(engine, f"layer {layer!r}").seconds
    if net_s <= 0:
        raise PlannerError(
            f"layer {layer!r}: its backward ({whole_s * 1e6:.2f} us, median of {len(raw_s)}) "
            f"measured no longer than the fixed cost fitted ({engine.seconds * 1e6:.2f} "
            f"us, spread {engine.spread:.0%}); the host is too busy to time it: re-run "
            f"`planner profile` on a quieter machine or with more --repeats")
    return net_s


def warm_engine_start(device: str = "cpu") -> None:
    """One tiny backward of an op no layer's timing reads (a sine of ENGINE_PROBE_ELEMENTS
    on its own leaf): the next `backward` call's start runs warm, as the start a profile
    takes out (`time_layer`) was measured. Run between a step neighbour's backward and a
    layer's timed one: the neighbour's work leaves the engine's start cold (11-12 us more
    on this CPU, 15-160 us after a block: bench/bench_small_backward.py --calls), which a
    step, running every layer in one call, pays once per micro-batch, not per layer."""
    import torch

    leaf = torch.randn(ENGINE_PROBE_ELEMENTS, device=device, requires_grad=True)
    y = leaf.sin()
    torch.autograd.backward(y, torch.ones_like(y))

