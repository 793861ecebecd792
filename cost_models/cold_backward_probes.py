"""What a layer's backward pays the host for running after the layer after's backward,
over the same backward run right after itself: per distinct backward op the layers
before it in backward did not run (`cold_backward_op_host_s`), and per ATen op a
composite backward runs inside its CPU kernel that they did not run
(`cold_backward_inner_op_host_s`); one thread, the probe clock.

A step runs each layer's backward nodes after those of the layer after it (reverse
order). `Layer.cold_distinct_ops_bwd` counts a layer's backward overloads that the
layers whose backward ran just before did not run (`ir.op_count.recent_backward_ops`),
`Layer.cold_inner_ops_bwd` the ops its composites run inside (`ir.composite_ops`:
`_embedding_bag_backward` runs ~20). The probe builds the same situation with a chain of
`cold_entry_probes._unary_ops` (or a composite's instance) in the place of a layer and a
`cold_entry_probes.neighbour_block` (a small transformer block, which runs none of those
ops) in that of its neighbour, each run as `layer_profile.time_layer` runs a profiled
layer's: the chain's forward, the neighbour's forward, then one call over both, the
chain's nodes (after the neighbour's) timed by an `autograd_engine.NodeSpan` (`cold_s`);
the same with a copy of the chain as the neighbour (`warm_s`), the two alternating. Between two of the chain's backwards
there run, as in a profile or a step, the chain's forward and a neighbour's work.

Why the older one-call probe (`sequence_probes.cold_backward_chains`, since deleted:
the chain's nodes after the others' nodes in one engine call, less the others' call
alone) read ~2x (4.7 us + 2.05 per cold op, 2026-11-25 quiet): (1) its intercept is its
subtraction's, not the chain's: the same chains' own nodes inside that one call, timed
by gradient hooks, paid 0.6 / 1.0 / 11 / 12 / 24 us more after the others' nodes than after a copy's at 1 / 2 /
4 / 5 / 11 cold ops, where the call differences read 7.4 / 8.6 / 18 / 17 / 33 (one call
or two made no difference to the nodes: run as here, 0.9 / 1.3 / 8.4 / 9.6 / 21); (2) its
chains' ops (exact GELU's, softmax's, layer norm's backward: large kernels) cost more
cold than a layer's typical cold op: the unary chains here read 1.2-1.3 us per op, the
chained calls ~2 (bench/bench_small_backward.py --probe, load 5-6: re-measure quiet).
What a layer pays also grows with what ran in between: the unary chains paid 0.55 us
per cold op after the older probe's 14 small calls, 1.4 after a block (an embedding
bag's backward 5.4 vs 17 us; dlrm's tables.3 missed 15), so the neighbour is a block.
Beyond a block it grows slowly and with no one variable (bench_small_backward --sweep:
an embedding's 4.1-4.4 us after the block, 5.2-5.7 after four, 5.8-6.0 with 11 more
distinct ops, 5.6-6.0 with 0.4 ms of Python after its forward, 6.4-6.9 after llama-tiny's
decoder layer), so the block's figures stand.

Fit (`cold_backward_cost`): cold - warm = direct x cold ops + inner x cold inner ops,
least squares through the origin, both >= 0. No intercept: layers with no cold op run
at their warm price (dlrm's tables.0-2 after another table's backward: 0-0.8 us off,
blocks after a block within 5%). A chain of ops the block runs at its own, larger shape
(GELU, layer norm) still paid 3-8 us here: a kernel's other paths, which no op count
sees; not priced. On this CPU (2026-11-25, load 4-6): 2.2-2.7, 3.0, 7.9-8.5, 10.2-11.1,
21.0-21.6 us at 1, 2, 7, 10, 17 cold ops, the embedding bag 12.6-13.3 at 1 + 19 inner,
the embedding 3.8-4.0 at 1 + 4: 1.19-1.21 us per cold op, 0.60-0.64 per inner op, rms
0.6-0.9 us (re-measure quiet).

What ran between also sets the figures: after one Linear's forward and backward a cold
op cost 0.5 us, an inner op 0.26, ~1/6 of the block's (bench/bench_backward_cold_work.py);
`cold_backward_calibration` probes both, and a layer's are read at its backward window's
ops (`Layer.backward_after_ops`; bench/bench_cold_backward_ab.py).

    >>> cost = cold_backward_cost(cold_backward_layers("cpu"))  # doctest: +SKIP
    >>> cost.op_s, cost.inner_op_s                               # ~1.2e-6, ~0.6e-6 here
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from types import SimpleNamespace

from cost_models.sequence_probes import ColdChain

# Chains of the first k `cold_entry_probes._unary_ops` (a layer's 1-17 cold backward ops:
# a norm's to a head's; none of them does the neighbour block run), the composites'
# instances (`ir.composite_ops.COMPOSITE_BACKWARDS`: their inner ops), and the runs per
# chain (medians; ~1 s in all here).
COLD_BACKWARD_CALLS = (1, 2, 4, 8, 12)
COLD_BACKWARD_COMPOSITES = ("aten._embedding_bag_backward.default",
                            "aten.embedding_dense_backward.default")
COLD_BACKWARD_RUNS = 41


@dataclass(frozen=True, slots=True)
class ColdBackwardCost:
    """Host seconds per cold backward op and per cold inner op of a composite
    (`cold_backward_cost`), and the fit's root-mean-square miss per chain."""

    op_s: float
    inner_op_s: float
    residual_s: float

    def calibration_fields(self) -> dict:
        """The `KernelCalibration` fields these figures fill."""
        return dict(cold_backward_op_host_s=self.op_s,
                    cold_backward_inner_op_host_s=self.inner_op_s)


