"""What a layer's forward pays the host for starting after another layer's work, over
the same forward run right after itself: per layer (`cold_entry_host_s`) and per distinct
op the work before did not run (`cold_op_host_s`); one thread, the probe clock.

A step runs each layer's forward after the layer before's: its generated Python, the
module-call machinery, its modules' and tensors' Python objects and its ops' code start
out of the caches, which every other host probe (tight loops) runs warm. The older probe
(`sequence_probes.cold_chains`: bare calls after the pool's other bare calls) read this
as a median per cold op over a curved line (5.3 us at 1 cold op, 0.9 at 26, and 2 us
for a chain with none), and its neighbour makes no module call: a one-module GraphModule
paid +8.7 us after it, +1.1 us after a small nn.TransformerEncoderLayer (one thread,
2026-11-25, load 3). Here the work before is what a step runs between a small layer's
forwards at least: a layer's forward and backward, the layer's own backward (since
2026-11-25 07:30 UTC; no measurable change yet: `step_work`), then the layer before's
forward (`neighbour_block`s: fx-traced pre-norm transformer blocks of ENTRY_WIDTH features over
ENTRY_TOKENS tokens, module calls and a block's activations). Each probe layer is a
fx-traced module (`_entry_layer`: a LayerNorm module, whose op the block runs, then k
unary ops it does not run), timed run once after that (`cold_s`) and right after itself
(`warm_s`), all layers in each round (`paired_rounds`). `cold_entry_cost` fits cold -
warm = entry + per-op x cold ops (a Theil-Sen line, both >= 0): the entry is what a layer with no cold op pays (gpt-tiny's final
norm: 14.3 us after its step neighbour, 8.0 right after itself:
bench/bench_small_layers.py's variants, 2026-11-25), the slope what each cold op adds
(`Layer.cold_distinct_ops_fwd` counts a layer's the same way: `ir.op_count
.cold_distinct_ops` over the op names the layers before ran).

On this CPU (2026-11-25, load 5-6): cold - warm 3.1-3.9, 5.8-6.9, 6.7-7.8, 9.8-12.2,
17-19, 27 us at 0, 1, 2, 4, 8, 12 cold ops: entry 3.4-4.4 us, 1.9-2.0 us per cold op,
rms 0.3-1.0 us. After the backward alone (a step's first layer: the step before ends in
a backward, its optimizer runs no module code): entry 7.2 us, 1.6-2.4 per cold op
(`KernelCalibration.cold_entry_after_backward_host_s`; llama-tiny's embedding, 1 cold
op, ran 9-10 us over its warm figure there). More work between costs more (the same
layers after 0, 1, 2, 4, 8, 16 blocks' forward and backward then a forward, no cold op:
+1.5, 3.6, 4.7, 6.7, 9.4, 11.7 us; 8 cold ops: +5, 20, 22, 31, 44, 90; after 64 MiB
written, beyond the 32 MiB L3, small layers ran 3-4x their profiled time:
bench/bench_small_layers.py's evict variant): a step of a bigger model evicts more than
the one layer priced here, so the figures are the least a step pays. Passes and the
Theil-Sen line (issue 17: 5.2, 42.5, 0.0, 4.8, 4.4 us entry over five profiles at load
5-9), 16 calls each alternating with the one-pass least-squares probe at load 5.6-6
(2026-11-25): entry 4.2-5.6 us (before: 3.5-7.4), after a backward 6.6-10.8 (6.5-19.0),
1.8-3.0 us per cold op (1.3-2.9); ~0.3 s a call either way. Re-measure quiet.

On an Intel Xeon (2 MiB L2 a core, 2026-11-25, load 4-7) the block pair read 4x the
figures above (15.5 us entry, 28 after a backward) while zoo layers paid 0-10: the entry is
what the work between evicts of the layer's code and objects, and a block's forward and
backward is far more than most layers' neighbours (a table's 6 ops, a head's 23). Not
bytes (a 16x16 block's work cost as much as a 64x64 one's; 1 MiB written cost 4.8 us, 2
MiB, this L2, 17), not page faults (none), not the clock (the wall clock read the same):
the layer norm's extra over its warm run was 1 us after its own backward alone, 8 after
a block's forward, 3-4 after one Linear's forward and backward, 29 after a block's,
15-16 after a block's then a block's forward (which warms the forward path again), 1-2
after a small layer's then a copy of its own code's forward (/tmp experiments of this
session, thread clock, 4-5 interleaved rounds). So the kit measures the fit after several
amounts of work after (ENTRY_WORK: `ColdEntryPoint`s at its ops) and after the same
code (`cold_entry_calibration`), and a layer's price is read off them at its own
(`host_dispatch.cold_entry_seconds`, `Layer.after_ops`, `Layer.same_code_before`).

    >>> cost = cold_entry_cost(cold_entry_chains("cpu"))  # doctest: +SKIP
    >>> cost.entry_s, cost.op_s                             # ~16e-6, ~4e-6 here
    >>> cold_entry_calibration("cpu")["cold_entry_points"]  # doctest: +SKIP
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from cost_models.sequence_probes import ColdChain, _overloads

# The neighbour's size: a zoo "tiny" model's layer (gpt-tiny, llama-tiny: 64 features, 64
# tokens at micro-batch 1); its activations (~16 KiB each, a few dozen) and code evict
# what a small layer's forward touches, as a step's block does.
ENTRY_WIDTH, ENTRY_TOKENS = 64, 64
# Cold ops per probe layer (0: the entry alone; up to ~a dozen: a head's or a relative
# bias's cold ops, below the in-sequence knee of ~16 distinct ops) and the rounds
# (`paired_rounds`' medians; ~0.25 s a call at load 2, 2026-11-25).
ENTRY_COLD_OPS = (0, 1, 2, 4, 8, 12)
ENTRY_RUNS = 40
# Passes over the layers (`paired_rounds`): each layer's runs in 4 lots of 10, so a slow
# spell as long as one lot (~40 ms here) spoils under half of any layer's runs.
ENTRY_PASSES = 4


def _unary_ops() -> list:
    """ENTRY_COLD_OPS[-1] differentiable unary calls, one distinct ATen overload each,
    none of which `neighbour_block` runs."""
    import torch
    import torch.nn.functional as F

    return [torch.tanh, torch.sigmoid, torch.exp, torch.erf, torch.sin, torch.cos,
            torch.neg, torch.abs, F.silu, F.elu, lambda x: torch.cumsum(x, -1),
            lambda x: x.clamp(min=-1.0)]


def neighbour_block(width: int = ENTRY_WIDTH):
    """A fx-traced pre-norm transformer block (layer norm, attention as linear, matmul,
    softmax, matmul, linear; layer norm, MLP with GELU; residual adds): a step's layer."""
    import torch
    from torch import fx, nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            q, k, v = self.qkv(self.ln_1(x)).chunk(3, dim=-1)
            scores = torch.softmax(q @ k.transpose(-1, -2) / width ** 0.5, dim=-1)
            x = x + self.proj(scores @ v)
            return x + self.down(nn.functional.gelu(self.up(self.ln_2(x))))

    return fx.symbolic_trace(Block())


