"""The forward host model in parts (cost_models.host_dispatch.forward_host_seconds), the fx
nodes that dispatch nothing counted per layer (ir.graph_measurer.python_nodes) and the
probe that prices them (cost_models.host_excess.python_node_seconds); the distinct ops
counted per layer and what ops pay in sequence among them (cost_models.sequence_probes);
and backward records against a real CPU forward and backward's (equal by a per-kind
rule)."""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest
import torch
from torch import nn

from cost_models.host_dispatch import forward_host_seconds
from ir.kernel_calibration import HostOpExcess, KernelCalibration
from ir.kernel_recorder import KernelRecorder
from ir.measure import build_layer_graph
from ir.op_count import OpCounter, count_ops
from ir.stand_in import StepInput
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
    0.25 + gelu's excess 7 = 1 + 6 + 3 + 1 + 7 = 18 us."""
    layer, spec = with_python_nodes(tiny_layer(), 4), cpu(FORWARD_PARTS)
    assert forward_host_seconds(layer, spec) == pytest.approx(18 * US)


def test_a_kit_without_the_node_figure_keeps_its_per_op_average():
    """A kit measured before the python-node probe: its per-op figure held the probe
    chain's excess on average, so neither nodes nor excess are added: 1 + 6 + 3 = 10 us;
    with no parts at all, 5 ops x 4 us."""
    old = dataclasses.replace(FORWARD_PARTS, python_node_host_s=0.0)
    layer = with_python_nodes(tiny_layer(), 4)
    assert forward_host_seconds(layer, cpu(old)) == pytest.approx(10 * US)
    assert forward_host_seconds(layer, cpu(None)) == pytest.approx(20 * US)


def test_a_kit_whose_per_op_residual_came_out_zero_still_prices_in_parts():
    """The per-op figure is what remains of the probe chain after its excess and nodes, and
    a loaded host once measured it 0: the layer is still priced in parts (2 views x 0.5 +
    3 ops x 0 + 1 call x 3 + 4 nodes x 0.25 + gelu's 7 = 12 us), not at 5 ops x the
    one-figure 4 us (20 us), which would switch models on a noisy residual."""
    zero = dataclasses.replace(FORWARD_PARTS, forward_host_op_s=0.0)
    layer = with_python_nodes(tiny_layer(), 4)
    assert forward_host_seconds(layer, cpu(zero)) == pytest.approx(12 * US)


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
    # x requires grad: blocks.0 is measured as the blocks after it, fed an activation (a
    # block fed the data makes no input gradient: tests/test_data_inputs.py)
    return build_layer_graph(Net(), {"x": torch.randn(2, 3, 8, requires_grad=True)},
                             dtype=torch.float32)


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
    # an activation, as a step's middle layer gets it: its gradient goes to the layer
    # before, no AccumulateGrad (`ir.stand_in.StepInput`: tests/test_step_inputs.py)
    x = StepInput.apply(torch.randn(*shape, requires_grad=True))
    forward, backward, saved_outputs, saved_others = _real_passes(module, x)
    calls = layer.kernels.forward_module_calls
    # the records now equal the real step's: no instrumentation terms left
    assert calls and (saved_outputs or saved_others)
    saved_others = 0
    assert _ops(layer.kernels.forward) == +forward
    assert _ops(layer.kernels.backward) == +backward
    assert layer.ops_fwd == sum((+forward).values())
    assert layer.ops_bwd == sum((+backward).values())
    fresh_x = StepInput.apply(x.detach().requires_grad_())
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
    from cost_models.host_dispatch import backward_host_seconds
    from tests.test_host_split import PARTS

    layer = tiny_layer()
    walked = dataclasses.replace(layer, measured=dataclasses.replace(
        layer.measured, autograd_nodes_bwd=10))
    assert backward_host_seconds(walked, cpu(PARTS)) == pytest.approx(51 * US)
    assert backward_host_seconds(layer, cpu(PARTS)) == pytest.approx(39 * US)


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
    assert forward_host_seconds(with_forward_nodes(layer, 2), spec) == pytest.approx(21 * US)
    assert forward_host_seconds(layer, spec) == pytest.approx(24 * US)
    data = recording.to_dict()
    del data["forward_node_host_s"]
    old = KernelCalibration.from_dict(json.loads(json.dumps(data)))
    assert old.forward_node_host_s == 0.0
    assert forward_host_seconds(with_forward_nodes(layer, 2), cpu(old)) == pytest.approx(
        18 * US)


