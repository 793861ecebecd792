"""A full recompute issues again only the TP collectives before the forward's last save
(`ir.tp_recompute`), counted on one block split by the executor on 2 gloo ranks.

Hand derivation (zoo models, tp 2, one block forward + backward, `executors`):
  llama-tiny, plain TP: forward o_proj and down_proj all-reduce their outputs (2);
    backward q, k, v, gate, up all-reduce their input gradients (5): 7. Full recompute:
    o_proj's all-reduce again (mlp_norm saves after it), not down_proj's (only the
    residual add follows, which saves nothing): 8.
  llama-tiny, SP: per row-parallel module an all-gather (its parent's input) and a
    reduce-scatter (its output) in forward, the same pair in backward: 4 + 4. Full: both
    all-gathers again (q/k/v and gate/up save the gathered input) and o_proj's
    reduce-scatter: 6 + 5.
  gpt-tiny, SP: its MLP ends in a dropout whose mask is saved after c_proj's
    reduce-scatter, so full issues both pairs again: 4 + 4 -> 6 + 6.
The trace records how many reductions come before the last save (1 for llama, 2 for
gpt), and `comm.tp_comm_s` prices those (`test_tp_pricing`).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from ir.strategy import Checkpoint, LayerStrategy
from planner.models import load_layer_graph

from dist_utils import spawn

MICRO_BATCH = 2
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


def _collectives(rank: int, world_size: int, payload) -> dict:
    """Funcol collectives dispatched by one forward + backward of block 1, split as the
    executor splits it, with and without full checkpointing."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils._python_dispatch import TorchDispatchMode

    from executors.checkpointing import apply_ac
    from executors.tensor_parallel import apply_tp
    from planner.models import load_model

    model, sequence_parallel = payload
    graph = load_layer_graph(model, micro_batch=MICRO_BATCH, dtype=torch.float32)
    layer = graph.layers[1]
    hidden = layer.output_bytes // (MICRO_BATCH * graph.seq_len * 4)  # fp32 b*s*h
    rows = graph.seq_len // world_size if sequence_parallel else graph.seq_len
    mesh = init_device_mesh("cpu", (world_size,))

    class Collectives(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if func.namespace == "_c10d_functional" and name in COLLECTIVES:
                self.counts[name] += 1
            return func(*args, **(kwargs or {}))

    found = {}
    for mode in (Checkpoint.NONE, Checkpoint.FULL):
        torch.manual_seed(0)
        block = load_model(model, MICRO_BATCH, None, device="cpu").module.get_submodule(
            layer.name)
        apply_tp(block, layer, LayerStrategy(tp=world_size,
                                             sequence_parallel=sequence_parallel), mesh)
        apply_ac(block, mode)
        x = torch.randn(MICRO_BATCH, rows, hidden, requires_grad=True)
        counter = Collectives()
        with counter:
            out = block(x)
            out = out[0] if isinstance(out, tuple) else out
            out.sum().backward()
        found[mode.value] = dict(counter.counts)
    return found


@pytest.mark.parametrize("model, sequence_parallel, plain, full", [
    ("llama-tiny", False, {"all_reduce": 7}, {"all_reduce": 8}),
    ("llama-tiny", True, {"all_gather_into_tensor": 4, "reduce_scatter_tensor": 4},
     {"all_gather_into_tensor": 6, "reduce_scatter_tensor": 5}),
    ("gpt-tiny", True, {"all_gather_into_tensor": 4, "reduce_scatter_tensor": 4},
     {"all_gather_into_tensor": 6, "reduce_scatter_tensor": 6})])
def test_a_full_recompute_reissues_the_collectives_before_the_last_save(
        model, sequence_parallel, plain, full):
    found = spawn(_collectives, 2, (model, sequence_parallel), timeout_s=400)[0]
    assert found == {Checkpoint.NONE.value: plain, Checkpoint.FULL.value: full}
    reductions = 1 if model == "llama-tiny" else 2
    graph = load_layer_graph(model, micro_batch=MICRO_BATCH, dtype=torch.float32)
    assert graph.layers[1].rowwise_before_last_save_fwd == reductions
