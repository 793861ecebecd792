"""The forward host model in parts (cost_models.compute.forward_host_seconds), the fx
nodes that dispatch nothing counted per layer (ir.graph_measurer.python_nodes) and the
probe that prices them (cost_models.host_excess.python_node_seconds); and backward
records against a real CPU forward and backward's (equal by a per-kind rule)."""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest
import torch
from torch import nn

from cost_models.compute import forward_host_seconds
from ir.kernel_calibration import HostOpExcess, KernelCalibration
from ir.kernel_recorder import KernelRecorder
from ir.measure import build_layer_graph
from ir.op_count import OpCounter, count_ops
from tests.test_host_split import US, cpu, tiny_layer

FORWARD_PARTS = KernelCalibration(
    measured_on="made up for the test", forward_host_op_s=2 * US, view_host_op_s=0.5 * US,
    module_call_host_s=3 * US, python_node_host_s=0.25 * US,
    host_op_excess=(HostOpExcess("aten::gelu", 7 * US),))


def with_python_nodes(layer, nodes: int):
    return dataclasses.replace(layer, measured=dataclasses.replace(
        layer.measured, python_nodes_fwd=nodes))


def test_forward_host_is_views_ops_calls_nodes_and_excess():
    """Hand computation, `tiny_layer`'s forward (5 ops: 2 views; gelu, arange, mul; one
    module call) with 4 python nodes: 2 views x 0.5 + 3 ops x 2 + 1 call x 3 + 4 nodes x
    0.25 + gelu's excess 7 = 1 + 6 + 3 + 1 + 7 = 18 us. On DTensors each of the 5 ops
    adds the spec's 15 us: 18 + 75 = 93 us."""
    layer, spec = with_python_nodes(tiny_layer(), 4), cpu(FORWARD_PARTS)
    assert forward_host_seconds(layer, spec, False) == pytest.approx(18 * US)
    assert forward_host_seconds(layer, spec, True) == pytest.approx(93 * US)


def test_a_kit_without_the_node_figure_keeps_its_per_op_average():
    """A kit measured before the python-node probe: its per-op figure held the probe
    chain's excess on average, so neither nodes nor excess are added: 1 + 6 + 3 = 10 us;
    with no parts at all, 5 ops x 4 us."""
    old = dataclasses.replace(FORWARD_PARTS, python_node_host_s=0.0)
    layer = with_python_nodes(tiny_layer(), 4)
    assert forward_host_seconds(layer, cpu(old), False) == pytest.approx(10 * US)
    assert forward_host_seconds(layer, cpu(None), False) == pytest.approx(20 * US)


def test_old_calibration_json_loads_without_the_node_figure():
    data = FORWARD_PARTS.to_dict()
    assert KernelCalibration.from_dict(json.loads(json.dumps(data))) == FORWARD_PARTS
    del data["python_node_host_s"]
    assert KernelCalibration.from_dict(data).python_node_host_s == 0.0