def test_forward_nodes_are_the_walk_without_accumulations(net_graph):
    """The head records addmm's node and the weight's transpose: 2 (its backward's 4 less
    the weight's and bias's accumulation); a block 6 (8 less 2)."""
    layers = {layer.name: layer for layer in net_graph.layers}
    assert layers["head"].autograd_nodes_fwd == 2
    assert layers["blocks.0"].autograd_nodes_fwd == 6


def test_calibration_takes_grad_off_op_figures_where_nodes_are_priced_apart():
    """HostOpCost -> KernelCalibration fields: where the grad-off runs were timed the
    per-op and per-view figures are the grad-off ones, the nodes apart; without them (GPU,
    old probes) the grad-on ones. A node figure that came out 0 (a difference of two runs
    on a loaded host) or a C++ view slope floored at 0 is a 0 cost, not a switch to the
    grad-on figures: the probe's `parts_measured` flag decides."""
    from cost_models.host_probes import HostOpCost

    cost = HostOpCost(4e-6, 3e-6, 0.1, 0.1, 10, 20, function_op_s=2e-6, view_op_s=1e-6,
                      function_nograd_op_s=1.2e-6, view_nograd_op_s=0.7e-6,
                      forward_node_s=0.8e-6, parts_measured=True)
    fields = cost.calibration_fields()
    assert (fields["forward_host_op_s"], fields["view_host_op_s"]) == (1.2e-6, 0.7e-6)
    assert fields["forward_node_host_s"] == 0.8e-6
    older = dataclasses.replace(cost, forward_node_s=0.0, function_nograd_op_s=0.0,
                                view_nograd_op_s=0.0, parts_measured=False
                                ).calibration_fields()
    assert (older["forward_host_op_s"], older["view_host_op_s"]) == (2e-6, 1e-6)
    noisy = dataclasses.replace(cost, forward_node_s=0.0).calibration_fields()
    assert (noisy["forward_host_op_s"], noisy["view_host_op_s"], noisy["forward_node_host_s"]
            ) == (1.2e-6, 0.7e-6, 0.0)
    flat_views = dataclasses.replace(cost, view_nograd_op_s=0.0).calibration_fields()
    assert (flat_views["forward_host_op_s"], flat_views["view_host_op_s"]) == (1.2e-6, 0.0)


def test_the_probe_times_recording_apart_from_dispatch(cpu_host_op_probe):
    """The probe times the chain with grad mode off (nothing recorded) apart from with it
    on, and each grad_fn it records costs the host a sub-10 us figure. Structure and
    units only: the per-op figures are net of the chain's excess, probed apart (the
    grad-off one a few tenths of a us here), and the per-node one is the difference of
    the two runs, so any of them can come out 0 on a loaded host (`calibration_fields`
    then still prices in parts: the test above); the grad-off view, timed directly, not."""
    probe = cpu_host_op_probe  # one real run (conftest)
    assert 0 <= probe.function_nograd_op_s < 1e-5 and 0 <= probe.function_op_s < 1e-5
    assert 0 <= probe.forward_node_s < 1e-5
    assert 0 < probe.view_nograd_op_s < 1e-5
    assert probe.calibration_fields()["view_host_op_s"] == probe.view_nograd_op_s


class CallBlock(nn.Module):
    """A hand count of the ATen ops (and distinct overloads) of its forward, on 2 x 3 x 8:
      x.shape[-1], width * 3      no op: getattr, getitem, mul: 3 python nodes
      self.norm(x)                native_layer_norm                       new: 1
      h.transpose(-1, -2)         transpose.int                           new: 2
      torch.matmul(h, hT)         3-D @ 3-D: expand x2, view x2, bmm,
                                  _unsafe_view (6 ops)                    new: 6
      F.softmax(s, -1)            _softmax, then autograd saves its
                                  output for backward: detach (2 ops)     new: 8
      torch.matmul(p, h)          as above (6 ops)                        new: 8
      self.lin(...)               F.linear on 3-D: t, view, addmm, view   new: 10 (t, addmm)
      .transpose(1, 2)            transpose.int                           new: 10
      .reshape(b, w * 3)          not contiguous: clone, _unsafe_view     new: 11 (clone)
    = 23 ops, 11 distinct overloads."""

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


