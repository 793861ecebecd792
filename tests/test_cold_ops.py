"""Cold ops: the distinct forward ops a layer runs that the layer before it did not
(`Layer.cold_distinct_ops_fwd`, `ir.op_count.cold_distinct_ops`), what the forward host
model adds for them (`cost_models.host_dispatch.forward_host_seconds`, `KernelCalibration
.cold_op_host_s`, probed by `cost_models.cold_entry_probes.cold_entry_cost`), and
`planner profile` timing each layer as a step runs it, after its neighbours' work
(`cost_models.layer_profile.step_neighbours`, `StepNeighbours`)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

from cost_models.host_dispatch import backward_host_seconds, forward_host_seconds
from cost_models.layer_profile import step_neighbours, time_layer
from ir.kernel_calibration import KernelCalibration
from ir.measure import build_layer_graph, layer_graph_from_trace
from ir.stand_in import real_factory
from ir.trace import trace
from tests.test_forward_host import FORWARD_PARTS, IN_SEQUENCE, with_distinct_ops, \
    with_python_nodes
from tests.test_host_split import US, cpu, tiny_layer

COLD = dataclasses.replace(FORWARD_PARTS, cold_op_host_s=2 * US)


def with_cold_ops(layer, cold: int):
    return dataclasses.replace(layer, cold_distinct_ops_fwd=cold)


def test_forward_host_adds_the_cold_ops():
    """`tiny_layer`'s 18 us (tests/test_forward_host.py) with 3 cold ops at 2 us each:
    18 + 3 x 2 = 24 us; none cold, 18 us; a kit without the figure (0), 18 us. With the
    in-sequence term too (20 distinct ops: 1 us more, `test_forward_host_adds_what_ops_
    pay_in_sequence`): 18 + 1 + 6 = 25 us."""
    layer = with_python_nodes(tiny_layer(), 4)
    assert forward_host_seconds(with_cold_ops(layer, 3), cpu(COLD)) == \
        pytest.approx(24 * US)
    assert forward_host_seconds(with_cold_ops(layer, 0), cpu(COLD)) == \
        pytest.approx(18 * US)
    assert forward_host_seconds(with_cold_ops(layer, 3), cpu(FORWARD_PARTS)) == \
        pytest.approx(18 * US)
    both = dataclasses.replace(IN_SEQUENCE, cold_op_host_s=2 * US)
    assert forward_host_seconds(with_cold_ops(with_distinct_ops(layer, 20), 3),
                                cpu(both)) == pytest.approx(25 * US)


class Scale(nn.Module):
    """relu then a multiply by a Python number: aten.relu.default, aten.mul.Tensor, and
    aten.detach.default: autograd keeps relu's output for its backward, and saving an
    output costs a detach (as tanh's and sigmoid's below)."""

    def forward(self, x):
        return torch.relu(x) * 2.0


class Mix(nn.Module):
    """aten.relu.default, aten.tanh.default, aten.add.Tensor, aten.detach.default."""

    def forward(self, x):
        return torch.relu(x) + torch.tanh(x)


class Gate(nn.Module):
    """aten.sigmoid.default, aten.tanh.default, aten.add.Tensor, aten.detach.default."""

    def forward(self, x):
        return torch.sigmoid(x) + torch.tanh(x)


class ThreeKinds(nn.Module):
    """Layers `scale`, `blocks.0-2` (each a `Mix`), `gate`, run in that order. Cold ops,
    from the docstrings: scale runs first, after its own backward (a step's last): that
    ran aten.mul.Tensor (the gradient times 2.0), aten.threshold_backward.default (relu's)
    and aten.detach.default (the gradient its input, a leaf, steals), so relu alone is
    cold (1); blocks.0 after scale: tanh and add are new, relu and detach are not (2);
    blocks.1 and .2 after a Mix: none (0); gate after a Mix: sigmoid (1).

    Backward, in backward order (gate, blocks.2, .1, .0, scale). A Mix's backward runs
    aten.tanh_backward.default, aten.threshold_backward.default, aten.add.Tensor (x's
    two gradients summed) and the input's detach; gate's the same with
    aten.sigmoid_backward.default for threshold_backward. gate runs last in forward, so
    its backward follows its own forward: sigmoid_backward and tanh_backward are cold
    (2); blocks.2 after gate's: threshold_backward (1); blocks.1 and .0 after a Mix's:
    none; scale after a Mix's: mul (1)."""

    def __init__(self):
        super().__init__()
        self.scale = Scale()
        self.blocks = nn.ModuleList(Mix() for _ in range(3))
        self.gate = Gate()

    def forward(self, x):
        x = self.scale(x)
        for block in self.blocks:
            x = block(x)
        return self.gate(x)


def test_cold_ops_are_those_the_layer_before_did_not_run():
    # no parameters: the input requires grad, else a step runs no backward at all
    graph = build_layer_graph(ThreeKinds(), {"x": torch.randn(2, 8, requires_grad=True)},
                              dtype=torch.float32)
    names = [layer.name for layer in graph.layers]
    assert names == ["scale", "blocks.0", "blocks.1", "blocks.2", "gate"]
    assert [layer.distinct_ops_fwd for layer in graph.layers] == [3, 4, 4, 4, 4]
    assert [layer.cold_distinct_ops_fwd for layer in graph.layers] == [1, 2, 0, 0, 1]
    assert graph.layers[0].forward_overloads == {"aten.relu.default", "aten.mul.Tensor",
                                                 "aten.detach.default"}
    assert [layer.cold_distinct_ops_bwd for layer in graph.layers] == [1, 0, 0, 1, 2]
    assert graph.layers[0].backward_overloads == {
        "aten.mul.Tensor", "aten.threshold_backward.default", "aten.detach.default"}


def _measured_three_kinds():
    inputs = {"x": torch.randn(2, 8, requires_grad=True)}
    traced = trace(ThreeKinds(), inputs, None, None, dtype=torch.float32)
    return layer_graph_from_trace(traced, inputs, None, name="three", dtype=torch.float32)


def test_step_neighbours_are_what_most_layers_of_a_kind_have():
    """A block's forward follows a block in two of its three places (blocks.0 follows
    scale): its predecessor is blocks.0 (index 1), its backward's blocks.1 (index 2);
    the first layer has no forward predecessor, the last no backward one."""
    _, measurer = _measured_three_kinds()
    assert step_neighbours(measurer, 1) == (1, 2)
    assert step_neighbours(measurer, 0) == (None, 1)
    assert step_neighbours(measurer, 4) == (3, None)


def test_time_layer_warms_with_the_step_neighbours(monkeypatch):
    """Timing blocks.0 (index 1), 1 warm-up + 2 timed runs: each run calls the layer
    before's forward (index 1 again, a block: its predecessor in most places, its own
    module, made after the timed one's), then the timed one, then the layer after's
    (index 2), whose backward runs before the timed backward (a Mix has no parameters:
    the gradient reaches its inputs)."""
    _, measurer = _measured_three_kinds()
    calls: list[tuple[int, int]] = []  # (layer index, which module made: 0 the first)
    made_modules: list[int] = []
    inputs: dict[int, list] = {}
    module_of, fresh_of = measurer.layer_module, measurer.fresh_inputs

    def counted_module(index, state):
        module, made = module_of(index, state), len(made_modules)
        made_modules.append(index)

        def run(*args):
            calls.append((index, made))
            return module(*args)
        return run

    def kept_inputs(index, state, factory):
        made = fresh_of(index, state, factory)
        reached = []  # gradients that reached each input (activations: no `.grad`)
        for t in made:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(lambda grad, reached=reached: reached.append(grad))
        inputs.setdefault(index, []).append((made, reached))
        return made

    monkeypatch.setattr(measurer, "layer_module", counted_module)
    monkeypatch.setattr(measurer, "fresh_inputs", kept_inputs)
    factory = real_factory("cpu")
    state = measurer.layer_state(1, factory)
    time_layer(measurer, 1, state, factory, "cpu", warmup=1, repeats=2)
    assert made_modules == [1, 1, 2]  # the timed layer's, then its neighbours'
    assert calls == [(1, 1), (1, 0), (2, 2)] * 3
    # The layer after's backward ran: its inputs got gradients in every run
    assert all(len(reached) == sum(isinstance(t, torch.Tensor) and t.requires_grad
                                   for t in made) > 0 for made, reached in inputs[2])
    assert len(inputs[2]) == 3


def test_each_timed_backward_runs_in_one_call_after_the_layer_afters_nodes(monkeypatch):
    """A step runs every layer's nodes in one engine call, so a profiled layer's backward
    is one call over the layer after's roots then its own (and the span's marker), with
    no call between its forward and it (the old harness ran the neighbour's backward and
    an engine-warming sine first, each its own call): a middle layer (index 1, the layer
    after a Mix of one root) and the last (index 4: no layer after; the layer before's
    forward and backward follow its call, as in a step). Runs: 1 warm-up + 2 timed; the
    probe's graphs come after them."""
    _, measurer = _measured_three_kinds()
    factory = real_factory("cpu")
    real_backward = torch.autograd.backward
    for index, calls_per_run, roots_in_timed in ((1, 1, 3), (4, 2, 2)):
        roots_per_call: list[int] = []

        def counted(roots, *args, **kwargs):
            roots = [roots] if isinstance(roots, torch.Tensor) else list(roots)
            roots_per_call.append(len(roots))
            return real_backward(roots, *args, **kwargs)

        monkeypatch.setattr(torch.autograd, "backward", counted)
        state = measurer.layer_state(index, factory)
        time_layer(measurer, index, state, factory, "cpu", warmup=1, repeats=2)
        monkeypatch.setattr(torch.autograd, "backward", real_backward)
        runs = roots_per_call[:3 * calls_per_run]
        assert runs[::calls_per_run] == [roots_in_timed] * 3, (index, roots_per_call)


def test_calibration_json_without_the_cold_figures_loads():
    both = dataclasses.replace(COLD, cold_backward_op_host_s=1 * US)
    data = json.loads(json.dumps(both.to_dict()))
    assert KernelCalibration.from_dict(data) == both
    del data["cold_op_host_s"], data["cold_backward_op_host_s"]
    old = KernelCalibration.from_dict(data)
    assert (old.cold_op_host_s, old.cold_backward_op_host_s) == (0.0, 0.0)


def test_backward_host_adds_the_cold_ops():
    """`tiny_layer`'s backward, 39 us (tests/test_host_split.py), with 2 cold ops at 1 us
    each: 41 us; a kit without the figure, 39 us."""
    from tests.test_host_split import PARTS

    layer = dataclasses.replace(tiny_layer(), cold_distinct_ops_bwd=2)
    cold = dataclasses.replace(PARTS, cold_backward_op_host_s=1 * US)
    assert backward_host_seconds(layer, cpu(cold)) == pytest.approx(41 * US)
    assert backward_host_seconds(layer, cpu(PARTS)) == pytest.approx(39 * US)
