"""A layer's input is measured as a training step's middle layer receives it: an activation
whose gradient goes on to the layer before, not a leaf whose gradient is accumulated into
`.grad` (`ir.stand_in.fresh`). A step runs no AccumulateGrad for a layer's input; the
kernel records (`ir.graph_measurer.measure_layer`) and the profile's timed backward
(`cost_models.layer_profile.time_layer`) run none either.

Hand derivation, counted under a dispatch mode over a REAL 2-layer step (x (4, 8) data
without grad -> Linear(8, 8) `first` -> Linear(8, 8) `second`, backward from ones on the
output), ops of `second`'s autograd nodes only (AddmmBackward0, its TBackward0 and its
two parameters' AccumulateGrad):
  AddmmBackward0: grad_h = g @ W (t of the saved W^T, mm), grad_W^T = h^T @ g (t, mm, t),
  grad_b = g.sum(0) (sum, view); TBackward0: t; AccumulateGrad: one detach per parameter
  (its gradient stolen into an empty `.grad`).
  => {t: 4, mm: 2, sum: 1, view: 1, detach: 2}: no third detach (the input's hand-over).
dlrm-small's top_mlp at micro-batch 4 reads slices of a concatenation: its input leaves'
gradients were not dense as AccumulateGrad wants and were copied (new_empty_strided +
copy_, 4 each); a step hands them to the interaction's nodes instead, copying nothing.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import cost_models.layer_profile as layer_profile
from ir.checkpoint_policy import op_name
from ir.measure import build_layer_graph, layer_graph_from_trace
from ir.stand_in import StepInput, is_step_input, real_factory
from ir.trace import trace
from planner.models import load_layer_graph, load_model

SECOND_LINEAR_BACKWARD = {"aten::t": 4, "aten::mm": 2, "aten::sum": 1, "aten::view": 1,
                          "aten::detach": 2}


class _TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.second(self.first(x))


class _NodeOps(TorchDispatchMode):
    """(op name, the autograd node running it) of every op dispatched."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((op_name(func), torch._C._current_autograd_node()))
        return func(*args, **(kwargs or {}))


def _reachable(roots, stop=()) -> list:
    """Autograd nodes reachable from `roots`' grad_fns, not through those in `stop`."""
    seen, stack = [], [t.grad_fn for t in roots]
    while stack:
        node = stack.pop()
        if node is None or node in stop or node in seen:
            continue
        seen.append(node)
        stack.extend(f for f, _ in node.next_functions)
    return seen


def _ops_of(ops, nodes) -> Counter:
    return Counter(op for op, node in ops if any(node is n for n in nodes))


def test_a_real_steps_second_linear_runs_the_derived_ops():
    torch.manual_seed(0)
    model = _TwoLinears()
    h = model.first(torch.randn(4, 8))
    y = model.second(h)
    nodes = _reachable([y], stop={h.grad_fn})
    with _NodeOps() as mode:
        torch.autograd.backward([y], [torch.ones_like(y)])
    assert _ops_of(mode.ops, nodes) == SECOND_LINEAR_BACKWARD


def test_the_records_backward_is_the_real_steps():
    graph = build_layer_graph(_TwoLinears(), {"x": torch.randn(4, 8)}, dtype=torch.float32)
    records = graph.layer("second").kernels.backward
    ops = Counter()
    for r in records:
        ops[r.op] += r.count
    assert ops == SECOND_LINEAR_BACKWARD


def test_dlrm_top_mlp_records_copy_no_input_gradient():
    top = load_layer_graph("dlrm-small", micro_batch=4, dtype=torch.float32).layer("top_mlp")
    ops = {r.op for r in top.kernels.backward}
    assert "aten::new_empty_strided" not in ops and "aten::copy_" not in ops


