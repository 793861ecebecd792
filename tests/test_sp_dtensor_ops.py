"""The ops the TP executor runs on DTensors outside its TP modules, counted on meta
(`ir.dtensor_ops`), against what the executor runs on 2 gloo ranks.

Hand derivation (fp32, zoo models, `executors.tensor_parallel.layer_tp_plan`):
  llama-tiny block: attn_norm and mlp_norm (LlamaRMSNorm) own a weight outside the 7 TP
    candidates. Forward 7 ops each: pow, mean, add (eps), rsqrt, detach (rsqrt's output
    saved), mul (x * r), mul (weight * y). Backward 18: weight * y: mul, mul, sum over
    (b, s), view to (h,) = 4; the weight's AccumulateGrad: detach = 1; x * r: mul, mul,
    sum over h = 3; rsqrt: detach, pow, mul by -1/2, mul = 4; mean: expand, div = 2;
    pow: pow, mul by 2, mul = 3; x's two uses inside the norm summed: add = 1.
    (The trace's block also sums the residual's gradient into x's: the executor does
    that add on plain tensors, after `from_local`'s backward, so it is not counted.)
  gpt-tiny block: ln1, ln2 (LayerNorm): forward native_layer_norm = 1; backward
    native_layer_norm_backward + the weight's and the bias's AccumulateGrad detach = 3.
Under SP every such module runs under SequenceParallel (DTensor ops); without SP none of
these does (no per-head norm in a split attention), so none is priced.
"""

from __future__ import annotations

import pytest
import torch

from cost_models.tp_host import dtensor_op_counts
from ir.strategy import LayerStrategy
from planner.models import load_layer_graph

from dist_utils import spawn

MICRO_BATCH = 2
EXPECTED = {"llama-tiny": {"attn_norm": (7, 18), "mlp_norm": (7, 18)},
            "gpt-tiny": {"ln1": (1, 3), "ln2": (1, 3)}}


@pytest.mark.parametrize("model", sorted(EXPECTED))
def test_the_trace_counts_each_replicated_module_s_ops(model):
    block = load_layer_graph(model, micro_batch=MICRO_BATCH, dtype=torch.float32).layers[1]
    counts = {path: (fwd, bwd) for path, fwd, bwd in block.replicated_module_ops}
    assert counts == EXPECTED[model]
    forward = sum(f for f, _ in EXPECTED[model].values())
    backward = sum(b for _, b in EXPECTED[model].values())
    assert dtensor_op_counts(block, LayerStrategy(tp=2, sequence_parallel=True)) == (
        forward, backward)
    assert dtensor_op_counts(block, LayerStrategy(tp=2)) == (0, 0)
    assert dtensor_op_counts(block, LayerStrategy()) == (0, 0)


def _dtensor_ops_per_module(rank: int, world_size: int, payload) -> dict:
    """Per replicated module of block 1 split by the executor: the ops dispatched with a
    DTensor argument in one forward and one backward of that module alone on this rank's
    sequence chunk (gradients cleared first, as training's zero_grad leaves them)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from executors.tensor_parallel import apply_tp
    from planner.models import load_model

    model, sequence_parallel = payload
    graph = load_layer_graph(model, micro_batch=MICRO_BATCH, dtype=torch.float32)
    layer = graph.layers[1]
    block = load_model(model, MICRO_BATCH, None, device="cpu").module.get_submodule(layer.name)
    apply_tp(block, layer, LayerStrategy(tp=world_size, sequence_parallel=sequence_parallel),
             init_device_mesh("cpu", (world_size,)))

    class DTensorOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += any(isinstance(a, DTensor) for a in tree_leaves((args, kwargs)))
            return func(*args, **(kwargs or {}))

    hidden = layer.output_bytes // (MICRO_BATCH * graph.seq_len * 4)  # fp32 b*s*h
    x = torch.randn(MICRO_BATCH, graph.seq_len // world_size, hidden, requires_grad=True)
    counts = {}
    for path, _, _ in layer.replicated_module_ops:
        module = block.get_submodule(path)
        for _ in range(2):  # the second run's counts: caches warm
            module.zero_grad(set_to_none=True)
            forward, backward = DTensorOps(), DTensorOps()
            with forward:
                y = module(x)
            loss = y.sum()
            with backward:
                loss.backward()
        counts[path] = (forward.count, backward.count)
    return counts


@pytest.mark.parametrize("model, sequence_parallel", [("llama-tiny", True),
                                                      ("gpt-tiny", True),
                                                      ("llama-tiny", False)])
def test_the_executor_runs_on_dtensors_the_ops_the_trace_counted(model, sequence_parallel):
    measured = spawn(_dtensor_ops_per_module, 2, (model, sequence_parallel), timeout_s=400)[0]
    expected = {path: counts if sequence_parallel else (0, 0)
                for path, counts in EXPECTED[model].items()}
    assert measured == expected
