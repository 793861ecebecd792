"""A forward started after other layers' work (`cost_models.cold_entry_probes`): the fit
of an entry per layer + a slope per cold op, the probe that measures it, the forward host
term that prices it (`host_dispatch.forward_host_seconds`), a step whose ops all fit in
the caches (`ir.op_count.step_evicts`, `Layer.step_warm`), the spec field, and `planner
profile` running the layers before a timed forward whose ops a step leaves warm
(`layer_profile.forward_window`, `StepNeighbours`)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

from cost_models import cold_entry_probes as ce
from cost_models.host_dispatch import forward_host_seconds
from cost_models.layer_profile import StepNeighbours, forward_window
from cost_models.sequence_probes import ColdChain
from ir.kernel_calibration import KernelCalibration
from ir.kernel_points import ColdEntryPoint
from ir.measure import build_layer_graph, layer_graph_from_trace
from ir.op_count import COLD_WINDOW_DISTINCT_OPS, OpCounter, step_evicts
from ir.stand_in import real_factory
from ir.trace import trace
from tests.test_forward_host import FORWARD_PARTS, with_python_nodes
from tests.test_host_split import US, cpu, tiny_layer

ENTRY = dataclasses.replace(FORWARD_PARTS, cold_entry_host_s=4 * US, cold_op_host_s=2 * US)


def test_the_fit_is_an_entry_per_layer_and_a_slope_per_cold_op():
    """Theil-Sen. On a line: (0 cold ops, 4 us), (2, 8), (4, 12): entry 4 us, 2 us per
    cold op, no miss. Off it, (0, 5), (2, 7), (4, 12): pairwise slopes 1, 1.75, 2.5 ->
    1.75 us; entry median(5, 7 - 3.5, 12 - 7) = 5 us; misses 0, 1.5, 0: rms sqrt(2.25 / 3).
    Falling: flat at the median (10 us). Below the origin (slopes 2, 2.25, 2.5 -> 2.25;
    entries -3, -3.5, -3 -> -3): through it, median(1 / 2, 6 / 4) = 1 us per cold op."""
    def chains(*points):
        return [ColdChain(n, (10 + extra) * US, 10 * US) for n, extra in points]

    cost = ce.cold_entry_cost(chains((0, 4), (2, 8), (4, 12)))
    assert (cost.entry_s, cost.op_s, cost.residual_s) == pytest.approx((4 * US, 2 * US, 0.0))
    cost = ce.cold_entry_cost(chains((0, 5), (2, 7), (4, 12)))
    assert (cost.entry_s, cost.op_s) == pytest.approx((5 * US, 1.75 * US))
    assert cost.residual_s == pytest.approx((2.25 / 3) ** 0.5 * US)
    assert ce.cold_entry_cost(chains((0, 12), (4, 8))).entry_s == pytest.approx(10 * US)
    assert ce.cold_entry_cost(chains((0, 12), (4, 8))).op_s == 0.0
    cost = ce.cold_entry_cost(chains((0, -3), (2, 1), (4, 6)))
    assert (cost.entry_s, cost.op_s) == pytest.approx((0.0, 1.0 * US))
    assert cost.calibration_fields() == {"cold_entry_host_s": 0.0, "cold_op_host_s": cost.op_s}


def test_one_chain_off_the_line_leaves_the_fit():
    """Six chains on 4 us + 2 us per cold op (ENTRY_COLD_OPS), one read 40 us over at 12
    cold ops or 42.5 over at none (the spread issue 17 saw). Ten of the fifteen pairwise
    slopes miss that chain and are 2 us, so their median (the 8th) is 2; the entry is the
    median of five 4s and one off: 4 us. The least squares before read 0.0 (the intercept
    fell below 0, so through the origin at 4.6 us per op) and 19.1 us, 0.22 per op: the
    issue's 0.0 and 42.5."""
    line = [(k, 4 + 2 * k) for k in ce.ENTRY_COLD_OPS]
    for off, over in ((12, 40.0), (0, 42.5)):
        chains = [ColdChain(k, (10 + y + (over if k == off else 0)) * US, 10 * US)
                  for k, y in line]
        cost = ce.cold_entry_cost(chains)
        assert (cost.entry_s, cost.op_s) == pytest.approx((4 * US, 2 * US))


