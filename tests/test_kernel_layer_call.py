"""`planner profile` calls a layer as a training step does: the step's model forward calls
each layer as a module (one `nn.Module.__call__`, then its leaf modules'), never through
fx's `_WrappedCall`; `GraphMeasurer.layer_module`'s GraphModule makes those module calls
(a leaf layer's call is the graph's own call_module: no second one)."""

import collections

import torch
from torch import nn
from torch.fx import graph_module

from ir.measure import layer_graph_from_trace
from ir.stand_in import real_factory
from ir.trace import LOSS_MODULE, trace
from planner.models import load_model


def _count_module_calls(run) -> int:
    calls = []
    handle = nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: calls.append(module))
    try:
        run()
    finally:
        handle.remove()
    return len(calls)


def test_profiled_layer_makes_the_module_calls_a_step_makes(monkeypatch):
    # what the step runs: the model's own forward, every module call named by its path
    model = load_model("llama-tiny", 2, None, device="cpu", seed=0)
    names = {id(m): name for name, m in model.module.named_modules()}
    leaves = {name for name, m in model.module.named_modules() if not list(m.children())}
    step_calls = collections.Counter()
    handle = nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: step_calls.update([names.get(id(module), "?")]))
    try:
        with torch.no_grad():
            model.module(**model.inputs)
    finally:
        handle.remove()

    loaded = load_model("llama-tiny", 2, None, device="meta")
    traced = trace(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                   dtype=torch.float32)
    graph, measurer = layer_graph_from_trace(traced, loaded.inputs, loaded.target,
                                             name=loaded.name, dtype=torch.float32)
    wrapped = []
    original = graph_module._WrappedCall.__call__
    monkeypatch.setattr(graph_module._WrappedCall, "__call__",
                        lambda self, *a, **k: wrapped.append(1) or original(self, *a, **k))
    checked = set()
    for i, layer in enumerate(graph.layers):
        if layer.name in ("embed", "blocks.0", "norm", "head"):
            state = measurer.layer_state(i, real_factory("cpu"))
            module = measurer.layer_module(i, state)
            inputs = measurer.fresh_inputs(i, state, real_factory("cpu"))
            with torch.no_grad():
                profiled = _count_module_calls(lambda: module(*inputs))
            # the layer's own call and its leaves' (fx inlines the containers between:
            # llama's `attn` and `mlp`, which the step calls too)
            in_step = sum(n for name, n in step_calls.items() if name == layer.name
                          or (name.startswith(layer.name + ".") and name in leaves))
            # the trace wraps the loss function in a module (`ir.trace.LOSS_MODULE`) that the
            # step calls as a function: the one module call the profile (and the count the
            # model prices, `GraphMeasurer.module_calls`) has beyond the step's
            loss_wrapper = sum(1 for n in measurer.infos[i].nodes.nodes
                               if n.op == "call_module" and str(n.target) == LOSS_MODULE)
            assert profiled == in_step + loss_wrapper, (layer.name, profiled, in_step)
            checked.add(layer.name)
    assert checked == {"embed", "blocks.0", "norm", "head"}
    assert step_calls["blocks.0"] == 1 and step_calls["embed"] == 1
    assert any(n.op == "call_module" and str(n.target) == LOSS_MODULE  # head holds the loss
               for layer, info in zip(graph.layers, measurer.infos) if layer.name == "head"
               for n in info.nodes.nodes)
    assert not wrapped  # fx's error-reporting wrapper: no step runs it
