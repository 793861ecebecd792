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

    >>> cost = cold_entry_cost(cold_entry_chains("cpu"))  # doctest: +SKIP
    >>> cost.entry_s, cost.op_s                             # ~4e-6, ~2e-6 here
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


def step_work(device: str = "cpu", after_backward: bool = False):
    """(fresh, step_between, before): a fresh probe input (made untimed, as `planner
    profile` makes them); what a step runs between a small layer's forwards at least,
    `step_between(own)`: a `neighbour_block`'s forward and backward (the layer after's),
    the backward of `own` (the layer's own last output; None: none), then another
    block's forward (the layer before's; not `after_backward`: what a step's first layer
    follows); that layer before. Its own backward cost the next forward 1.1-1.4 us more
    at 0 cold ops in two runs (load 6.5, 2026-11-25); five alternating pairs with and
    without it (load 6-8) gave medians of 5.5 / 5.3 us entry, 1.9 / 2.3 us per cold op,
    and bench_kernel_model's forwards on the one timing 21 / 22 of 54 over 15% (closer
    on 11 rows, further on 13): within this host's noise (entry 1.6-27 us across runs);
    re-measure quiet."""
    import torch

    after, before = neighbour_block().to(device), neighbour_block().to(device)

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


def cold_entry_chains(device: str = "cpu", after_backward: bool = False) -> list[ColdChain]:
    """Each ENTRY_COLD_OPS probe layer timed run once after what a step runs between a
    small layer's forwards at least (`cold_s`: `step_work`'s, a `neighbour_block`'s
    forward and backward, the layer's own backward of its last cold run, then another
    block's forward, the layer before's; `after_backward`: without the last, what a step's
    first layer follows) and right after its own forward (`warm_s`), `paired_rounds`'
    figures; cold ops counted as a layer's are (its overloads the block's forward did not
    run). One thread, grad mode on, fresh inputs each run (made untimed, as `planner
    profile` makes them)."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    fresh, step_between, before = step_work(device, after_backward)
    with _one_thread(), torch.set_grad_enabled(True):
        block_ops = _overloads(lambda: before(fresh()))
        layers = []
        for k in ENTRY_COLD_OPS:
            layer = _entry_layer(k).to(device)
            layers.append((len(_overloads(lambda: layer(fresh())) - block_ops), layer))
            for _ in range(3):  # allocator and autograd warm-up, untimed
                step_between(layer(fresh()))
                layer(fresh())
        return paired_rounds(layers, step_between, fresh, probe_clock(device))


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
