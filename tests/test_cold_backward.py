"""The cold backward probe (`cost_models.sequence_probes.cold_backward_chains`) times a
chain's backward nodes inside one engine call, after other nodes and after a copy of its
own, as a step runs a layer's nodes; each chain's figures are differences of call medians
(checked here on a scripted clock), and the engine really runs the part built last first
(checked with gradient hooks)."""

from __future__ import annotations

import itertools

import torch

import cost_models.host_probes as host_probes
import cost_models.sequence_probes as sp

# Seconds one backward call takes on the scripted clock, by the probe's call order per run:
# the others alone, chain + others, the chain alone, chain + chain (each run does these four).
OTHERS_S, COLD_S, COPY_S, WARM_S = 10e-6, 17e-6, 4e-6, 6e-6


def test_chain_figures_are_call_differences(monkeypatch):
    """cold_s = (chain + others) - others = 17 - 10 = 7 us; warm_s = (chain + chain) -
    chain = 6 - 4 = 2 us, for every chain (the scripted calls do not depend on it)."""
    elapsed = itertools.cycle([OTHERS_S, COLD_S, COPY_S, WARM_S])
    now = [0.0]

    def clock():  # each call reads it twice: start, then start + that call's seconds
        if clock.started:
            now[0] += next(elapsed)
        clock.started = not clock.started
        return now[0]

    clock.started = False
    monkeypatch.setattr(host_probes, "probe_clock", lambda device: clock)
    chains = sp.cold_backward_chains("cpu")
    assert len(chains) == len(sp.COLD_BACKWARD_CALLS)
    for chain in chains:
        assert abs(chain.cold_s - 7e-6) < 1e-12 and abs(chain.warm_s - 2e-6) < 1e-12


def test_the_engine_runs_the_part_built_last_first():
    """What the probe's cold and warm calls rest on: in one backward call the nodes of the
    chain built first run after those of the chain built after it."""
    calls = sp.chained_calls("cpu")
    order = []

    def built(name, chain):
        z = torch.randn(2, 8, 8, requires_grad=True)
        z.register_hook(lambda g: order.append(name))  # fires once its chain has run
        for call in chain:
            z = call(z)
        return z.sum()

    first = built("first", calls[:4])
    last = built("last", calls[-sp.COLD_BACKWARD_OTHERS:])
    (first + last).backward()
    assert order == ["last", "first"]
