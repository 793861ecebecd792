"""The profile times each layer's forward as its own GraphModule (`GraphMeasurer.
layer_module`); these tests prove that module computes exactly what the instrumented,
node-by-node run (`start_run` + `run_forward`, what `measure_layer` counts) computes: the
same outputs and the same gradients, bit for bit, for every unique layer of zoo models
traced both ways (torch.fx and torch.export)."""

import pytest
import torch

from cost_models.layer_profile import time_layer
from ir.measure import layer_graph_from_trace
from ir.saved_tensors import tensor_leaves
from ir.stand_in import real_factory
from ir.trace import trace
from planner.models import load_model

CASES = [(m, "fx") for m in ("gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny", "cnn-small",
                              "dlrm-small")] + [("gpt-tiny", "export"), ("llama-tiny", "export")]


def _measured(model: str, method: str = "fx"):
    loaded = load_model(model, 2, None, device="meta")
    traced = trace(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                   force=method, dtype=torch.float32)
    assert traced.method == method
    graph, measurer = layer_graph_from_trace(traced, loaded.inputs, loaded.target,
                                             name=loaded.name, dtype=torch.float32)
    return traced, graph, measurer


def _grads(tensors):
    out = [None if t.grad is None else t.grad.clone() for t in tensors]
    for t in tensors:
        t.grad = None
    return out


@pytest.mark.parametrize("model,method", CASES)
def test_layer_module_computes_what_the_interpreter_computes(model, method):
    traced, graph, measurer = _measured(model, method)
    factory = real_factory("cpu")
    seen = set()
    for i, layer in enumerate(graph.layers):
        if layer.structural_hash in seen:
            continue
        seen.add(layer.structural_hash)
        state = measurer.layer_state(i, factory)
        runner = measurer.start_run(i, state, factory)
        inputs = [runner.env[a] for a in measurer.infos[i].inputs]
        leaves = [t for v in inputs for t in tensor_leaves(v) if t.requires_grad]
        for t in leaves:  # activations (`ir.stand_in.StepInput`): kept for the comparison
            t.retain_grad()
        leaves += [t for t in state.values() if t.requires_grad]
        torch.manual_seed(0)  # dropout draws the same masks in both runs
        measurer.run_forward(i, runner)
        expected_roots = measurer.grad_roots(i, runner)
        module = measurer.layer_module(i, state)
        torch.manual_seed(0)
        returned = module(*inputs)
        roots = measurer.module_roots(i, returned)
        returned_nodes = measurer._returned_nodes(i)
        assert len(returned) == len(returned_nodes), layer.name
        for node, value in zip(returned_nodes, returned):
            want, got = list(tensor_leaves(runner.env[node])), list(tensor_leaves(value))
            assert len(want) == len(got), (layer.name, node.name)
            for w, g in zip(want, got):
                assert torch.equal(w, g), (model, layer.name, node.name)
        assert len(roots) == len(expected_roots), layer.name
        ones = lambda ts: [torch.ones_like(t) for t in ts]  # noqa: E731
        if roots:
            torch.autograd.backward(expected_roots, ones(expected_roots))
            want = _grads(leaves)
            torch.autograd.backward(roots, ones(roots))
            got = _grads(leaves)
            assert any(g is not None for g in got), layer.name
            for w, g in zip(want, got):
                assert (w is None) == (g is None), layer.name
                assert w is None or torch.equal(w, g), (model, layer.name)


def test_layer_module_is_generated_code_over_the_layers_modules():
    """One Python function per layer: the leaf modules called from generated code, not
    one interpreter step (and `functional_call`) per node; and `time_layer` times it."""
    traced, graph, measurer = _measured("gpt-tiny")
    i = next(i for i, layer in enumerate(graph.layers) if layer.name == "blocks.0")
    state = measurer.layer_state(i, real_factory("cpu"))
    module = measurer.layer_module(i, state)
    calls = [n for n in module.graph.nodes if n.op == "call_module"]
    assert calls and all(isinstance(module.get_submodule(n.target), torch.nn.Module)
                         for n in calls)
    assert "functional_call" not in module.code
    params = {id(p) for p in module.parameters()}
    assert params and params <= {id(t) for t in state.values()}
    forward_s, backward_s = time_layer(measurer, i, state, real_factory("cpu"), "cpu",
                                       warmup=1, repeats=2)
    assert forward_s > 0 and backward_s > 0
