"""The cost model counts what tensor parallelism really stores per rank.

Multi-query Falcon's fused query_key_value is stored [q_r | k | v] on rank r
(`executors.fused.FusedSplit.shared`): its one key/value head is replicated, not split.
The layer IR's `tp_params` (what TP divides, `cost_models.model_states.tp_local_params`)
must leave those rows out, or parameters, gradients, optimizer states and the TP-able
compute share are under-counted by 2·head_dim·hidden per block per rank. The oracle is
the executor: the bytes of the local shards a TP 2 plan leaves on each of 2 gloo ranks.
"""

from __future__ import annotations

import pytest
import torch

from cost_models.compute import tp_compute_fraction
from cost_models.model_states import held_bytes_per_param, layer_held_states
from executors import apply
from ir.plan import uniform_plan
from ir.strategy import Precision
from planner.models import load_layer_graph, load_model

from dist_utils import spawn

SPEC = "hf:tests/data/hf/falcon/config.json"  # multi_query, 4 heads, hidden 64
SEQ = 16
GLOBAL_BATCH = 4
TP = 2


def _graph():
    return load_layer_graph(SPEC, micro_batch=1, seq_len=SEQ, dtype=torch.float32)


def _plan(graph):
    return uniform_plan(len(graph.layers), global_batch=GLOBAL_BATCH, precision=Precision.FP32,
                        tp=TP)


def _local_bytes(rank: int, world_size: int, payload) -> dict[str, int]:
    graph = _graph()
    loaded = load_model(SPEC, micro_batch=1, seq_len=SEQ, device="cpu", seed=0)
    pm = apply(loaded.module, _plan(graph), graph, loss_fn=loaded.loss_fn,
               optimizer=torch.optim.AdamW, example_inputs=loaded.inputs)
    out = {}
    for layer in graph.layers:
        prefix = f"{layer.name}."
        out[layer.name] = sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
            for name, p in pm.module.named_parameters() if name.startswith(prefix))
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_falcon_mqa_parameter_bytes_under_tp_match_the_executor():
    graph = _graph()
    plan = _plan(graph)
    held = held_bytes_per_param(Precision.FP32, "adamw")
    per_rank = spawn(_local_bytes, TP, timeout_s=240)
    assert per_rank[0] == per_rank[1]  # [q_r | k | v]: every rank alike
    blocks = [(i, layer) for i, layer in enumerate(graph.layers)
              if layer.name.startswith("transformer.h.")]
    assert len(blocks) == 2  # both Falcon blocks hold a shared k/v
    for i, layer in blocks:
        predicted = layer_held_states(layer, plan.layer_strategies[i], held).params
        assert predicted == per_rank[0][layer.name], layer.name
        # the TP-able compute share is the TP-able share of the parameters: what one rank holds
        local_params = per_rank[0][layer.name] / held.weights
        assert tp_compute_fraction(layer, plan.layer_strategies[i]) == pytest.approx(
            local_params / layer.params, rel=1e-12)
        assert layer.tp_params < layer.params  # the shared rows are not divided
