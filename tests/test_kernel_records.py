"""Kernel records of a GPT block (planner/zoo/gpt.py), pinned against a hand derivation.

Block: B=2, T=12, h=32, heads nh=2 (hd=16), ffn f=4h=128, dropout 0.1, biases on, float32
(e=4 bytes), traced on meta. N = B*T = 24 tokens. Tensor sizes in bytes:
    A = N*h*e = 3072        one (B, T, h) activation
    F = N*f*e = 12288       one (B, T, f) MLP activation
    S = B*nh*T*T*e = 2304   one (B, nh, T, T) score tensor
Bytes of a kernel = each input tensor read once + each output written once; weight bytes
= the reads of parameters.

Forward (Block.forward: x + attn(ln1(x)), then + mlp(ln2(x))):
  GEMMs. nn.Linear on (B, T, in) is addmm(bias, x2d (N x in), W^T):
    q, k, v, proj: 4 x addmm (1, N, h, h): 2*N*h*h FLOPs; weights (h*h + h)*e;
                   activations N*h*e in + N*h*e out.
    fc1: addmm (1, N, f, h), fc2: addmm (1, N, h, f): 2*N*h*f FLOPs each; weights
                   (h*f + f)*e and (f*h + h)*e; activations (N*h + N*f)*e each.
    q @ k^T: bmm (B*nh, T, T, hd); att @ v: bmm (B*nh, T, hd, T): 2*B*nh*T*T*hd FLOPs
                   each; bytes: q-sized + k-sized in, scores out = 2*A' + S (A' = A here,
                   B*nh*T*hd = N*h) and S + A' in, A' out.
    total = 24*N*h^2 + 4*B*T^2*h (Narayanan et al. 2021).
  Memory-bound kernels (17):
    2 native_layer_norm       x in, y out, mean and rstd (N each) out: 2A + 2*N*e;
                              weight + bias read: 2*h*e
    4 clone                   matmul's reshape of non-contiguous q, k^T, v and the
                              (B, T, nh, hd) output before proj: 2A each
    1 mul (1/sqrt(hd))        2S
    1 arange (T int64)        T*8 written
    1 gt (causal mask)        two views of the positions read (2*T*8), T*T bools written
    1 masked_fill             scores and the mask in, scores out: 2S + T*T
    1 _softmax                2S
    3 dropouts, each recorded as the one kernel CUDA runs (native_dropout; meta and CPU
      run bernoulli_, div_, mul instead): x in, out and a bool mask (1 byte per element)
      out: 2X + X/e, with X = S (attention probabilities) or A (twice: after proj and
      after fc2)
    2 add (residuals)         3A each
    1 gelu                    2F
Backward (autograd of the above; one ones_like seeds the gradient of the block output):
  GEMMs (16): per Linear, grad_x = g @ W: mm (1, N, in, out) reading W (no bias), and
    grad_W = x^T @ g: mm (1, in, out, N), no parameter read; for each bmm two bmms
    (grad of each operand); total FLOPs = 2 x forward.
  Memory-bound kernels (24):
    1 ones_like (A written); 3 native_dropout_backward (g and the bool mask in, out:
    2X + X/e, X = A twice and S once); 6 sum (bias grads: g (N x out) read, out written
    as weight bytes, since it does not grow with the batch: 5 with out = h, 1 with
    out = f); 1 gelu_backward (3F); 2 native_layer_norm_backward (g, x in, mean, rstd
    in, dx out: 3A + 2*N*e; weight + bias read and dweight, dbias written: 4*h*e weight
    bytes);
    4 add (gradient accumulation: the two residual branches, and ln1's output feeding
    q, k and v: 2 more); 4 clone (reshapes of non-contiguous gradients of q, k, v and of
    att @ v's output: 2A each); 1 _softmax_backward_data (g, y in, dx out: 3S);
    1 masked_fill (2S + T*T); 1 mul (scale: 2S).
Selective checkpointing (ir.checkpoint_policy) keeps only the addmm outputs: it recomputes
every forward kernel but the 6 addmm: the 2 bmm and all 17 memory-bound kernels.
"""

