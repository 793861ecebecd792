"""A layer fed by the model's own data (images, dense features) makes no gradient for it,
as in a training step, where the batch does not require grad (`ir.stand_in.is_data`).

Hand derivations, fp32, micro-batch B = 16:
  cnn-small stem: conv3x3 3 -> 16 channels, padding 1, on (B, 3, 16, 16) images: forward
    2 * B*256 * 16 * 3*9 FLOPs; its backward is ONE convolution_backward that computes
    the weight's gradient alone (output_mask [False, True, False]): as many FLOPs as the
    forward. Each block's two convs (16 -> 16) compute input and weight gradients.
  mlp-small blocks.0: Linear 32 -> 64 on (B, 32): backward GEMMs grad_W = g^T @ x, one
    mm (1, 64, 32, B); no grad_x = g @ W (mm (1, B, 32, 64)). blocks.1 (64 -> 64) has both.
  dlrm-small bottom_mlp: Linear 13 -> 64 -> 32 -> 16 on (B, 13) dense features: 6 GEMMs
    less the first Linear's grad_x (mm (1, B, 13, 64)): 5.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ir.kernel_records import CONV_GRAD_INPUT, CONV_GRAD_WEIGHT, KernelKind
from ir.measure import build_layer_graph
from planner.models import load_layer_graph, load_model

B = 16


@pytest.fixture(scope="module")
def graphs():
    return {spec: load_layer_graph(spec, micro_batch=B, dtype=torch.float32)
            for spec in ("cnn-small", "mlp-small", "dlrm-small")}


def _compute(records) -> dict:
    """{(op, shape): count} of the GEMM and convolution records."""
    out: dict = {}
    for r in records:
        if r.kind in (KernelKind.GEMM, KernelKind.CONV):
            out[(r.op, r.shape)] = out.get((r.op, r.shape), 0) + r.count
    return out


def test_cnn_stem_computes_no_input_gradient(graphs):
    graph = graphs["cnn-small"]
    stem, block = graph.layer("stem"), graph.layer("blocks.0")
    (conv,) = [r for r in stem.kernels.forward if r.kind is KernelKind.CONV]
    (grad,) = [r for r in stem.kernels.backward if r.kind is KernelKind.CONV]
    assert conv.flops == 2 * B * 256 * 16 * 3 * 9
    assert grad.shape[-1] == CONV_GRAD_WEIGHT and grad.count == 1 and grad.flops == conv.flops
    assert stem.gradless_input_bytes == stem.input_bytes == B * 3 * 256 * 4
    grads = [r for r in block.kernels.backward if r.kind is KernelKind.CONV]
    assert [(r.shape[-1], r.count) for r in grads] == [(CONV_GRAD_INPUT | CONV_GRAD_WEIGHT, 2)]
    assert block.gradless_input_bytes == 0


def test_mlp_and_dlrm_first_linear_has_no_grad_input_matmul(graphs):
    mlp = graphs["mlp-small"]
    assert _compute(mlp.layer("blocks.0").kernels.backward) == {("aten::mm", (1, 64, 32, B)): 1}
    assert _compute(mlp.layer("blocks.1").kernels.backward) == {
        ("aten::mm", (1, B, 64, 64)): 1, ("aten::mm", (1, 64, 64, B)): 1}
    bottom = graphs["dlrm-small"].layer("bottom_mlp")
    gemms = _compute(bottom.kernels.backward)
    assert sum(gemms.values()) == 5 and ("aten::mm", (1, B, 13, 64)) not in gemms
    assert bottom.gradless_input_bytes == bottom.input_bytes == B * 13 * 4


def test_a_block_fed_data_is_measured_apart_from_its_twins():
    """in_features = width: blocks.0 has blocks.1's structure, but its input is the data;
    one shared measurement would price its backward's grad_x matmul or drop blocks.1's."""
    graph = load_layer_graph("mlp:in_features=64", micro_batch=B, dtype=torch.float32)
    first, second = graph.layer("blocks.0"), graph.layer("blocks.1")
    assert first.structural_hash != second.structural_hash
    assert ("aten::mm", (1, B, 64, 64)) not in _compute(first.kernels.backward)
    assert ("aten::mm", (1, B, 64, 64)) in _compute(second.kernels.backward)


def test_a_stage_after_a_cut_still_makes_its_input_gradient(graphs):
    """A later pipeline stage's input comes from the stage before (torch's PipelineStage
    receives it with requires_grad): every layer right after a cut takes activations,
    and its backward makes their gradient (mlp-small pp=2: blocks.2 after the cut): all
    its input but the head's integer labels (B x 8 bytes) gets a gradient."""
    graph = graphs["mlp-small"]
    assert graph.cut_points == (0, 1, 2, 3)
    for cut in graph.cut_points:
        after = graph.layers[cut + 1]
        labels = B * 8 if after.name == "head" else 0
        assert (after.input_bytes, after.gradless_input_bytes) == (B * 64 * 4 + labels, labels)
    assert ("aten::mm", (1, B, 64, 64)) in _compute(graph.layer("blocks.2").kernels.backward)


