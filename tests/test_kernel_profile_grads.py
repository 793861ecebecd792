"""`planner profile` times what a training step's first micro-batch runs: every repeat's
backward finds no `.grad` on the layer's parameters (it steals each new gradient), not
the last repeat's gradient to `add_` into (`cost_models.layer_profile.time_layer`)."""

import torch

from cost_models.layer_profile import time_layer
from ir.measure import layer_graph_from_trace
from ir.stand_in import real_factory
from ir.trace import trace
from planner.models import load_model


def test_every_profiled_backward_starts_without_gradients():
    loaded = load_model("llama-tiny", 2, None, device="meta")
    traced = trace(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                   dtype=torch.float32)
    graph, measurer = layer_graph_from_trace(traced, loaded.inputs, loaded.target,
                                             name=loaded.name, dtype=torch.float32)
    i = next(i for i, layer in enumerate(graph.layers) if layer.name == "blocks.0")
    state = measurer.layer_state(i, real_factory("cpu"))
    params = [t for t in state.values() if isinstance(t, torch.Tensor) and t.requires_grad]
    assert len(params) >= 2
    seen = []  # per parameter gradient computed: was a .grad already there?
    for p in params:
        # a tensor hook runs when p's gradient is computed, before it is accumulated
        p.register_hook(lambda grad, p=p: seen.append(p.grad is not None))
    warmup, repeats = 1, 3
    time_layer(measurer, i, state, real_factory("cpu"), "cpu", warmup=warmup, repeats=repeats)
    # one gradient per parameter per run (warm-up included), none onto a leftover .grad
    assert len(seen) == (warmup + repeats) * len(params)
    assert not any(seen)