def test_distinct_ops_are_counted_per_layer():
    """`CallBlock`'s docstring: 23 ops of 11 distinct overloads, 3 python nodes (the lone
    block's layer is named after its list); the head, a lone Linear on 2 x 24 (F.linear on
    2-D: t, addmm): 2 ops, 2 distinct."""
    graph = build_layer_graph(CallNet(), {"x": torch.randn(2, 3, 8)}, dtype=torch.float32)
    layers = {layer.name: layer for layer in graph.layers}
    block = layers["blocks"]
    assert (block.ops_fwd, block.distinct_ops_fwd, block.python_nodes_fwd) == (23, 11, 3)
    assert (layers["head"].ops_fwd, layers["head"].distinct_ops_fwd) == (2, 2)


def with_distinct_ops(layer, distinct: int):
    return dataclasses.replace(layer, measured=dataclasses.replace(
        layer.measured, distinct_ops_fwd=distinct))


IN_SEQUENCE = dataclasses.replace(FORWARD_PARTS, in_sequence_op_host_s=0.05 * US,
                                  in_sequence_knee_distinct_ops=16.0)


def test_forward_host_adds_what_ops_pay_in_sequence():
    """`tiny_layer`'s 18 us (`test_forward_host_is_views_ops_calls_nodes_and_excess`) run
    among 20 distinct ops on a kit at 0.05 us per op per distinct op beyond 16: 5 ops x
    0.05 x (20 - 16) = 1 us more, 19 us; among 16 or fewer (at the knee, below it, or not
    counted: 0), 18 us; a kit without the figure (0), 18 us."""
    layer = with_python_nodes(tiny_layer(), 4)
    spec = cpu(IN_SEQUENCE)
    assert forward_host_seconds(with_distinct_ops(layer, 20), spec) == \
        pytest.approx(19 * US)
    for distinct in (16, 5, 0):
        assert forward_host_seconds(with_distinct_ops(layer, distinct), spec) == \
            pytest.approx(18 * US)
    assert forward_host_seconds(with_distinct_ops(layer, 20), cpu(FORWARD_PARTS)) == \
        pytest.approx(18 * US)


def test_in_sequence_counts_only_the_distinct_ops_beyond_the_host_probe_chains():
    """The kit's per-op figures are timed on the host probe's function chain, itself run
    in order among its HOST_OP_CHAIN_DISTINCT_OPS (5) distinct ops, so they already hold
    what its non-view ops pay among 5 (the view figure is a tight loop's). On a kit whose
    fit read its knee at 0 (0.05 us per op per distinct op), `tiny_layer`'s 18 us (5 ops,
    2 views) among 20 distinct: 5 x 0.05 x 20 - 3 x 0.05 x 5 = 5 - 0.75 = 4.25 us more,
    22.25 us; among 3: 0.75 - 0.75 = 0, 18 us; among 5: 1.25 - 0.75 = 0.5, 18.5 us.
    With the knee at 16 (above the chain's 5), as before."""
    from cost_models.host_probes import HOST_OP_CHAIN_DISTINCT_OPS

    assert HOST_OP_CHAIN_DISTINCT_OPS == 5
    layer = with_python_nodes(tiny_layer(), 4)
    spec = cpu(dataclasses.replace(IN_SEQUENCE, in_sequence_knee_distinct_ops=0.0))
    for distinct, us in ((20, 22.25), (3, 18.0), (5, 18.5)):
        assert forward_host_seconds(with_distinct_ops(layer, distinct), spec) == \
            pytest.approx(us * US)


