"""`planner profile` draws a timed layer's inputs after its step neighbours' forwards run,
as a step's layer reads what the layer before it just wrote
(`cost_models.layer_profile.time_layer`); drawn before them, the neighbours' work evicts
the inputs and the layer reads them cold, which no step runs."""

from __future__ import annotations

from cost_models.layer_profile import time_layer
from ir.stand_in import real_factory
from tests.test_cold_ops import _measured_three_kinds


def test_timed_inputs_are_drawn_after_the_neighbours_forwards(monkeypatch):
    """blocks.0 (index 1) of `_measured_three_kinds`, 1 warm-up + 2 timed runs: the layer
    before it in a step is a block (index 1 again, its own module and state). Logged in
    order: every draw of inputs (whether for the timed layer's state or a neighbour's)
    and every module call. Each timed call's inputs must be the last ones drawn for the
    timed state, after the neighbour's forward call of that run: the old order (draw,
    then the neighbours) logs draw-timed, draw-neighbour, call-neighbour, call-timed."""
    _, measurer = _measured_three_kinds()
    factory = real_factory("cpu")
    timed_state = measurer.layer_state(1, factory)
    log: list[tuple[str, int, bool]] = []  # (event, layer index, for the timed state)
    module_of, fresh_of = measurer.layer_module, measurer.fresh_inputs

    def logged_module(index, state):
        module, timed = module_of(index, state), state is timed_state

        def run(*args):
            log.append(("call", index, timed))
            return module(*args)
        return run

    def logged_inputs(index, state, factory):
        log.append(("draw", index, state is timed_state))
        return fresh_of(index, state, factory)

    monkeypatch.setattr(measurer, "layer_module", logged_module)
    monkeypatch.setattr(measurer, "fresh_inputs", logged_inputs)
    time_layer(measurer, 1, timed_state, factory, "cpu", warmup=1, repeats=2)
    timed_calls = [i for i, event in enumerate(log) if event == ("call", 1, True)]
    assert len(timed_calls) == 3
    for call in timed_calls:
        before = log[:call]
        drawn = max(i for i, event in enumerate(before) if event == ("draw", 1, True))
        neighbour = max(i for i, event in enumerate(before) if event == ("call", 1, False))
        assert neighbour < drawn, log  # the neighbour ran, then the timed inputs were drawn
        assert all(event[0] == "draw" for event in log[drawn:call]), log