class StandInHost:
    """A stand-in clock and work for `paired_rounds`: a layer of n cold ops runs WARM_US +
    n x WARM_OP_US, + ENTRY_US + n x OP_US when it is the first call after the step work;
    each timed call jitters by up to +-JITTER_US (a seeded draw); the runs whose step work
    is step number `slow_steps` run SLOW_FACTOR x (a slow spell of the host), and the
    cold run after step `pause_step` pays PAUSE_US more (one collector pause)."""

    WARM_US, WARM_OP_US, ENTRY_US, OP_US = 10.0, 4.0, 4.0, 2.0
    JITTER_US, SLOW_FACTOR, PAUSE_US = 0.25, 3.0, 1000.0

    def __init__(self, slow_steps=range(0), pause_step=-1):
        import random

        self.now_s, self.steps, self.cold = 0.0, 0, False
        self.slow_steps, self.pause_step = slow_steps, pause_step
        self.draw = random.Random(0)

    def clock(self):
        return self.now_s

    def fresh(self):
        return None

    def step_between(self, own):
        self.steps, self.cold = self.steps + 1, True

    def layer(self, cold_ops):
        def run(x):
            us = self.WARM_US + cold_ops * self.WARM_OP_US + self.draw.uniform(-1, 1) * \
                self.JITTER_US
            if self.cold:
                us += self.ENTRY_US + cold_ops * self.OP_US
                us += self.PAUSE_US if self.steps == self.pause_step else 0.0
            if self.steps in self.slow_steps:
                us *= self.SLOW_FACTOR
            self.now_s, self.cold = self.now_s + us * US, False
        return run

    def chains(self, passes=ce.ENTRY_PASSES):
        layers = [(k, self.layer(k)) for k in ce.ENTRY_COLD_OPS]
        return ce.paired_rounds(layers, self.step_between, self.fresh, self.clock,
                                passes=passes)


def test_a_slow_spell_and_a_pause_leave_the_probe_within_its_jitter():
    """6 layers x 40 runs = 240 step works; a spell over steps 100-149 (a fifth of the
    probe, 3x slower) and a 1 ms pause at step 30. In 4 passes of 10 runs a layer, the
    spell covers at most 10 runs of any layer (its lots are 50 steps or more apart), the
    pause 1:
    each median of cold - warm is from unspoiled runs, within 2 x JITTER_US = 0.5 us of
    ENTRY_US + n x OP_US. The fit then (hand bound for x = 0, 1, 2, 4, 8, 12, each y
    within +-0.5): a pairwise slope is off by at most 1 / |dx|, the 8th largest of those
    bounds is 1 / 4, so the slope is within 0.25 us; y - slope x is off by at most 0.5 +
    0.25 x (0.5, 0.75, 1, 1.5, 2.5, 3.5), its median of six by the mean of the 3rd and
    4th largest: 1.25 us. All of a layer's runs in one pass (the old order), the same
    spell covers 21 runs of the 2-op layer (steps 81-120) and 29 of the 4-op one (121-160):
    the latter's median reads 3x (36 us, not 12)."""
    host = StandInHost(slow_steps=range(100, 150), pause_step=30)
    chains = host.chains()
    assert [c.cold_ops for c in chains] == list(ce.ENTRY_COLD_OPS)
    for c in chains:
        assert abs(c.extra_s / US - (4 + 2 * c.cold_ops)) <= 0.5
    cost = ce.cold_entry_cost(chains)
    assert abs(cost.entry_s / US - 4) <= 1.25 and abs(cost.op_s / US - 2) <= 0.25
    one_pass = StandInHost(slow_steps=range(100, 150), pause_step=30).chains(passes=1)
    assert one_pass[3].cold_ops == 4 and one_pass[3].extra_s / US > 30


