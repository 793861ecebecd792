"""What a layer's forward ops pay for running in order among few distinct ops
(cost_models.sequence_probes): the probe reads chains down to 2 distinct calls, the fit
keeps a measured low segment from one distinct op up to its knee and a slope beyond, and
the host model prices a layer by the curve's difference from the host probe chain's own
5 distinct ops (host_dispatch.forward_host_seconds)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cost_models.host_dispatch import forward_host_seconds
from cost_models.sequence_probes import (SEQUENCE_DISTINCT, SequenceChain,
                                         in_sequence_cost, in_sequence_extra_per_op_s)
from ir.kernel_calibration import KernelCalibration
from tests.test_forward_host import FORWARD_PARTS, with_distinct_ops, with_python_nodes
from tests.test_host_split import US, cpu, tiny_layer

# 0.2 us per op per distinct op from 1 up to a knee of 4, then 0.05 beyond it
TWO_SEGMENTS = dataclasses.replace(FORWARD_PARTS, in_sequence_low_op_host_s=0.2 * US,
                                   in_sequence_op_host_s=0.05 * US,
                                   in_sequence_knee_distinct_ops=4.0)


def test_the_probe_reads_chains_of_as_few_distinct_calls_as_small_layers_run():
    """A Linear then a ReLU runs 3 distinct ATen ops (t, addmm, relu), the host probe
    chain 5: the probe's chains start at 2 distinct calls and read 3 and 5 too, up to a
    block's 48."""
    assert {2, 3, 5} <= set(SEQUENCE_DISTINCT) and max(SEQUENCE_DISTINCT) == 48


def test_the_extra_per_op_rises_on_its_low_segment_then_its_slope():
    """One distinct op is its own tight loop (0); 0.2 us per distinct op up to the knee
    at 4 (2: 0.2, 4: 0.6 us), then 0.05 beyond it (10: 0.6 + 0.3 = 0.9 us); without a
    low segment (kits before it), the old line: 0.05 x (10 - 4) = 0.3 us."""
    extra = lambda d, low=0.2e-6: in_sequence_extra_per_op_s(0.05e-6, 4.0, d, low)  # noqa: E731
    for d, us in ((0, 0.0), (1, 0.0), (2, 0.2), (4, 0.6), (10, 0.9)):
        assert extra(d) == pytest.approx(us * 1e-6)
    assert extra(10, 0.0) == pytest.approx(0.3e-6)


def test_the_fit_reads_the_low_segment_the_knee_and_the_slope():
    """Chains made by hand on the curve above (ops 48-60 apiece): the fit reads 0.2 us
    per distinct op up to 4, 0.05 us beyond, no residual; the kit fields carry all three."""
    def curve(d):  # written out, not the module's function
        return 0.2e-6 * (min(d, 4) - 1) + 0.05e-6 * max(0, d - 4)

    chains = [SequenceChain(48, d, ops, d, 100e-6 + ops * curve(d), 100e-6)
              for d, ops in ((2, 48), (3, 48), (5, 57), (8, 60), (16, 60), (24, 60),
                             (48, 61))]
    cost = in_sequence_cost(chains)
    assert cost.low_op_s == pytest.approx(0.2e-6)
    assert cost.op_s == pytest.approx(0.05e-6)
    assert cost.knee_distinct_ops == 4.0
    assert cost.residual_s == pytest.approx(0.0, abs=1e-12)
    assert cost.calibration_fields() == dict(
        in_sequence_low_op_host_s=cost.low_op_s, in_sequence_op_host_s=cost.op_s,
        in_sequence_knee_distinct_ops=4.0)


def test_the_fit_refuses_too_few_counts_and_keeps_two_above_its_knee():
    """Two distinct-op counts fit no knee: refused by name. Over (2, 3, 40) with the top
    chain alone far off the line, the knee stays below 3 (two counts beyond it)."""
    from ir.errors import PlannerError

    def chain(d, extra_us):
        return SequenceChain(48, d, 48, d, 100e-6 + 48 * extra_us * 1e-6, 100e-6)

    with pytest.raises(PlannerError, match=r"in-sequence fit: chains of \[2, 5\]"):
        in_sequence_cost([chain(2, 0.1), chain(5, 0.4)])
    assert in_sequence_cost([chain(2, 0.1), chain(3, 0.2), chain(40, 9.0)]).knee_distinct_ops < 3


def test_a_layer_of_fewer_distinct_ops_than_the_probe_chain_pays_the_low_segment_less():
    """`tiny_layer`'s 18 us (5 ops, 2 of them views) priced against the chain's 5 distinct
    ops (0.6 + 0.05 = 0.65 us an op on the curve), credited on its 3 non-view ops only
    (the view figure is a tight loop's): 3 x 0.65 = 1.95 us. Among 2 (0.2 us an op):
    5 x 0.2 - 1.95 = -0.95, 17.05 us; among 5: 3.25 - 1.95 = +1.3, 19.3 us; among 20
    (0.6 + 0.8 = 1.4 us): 7 - 1.95 = +5.05, 23.05 us; distinct ops not counted: 18 us."""
    layer = with_python_nodes(tiny_layer(), 4)
    spec = cpu(TWO_SEGMENTS)
    for distinct, us in ((2, 17.05), (5, 19.3), (20, 23.05), (0, 18.0)):
        assert forward_host_seconds(with_distinct_ops(layer, distinct), spec) == \
            pytest.approx(us * US)


def test_calibration_json_without_the_low_segment_loads_it_as_zero():
    data = json.loads(json.dumps(TWO_SEGMENTS.to_dict()))
    assert KernelCalibration.from_dict(data) == TWO_SEGMENTS
    del data["in_sequence_low_op_host_s"]
    assert KernelCalibration.from_dict(data).in_sequence_low_op_host_s == 0.0


def test_the_probe_fits_several_draws_of_the_pool_at_each_count(monkeypatch):
    """Which calls a chain draws moves its extra as much as how many (16 distinct calls:
    ~500 ns an op on one draw, ~1,300 on another, 2026-11-26): `in_sequence_chains`
    times every SEQUENCE_DISTINCT count on each of SEQUENCE_SEEDS' draws (three or more),
    so the fit reads the pool's average, not one draw's."""
    from cost_models import sequence_probes

    drawn = []

    def chain(pool, distinct, calls=48, device="cpu", grad=False, seed=0):
        drawn.append((distinct, seed))
        return SequenceChain(calls, distinct, calls, distinct, 1e-4, 1e-4)

    monkeypatch.setattr(sequence_probes, "sequence_chain", chain)
    chains = sequence_probes.in_sequence_chains("cpu")
    assert len(sequence_probes.SEQUENCE_SEEDS) >= 3
    assert sorted(drawn) == sorted((k, s) for k in SEQUENCE_DISTINCT
                                   for s in sequence_probes.SEQUENCE_SEEDS)
    assert len(chains) == len(drawn)