from __future__ import annotations

import pytest
import torch

from ir.kernel_records import KernelKind
from ir.measure import build_layer_graph
from ir.strategy import Checkpoint
from planner.zoo import gpt

B, T, H, NH, E = 2, 12, 32, 2, 4
HD, FF, N = H // NH, 4 * H, B * T
A, F, S = N * H * E, N * FF * E, B * NH * T * T * E


@pytest.fixture(scope="module")
def block():
    config = gpt.Config(layers=2, hidden=H, heads=NH, vocab=64, seq=T, dropout=0.1)
    with torch.device("meta"):
        model = gpt.build(config)
    inputs, labels = gpt.example_inputs(config, micro_batch=B)
    graph = build_layer_graph(model, inputs, labels, gpt.loss_fn, name="gpt", dtype=torch.float32)
    assert graph.layer("blocks.1").kernels is graph.layer("blocks.0").kernels  # measured once
    return graph.layer("blocks.0")


def _gemms(records):
    """{(op, shape): count}."""
    out: dict = {}
    for r in records:
        if r.kind is KernelKind.GEMM:
            out[(r.op, r.shape)] = out.get((r.op, r.shape), 0) + r.count
    return out


def _memory(records):
    kernels = [r for r in records if r.kind is KernelKind.MEMORY]
    return (sum(r.count for r in kernels), sum(r.count * r.activation_bytes for r in kernels),
            sum(r.count * r.weight_bytes for r in kernels))


def test_forward_gemms_match_the_hand_count(block):
    fwd = block.kernels.forward
    assert _gemms(fwd) == {("aten::addmm", (1, N, H, H)): 4, ("aten::addmm", (1, N, FF, H)): 1,
                           ("aten::addmm", (1, N, H, FF)): 1,
                           ("aten::bmm", (B * NH, T, T, HD)): 1,
                           ("aten::bmm", (B * NH, T, HD, T)): 1}
    gemm = [r for r in fwd if r.kind is KernelKind.GEMM]
    assert sum(r.total_flops for r in gemm) == 24 * N * H * H + 4 * B * T * T * H
    weights = sum(r.count * r.weight_bytes for r in gemm)
    assert weights == (4 * (H * H + H) + (H * FF + FF) + (FF * H + H)) * E
    activations = sum(r.count * r.activation_bytes for r in gemm)
    assert activations == 4 * 2 * A + 2 * (A + F) + (2 * A + S) + (S + 2 * A)