def test_a_layer_taking_data_and_activations_makes_only_the_activations_gradient():
    class Gate(nn.Module):  # the activation h, gated by the data x
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, h, x):
            return self.fc(h) * x

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.gate = nn.Linear(8, 8), Gate()

        def forward(self, x):
            return self.gate(self.first(x), x)

    graph = build_layer_graph(Model(), {"x": torch.randn(4, 8)}, dtype=torch.float32)
    gate = graph.layer("gate")
    assert (gate.input_bytes, gate.gradless_input_bytes) == (2 * 4 * 8 * 4, 4 * 8 * 4)
    # grad of fc's output (g * x) and grad_h, grad_W: no g * fc(h) for x's gradient
    assert sum(r.count for r in gate.kernels.backward if r.op == "aten::mul") == 1
    assert _compute(gate.kernels.backward) == {("aten::mm", (1, 4, 8, 8)): 1,
                                               ("aten::mm", (1, 8, 8, 4)): 1}


class _LiveComputeKernels(TorchDispatchMode):
    """The GEMM and convolution kernels a real step runs, recorded as the IR records them."""

    def __init__(self):
        super().__init__()
        from ir.kernel_recorder import KernelRecorder
        self.recorder = KernelRecorder(weight_keys=set())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.recorder.record(func, args, kwargs or {}, out)
        return out


@pytest.mark.parametrize("spec", ["cnn-small", "mlp-small"])
def test_backward_kernels_are_a_real_steps(graphs, spec):
    """One real CPU step of the model (data without grad): its backward's GEMMs and
    convolutions, gradients requested included, are the IR's summed over the layers."""
    torch.manual_seed(0)
    loaded = load_model(spec, B, None, device="cpu")
    out = loaded.module(**loaded.inputs)
    loss = loaded.loss_fn(out, loaded.target)
    with _LiveComputeKernels() as live:
        loss.backward()
    ir: dict = {}
    for layer in graphs[spec].layers:
        for key, n in _compute(layer.kernels.backward).items():
            ir[key] = ir.get(key, 0) + n
    assert _compute(live.recorder.records()) == ir


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # the images need no grad
def test_the_stems_backward_memory_is_a_real_steps(graphs):
    """The memory model's stem backward holds its output's gradient and makes none for the
    images (grad_flow_bytes: the output's alone), as a real step's stem backward, tracked
    live, makes nothing by its convolution's backward but the weight's gradient (16 x 3 x
    3 x 3 fp32: 1728 bytes), no (B, 3, 16, 16) input gradient."""
    from cost_models.activations import layer_activations
    from cost_models.common import StepConfig
    from ir.memory_tracker import LiveTensorTracker
    from ir.strategy import LayerStrategy, Precision

    stem = graphs["cnn-small"].layer("stem")
    config = StepConfig(micro_batch=B, graph_micro_batch=B, graph_dtype="float32",
                        precision=Precision.FP32, seq_len=None, device_type="cpu")
    assert layer_activations(stem, LayerStrategy(), config).grad_flow_bytes == stem.output_bytes

    torch.manual_seed(0)
    loaded = load_model("cnn-small", B, None, device="cpu")
    model, mem, start = loaded.module, LiveTensorTracker(record=True), []
    model.stem.register_full_backward_pre_hook(lambda m, g: start.append(mem.clock))
    with mem:
        loaded.loss_fn(model(**loaded.inputs), loaded.target).backward()
    made = [s.nbytes for birth, _, s in mem.lifetimes()
            if birth > start[0] and s.made_by.startswith("convolution_backward")]
    assert made == [16 * 3 * 3 * 3 * 4]