def test_the_host_probe_chain_runs_the_distinct_ops_it_is_credited_with():
    """HOST_OP_CHAIN_DISTINCT_OPS is the `OpCounter` count of the chain
    `host_probes.host_op_seconds_by_pass` times its per-op figures on (`host_probe_chain`
    run by `run_as_functions`, grad on): by hand t, addmm, native_layer_norm, gelu, sum."""
    from cost_models.clusters import OP_OVERHEAD_WIDTH
    from cost_models.host_probes import (HOST_OP_CHAIN_DISTINCT_OPS, host_probe_chain,
                                         run_as_functions)

    (_, _, calls), x, counter = host_probe_chain(), torch.randn(2, OP_OVERHEAD_WIDTH), OpCounter()
    with counter:
        run_as_functions(calls, x)
    assert counter.distinct_ops == HOST_OP_CHAIN_DISTINCT_OPS == 5


def test_the_in_sequence_fit_finds_the_knee_and_the_slope():
    """Chains made by hand at 40 ns per op per distinct op beyond 12 (and a flat 0 below):
    10 distinct, 0; 20 distinct, 60 ops: 60 x 40 x 8 = 19.2 us; 30 distinct, 50 ops: 50 x
    40 x 18 = 36 us; 40 distinct, 40 ops: 40 x 40 x 28 = 44.8 us. The fit reads 40 ns
    beyond 12, no residual; the kit fields carry both."""
    from cost_models.sequence_probes import SequenceChain, in_sequence_cost

    chains = [SequenceChain(48, d, ops, d, 100e-6 + extra, 100e-6)
              for d, ops, extra in ((10, 60, 0.0), (20, 60, 19.2e-6), (30, 50, 36e-6),
                                    (40, 40, 44.8e-6))]
    cost = in_sequence_cost(chains)
    assert cost.op_s == pytest.approx(40e-9)
    assert cost.knee_distinct_ops == 12.0
    assert cost.residual_s == pytest.approx(0.0, abs=1e-12)
    assert cost.calibration_fields() == dict(in_sequence_low_op_host_s=0.0,
                                             in_sequence_op_host_s=cost.op_s,
                                             in_sequence_knee_distinct_ops=12.0)


def test_the_sequence_probe_counts_its_chain_as_a_layer_is_counted():
    """A chain of 8 calls of 4 distinct ones from the pool: its ops and distinct ops are
    the dispatch counter's (the same `OpCounter` a layer's forward runs under), distinct
    at most the ops and at least one per distinct call; both timings positive and below
    1 ms. The pool's calls are distinct Python calls (48)."""
    import random

    from cost_models.sequence_probes import SEQUENCE_SEED, sequence_chain, sequence_pool

    pool = sequence_pool("cpu", grad=True)
    assert len(pool) == 48 and len(set(pool)) == 48
    chain = sequence_chain(pool, 4, calls=8, grad=True)
    kinds = list(pool)
    random.Random(SEQUENCE_SEED).shuffle(kinds)
    counter = OpCounter()
    with counter, torch.enable_grad():
        for call in (kinds[:4] * 2):
            call()
    assert (chain.calls, chain.distinct_calls) == (8, 4)
    assert (chain.ops, chain.distinct_ops) == (counter.count, counter.distinct_ops)
    assert 4 <= chain.distinct_ops <= chain.ops
    assert 0 < chain.in_order_s < 1e-3 and 0 < chain.tight_loops_s < 1e-3


def test_calibration_json_without_the_sequence_figures_and_with_retired_ones_loads():
    """A kit written before the in-sequence figures loads them as 0; one written on
    2026-11-24 carries the per-call figures at 0 (never measured by profile-device) and
    loads as before; a measured per-call figure is refused, naming the field."""
    from ir.errors import PlannerError

    data = json.loads(json.dumps(IN_SEQUENCE.to_dict()))
    assert KernelCalibration.from_dict(data) == IN_SEQUENCE
    del data["in_sequence_op_host_s"], data["in_sequence_knee_distinct_ops"]
    old = KernelCalibration.from_dict(data)
    assert (old.in_sequence_op_host_s, old.in_sequence_knee_distinct_ops) == (0.0, 0.0)
    retired = dict(data, python_call_host_s=0.0, inner_op_host_s=0.0,
                   wrapped_number_host_s=0.0, cast_wrapped_number_host_s=0.0)
    assert KernelCalibration.from_dict(retired) == old
    with pytest.raises(PlannerError, match="python_call_host_s"):
        KernelCalibration.from_dict(dict(retired, python_call_host_s=1e-6))