def test_forward_memory_kernels_match_the_hand_count(block):
    count, activation_bytes, weight_bytes = _memory(block.kernels.forward)
    assert count == 17
    expected = (2 * (2 * A + 2 * N * E) + 4 * 2 * A + 2 * S + T * 8 + (2 * T * 8 + T * T)
                + (2 * S + T * T) + 2 * S + (2 * S + S // E) + 2 * (2 * A + A // E)
                + 2 * 3 * A + 2 * F)
    assert activation_bytes == expected
    assert weight_bytes == 2 * 2 * H * E


def test_backward_kernels_match_the_hand_count(block):
    bwd = block.kernels.backward
    gemm = [r for r in bwd if r.kind is KernelKind.GEMM]
    assert sum(r.count for r in gemm) == 16
    assert sum(r.total_flops for r in gemm) == 2 * (24 * N * H * H + 4 * B * T * T * H)
    assert {op for op, _ in _gemms(bwd)} == {"aten::mm", "aten::bmm"}
    # grad_x = g @ W reads each Linear weight once; weight gradients read no parameter
    assert sum(r.count * r.weight_bytes for r in gemm) == (4 * H * H + 2 * H * FF) * E
    count, activation_bytes, weight_bytes = _memory(bwd)
    assert count == 23  # no ones_like seed: training's loss gradient flows in
    expected = (2 * (2 * A + A // E) + (2 * S + S // E) + 5 * N * H * E + N * FF * E + 3 * F
                + 2 * (3 * A + 2 * N * E) + 4 * 3 * A + 4 * 2 * A + 3 * S
                + (2 * S + T * T) + 2 * S)
    assert activation_bytes == expected
    assert weight_bytes == 2 * 4 * H * E + 5 * H * E + FF * E  # norms; bias gradients


def test_selective_recomputes_everything_but_the_linear_matmuls(block):
    kernels = block.kernels
    again = kernels.recomputed(Checkpoint.SELECTIVE)
    assert _gemms(again) == {("aten::bmm", (B * NH, T, T, HD)): 1,
                             ("aten::bmm", (B * NH, T, HD, T)): 1}
    assert _memory(again)[0] == 17
    assert sum(r.count for r in again if r.op == "aten::native_dropout") == 3
    assert kernels.recomputed(Checkpoint.FULL) == kernels.forward
    assert kernels.recomputed(Checkpoint.NONE) == ()
    assert all(r.saved_under_selective == (r.op == "aten::addmm") for r in kernels.forward)


def test_records_are_aggregated_and_shared_by_identical_blocks(block):
    keys = [(r.op, r.kind, r.dtype, r.shape, r.flops, r.weight_bytes, r.activation_bytes)
            for r in block.kernels.forward]
    assert len(keys) == len(set(keys))  # one record per (op, shape, dtype, bytes)
    assert len(block.kernels.forward) < 40  # compact: counts, not a log of every call


class _SdpaBlock(torch.nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, t, h)  # (b, heads, t, d) -> (b, t, h)


class _SdpaModel(torch.nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_SdpaBlock(hidden, heads) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_sdpa_is_one_fused_attention_kernel_forward_and_backward():
    """F.scaled_dot_product_attention runs as its math decomposition on meta (bmm, softmax,
    ...); it is recorded as the one kernel a GPU runs: 4*b*heads*s^2*d FLOPs forward,
    2.5x backward (Dao 2023), reading q, k, v and writing the output (q-sized) forward;
    reading q, k, v, out, d_out and writing dq, dk, dv backward."""
    b, t, h, heads = 2, 16, 32, 4
    with torch.device("meta"):
        model = _SdpaModel(h, heads)
    graph = build_layer_graph(model, {"x": torch.empty(b, t, h, device="meta")}, name="sdpa",
                              dtype=torch.float32)
    kernels = graph.layers[0].kernels
    fwd = [r for r in kernels.forward if r.kind is KernelKind.ATTENTION]
    bwd = [r for r in kernels.backward if r.kind is KernelKind.ATTENTION]
    assert len(fwd) == len(bwd) == 1
    q_bytes = b * t * h * E
    assert fwd[0].shape == (b, heads, t, t, h // heads) and fwd[0].causal
    assert fwd[0].flops == 4 * b * heads * t * t * (h // heads)
    assert bwd[0].flops == 2.5 * fwd[0].flops
    assert (fwd[0].activation_bytes, bwd[0].activation_bytes) == (4 * q_bytes, 8 * q_bytes)
    # no trace of the decomposition: the only matmuls left are the Linear's (and its grads)
    assert {r.op for r in kernels.forward if r.kind is KernelKind.GEMM} == {"aten::addmm"}
    assert {r.op for r in kernels.backward if r.kind is KernelKind.GEMM} == {"aten::mm"}
    assert not any("softmax" in r.op for r in kernels.forward + kernels.backward)
    assert fwd[0] in kernels.recomputed(Checkpoint.SELECTIVE)  # the policy keeps only mm/addmm


def test_gradients_shaped_like_weights_are_weight_bytes():
    """An embedding's dense gradient (rows x dim) and a bias gradient (a `sum` over the
    tokens, (1, out)) do not grow with the micro-batch: they are recorded as weight
    bytes; an activation-sized output of the same op is not."""
    from ir.kernel_recorder import KernelRecorder

    rec = KernelRecorder(weight_keys=set(), weight_shapes=frozenset({(100, 8), (8,)}))
    grad = torch.empty(2, 5, 8, device="meta")
    ids = torch.zeros(2, 5, dtype=torch.long, device="meta")
    table_grad = torch.empty(100, 8, device="meta")
    rec.record(torch.ops.aten.embedding_dense_backward.default, (grad, ids, 100, -1, False),
               {}, table_grad)
    g2d = torch.empty(10, 8, device="meta")
    rec.record(torch.ops.aten.sum.dim_IntList, (g2d, [0], True), {},
               torch.empty(1, 8, device="meta"))
    rec.record(torch.ops.aten.sum.dim_IntList, (grad, [1], False), {},
               torch.empty(2, 8, device="meta"))
    table, bias, pooled = rec.records()
    assert (table.weight_bytes, table.activation_bytes) == (100 * 8 * 4, 80 * 4 + 10 * 8)
    assert (bias.weight_bytes, bias.activation_bytes) == (8 * 4, 80 * 4)
    assert (pooled.weight_bytes, pooled.activation_bytes) == (0, (80 + 16) * 4)


def test_a_convolution_records_its_channels_positions_kernel_and_requested_gradients():
    """Conv2d 3 -> 16 channels, 3x3, padding 1, on (2, 3, 8, 8): 2 images x 64 output
    positions; forward FLOPs 2 x 2*64 x 16 x 3*9 = 110592; its backward with the input
    requiring grad computes grad_input and grad_weight (output_mask [True, True, False]),
    twice the forward's FLOPs; with a data input only grad_weight."""
    import torch

    from ir.kernel_records import CONV_GRAD_INPUT, CONV_GRAD_WEIGHT
    from ir.kernel_recorder import KernelRecorder

    aten = torch.ops.aten
    x = torch.empty(2, 3, 8, 8, device="meta")
    w = torch.empty(16, 3, 3, 3, device="meta")
    conv_args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    out = aten.convolution.default(x, w, None, *conv_args)
    grad = torch.empty_like(out)
    rec = KernelRecorder(weight_keys=set())
    rec.record(aten.convolution.default, (x, w, None, *conv_args), {}, out)
    for mask in ([True, True, False], [False, True, False]):
        args = (grad, x, w, None, *conv_args, mask)
        rec.record(aten.convolution_backward.default, args, {},
                   aten.convolution_backward.default(*args))
    fwd, both, weight_only = rec.records()
    assert fwd.kind is KernelKind.CONV and fwd.shape == (1, 2, 3, 16, 64, 9, 0)
    assert fwd.flops == 2 * 2 * 64 * 16 * 3 * 9 == 110592
    assert both.shape[-1] == CONV_GRAD_INPUT | CONV_GRAD_WEIGHT and both.flops == 2 * fwd.flops
    assert weight_only.shape[-1] == CONV_GRAD_WEIGHT and weight_only.flops == fwd.flops


def test_an_embedding_bag_records_its_ids_bags_and_width():
    """nn.EmbeddingBag(100, 16, mode="sum") over (3, 2) ids (3 bags of 2) traced on meta:
    the forward `_embedding_bag` and the backward `_embedding_bag_backward` are recorded
    with the shape (ids, bags, dim) = (6, 3, 16); the backward's dense gradient (100 x 16
    floats) is weight bytes."""
    from ir.kernel_recorder import KernelRecorder
    from ir.op_count import OpCounter

    bag = torch.nn.EmbeddingBag(100, 16, mode="sum", device="meta")
    ids = torch.zeros(3, 2, dtype=torch.long, device="meta")
    recorder = KernelRecorder(weight_keys=set(), weight_shapes=frozenset({(100, 16)}))
    with OpCounter(recorder):
        out = bag(ids)
        out.backward(torch.ones_like(out))
    bags = [r for r in recorder.records() if "embedding_bag" in r.op]
    assert {(r.op, r.shape) for r in bags} == {("aten::_embedding_bag", (6, 3, 16)),
                                               ("aten::_embedding_bag_backward", (6, 3, 16))}
    backward = next(r for r in bags if r.op.endswith("backward"))
    assert backward.weight_bytes == 100 * 16 * 4


def test_inner_loops_follow_strides_broadcasts_and_slices():
    """(elements per innermost loop, loops) of memory-bound ops, worked out by hand from
    the strides: a contiguous add runs one loop over all 2*3*8*8 = 384 elements; a clone
    of a (2, 8, 3, 8) tensor's transpose(1, 2) stops at its 8-wide rows (stride 8*3*8 =
    192 next, not 8): 48 loops; an expand of a size-1 middle dim (stride 0) likewise, 32
    loops of 8; a per-row scale (2, 3, 1) broadcast along the last dim keeps the 8-wide
    loop and cannot merge further (stride 1 next to 0): 6 loops; a sum over dim 2 of
    (2, 3, 4, 8) (keepdim) runs its reduced dim innermost (TensorIterator's reduction
    order): 2*3*8 = 48 loops of 4, strided by 8; cat along the last dim
    copies 4-wide rows, 6 per input; slice_backward writes its (2, 3, 4) gradient into
    dim 1's slice: 2 loops of 3 * 4 = 12."""
    from ir.kernel_recorder import inner_loops

    def m(*shape):
        return torch.empty(*shape, device="meta")

    x = m(2, 3, 8, 8)
    assert inner_loops("add", (x, x), [x], [m(2, 3, 8, 8)]) == (384, 1)
    t = m(2, 8, 3, 8).transpose(1, 2)
    assert inner_loops("clone", (t,), [t], [m(2, 3, 8, 8)]) == (8, 48)
    e = m(2, 3, 1, 8).expand(2, 3, 4, 8)
    assert inner_loops("clone", (e,), [e], [m(2, 3, 4, 8)]) == (8, 24)
    row = m(2, 3, 1)
    y = m(2, 3, 8)
    assert inner_loops("mul", (y, row), [y, row], [m(2, 3, 8)]) == (8, 6)
    s = m(2, 3, 4, 8)
    assert inner_loops("sum", (s, [2], True), [s], [m(2, 3, 1, 8)]) == (4, 48)
    a, b = m(2, 3, 4), m(2, 3, 4)
    assert inner_loops("cat", ([a, b], -1), [a, b], [m(2, 3, 8)]) == (4, 12)
    g = m(2, 3, 4)
    assert inner_loops("slice_backward", (g, [2, 6, 4], 1, 0, 3, 1), [g],
                       [m(2, 6, 4)]) == (12, 2)


def test_tanh_gelu_is_recorded_and_charged_apart_from_exact_gelu():
    """A block with one exact and one tanh GELU: the records tell them apart (variant
    "tanh", forward and backward), everything else about the two equal, and the host
    excess table charges each its own figure: exact 7 us + tanh 0.25 us = 7.25 us of
    forward excess (exact GELU's alone keyed by op name would be 14)."""
    from cost_models.host_excess import TANH_GELU, records_excess_seconds
    from ir.kernel_calibration import HostOpExcess, KernelCalibration

    class TwoGelus(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):  # both on an activation: the data x gets no gradient
            h = self.fc(x)
            return torch.nn.functional.gelu(h) + torch.nn.functional.gelu(h, approximate="tanh")

    graph = build_layer_graph(torch.nn.Sequential(TwoGelus()), {"input": torch.randn(2, 8)},
                              dtype=torch.float32)
    kernels = graph.layers[0].kernels
    for records, op in ((kernels.forward, "aten::gelu"), (kernels.backward, "aten::gelu_backward")):
        gelus = sorted((r for r in records if r.op == op), key=lambda r: r.variant)
        assert [(r.variant, r.count) for r in gelus] == [("", 1), ("tanh", 1)]
        assert gelus[1].excess_key == f"{op}(approximate=tanh)"
        assert gelus[0].shape == gelus[1].shape and gelus[0].flops == gelus[1].flops
    cal = KernelCalibration(measured_on="made up for the test", host_op_excess=(
        HostOpExcess("aten::gelu", 7e-6), HostOpExcess(TANH_GELU, 0.25e-6)))
    assert records_excess_seconds(kernels.forward, cal.host_excess_s) == pytest.approx(
        7.25e-6 + sum(r.count * cal.host_excess_s(r.op) for r in kernels.forward
                      if r.op not in ("aten::gelu",)))