def test_forward_host_adds_the_entry_and_the_cold_ops():
    """`tiny_layer`'s 18 us (tests/test_forward_host.py) + the entry 4 + 3 cold ops x 2 =
    28 us; no cold op: 22 us (the entry alone). A step whose ops all stay warm
    (`step_warm`): 18 us. A kit without the entry (0): the cold ops alone, step_warm or not,
    as kits before it priced (18 + 6 = 24 us)."""
    layer = with_python_nodes(tiny_layer(), 4)
    cold = dataclasses.replace(layer, cold_distinct_ops_fwd=3)
    assert forward_host_seconds(cold, cpu(ENTRY)) == pytest.approx(28 * US)
    assert forward_host_seconds(layer, cpu(ENTRY)) == pytest.approx(22 * US)
    warm = dataclasses.replace(cold, step_warm=True)
    assert forward_host_seconds(warm, cpu(ENTRY)) == pytest.approx(18 * US)
    before = dataclasses.replace(ENTRY, cold_entry_host_s=0.0)
    for priced in (cold, warm):
        assert forward_host_seconds(priced, cpu(before)) == pytest.approx(24 * US)


def test_a_forward_after_a_backward_pays_its_own_entry():
    """The first layer (`forward_after_backward`) with a kit's after-backward entry of 7 us:
    18 + 7 + 3 x 2 = 31 us; a kit without that figure prices it at the entry, 28 us. Its
    position key sets it apart from the same structure elsewhere only where the kit has
    the figure."""
    from cost_models.host_dispatch import host_position_key

    layer = dataclasses.replace(with_python_nodes(tiny_layer(), 4), cold_distinct_ops_fwd=3)
    first = dataclasses.replace(layer, forward_after_backward=True)
    kit = dataclasses.replace(ENTRY, cold_entry_after_backward_host_s=7 * US)
    assert forward_host_seconds(first, cpu(kit)) == pytest.approx(31 * US)
    assert forward_host_seconds(layer, cpu(kit)) == pytest.approx(28 * US)
    assert forward_host_seconds(first, cpu(ENTRY)) == pytest.approx(28 * US)
    assert host_position_key(first, cpu(kit)) != host_position_key(layer, cpu(kit))
    assert host_position_key(first, cpu(ENTRY)) == host_position_key(layer, cpu(ENTRY))


def test_calibration_json_carries_the_entry_and_loads_without_it():
    kit = dataclasses.replace(ENTRY, cold_entry_after_backward_host_s=7 * US)
    data = json.loads(json.dumps(kit.to_dict()))
    assert (data["cold_entry_host_s"], data["cold_entry_after_backward_host_s"]) == (4 * US,
                                                                                    7 * US)
    assert KernelCalibration.from_dict(data) == kit
    del data["cold_entry_host_s"], data["cold_entry_after_backward_host_s"]
    old = KernelCalibration.from_dict(data)
    assert old.cold_entry_host_s == old.cold_entry_after_backward_host_s == 0.0
    assert old.cold_op_host_s == 2 * US
    with pytest.raises(Exception, match="cold_entry_host_s"):
        KernelCalibration.from_dict({**data, "cold_entry_host_s": -1.0})


def test_a_step_evicts_when_its_ops_are_more_than_the_window():
    """Forward and backward ops together: the window's size stays warm, one more evicts."""
    fwd = [frozenset(f"f{i}" for i in range(COLD_WINDOW_DISTINCT_OPS - 4))]
    bwd = [frozenset({"b0", "b1", "b2"}), frozenset({"b3", "f0"})]
    assert not step_evicts(fwd, bwd)  # window - 4 + 4 distinct
    assert step_evicts(fwd, bwd + [frozenset({"b4"})])


class Wide(nn.Module):
    """As many distinct forward ops as the window (16: layer norm, addmm, the unary ops...)."""

    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        x = self.fc(self.norm(x))
        for call in (torch.tanh, torch.sigmoid, torch.exp, torch.erf, torch.sin, torch.cos,
                     torch.neg, torch.abs, torch.relu, torch.nn.functional.silu,
                     torch.nn.functional.elu, torch.nn.functional.gelu):
            x = call(x)
        return x


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_graphs_mark_a_step_that_stays_warm():
    """Two Linears and a ReLU: a handful of distinct ops, the step stays warm; `Wide`'s
    step evicts: its layers are priced cold."""
    small = build_layer_graph(Small(), {"x": torch.randn(2, 8)}, dtype=torch.float32)
    wide = build_layer_graph(Wide(), {"x": torch.randn(2, 8)}, dtype=torch.float32)
    assert all(layer.step_warm for layer in small.layers)
    assert not any(layer.step_warm for layer in wide.layers)
    assert [layer.forward_after_backward for layer in small.layers] == \
        [True] + [False] * (len(small.layers) - 1)


