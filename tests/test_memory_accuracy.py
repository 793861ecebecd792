"""The memory model against what the executor really holds: tied copies, FSDP2 units,
pipeline schedules, sequence parallelism, and the tracker that measures them."""

from __future__ import annotations

import pytest
import torch

from planner.models import load_layer_graph, load_model


# ---- the IR records tied copies as the executor makes them ----------------------------------

@pytest.mark.parametrize("spec, copies", [
    ("gpt-tiny", {"head": ("head.weight",)}),
    ("t5-tiny", {"decoder_embed": ("decoder_embed.tok.weight",), "head": ("head.weight",)}),
    ("llama-tiny", {}),
])
def test_ir_records_the_tied_copies_the_executor_makes(spec, copies):
    from executors.tied import find_tie_groups

    graph = load_layer_graph(spec, micro_batch=1, dtype=torch.float32)
    module = load_model(spec, device="meta").module
    recorded = {l.name: l.tied_param_names for l in graph.layers if l.tied_params}
    assert recorded == copies
    # executors.tied.untie gives every layer of a tie group after the first its own copy
    groups = find_tie_groups(module, graph)
    made = {graph.layers[j].name: names for g in groups
            for j, names in zip(g.layers[1:], g.names[1:])}
    assert made == copies
    for name in copies:
        layer = graph.layer(name)
        size = module.get_parameter(layer.tied_param_names[0]).numel()
        assert layer.tied_params == size
        assert layer.tied_tp_params == size  # the copy sits in the layer's TP candidate
        assert layer.max_param_numel >= size
    # the owner still counts the parameter once: the IR's total is the model's
    assert sum(l.params for l in graph.layers) == graph.num_params
