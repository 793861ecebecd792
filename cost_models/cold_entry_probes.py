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
(`warm_s`). `cold_entry_cost` fits cold - warm = entry + per-op x cold ops (least
squares, both >= 0): the entry is what a layer with no cold op pays (gpt-tiny's final
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
the one layer priced here, so the figures are the least a step pays.

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
# bias's cold ops, below the in-sequence knee of ~16 distinct ops) and the runs per layer
# (medians; ~60 ms in all here).
ENTRY_COLD_OPS = (0, 1, 2, 4, 8, 12)
ENTRY_RUNS = 40


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
    first layer follows) and right after its own forward (`warm_s`),
    alternating, medians of ENTRY_RUNS; cold ops counted as a layer's are (its overloads
    the block's forward did not run). One thread, grad mode on, fresh inputs each run
    (made untimed, as `planner profile` makes them)."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    clock = probe_clock(device)
    fresh, step_between, before = step_work(device, after_backward)
    chains = []
    with _one_thread(), torch.set_grad_enabled(True):
        block_ops = _overloads(lambda: before(fresh()))
        for k in ENTRY_COLD_OPS:
            layer = _entry_layer(k).to(device)
            cold_ops = len(_overloads(lambda: layer(fresh())) - block_ops)
            for _ in range(3):  # allocator and autograd warm-up, untimed
                step_between(layer(fresh()))
                layer(fresh())
            cold, warm, out = [], [], None
            for _ in range(ENTRY_RUNS):
                step_between(out)
                x = fresh()
                start = clock()
                out = layer(x)  # its backward runs in the next step_between, as in a step
                cold.append(clock() - start)
                layer(fresh())
                x = fresh()
                start = clock()
                layer(x)
                warm.append(clock() - start)
            chains.append(ColdChain(cold_ops, statistics.median(cold), statistics.median(warm)))
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
    """Least squares of cold - warm = entry + slope x cold ops over `chains` (both >= 0:
    where one comes out below 0, the other is refitted alone, through the origin or flat)."""
    xs = [c.cold_ops for c in chains]
    ys = [c.cold_s - c.warm_s for c in chains]
    n, mean_x, mean_y = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    entry = mean_y - slope * mean_x
    if slope < 0:  # flat: the mean
        slope, entry = 0.0, mean_y
    if entry < 0:  # through the origin
        sx2 = sum(x * x for x in xs)
        entry, slope = 0.0, (sum(x * y for x, y in zip(xs, ys)) / sx2 if sx2 else 0.0)
    entry, slope = max(0.0, entry), max(0.0, slope)
    sse = sum((entry + slope * x - y) ** 2 for x, y in zip(xs, ys))
    return ColdEntryCost(entry, slope, (sse / n) ** 0.5)