def _timed_backward_ops(model, inputs, layer_name, monkeypatch):
    """Ops of `time_layer`'s one timed backward of `layer_name` (no warm-up, one repeat),
    by autograd node: those of the nodes its outputs reach, and those run by an
    AccumulateGrad that is not one of the layer's parameters'. Its inputs' nodes
    (`StepInput`) run after the span's end: the ready queue runs the node of highest
    sequence number first, so each must be made before the span's marker."""
    traced = trace(model, inputs, None, None, dtype=torch.float32)
    graph, measurer = layer_graph_from_trace(traced, inputs, None, name="m",
                                             dtype=torch.float32)
    index = next(i for i, layer in enumerate(graph.layers) if layer.name == layer_name)
    state = measurer.layer_state(index, real_factory("cpu"))
    params = [t for t in state.values() if isinstance(t, torch.Tensor)]
    spans, seen = [], {}
    real_backward = torch.autograd.backward

    class Span(layer_profile.NodeSpan):
        def __init__(self, *args):
            super().__init__(*args)
            spans.append(self)

    def backward(roots, seeds, *args, **kwargs):
        if not (spans and roots and roots[-1] is spans[-1].root) or seen:
            return real_backward(roots, seeds, *args, **kwargs)
        seen["nodes"] = _reachable(roots[:-1])
        marker = roots[-1].grad_fn._sequence_nr()  # the span ends as this node starts
        seen["late"] = [n for n in seen["nodes"] if is_step_input(n)
                        and n._sequence_nr() > marker]
        with _NodeOps() as mode:
            real_backward(roots, seeds, *args, **kwargs)
        seen["ops"] = mode.ops
        return None

    monkeypatch.setattr(layer_profile, "NodeSpan", Span)
    monkeypatch.setattr(torch.autograd, "backward", backward)
    layer_profile.time_layer(measurer, index, state, real_factory("cpu"), "cpu", warmup=0,
                             repeats=1)
    foreign = [op for op, node in seen["ops"] if type(node).__name__ == "AccumulateGrad"
               and not any(node.variable is p for p in params)
               and node.variable is not spans[0].leaf]
    assert any(is_step_input(n) for n in seen["nodes"])
    # each input's node runs after the span's end, as the layer before's in a step
    assert seen["late"] == []
    return _ops_of(seen["ops"], seen["nodes"]), foreign


def test_the_profiles_timed_backward_runs_the_real_steps_ops(monkeypatch):
    ops, foreign = _timed_backward_ops(_TwoLinears(), {"x": torch.randn(4, 8)}, "second",
                                       monkeypatch)
    assert foreign == []
    assert ops == SECOND_LINEAR_BACKWARD


def test_the_profiles_dlrm_top_mlp_backward_accumulates_no_input(monkeypatch):
    loaded = load_model("dlrm-small", 4, None, device="meta")
    _, foreign = _timed_backward_ops(loaded.module, loaded.inputs, "top_mlp", monkeypatch)
    assert foreign == []


def test_the_spans_probe_chain_hands_over_no_input_gradient():
    """The span's own cost (`autograd_engine.EngineSampler(nodes_only=True)`), taken out
    of each profiled backward, holds no hand-over of its chain's leaf either: that chain
    starts at a `StepInput`, as a profiled layer's input does."""
    from cost_models.autograd_engine import EngineSampler

    sampler = EngineSampler("cpu", layer_profile.time.perf_counter, nodes_only=True)
    with _NodeOps() as mode:
        sampler.sample()
    assert [op for op, node in mode.ops if type(node).__name__ == "AccumulateGrad"
            and node.variable is sampler.leaf] == []
    assert sampler.leaf.grad is None  # `sample` clears it only without `nodes_only`


def test_a_layer_may_write_its_input_in_place():
    """An in-place op on a layer's input, as on an activation in a step (a ReLU(inplace)
    first thing in a layer): a `StepInput` is no view, whose in-place write autograd
    would refuse (a custom Function's view output)."""
    fc = nn.Linear(8, 8)
    x = StepInput.apply(torch.randn(4, 8, requires_grad=True))
    y = fc(torch.relu_(x))
    torch.autograd.backward([y], [torch.ones_like(y)])
    assert fc.weight.grad is not None