class Block(nn.Module):
    """Its forward, read off the source: `x.shape` (getattr), `[-1]` (getitem), `* 2`
    (mul on an int), `// 2` (floordiv on an int) and `.float()` of a float tensor
    dispatch no ATen op: 5 python nodes. `self.lin` is the one module call; `view`
    and `relu` dispatch."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = x.shape[-1]
        n = h * 2
        y = self.lin(x)
        y = y.view(-1, n // 2)
        return torch.relu(y).float()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture(scope="module")
def net_graph():
    return build_layer_graph(Net(), {"x": torch.randn(2, 3, 8)}, dtype=torch.float32)


def test_python_nodes_are_counted_per_layer(net_graph):
    layers = {layer.name: layer for layer in net_graph.layers}
    assert layers["blocks.0"].python_nodes_fwd == 5
    assert layers["blocks.0"].kernels.forward_module_calls == 1
    assert layers["head"].python_nodes_fwd == 0  # a lone Linear: one module call


def _ops(records) -> collections.Counter:
    out = collections.Counter()
    for r in records:
        out[r.op] += r.count
    return out


def _real_passes(module: nn.Module, x: torch.Tensor):
    """ATen ops of one real CPU forward and of its backward (seed made outside), as
    `planner profile` and training run a layer: no hooks, no interpreter; and the
    tensors its autograd nodes saved, (outputs, others), read off the graph by name
    (autograd calls a saved output `_saved_result*`)."""
    forward, backward = KernelRecorder(set()), KernelRecorder(set())
    with OpCounter(forward):
        y = module(x)
    outputs = others = 0
    seen, stack = set(), [y.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for name in dir(node):
            if name.startswith("_saved_") and isinstance(getattr(node, name), torch.Tensor):
                outputs, others = ((outputs + 1, others) if name.startswith("_saved_result")
                                   else (outputs, others + 1))
        stack.extend(f for f, _ in node.next_functions)
    seed = torch.ones_like(y)
    with OpCounter(backward):
        torch.autograd.backward(y, seed)
    return _ops(forward.records()), _ops(backward.records()), outputs, others


@pytest.mark.parametrize("name, make, shape", [
    ("head", lambda: nn.Linear(8, 2), (6, 8)),  # the blocks' view flattens to 6 x 8
    ("blocks.0", Block, (2, 3, 8)),
])
def test_recorded_ops_are_a_real_cpu_steps_by_a_per_kind_rule(net_graph, name, make, shape):
    """A layer traced on meta records the ops a real CPU forward and backward of the same
    module dispatch, but for what the instrumented run adds (`ir.graph_measurer`):
      forward  + one `view` per module call (FlopCounterMode's module tracker passes
                 each module's input through an autograd Function),
               - one `detach` per saved output (under saved-tensor hooks autograd no
                 longer detaches an output it saves);
      backward + one `ones_like` per root (the seed; training's loss gradient flows in),
               + one `detach` per other saved tensor (each unpacked through the hooks).
    Linear: addmm saves mat1 and mat2 (2 others); Block: those 2 and relu's result (an
    output). Parameter gradients: a fresh step steals each (one `detach` apiece, in both);
    a backward into existing `.grad` (accumulation, the profile's repeats) runs one `add_`
    per parameter tensor instead."""
    layer = next(layer for layer in net_graph.layers if layer.name == name)
    module = make()
    x = torch.randn(*shape, requires_grad=True)
    forward, backward, saved_outputs, saved_others = _real_passes(module, x)
    calls = layer.kernels.forward_module_calls
    # the records now equal the real step's: no instrumentation terms left
    assert calls and (saved_outputs or saved_others)
    saved_others = 0
    assert _ops(layer.kernels.forward) == +forward
    assert _ops(layer.kernels.backward) == +backward
    assert layer.ops_fwd == sum((+forward).values())
    assert layer.ops_bwd == sum((+backward).values())
    fresh_x = x.detach().requires_grad_()
    _, again, _, _ = _real_passes(module, fresh_x)  # weights' .grad held: added into
    params = len(list(module.parameters()))
    assert again["aten::add_"] == params
    assert again["aten::detach"] == backward["aten::detach"] - saved_others - params


def test_the_node_probe_times_nodes_that_dispatch_nothing():
    """The probe's module dispatches no ATen op, and a node costs the host something
    below a microsecond-scale op (a few dozen ns of Python here)."""
    from cost_models.host_excess import (NODES_PER_PATTERN, no_dispatch_graph_module,
                                         python_node_seconds)

    module, x = no_dispatch_graph_module(3), torch.randn(2, 8)
    assert count_ops(lambda: module(x)) == 0
    calls = [n for n in module.graph.nodes if n.op in ("call_function", "call_method")]
    assert len(calls) == 3 * NODES_PER_PATTERN
    assert 0 < python_node_seconds("cpu") < 1e-5


def test_autograd_nodes_are_walked_per_layer(net_graph):
    """Read off the modules: the head (Linear on 6 x 8) runs addmm's node, the weight's
    transpose, and the weight's and bias's accumulation: 4 (its input stand-in is a leaf
    only in the measurement: not counted). A block: relu, the view, Linear's unflatten
    view, addmm, t, flatten view, 2 accumulations: 8 (`.float()` of a float tensor
    records none)."""
    layers = {layer.name: layer for layer in net_graph.layers}
    assert layers["head"].autograd_nodes_bwd == 4
    assert layers["blocks.0"].autograd_nodes_bwd == 8


def test_backward_host_takes_the_walked_node_count():
    """`tiny_layer`'s backward with 10 walked nodes instead of the proxy's 6: 3 + 8 + 10 x
    3 + 10 = 51 us (the proxy's 39 us: `test_host_split`)."""
    from cost_models.compute import backward_host_seconds
    from tests.test_host_split import PARTS

    layer = tiny_layer()
    walked = dataclasses.replace(layer, measured=dataclasses.replace(
        layer.measured, autograd_nodes_bwd=10))
    assert backward_host_seconds(walked, cpu(PARTS), False) == pytest.approx(51 * US)
    assert backward_host_seconds(layer, cpu(PARTS), False) == pytest.approx(39 * US)


def with_forward_nodes(layer, nodes: int):
    return dataclasses.replace(layer, measured=dataclasses.replace(
        layer.measured, autograd_nodes_fwd=nodes))


def test_forward_host_adds_the_grad_fns_the_forward_records():
    """A kit with the per-node record figure (1.5 us; its per-op figures grad-off): the 18
    us of `test_forward_host_is_views_ops_calls_nodes_and_excess` + the layer's forward
    nodes x 1.5. Walked: 2 nodes -> 18 + 3 = 21 us. Not walked (an IR before the count):
    one per floating-point record, gelu, 2 views, mul (the int64 arange records none) =
    4 -> 18 + 6 = 24 us. A kit without the figure (old JSON: field absent) keeps 18."""
    recording = dataclasses.replace(FORWARD_PARTS, forward_node_host_s=1.5 * US)
    layer = with_python_nodes(tiny_layer(), 4)
    spec = cpu(recording)
    assert forward_host_seconds(with_forward_nodes(layer, 2), spec, False) == pytest.approx(21 * US)
    assert forward_host_seconds(layer, spec, False) == pytest.approx(24 * US)
    data = recording.to_dict()
    del data["forward_node_host_s"]
    old = KernelCalibration.from_dict(json.loads(json.dumps(data)))
    assert old.forward_node_host_s == 0.0
    assert forward_host_seconds(with_forward_nodes(layer, 2), cpu(old), False) == pytest.approx(
        18 * US)


def test_forward_nodes_are_the_walk_without_accumulations(net_graph):
    """The head records addmm's node and the weight's transpose: 2 (its backward's 4 less
    the weight's and bias's accumulation); a block 6 (8 less 2)."""
    layers = {layer.name: layer for layer in net_graph.layers}
    assert layers["head"].autograd_nodes_fwd == 2
    assert layers["blocks.0"].autograd_nodes_fwd == 6


def test_calibration_takes_grad_off_op_figures_where_nodes_are_priced_apart():
    """HostOpCost -> KernelCalibration fields: with a per-node figure the per-op and
    per-view figures are the grad-off ones; without (GPU, old probes) the grad-on ones."""
    from cost_models.host_probes import HostOpCost

    cost = HostOpCost(4e-6, 3e-6, 0.1, 0.1, 10, 20, function_op_s=2e-6, view_op_s=1e-6,
                      function_nograd_op_s=1.2e-6, view_nograd_op_s=0.7e-6,
                      forward_node_s=0.8e-6)
    fields = cost.calibration_fields()
    assert (fields["forward_host_op_s"], fields["view_host_op_s"]) == (1.2e-6, 0.7e-6)
    assert fields["forward_node_host_s"] == 0.8e-6
    older = dataclasses.replace(cost, forward_node_s=0.0).calibration_fields()
    assert (older["forward_host_op_s"], older["view_host_op_s"]) == (2e-6, 1e-6)


def test_the_probe_times_recording_apart_from_dispatch():
    """The probe's chain with grad mode off is cheaper per op than with it on (nothing
    recorded), and each grad_fn it records costs the host a positive sub-10 us figure."""
    from cost_models.host_probes import host_op_seconds_by_pass

    probe = host_op_seconds_by_pass("cpu")
    assert 0 < probe.function_nograd_op_s < probe.function_op_s
    assert 0 < probe.forward_node_s < 1e-5
    assert 0 < probe.view_nograd_op_s


class CallBlock(nn.Module):
    """Python-level torch calls vs ops dispatched inside C++ composites, read off the
    forward on 2 x 3 x 8 fp32 (ATen's decompositions, torch 2.13):
      x.shape[-1], width * 3      no op: getattr, getitem, mul: 3 python nodes
      self.norm(x)                F.layer_norm -> native_layer_norm       1 call, 0 inner
      h.transpose(-1, -2)         transpose                               1 call, 0 inner
      torch.matmul(h, hT)         3-D @ 3-D: expand x2, view x2, bmm,
                                  _unsafe_view                            1 call, 5 inner
      F.softmax(s, -1)            _softmax, then autograd saves its
                                  output for backward: a detach           1 call, 1 inner
      torch.matmul(p, h)          as above                                1 call, 5 inner
      self.lin(...)               F.linear on 3-D: t, view, addmm, view   1 call, 3 inner
      .transpose(1, 2)            transpose                               1 call, 0 inner
      .reshape(b, w * 3)          not contiguous: clone, _unsafe_view     1 call, 1 inner
    = 8 calls, 15 inner ops, 23 ops."""

    def __init__(self):
        super().__init__()
        self.norm, self.lin = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x):
        width = x.shape[-1]
        h = self.norm(x)
        p = torch.nn.functional.softmax(torch.matmul(h, h.transpose(-1, -2)), -1)
        y = self.lin(torch.matmul(p, h)).transpose(1, 2)
        return y.reshape(2, width * 3)


class CallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([CallBlock()])
        self.head = nn.Linear(24, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_python_calls_are_counted_apart_from_ops_inside_composites():
    """`CallBlock`'s docstring: 8 calls of its 23 ops (the lone block's layer is named
    after its list); the head, a lone Linear on 2 x 24 (F.linear on 2-D: t, addmm): 1
    call of 2 ops."""
    graph = build_layer_graph(CallNet(), {"x": torch.randn(2, 3, 8)}, dtype=torch.float32)
    layers = {layer.name: layer for layer in graph.layers}
    block = layers["blocks"]
    assert (block.python_calls_fwd, block.ops_fwd, block.python_nodes_fwd) == (8, 23, 3)
    assert (layers["head"].python_calls_fwd, layers["head"].ops_fwd) == (1, 2)


PER_CALL = dataclasses.replace(FORWARD_PARTS, python_call_host_s=1 * US,
                               inner_op_host_s=0.25 * US)


def with_python_calls(layer, calls: int):
    return dataclasses.replace(layer, measured=dataclasses.replace(
        layer.measured, python_calls_fwd=calls))


def test_forward_host_prices_python_calls_and_inner_ops():
    """`tiny_layer`'s 5 ops as 3 Python calls (gelu, arange, mul) and 2 inner ops (its
    views, as inside a composite), 4 python nodes, a kit at 1 us per call and 0.25 per
    inner op: 3 x 1 + 2 x 0.25 + 1 module call x 3 + 4 nodes x 0.25 + gelu's excess 7 =
    3 + 0.5 + 3 + 1 + 7 = 14.5 us (the views and per-op figures unused: the same layer
    priced by them is 18 us). On DTensors each of the 5 ops adds 15 us: 89.5 us. With the
    per-node record figure (1.5 us) and 2 walked grad_fns: 14.5 + 3 = 17.5 us."""
    layer = with_python_calls(with_python_nodes(tiny_layer(), 4), 3)
    spec = cpu(PER_CALL)
    assert forward_host_seconds(layer, spec, False) == pytest.approx(14.5 * US)
    assert forward_host_seconds(layer, spec, True) == pytest.approx(89.5 * US)
    recording = cpu(dataclasses.replace(PER_CALL, forward_node_host_s=1.5 * US))
    assert forward_host_seconds(with_forward_nodes(layer, 2), recording, False) == \
        pytest.approx(17.5 * US)


def test_old_kits_and_uncounted_layers_keep_the_view_and_op_pricing():
    """A layer measured before the call count (0) on the new kit, and a counted layer on
    a kit written before the per-call figures (old JSON: fields absent -> 0), both price
    as `test_forward_host_is_views_ops_calls_nodes_and_excess`: 18 us."""
    uncounted = with_python_nodes(tiny_layer(), 4)
    assert forward_host_seconds(uncounted, cpu(PER_CALL), False) == pytest.approx(18 * US)
    data = json.loads(json.dumps(PER_CALL.to_dict()))
    assert KernelCalibration.from_dict(data) == PER_CALL
    for field in ("python_call_host_s", "inner_op_host_s", "wrapped_number_host_s",
                  "cast_wrapped_number_host_s"):
        del data[field]
    old = KernelCalibration.from_dict(data)
    assert (old.python_call_host_s, old.inner_op_host_s) == (0.0, 0.0)
    assert (old.wrapped_number_host_s, old.cast_wrapped_number_host_s) == (0.0, 0.0)
    counted = with_python_calls(uncounted, 3)
    assert forward_host_seconds(counted, cpu(old), False) == pytest.approx(18 * US)


def test_the_call_probe_prices_a_call_above_an_op_inside_a_composite():
    """The probe's chains dispatch what its docstring says (16 adds; 16 F.linear on 3-D,
    4 ops each), and a Python call costs the host more than an op a composite dispatches
    inside one, both positive and below 10 us; the kit carries both."""
    from cost_models.call_probes import CALL_CHAIN_CALLS, python_call_seconds

    cost = python_call_seconds("cpu", lambda op: 0.0)
    assert (cost.chain_ops, cost.composite_ops) == (CALL_CHAIN_CALLS, 4 * CALL_CHAIN_CALLS)
    assert 0 < cost.inner_op_s < cost.call_s < 1e-5
    assert 0 < cost.cast_wrapped_number_s < 1e-5 and 0 <= cost.wrapped_number_s < 1e-5
    assert cost.calibration_fields() == dict(
        python_call_host_s=cost.call_s, inner_op_host_s=cost.inner_op_s,
        wrapped_number_host_s=cost.wrapped_number_s,
        cast_wrapped_number_host_s=cost.cast_wrapped_number_s)


def test_wrapped_numbers_are_python_numbers_in_tensor_arguments():
    """`x * 0.5` on float32 dispatches mul.Tensor(x, 0.5): a double wrapped and cast; `i +
    1` on int64 a long, no cast; `x + y` none; `x.pow(2)` and `torch.clamp(x, min=0.0)`
    take Scalar arguments (nothing wrapped)."""
    from ir.op_count import OpCounter

    x, y, i = torch.randn(2, 8), torch.randn(2, 8), torch.arange(4)
    for fn, expected in ((lambda: x * 0.5, (1, 1)), (lambda: i + 1, (1, 0)),
                         (lambda: x + y, (0, 0)), (lambda: x.pow(2), (0, 0)),
                         (lambda: torch.clamp(x, min=0.0), (0, 0))):
        counter = OpCounter()
        with counter:
            fn()
        assert (counter.wrapped_numbers, counter.cast_wrapped_numbers) == expected


class NumberBlock(nn.Module):
    """`(x * 0.5 + 1) * x + (x > 0).long() * 2`: 0.5 and 1 into float32 ops (2 cast), 2
    into an int64 op (not cast), `> 0` a Scalar argument (gt.Scalar: none), the rest
    tensors: 3 wrapped numbers, 2 cast."""

    def forward(self, x):
        return (x * 0.5 + 1) * x + (x > 0).long() * 2


def test_wrapped_numbers_are_counted_per_layer():
    """The Sequential is one layer: `NumberBlock`'s 3 numbers (2 cast); its Linear
    (F.linear: t, addmm on tensors) hands torch none."""
    net = nn.Sequential(NumberBlock(), nn.Linear(8, 2))
    graph = build_layer_graph(net, {"input": torch.randn(2, 8)}, dtype=torch.float32)
    (layer,) = graph.layers
    assert (layer.wrapped_numbers_fwd, layer.cast_wrapped_numbers_fwd) == (3, 2)


def test_forward_host_prices_wrapped_numbers():
    """The 14.5 us of `test_forward_host_prices_python_calls_and_inner_ops` with 3 wrapped
    numbers, 2 of them cast, at 0.4 us and 1.2 us: 14.5 + 0.4 + 2.4 = 17.3 us."""
    layer = with_python_calls(with_python_nodes(tiny_layer(), 4), 3)
    layer = dataclasses.replace(layer, measured=dataclasses.replace(
        layer.measured, wrapped_numbers_fwd=3, cast_wrapped_numbers_fwd=2))
    kit = dataclasses.replace(PER_CALL, wrapped_number_host_s=0.4 * US,
                              cast_wrapped_number_host_s=1.2 * US)
    assert forward_host_seconds(layer, cpu(kit), False) == pytest.approx(17.3 * US)


class NoopBlock(nn.Module):
    """`x.to(torch.float32)`, `.contiguous()` and `.float()` on a contiguous float32 tensor
    return it (no op: torch calls that dispatched nothing); `x.size(-1)` is a Python node
    that is no such call; then one op (mul)."""

    def forward(self, x):
        y = x.to(torch.float32).contiguous().float()
        return y * x.size(-1)


def test_noop_torch_calls_are_counted_among_python_nodes():
    """3 no-op calls of `NoopBlock`'s python nodes (the `size` call is not one); a
    `.to` that casts dispatches an op: a call, not a no-op (the count reads the ops each
    node dispatched)."""
    graph = build_layer_graph(NoopBlock(), {"x": torch.randn(2, 8)}, dtype=torch.float32)
    (layer,) = graph.layers
    assert layer.noop_calls_fwd == 3
    assert layer.python_nodes_fwd >= 4  # the three and the size call at least
    assert layer.python_calls_fwd == 1  # mul
    from torch import fx

    from ir.op_count import noop_calls

    g = fx.Graph()
    x = g.placeholder("x")
    cast = g.call_method("to", (x, torch.float32))
    g.output(cast)
    nodes = [cast]
    assert noop_calls(nodes, {cast: 0}, 0) == 1  # dispatched nothing: same dtype
    assert noop_calls(nodes, {cast: 0}, 1) == 0  # dispatched one op: a real cast


def test_forward_host_prices_noop_calls_per_call_on_the_per_call_kit():
    """The 14.5 us of `test_forward_host_prices_python_calls_and_inner_ops` with 1 of its 4
    python nodes a no-op torch call: that one at the 1 us call price, not 0.25: 14.5 -
    0.25 + 1 = 15.25 us. A kit without the per-call figures prices it as a python node,
    as before: the 18 us of `test_forward_host_is_views_ops_calls_nodes_and_excess`."""
    layer = with_python_calls(with_python_nodes(tiny_layer(), 4), 3)
    layer = dataclasses.replace(layer, measured=dataclasses.replace(
        layer.measured, noop_calls_fwd=1))
    assert forward_host_seconds(layer, cpu(PER_CALL), False) == pytest.approx(15.25 * US)
    assert forward_host_seconds(layer, cpu(FORWARD_PARTS), False) == pytest.approx(18 * US)