class NormHead(nn.Module):
    """Three blocks of `Wide` (each a window's worth of distinct ops), a norm, a head."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Wide() for _ in range(3))
        self.norm, self.head = nn.LayerNorm(8), nn.Linear(8, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _measured(module):
    inputs = {"x": torch.randn(2, 8, requires_grad=True)}
    traced = trace(module, inputs, None, None, dtype=torch.float32)
    return layer_graph_from_trace(traced, inputs, None, name="t", dtype=torch.float32)


def test_the_profile_runs_the_layers_before_whose_ops_stay_warm():
    """The head (index 4) follows the norm (1 distinct op, fewer than the window) and the
    last block: both run before its timed forward, the block first; a block follows one
    block (a window's worth of ops); the first layer follows nothing. Without the
    graph's layers (older callers), the layer before alone."""
    graph, measurer = _measured(NormHead())
    assert [layer.name for layer in graph.layers] == [
        "blocks.0", "blocks.1", "blocks.2", "norm", "head"]
    assert graph.layers[0].distinct_ops_fwd >= COLD_WINDOW_DISTINCT_OPS
    assert forward_window(graph.layers, 3) == [2, 3]
    assert forward_window(graph.layers, 1) == [1]
    assert forward_window(graph.layers, None) == []
    factory = real_factory("cpu")
    assert StepNeighbours(measurer, 4, factory, graph.layers).befores == [2, 3]
    assert StepNeighbours(measurer, 4, factory).befores == [3]
    assert StepNeighbours(measurer, 1, factory, graph.layers).befores == [0]  # blocks.0
    ran = []
    neighbours = StepNeighbours(measurer, 4, factory, graph.layers)
    assert set(neighbours.runs) == {2, 3}  # their modules and states made (no layer after)
    neighbours._forward = ran.append
    neighbours.before_forward()
    assert ran == [2, 3]


def test_the_probe_counts_cold_ops_as_layers_are_counted():
    """Each probe layer's cold ops are its overloads less the neighbour block's, counted
    with the dispatch counter a layer's forward runs under: exactly ENTRY_COLD_OPS (the
    unary ops the block does not run; its LayerNorm the block does). Timings positive and
    below 1 ms; the fit's figures >= 0 and below 0.2 ms (seconds, not microseconds)."""
    def overloads(module):
        counter = OpCounter()
        with counter, torch.enable_grad():
            module(torch.randn(1, ce.ENTRY_TOKENS, ce.ENTRY_WIDTH, requires_grad=True))
        return counter.overload_names

    block = overloads(ce.neighbour_block())
    assert [len(overloads(ce._entry_layer(k)) - block) for k in ce.ENTRY_COLD_OPS] == \
        list(ce.ENTRY_COLD_OPS)
    for after_backward in (False, True):
        chains = ce.cold_entry_chains("cpu", after_backward=after_backward)
        assert [c.cold_ops for c in chains] == list(ce.ENTRY_COLD_OPS)
        assert all(0 < c.cold_s < 1e-3 and 0 < c.warm_s < 1e-3 for c in chains)
        cost = ce.cold_entry_cost(chains)
        # seconds, not us: a layer's entry and a cold op cost microseconds (4-9 us and ~2
        # here, 2026-11-25), well under 0.2 ms even on a loaded host; no order asserted
        assert 0 <= cost.entry_s < 2e-4 and 0 <= cost.op_s < 2e-4


# A kit with points: 1 us + 1 per cold op after 20 ops after, 4 + 2 after 100, 5 + 2
# after 150; after a backward 0.5 + 1 after 20, 7 + 2 after 100; the same code 0.25 us.
POINTS = dataclasses.replace(
    ENTRY, cold_entry_after_backward_host_s=7 * US, cold_entry_same_code_host_s=0.25 * US,
    cold_entry_points=(ColdEntryPoint(100, False, 4 * US, 2 * US),
                       ColdEntryPoint(20, False, 1 * US, 1 * US),
                       ColdEntryPoint(150, False, 5 * US, 2 * US),
                       ColdEntryPoint(20, True, 0.5 * US, 1 * US),
                       ColdEntryPoint(100, True, 7 * US, 2 * US)))


def test_the_entry_is_read_off_the_kits_points_at_the_work_between():
    """`cold_entry_seconds`, 3 cold ops, on the line between the two points bracketing the
    layer's `after_ops`, flat beyond the ends: 0 or 20 ops, 1 + 3 x 1 = 4 us; 60 (half
    way to 100), 2.5 + 3 x 1.5 = 7; 100, 4 + 6 = 10; 125, 4.5 + 6 = 10.5; 300, 5 + 6 = 11.
    After a backward, its own points: 0.5 + 3 = 3.5 us at 20, 7 + 6 = 13 at 300. The layer
    before running the same ops: 0.25 us + 3 x the least point's 1 whatever the work (not
    the first layer: none is before it). A kit without points: the single figures, 10 us
    anywhere. The position key tells the ops between apart only where the kit has points;
    the points travel in the calibration's JSON."""
    from cost_models.host_dispatch import cold_entry_seconds, host_position_key

    layer = dataclasses.replace(with_python_nodes(tiny_layer(), 4), cold_distinct_ops_fwd=3)

    def at(ops, kit=POINTS, **changes):
        return cold_entry_seconds(dataclasses.replace(layer, after_ops=ops, **changes),
                                  kit) / US

    assert [at(ops) for ops in (0, 20, 60, 100, 125, 300)] == pytest.approx(
        [4, 4, 7, 10, 10.5, 11])
    assert at(20, forward_after_backward=True) == pytest.approx(3.5)
    assert at(300, forward_after_backward=True) == pytest.approx(13)
    assert at(300, same_code_before=True) == pytest.approx(3.25)
    assert at(20, same_code_before=True, forward_after_backward=True) == pytest.approx(3.5)
    assert at(20, ENTRY) == at(300, ENTRY) == pytest.approx(10)
    full = with_python_nodes(tiny_layer(), 4)
    assert forward_host_seconds(dataclasses.replace(full, after_ops=20),
                                cpu(POINTS)) == pytest.approx(19 * US)
    keys = [host_position_key(dataclasses.replace(layer, after_ops=ops), cpu(kit))
            for kit in (POINTS, ENTRY) for ops in (20, 100)]
    assert keys[0] != keys[1] and keys[2] == keys[3]
    # the points price the place even where the kit's single figures read 0 (a loaded fit)
    zeroed = dataclasses.replace(POINTS, cold_op_host_s=0.0, cold_entry_after_backward_host_s=0.0)
    assert (host_position_key(dataclasses.replace(layer, after_ops=20), cpu(zeroed))
            != host_position_key(dataclasses.replace(layer, after_ops=150), cpu(zeroed)))
    assert (host_position_key(layer, cpu(zeroed))
            != host_position_key(dataclasses.replace(layer, forward_after_backward=True),
                                 cpu(zeroed)))
    assert KernelCalibration.from_dict(json.loads(json.dumps(POINTS.to_dict()))) == POINTS


def test_the_same_code_entry_is_read_off_the_points_at_the_work_between():
    """Points that carry the same-code entry (`ColdEntryPoint.same_code_entry_s`: 0.5 us
    after 20 ops, 2 after 100) price a layer after the same code on their line, 3 cold
    ops at the least point's 1 us each: 0.5 + 3 = 3.5 us at 20 ops, 1.25 + 3 = 4.25 at 60,
    2 + 3 = 5 at 300, where the kit's single figure read 3.25 at any (dlrm's tables.1-3
    run after 106 ops: the single figure, probed after 17, priced their forwards
    21-33% under, bench_kernel_model --reprice, 2026-11-26). The field travels in the
    JSON; a kit written before it reads 0 there and prices the single figure."""
    from cost_models.host_dispatch import cold_entry_seconds

    layer = dataclasses.replace(with_python_nodes(tiny_layer(), 4), cold_distinct_ops_fwd=3,
                                same_code_before=True)
    same = {20: 0.5 * US, 100: 2 * US}
    kit = dataclasses.replace(POINTS, cold_entry_points=tuple(
        dataclasses.replace(p, same_code_entry_s=same.get(p.after_ops, 0.0))
        if not p.after_backward else p for p in POINTS.cold_entry_points))

    def at(ops, calibration=kit):
        return cold_entry_seconds(dataclasses.replace(layer, after_ops=ops), calibration) / US

    assert [at(ops) for ops in (20, 60, 300)] == pytest.approx([3.5, 4.25, 5])
    assert at(300, POINTS) == pytest.approx(3.25)
    assert KernelCalibration.from_dict(json.loads(json.dumps(kit.to_dict()))) == kit
    older = kit.to_dict()
    for point in older["cold_entry_points"]:
        del point["same_code_entry_s"]
    assert at(300, KernelCalibration.from_dict(older)) == pytest.approx(3.25)


def test_graphs_count_the_work_after_and_the_same_code_before():
    """`ir.op_count.step_between` on `NormHead` (3 `Wide` blocks, a norm, a head): each
    layer's `after_ops` is the forward + backward ops of the layers `planner profile` runs
    between two of its forwards (`StepNeighbours.afters`, its backward window): a block
    before a block, the next block's (its 20 distinct backward ops fill the window); the
    last block, the norm's and the head's (their 7 do not: the profile runs both, and
    counting the norm's alone priced dlrm's bottom_mlp, before four tables and top_mlp,
    at 7 ops where 150 ran: -19..-33%, bench_kernel_model --reprice, 2026-11-26); the
    norm, the head's; the head's (the last) those of its window before (the last block
    and the norm, whose forwards and backwards it runs after its backward,
    `StepNeighbours.after_backward`); a block after a block runs the same code, the first
    block (nothing before), the norm and the head not."""
    graph, _ = _measured(NormHead())
    both = [layer.ops_fwd + layer.ops_bwd for layer in graph.layers]
    assert [layer.after_ops for layer in graph.layers] == [
        both[1], both[2], both[3] + both[4], both[4], both[2] + both[3]]
    assert [layer.same_code_before for layer in graph.layers] == [
        False, True, True, False, False]


def test_a_warm_step_prices_the_least_works_entry_except_after_the_same_code():
    """A step whose ops all stay warm (`step_warm`): its layers read the after-backward
    point at the fewest ops (POINTS: 0.5 us + 1 per cold op after 20), wherever they
    stand (3 cold ops: 18 + 3.5 = 21.5 us, first or not, at 20 ops after or 300); none
    after the same code (18 us) unless a backward ran between (a pipeline stage's first
    forward after a backward, traced after a block like it: 21.5); a kit without points
    (ENTRY) prices none, as before."""
    from cost_models.host_dispatch import warm_step_entry_seconds

    warm = dataclasses.replace(with_python_nodes(tiny_layer(), 4), cold_distinct_ops_fwd=3,
                               step_warm=True)
    for changes in ({}, {"forward_after_backward": True}, {"after_ops": 300}):
        assert forward_host_seconds(dataclasses.replace(warm, **changes),
                                    cpu(POINTS)) == pytest.approx(21.5 * US)
    same = dataclasses.replace(warm, same_code_before=True)
    assert forward_host_seconds(same, cpu(POINTS)) == pytest.approx(18 * US)
    same_after_backward = dataclasses.replace(same, forward_after_backward=True)
    assert forward_host_seconds(same_after_backward, cpu(POINTS)) == pytest.approx(21.5 * US)
    assert warm_step_entry_seconds(warm, ENTRY) == 0.0
    assert forward_host_seconds(warm, cpu(ENTRY)) == pytest.approx(18 * US)