def _entry_layer(cold_ops: int, width: int = ENTRY_WIDTH):
    """A fx-traced layer: a LayerNorm module, then the first `cold_ops` `_unary_ops`."""
    from torch import fx, nn

    calls = _unary_ops()[:cold_ops]

    class EntryLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(width)

        def forward(self, x):
            x = self.norm(x)
            for call in calls:
                x = call(x)
            return x

    return fx.symbolic_trace(EntryLayer())


def small_neighbour(width: int = ENTRY_WIDTH):
    """A fx-traced layer of one nn.Linear: the least a step runs beside a layer (a table,
    a head's projection); `neighbour_block` about the most a small model's step does."""
    from torch import fx, nn

    class Small(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(width, width)

        def forward(self, x):
            return self.proj(x)

    return fx.symbolic_trace(Small())


# The layer after's kinds (`step_work`): the least and about the most a small model's step
# runs between a layer's backward and its next forward
NEIGHBOURS = {"block": neighbour_block, "small": small_neighbour}


def step_work(device: str = "cpu", after_backward: bool = False, after: str = "block",
              before: str = "block"):
    """(fresh, step_between, before): a fresh probe input (made untimed, as `planner
    profile` makes them); what a step runs between a small layer's forwards at least,
    `step_between(own)`: the layer after's forward and backward (`after`, a NEIGHBOURS
    kind), the backward of `own` (the layer's own last output; None: none), then the
    layer before's forward (`before`: "block", a `neighbour_block`; "same", a 0-cold-op
    `_entry_layer`, the probe layer's own code, as a table after a table; not
    `after_backward`: what a step's first layer follows); that layer before. Its own
    backward cost the next forward 1.1-1.4 us more at 0 cold ops in two runs (load 6.5,
    2026-11-25): within this host's noise then; re-measure quiet."""
    import torch

    after = NEIGHBOURS[after]().to(device)
    before = (_entry_layer(0) if before == "same" else NEIGHBOURS[before]()).to(device)

    def fresh():
        return torch.randn(1, ENTRY_TOKENS, ENTRY_WIDTH, device=device, requires_grad=True)

    def step_between(own=None):  # as a step runs them after a layer's forward
        out = after(fresh())
        out.backward(torch.ones_like(out))
        if own is not None:
            own.backward(torch.ones_like(own))
        if not after_backward:
            before(fresh())

    return fresh, step_between, before


def neighbour_ops(kind: str, device: str = "cpu") -> tuple[int, int]:
    """ATen ops of a NEIGHBOURS kind's forward and of its backward, counted as a layer's
    `ops_fwd` and `ops_bwd` are (`Layer.after_ops` sums a step's the same way)."""
    import torch

    from ir.op_count import count_ops

    layer = NEIGHBOURS[kind]().to(device)
    x = torch.randn(1, ENTRY_TOKENS, ENTRY_WIDTH, device=device, requires_grad=True)
    out = []
    forward = count_ops(lambda: out.append(layer(x)))
    seed = torch.ones_like(out[0])
    return forward, count_ops(lambda: out[0].backward(seed))


def cold_entry_chains(device: str = "cpu", after_backward: bool = False,
                      after: str = "block", before: str = "block") -> list[ColdChain]:
    """Each ENTRY_COLD_OPS probe layer timed run once after what a step runs between a
    small layer's forwards at least (`cold_s`: `step_work`'s, the layer after's forward
    and backward, the layer's own backward of its last cold run, then the layer before's
    forward; `after_backward`: without the last, what a step's first layer follows;
    `before` "same": the 0-cold-op layer alone) and right after its own forward
    (`warm_s`), `paired_rounds`' figures; cold ops counted as a layer's are (its
    overloads the layer before's forward did not run). One thread, grad mode on, fresh
    inputs each run (made untimed, as `planner profile` makes them)."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    fresh, step_between, block = step_work(device, after_backward, after, before)
    with _one_thread(), torch.set_grad_enabled(True):
        block_ops = _overloads(lambda: block(fresh()))
        layers = []
        for k in (0,) if before == "same" else ENTRY_COLD_OPS:
            layer = _entry_layer(k).to(device)
            layers.append((len(_overloads(lambda: layer(fresh())) - block_ops), layer))
            for _ in range(3):  # allocator and autograd warm-up, untimed
                step_between(layer(fresh()))
                layer(fresh())
        return paired_rounds(layers, step_between, fresh, probe_clock(device))


# The (layer after, layer before) pairs the kit probes (`cold_entry_calibration`): the
# least and about the most a small model's step runs after a layer (one Linear, a block),
# a block before (a layer of other code); None before: after the backward alone (a step's
# first layer). A small layer before too read the least pair's entry ~0 (1.2 us a cold op,
# the norm's op then cold): priced so, dlrm's tables.0 and cnn's stem fell 20-40% under
# (bench_cold_entry_ab over 3 runs, load 3-4, 2026-11-25), so the before is not an axis.
# Ops are a rough measure of the work: after a backward, a conv block's 31 ops (469 us
# fwd+bwd) cost the norm 14.9 us where the line reads 6.8 (a Linear's 17 ops, 129 us: 4.3;
# a block's 115, 990 us: 28.6; load 3.7): its seconds would place it (13.9); next to do.
ENTRY_WORK = (("small", "block"), ("block", "block"), ("small", None), ("block", None))


def cold_entry_calibration(device: str = "cpu") -> dict:
    """The `KernelCalibration` fields of a forward's start after other layers' work: a
    `ColdEntryPoint` per ENTRY_WORK pair (`cold_entry_cost` of its chains, at the ops
    of the layer after's forward and backward), the
    block pair's figures as the single ones kits before the points had, and at each
    point with a layer before, the entry after the same layer after with the probe
    layer's own code run just before (`ColdEntryPoint.same_code_entry_s`; the small
    one's is `cold_entry_same_code_host_s`, what kits before priced every such layer:
    it grows with the work between, 0.60-0.78 us after the small layer, 1.69-2.07 after
    the block, four interleaved rounds, load 0.6, 2026-11-26)."""
    from ir.kernel_points import ColdEntryPoint

    ops = {kind: neighbour_ops(kind, device) for kind in NEIGHBOURS}
    points = []
    for after, before in ENTRY_WORK:
        cost = cold_entry_cost(cold_entry_chains(device, before is None, after,
                                                 before or "block"))
        same_s = 0.0 if before is None else cold_entry_cost(cold_entry_chains(
            device, after=after, before="same")).entry_s
        points.append(ColdEntryPoint(sum(ops[after]), before is None, cost.entry_s,
                                     cost.op_s, same_s))
    block, first = points[ENTRY_WORK.index(("block", "block"))], points[-1]
    small = points[ENTRY_WORK.index(("small", "block"))]
    return dict(cold_entry_host_s=block.entry_s, cold_op_host_s=block.op_s,
                cold_entry_after_backward_host_s=first.entry_s,
                cold_entry_points=tuple(points),
                cold_entry_same_code_host_s=small.same_code_entry_s)


def paired_rounds(layers, step_between, fresh, clock, runs: int = ENTRY_RUNS,
                  passes: int = ENTRY_PASSES) -> list[ColdChain]:
    """`layers` ((cold ops, layer) pairs) timed `runs` times each, in `passes` passes over
    all layers (the order rotated a place a pass). A run: `step_between(the layer's last
    cold output)`, the layer timed (cold), run again, timed (warm); a pass runs a layer's
    runs back to back after one untimed run, so its code was last run just before the
    step work, as in one long chain. A ColdChain per layer: `warm_s` the median warm
    seconds, `extra_s` (`cold_s - warm_s`) the median of the per-run cold - warm. Passes,
    not all of a layer's runs at once: a slow spell of the host (another process, a
    frequency dip) as long as a layer's runs lands on one pass of a few layers, under half
    of each one's runs, which the medians drop, instead of on all runs of one or two
    layers, which moved the fit's line (entry 5.2, 42.5, 0.0, 4.8, 4.4 us over five
    `profile_device` runs at load 5-9, 2026-11-25). The cyclic collector is off while
    timing (as `timeit` does): a collection is a pause of the whole step, not the entry of
    the layer it lands in."""
    import gc

    if not 1 <= passes <= runs:
        raise ValueError(f"paired_rounds: passes ({passes}) must be between 1 and runs ({runs})")
    # per layer, by its place in `layers` (two layers may have the same cold-op count)
    cold = [[] for _ in layers]
    warm = [[] for _ in layers]
    outs = [None] * len(layers)
    order = list(range(len(layers)))
    enabled = gc.isenabled()
    gc.disable()  # no gc.collect() first: ~85 ms with torch loaded, a third of the probe
    try:
        for p in range(passes):
            shift = p % len(layers)
            for i in order[shift:] + order[:shift]:
                layer = layers[i][1]
                outs[i] = layer(fresh())  # untimed: the layer's code warm before the step work
                for _ in range(runs // passes):
                    step_between(outs[i])
                    x = fresh()
                    start = clock()
                    outs[i] = layer(x)  # its backward runs in the next step_between, as in a step
                    cold[i].append(clock() - start)
                    layer(fresh())
                    x = fresh()
                    start = clock()
                    layer(x)
                    warm[i].append(clock() - start)
    finally:
        if enabled:
            gc.enable()
    chains = []
    for i, (k, _) in enumerate(layers):
        warm_s = statistics.median(warm[i])
        extra_s = statistics.median(c - w for c, w in zip(cold[i], warm[i]))
        chains.append(ColdChain(k, warm_s + extra_s, warm_s))
    return chains


@dataclass(frozen=True, slots=True)
class ColdEntryCost:
    """Host seconds a layer's forward pays for starting after another layer's work:
    `entry_s` per layer + `op_s` per cold distinct op (`cold_entry_cost`'s fit)."""

    entry_s: float
    op_s: float
    residual_s: float  # the fit's root-mean-square miss per probe layer, for the record

    def calibration_fields(self) -> dict:
        """The `KernelCalibration` fields these figures fill."""
        return dict(cold_entry_host_s=self.entry_s, cold_op_host_s=self.op_s)


def cold_entry_cost(chains: list[ColdChain]) -> ColdEntryCost:
    """Theil-Sen line (Sen 1968): slope the median of the pairwise slopes, entry the median
    of cold - warm - slope x cold ops, over `chains`; both >= 0 (a slope below 0: flat at
    the median; an entry below 0: through the origin, slope the median of extra / cold
    ops). Least squares let one chain's slow reading at 0 or 12 cold ops swing the slope
    and with it the entry (the intercept moves by the mean cold ops, ~4.5, times the slope's
    error); this line holds with one chain of six off."""
    xs = [c.cold_ops for c in chains]
    ys = [c.extra_s for c in chains]
    pairs = [(ys[j] - ys[i]) / (xs[j] - xs[i])
             for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    slope = statistics.median(pairs) if pairs else 0.0
    if slope < 0:  # flat: the median
        slope = 0.0
    entry = statistics.median(y - slope * x for x, y in zip(xs, ys))
    if entry < 0:  # through the origin
        ratios = [y / x for x, y in zip(xs, ys) if x]
        entry, slope = 0.0, max(0.0, statistics.median(ratios) if ratios else 0.0)
    sse = sum((entry + slope * x - y) ** 2 for x, y in zip(xs, ys))
    return ColdEntryCost(entry, slope, (sse / len(xs)) ** 0.5)