def _ops_of(build, device: str):
    """(forward overloads, backward overloads) of `build()`'s graph, as a layer's are
    recorded (`ir.op_count.OpCounter.overload_names`)."""
    import torch

    from cost_models.sequence_probes import _overloads

    box = {}
    forward = _overloads(lambda: box.setdefault("out", build()))
    out = box["out"]
    backward = _overloads(lambda: torch.autograd.backward(out, torch.ones_like(out)))
    return SimpleNamespace(forward_overloads=forward, backward_overloads=backward)


def backward_after(build, before, clock, device: str) -> float:
    """Seconds of `build()`'s backward nodes after its forward and `before()`'s, run in one
    call after `before()`'s nodes and timed by a `NodeSpan`: `layer_profile.time_layer`'s
    order (its own cost cancels in cold - warm)."""
    import torch

    from cost_models.autograd_engine import NodeSpan

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    span = NodeSpan(device, clock, sync)
    out, prior = build(), before()
    span.arm([out])
    roots = [prior, out, span.root]
    torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])
    return span.seconds()


def cold_backward_layers(device: str = "cpu", after: str = "block") -> list[ColdChain]:
    """Each chain of COLD_BACKWARD_CALLS `_unary_ops` (on a 2 x 8 x 8 input) and each
    composite of COLD_BACKWARD_COMPOSITES timed cold (after the forward and backward of
    `after`, a `cold_entry_probes.NEIGHBOURS` kind: a block, one Linear) and warm (after a
    copy of itself), as the module docstring says."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.cold_entry_probes import ENTRY_TOKENS, ENTRY_WIDTH, NEIGHBOURS, \
        _unary_ops
    from cost_models.host_probes import probe_clock
    from ir.composite_ops import COMPOSITE_BACKWARDS, cold_inner_ops_bwd
    from ir.op_count import cold_distinct_ops_bwd

    clock, block = probe_clock(device), NEIGHBOURS[after]().to(device)

    def neighbour():
        return block(torch.randn(1, ENTRY_TOKENS, ENTRY_WIDTH, device=device,
                                 requires_grad=True))

    def chain_of(calls):
        def build():
            z = torch.randn(2, 8, 8, device=device, requires_grad=True)
            for call in calls:
                z = call(z)
            return z
        return build

    builds = ([chain_of(_unary_ops()[:k]) for k in COLD_BACKWARD_CALLS]
              + [COMPOSITE_BACKWARDS[name] for name in COLD_BACKWARD_COMPOSITES])

    results = []
    with _one_thread(), torch.random.fork_rng(), torch.set_grad_enabled(True):
        after = _ops_of(neighbour, device).backward_overloads
        for build in builds:
            ops = _ops_of(build, device)
            cold, warm = [], []
            for _ in range(COLD_BACKWARD_RUNS):
                cold.append(backward_after(build, neighbour, clock, device))
                warm.append(backward_after(build, build, clock, device))
            results.append(ColdChain(cold_distinct_ops_bwd(ops, after), statistics.median(cold),
                                     statistics.median(warm), cold_inner_ops_bwd(ops, after)))
    return results


def cold_backward_cost(chains: list[ColdChain]) -> ColdBackwardCost:
    """Least squares of extra_s = op_s x cold ops + inner_op_s x cold inner ops over
    `chains`, through the origin, both >= 0 (where the free fit has one < 0, the better of
    the two one-term fits, the other term 0)."""
    rows = [(c.cold_ops, c.cold_inner_ops, c.extra_s) for c in chains]

    def sse(op_s: float, inner_s: float) -> float:
        return sum((op_s * a + inner_s * b - y) ** 2 for a, b, y in rows)

    saa, sbb = sum(a * a for a, _, _ in rows), sum(b * b for _, b, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    say, sby = sum(a * y for a, _, y in rows), sum(b * y for _, b, y in rows)
    candidates = [(max(0.0, say / saa) if saa > 0 else 0.0, 0.0),
                  (0.0, max(0.0, sby / sbb) if sbb > 0 else 0.0)]
    det = saa * sbb - sab * sab
    if det > 0:
        free = ((say * sbb - sby * sab) / det, (sby * saa - say * sab) / det)
        if min(free) >= 0:
            candidates.append(free)
    op_s, inner_s = min(candidates, key=lambda c: sse(*c))
    return ColdBackwardCost(op_s, inner_s, (sse(op_s, inner_s) / max(1, len(rows))) ** 0.5)


# The layers after the kit probes before a chain's backward (`cold_entry_probes.NEIGHBOURS`):
# one Linear and a block, about the least and the most a small model's step runs between a
# layer's forward and its backward. The per-op figures differ ~6x between them (0.52 vs
# 3.3 us a cold op, 0.26 vs 1.8 an inner op: bench/bench_backward_cold_work.py, six
# interleaved rounds, load 4.8, 2026-11-25), so a layer's are read at its window's ops.
COLD_BACKWARD_WORK = ("small", "block")


def cold_backward_calibration(device: str = "cpu") -> dict:
    """The `KernelCalibration` fields of cold backward ops: a `ColdBackwardPoint` per
    COLD_BACKWARD_WORK kind (`cold_backward_cost` of its chains, at the kind's forward and
    backward ops, as `Layer.backward_after_ops` counts a window's), the block's figures
    as the single ones kits before the points had."""
    from cost_models.cold_entry_probes import neighbour_ops
    from ir.kernel_points import ColdBackwardPoint

    costs = {kind: cold_backward_cost(cold_backward_layers(device, kind))
             for kind in COLD_BACKWARD_WORK}
    points = tuple(ColdBackwardPoint(sum(neighbour_ops(kind, device)), cost.op_s,
                                     cost.inner_op_s) for kind, cost in costs.items())
    return dict(costs["block"].calibration_fields(), cold_backward_points=points)
