"""The kernel-level time model (cost_models/kernel_time.py) on hand-computed cases.

Each expected figure is worked out here from the formula and the numbers of the case
(peak, bandwidth, measured points), not by calling the model's helpers.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from ir.cluster import ClusterSpec
from ir.kernel_calibration import (GemmPoint, HostOpExcess, KernelCalibration, MemoryKernelPoint,
                                   SdpaPoint)
from ir.kernel_records import KernelKind, KernelRecord, KernelRecords
from ir.layer import Layer, LayerMeasurement
from ir.strategy import Checkpoint, LayerStrategy, Precision

from cost_models.common import StepConfig
from cost_models.compute import layer_compute
from cost_models.kernel_time import layer_kernel_seconds, pass_seconds

PEAK = 1e15  # bf16 FLOP/s of the made-up device
HBM_GBPS = 2000.0
MiB = 2**20


def spec(calibration: KernelCalibration | None = None, device: str = "A100-SXM4-80GB",
         op_overhead_s: float = 0.0) -> ClusterSpec:
    return ClusterSpec(
        name="test", device=device, num_nodes=1, devices_per_node=8,
        device_memory_bytes=80 * 2**30, peak_flops_by_dtype=(("bfloat16", PEAK),),
        hbm_gbps=HBM_GBPS, intra_node_gbps=100.0, inter_node_gbps=25.0,
        intra_node_latency_s=1e-6, inter_node_latency_s=1e-5, runtime_overhead_bytes=0,
        matmul_efficiency=0.8, op_overhead_s=op_overhead_s, kernel_calibration=calibration)


CALIBRATION = KernelCalibration(
    measured_on="made up for the test",
    gemm=(GemmPoint(4096, 4096, 4096, "bfloat16", 5e14), GemmPoint(256, 256, 256, "bfloat16", 1e13)),
    memory_kernels=(MemoryKernelPoint("add", "bfloat16", 1 * MiB, 1000.0),
                    MemoryKernelPoint("add", "bfloat16", 64 * MiB, 2000.0),
                    MemoryKernelPoint("softmax", "bfloat16", 64 * MiB, 500.0)),
    sdpa=(SdpaPoint("default", "bfloat16", 4, 16, 2048, 128, True, 1e-3, 2.5e-3),
          SdpaPoint("flash_attention", "bfloat16", 4, 16, 2048, 128, True, 9e-3, 9e-3)),
    launch_device_s=5e-6)


def config(micro_batch: int = 1, seq_len: int = 1024) -> StepConfig:
    return StepConfig(micro_batch=micro_batch, graph_micro_batch=1, graph_dtype="bfloat16",
                      precision=Precision.BF16_MIXED, seq_len=seq_len)


def gemm(m, n, k, count=1, saved=True):
    return KernelRecord("aten::mm", KernelKind.GEMM, "bfloat16", (1, m, n, k), count,
                        flops=2 * m * n * k, weight_bytes=k * n * 2,
                        activation_bytes=(m * k + m * n) * 2, saved_under_selective=saved)


def memory(op, nbytes, count=1):
    return KernelRecord(op, KernelKind.MEMORY, "bfloat16", (nbytes // 2,), count,
                        activation_bytes=nbytes)


def test_a_gemm_runs_at_the_measured_rate_of_its_shape():
    # 4096^3: 2 * 4096^3 FLOPs at the measured 5e14 FLOP/s (efficiency 0.5 of 1e15);
    # its 3 * 4096^2 * 2 bytes take 100.7 MB / 2 TB/s = 50 us, under the 275 us of compute.
    t = pass_seconds((gemm(4096, 4096, 4096),), spec(CALIBRATION), config(seq_len=4096), 1.0,
                     backward=False)
    assert t.gemm_s == pytest.approx(137438953472 / 5e14)
    assert t.launch_s == 0.0 and t.kernels == 1


def test_a_gemm_without_a_table_takes_the_analytic_efficiency():
    # A100 n_half = 192: a 1024^3 product (edge 3mnk/(mk+kn+mn) = 1024) runs at
    # 0.8 * 1024 / 1216 of peak; one more for a 1024 x 4096 x 1024 product: edge
    # 3*1024*4096*1024 / (1024*1024 + 1024*4096 + 1024*4096) = 1365.33
    t = pass_seconds((gemm(1024, 1024, 1024),), spec(), config(), 1.0, backward=False)
    assert t.gemm_s == pytest.approx(2 * 1024**3 / (PEAK * 0.8 * 1024 / 1216))
    t = pass_seconds((gemm(1024, 4096, 1024),), spec(), config(), 1.0, backward=False)
    edge = 4096 / 3
    assert t.gemm_s == pytest.approx(2 * 1024 * 4096 * 1024 / (PEAK * 0.8 * edge / (edge + 192)))


def test_the_token_dimension_grows_with_the_micro_batch():
    # IR: 1 x 1024 tokens. At micro-batch 4 the forward product is 4096 x 4096 x 4096
    # (the measured point, 5e14 FLOP/s) and a weight gradient (m = 4096 features,
    # k = 1024 tokens) grows in k to the same shape.
    cfg = config(micro_batch=4, seq_len=1024)
    fwd = pass_seconds((gemm(1024, 4096, 4096),), spec(CALIBRATION), cfg, 1.0, backward=False)
    assert fwd.gemm_s == pytest.approx(4 * 2 * 1024 * 4096 * 4096 / 5e14)
    # analytic (no table): the grown weight gradient is a 4096^3 product, edge 4096
    wgrad = pass_seconds((gemm(4096, 4096, 1024),), spec(), cfg, 1.0, backward=True)
    assert wgrad.gemm_s == pytest.approx(2 * 4096**3 / (PEAK * 0.8 * 4096 / (4096 + 192)))


def test_a_memory_bound_kernel_moves_its_bytes_at_the_measured_bandwidth():
    # add over 8 MiB: between the 1 MiB (1000 GB/s) and 64 MiB (2000 GB/s) points,
    # log2(8) / log2(64) = 1/2 of the way: 1500 GB/s. Two calls.
    t = pass_seconds((memory("aten::add", 8 * MiB, count=2),), spec(CALIBRATION), config(),
                     1.0, backward=False)
    assert t.memory_s == pytest.approx(2 * 8 * MiB / 1500e9)
    # softmax has one point (500 GB/s), used at any size; no table: the spec's 2000 GB/s
    # times the share a softmax reached on the measured H100 (1276 of 3350 GB/s); a CPU
    # spec's bandwidth is its own measurement, taken whole
    t = pass_seconds((memory("aten::_softmax", 8 * MiB),), spec(CALIBRATION), config(), 1.0,
                     backward=False)
    assert t.memory_s == pytest.approx(8 * MiB / 500e9)
    t = pass_seconds((memory("aten::_softmax", 8 * MiB),), spec(), config(), 1.0, backward=False)
    assert t.memory_s == pytest.approx(8 * MiB / (2000e9 * 1276 / 3350))
    t = pass_seconds((memory("aten::_softmax", 8 * MiB),), spec(device="cpu"), config(), 1.0,
                     backward=False)
    assert t.memory_s == pytest.approx(8 * MiB / 2000e9)


def test_tiny_kernels_take_the_launch_floor():
    # 3 adds of 1 KiB: 1024 / 1000 GB/s = 1.02 ns each, under the 5 us floor per kernel;
    # views launch nothing. Without a table a GPU's floor is the H100's measured 1.22 us.
    view = KernelRecord("aten::view", KernelKind.VIEW, "bfloat16", (), 7)
    t = pass_seconds((memory("aten::add", 1024, count=3), view), spec(CALIBRATION), config(),
                     1.0, backward=False)
    assert t.total_s == pytest.approx(3 * 5e-6)
    assert t.memory_s == pytest.approx(3 * 1024 / 1000e9)
    assert (t.kernels, t.ops) == (3, 10)
    t = pass_seconds((memory("aten::add", 1024, count=3),), spec(), config(), 1.0,
                     backward=False)
    assert t.total_s == pytest.approx(3 * 1.22e-6)


def attention(backward: bool) -> KernelRecord:
    flops = 4 * 4 * 16 * 2048 * 2048 * 128  # 4 * b * heads * s^2 * d
    return KernelRecord("aten::scaled_dot_product_attention", KernelKind.ATTENTION, "bfloat16",
                        (4, 16, 2048, 2048, 128), 1, int(flops * (2.5 if backward else 1)),
                        activation_bytes=4 * 4 * 16 * 2048 * 128 * 2, causal=True)


def test_fused_attention_runs_at_the_dispatched_backends_measured_rate():
    # the same shape as the measured "default" point: its seconds, forward and backward
    # (the slower flash point is not what dispatch picked)
    for backward, seconds in ((False, 1e-3), (True, 2.5e-3)):
        t = pass_seconds((attention(backward),), spec(CALIBRATION), config(seq_len=2048), 1.0,
                         backward=backward)
        assert t.attention_s == pytest.approx(seconds)
    # twice the micro-batch: twice the FLOPs at the same rate
    t = pass_seconds((attention(False),), spec(CALIBRATION), config(2, seq_len=2048), 1.0,
                     backward=False)
    assert t.attention_s == pytest.approx(2e-3)


def test_fused_attention_without_a_table_is_a_causal_roofline():
    # half of 4*4*16*2048^2*128 FLOPs (causal) at the efficiency of a 2048 x 2048 x 128
    # GEMM: edge 3*2048*2048*128 / (2048*128 + 128*2048 + 2048*2048) = 341.33
    t = pass_seconds((attention(False),), spec(), config(seq_len=2048), 1.0, backward=False)
    edge = 3 * 2048 * 2048 * 128 / (2 * 2048 * 128 + 2048 * 2048)
    flops = 4 * 4 * 16 * 2048 * 2048 * 128
    assert t.attention_s == pytest.approx(flops / 2 / (PEAK * 0.8 * edge / (edge + 192)))


def test_tensor_parallelism_divides_each_kernel_by_the_layer_share():
    # share 1/4 of an add: a quarter of the bytes (2 MiB: 1000 + (2000-1000) * 1/6 GB/s)
    t = pass_seconds((memory("aten::add", 8 * MiB),), spec(CALIBRATION), config(), 0.25,
                     backward=False)
    assert t.memory_s == pytest.approx(2 * MiB / ((1000 + 1000 / 6) * 1e9))


def _layer(kernels: KernelRecords) -> Layer:
    return Layer(name="blocks.0", kind="Block", index=0, params=0, param_bytes=0, tp_params=0,
                 input_bytes=0, output_bytes=0, structural_hash="x",
                 measured=LayerMeasurement(ops_fwd=5, ops_bwd=5, kernels=kernels))


def test_checkpointing_recomputes_the_recorded_kernels():
    # forward: one 4096^3 GEMM the selective policy keeps, one 64 MiB softmax it does not
    big = gemm(4096, 4096, 4096, saved=True)
    soft = memory("aten::_softmax", 64 * MiB)
    kernels = KernelRecords(forward=(big, soft), backward=(big,))
    layer, cluster, cfg = _layer(kernels), spec(CALIBRATION), config(seq_len=4096)
    gemm_s, softmax_s = 137438953472 / 5e14, 64 * MiB / 500e9
    none = layer_compute(layer, LayerStrategy(), cluster, cfg)
    assert none.forward_s == pytest.approx(gemm_s + softmax_s)
    assert none.recompute_s == 0.0
    selective = layer_compute(layer, LayerStrategy(checkpoint=Checkpoint.SELECTIVE), cluster, cfg)
    assert selective.recompute_s == pytest.approx(softmax_s)
    full = layer_compute(layer, LayerStrategy(checkpoint=Checkpoint.FULL), cluster, cfg)
    assert full.recompute_s == pytest.approx(gemm_s + softmax_s)
    times = layer_kernel_seconds(kernels, cluster, cfg)
    assert times.selective_recompute.ops == 1 and math.isclose(times.backward.gemm_s, gemm_s)


def test_host_dispatch_bounds_a_gpu_layer_of_tiny_kernels():
    # 5 ops at 20 us of host time each outlast 1 kernel of 5 us: max(device, host)
    tiny = KernelRecords(forward=(memory("aten::add", 1024),), backward=())
    out = layer_compute(_layer(tiny), LayerStrategy(), spec(CALIBRATION, op_overhead_s=20e-6),
                        config())
    assert out.forward_s == pytest.approx(5 * 20e-6)


@pytest.fixture(scope="module")
def gpt3_graph():
    import torch

    from planner.models import load_layer_graph

    return load_layer_graph("gpt3-6.7b", 1, None, torch.bfloat16)


@pytest.mark.parametrize("preset", ["a100-40g", "a100-80g", "h100-80g", "h200"])
def test_no_gpu_preset_predicts_more_than_its_best_gemm_efficiency(gpt3_graph, preset):
    """A plan's MFU cannot beat the best fraction of peak the device's GEMMs reach (the
    measured table's fastest bf16 point, else the preset's best measured fraction)."""
    from cost_models.clusters import get_cluster
    from planner.search import search

    cluster = get_cluster(preset, nodes=2)
    cal = cluster.kernel_calibration
    best = (cal.best_gemm("bfloat16").flop_per_s / cluster.peak_flops("bfloat16")
            if cal is not None and cal.best_gemm("bfloat16") else cluster.matmul_efficiency)
    result = search(gpt3_graph, cluster, 128, with_baselines=False)
    assert result.best is not None
    assert 0 < result.best.estimate.mfu < best


def test_a_weight_gradient_gemm_moves_weight_sized_bytes_at_any_batch():
    # grad_W = x^T @ dy of a 512 x 1024 Linear, recorded at one token: (m, n, k) =
    # (512, 1024, 1). At 4096 tokens k = 4096; it reads 512 x 4096 and 4096 x 1024 and
    # writes 512 x 1024 (2 bytes each): 14,680,064 bytes / 2 TB/s = 7.34 us, not the
    # recorded bytes x 4096 (the output alone would then be 4.3 GB, 2.1 ms). FLOPs:
    # 2 * 512 * 1024 * 4096 at the analytic efficiency of that shape (edge
    # 3mnk / (mk + kn + mn) = 1489.45, A100 n_half 192: 0.8 * 1489.45 / 1681.45).
    record = KernelRecord("aten::mm", KernelKind.GEMM, "bfloat16", (1, 512, 1024, 1), 1,
                          flops=2 * 512 * 1024, weight_bytes=0,
                          activation_bytes=(512 + 1024 + 512 * 1024) * 2)
    t = pass_seconds((record,), spec(), config(micro_batch=4096, seq_len=1), 1.0,
                     backward=True)
    edge = 3 * 512 * 1024 * 4096 / (512 * 4096 + 4096 * 1024 + 512 * 1024)
    compute_s = 2 * 512 * 1024 * 4096 / (PEAK * 0.8 * edge / (edge + 192))
    memory_s = (512 * 4096 + 4096 * 1024 + 512 * 1024) * 2 / (HBM_GBPS * 1e9)
    assert t.gemm_s == pytest.approx(max(compute_s, memory_s))
    assert t.gemm_s < 1e-4


def test_forward_host_time_is_views_ops_and_module_calls_where_measured_apart():
    # 5 forward ops (3 views), 2 module calls: 3 x 1 us + 2 x 2 us + 2 x 3 us = 13 us of
    # host on a CPU spec whose kit measured the parts; without them (or the count)
    # 5 x op_overhead_s.
    import dataclasses

    from cost_models.host_dispatch import forward_host_seconds

    view = KernelRecord("aten::view", KernelKind.VIEW, "float32", (), count=3)
    counted = KernelRecords(forward=(memory("aten::add", 1024), view), backward=(),
                            forward_module_calls=2)
    cal = dataclasses.replace(CALIBRATION, forward_host_op_s=2e-6, module_call_host_s=3e-6,
                              view_host_op_s=1e-6)
    cpu = spec(cal, device="cpu", op_overhead_s=7e-6)
    assert forward_host_seconds(_layer(counted), cpu) == pytest.approx(13e-6)
    uncounted = KernelRecords(forward=counted.forward, backward=())
    assert forward_host_seconds(_layer(uncounted), cpu) == pytest.approx(35e-6)
    plain = dataclasses.replace(cpu, kernel_calibration=CALIBRATION)
    assert forward_host_seconds(_layer(counted), plain) == pytest.approx(35e-6)


def test_a_layer_counts_the_module_calls_its_forward_makes():
    """mlp-small's block is Linear then ReLU (planner/zoo/mlp.py), called from its
    forward: 2 module calls, whichever way it is traced (fx keeps both as call_module; export inlines them
    and the two modules' ops are told apart by their module stack)."""
    import torch

    from ir.measure import layer_graph_from_trace
    from ir.trace import trace
    from planner.models import load_model

    loaded = load_model("mlp-small", 2, None, device="meta")
    for method in ("fx", "export"):
        traced = trace(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                       force=method, dtype=torch.float32)
        graph, _ = layer_graph_from_trace(traced, loaded.inputs, loaded.target,
                                          name=loaded.name, dtype=torch.float32)
        block = next(layer for layer in graph.layers if layer.name == "blocks.1")
        assert block.kernels.forward_module_calls == 2, method


def test_an_embedding_backward_is_a_table_fill_plus_a_scatter_per_index():
    """embedding_dense_backward of 4096 indices into a 1024 x 64 bf16 table (micro-batch 1;
    the record reads 4096 rows of 128 bytes and 4096 int64 indices, writes the 128 KiB
    table): the table written at the measured copy bandwidth (800 GB/s), 4096 x 40 ns of
    scatter, the 512 KiB of rows at the add's (1000 GB/s at its 1 MiB point). Twice the
    micro-batch doubles the indices and rows, not the table. A kit that ran the embedding
    probes but read the per-index slope 0 (two timings alike on a loaded host) still
    prices it in parts, at 0 per index; a kit without them streams all its bytes as a
    copy."""
    import dataclasses

    from cost_models.common import GB

    table_bytes, rows = 1024 * 64 * 2, 4096
    record = KernelRecord("aten::embedding_dense_backward", KernelKind.MEMORY, "bfloat16",
                          (1024, 64), 1, weight_bytes=table_bytes,
                          activation_bytes=rows * (64 * 2 + 8))
    copy = MemoryKernelPoint("copy", "bfloat16", 1 * MiB, 800.0)
    with_copy = dataclasses.replace(CALIBRATION, memory_kernels=(
        *CALIBRATION.memory_kernels, copy))
    cal = dataclasses.replace(with_copy, embedding_backward_index_s=40e-9)
    for micro_batch in (1, 2):
        t = pass_seconds((record,), spec(cal), config(micro_batch), 1.0, backward=True)
        n = rows * micro_batch
        assert t.memory_s == pytest.approx(table_bytes / (800 * GB) + n * 40e-9
                                           + n * 64 * 2 / (1000 * GB))
    zero_slope = dataclasses.replace(with_copy, embedding_bag_call_s=2e-6)
    t = pass_seconds((record,), spec(zero_slope), config(), 1.0, backward=True)
    assert t.memory_s == pytest.approx(table_bytes / (800 * GB) + rows * 64 * 2 / (1000 * GB))
    plain = pass_seconds((record,), spec(with_copy), config(), 1.0, backward=True)
    assert plain.memory_s == pytest.approx(record.bytes_per_call / (800 * GB))


def conv_record(op: str, batch: int, grads: int, c_in: int = 16, count: int = 1):
    """A 3x3 conv of c_in -> 16 channels over 16 x 16 positions, float32 (cnn-small's)."""
    flops = 2 * batch * 256 * 16 * c_in * 9 * (1 if op == "aten::convolution" else
                                               bin(grads & 3).count("1"))
    return KernelRecord(op, KernelKind.CONV, "float32", (1, batch, c_in, 16, 256, 9, grads),
                        count, flops=flops)


def cpu_config(micro_batch: int) -> StepConfig:
    return StepConfig(micro_batch=micro_batch, graph_micro_batch=1, graph_dtype="float32",
                      precision=Precision.FP32, device_type="cpu")


def test_a_convolution_runs_at_the_measured_rate_of_the_nearest_conv():
    """Forward FLOPs 2 * batch * 256 * 16 * c_in * 9 at the nearest point's rate (its own
    FLOPs over its seconds); a backward's requested halves apart, grad_bias a sum."""
    from ir.kernel_calibration import ConvPoint
    from ir.kernel_records import CONV_GRAD_BIAS, CONV_GRAD_INPUT, CONV_GRAD_WEIGHT

    points = (ConvPoint("float32", 1, 3, 16, 16, 3, 10e-6, 20e-6, 30e-6),
              ConvPoint("float32", 4, 3, 16, 16, 3, 80e-6, 50e-6, 60e-6),
              ConvPoint("float32", 4, 16, 16, 16, 3, 70e-6, 80e-6, 90e-6))
    cal = KernelCalibration(measured_on="made up", conv=points)
    cpu = dataclasses.replace(spec(cal, device="cpu"), peak_flops_by_dtype=(("float32", 1e11),))
    # the stem's point at micro-batch 4 (the IR's batch 1 grown 4x): its seconds exactly
    fwd = pass_seconds((conv_record("aten::convolution", 1, 0, c_in=3),), cpu, cpu_config(4),
                       1.0, backward=False)
    assert fwd.conv_s == pytest.approx(80e-6) and fwd.gemm_s == 0.0
    both = conv_record("aten::convolution_backward", 1, CONV_GRAD_INPUT | CONV_GRAD_WEIGHT, 3)
    assert pass_seconds((both,), cpu, cpu_config(4), 1.0, True).conv_s == pytest.approx(110e-6)
    weight = conv_record("aten::convolution_backward", 1, CONV_GRAD_WEIGHT, c_in=3)
    assert pass_seconds((weight,), cpu, cpu_config(4), 1.0, True).conv_s == pytest.approx(60e-6)
    # at micro-batch 2 the stem points of batch 1 and 4 are equally near (one octave each
    # way): their rates' geometric mean, F/10us and 4F/80us = F/20us (F: batch 1's FLOPs),
    # for 2F of work -> 2 x sqrt(10 x 20) us
    fwd2 = pass_seconds((conv_record("aten::convolution", 1, 0, c_in=3),), cpu, cpu_config(2),
                        1.0, backward=False)
    assert fwd2.conv_s == pytest.approx(2 * math.sqrt(10 * 20) * 1e-6)
    # grad_bias: the output gradient (4 x 16 x 256 float32) through the "sum" kernel
    bias = conv_record("aten::convolution_backward", 1, CONV_GRAD_BIAS, c_in=16)
    assert pass_seconds((bias,), cpu, cpu_config(4), 1.0, True).conv_s == pytest.approx(
        4 * 16 * 256 * 4 / (HBM_GBPS * 1e9))


def test_a_convolution_without_a_table_is_its_implicit_gemm():
    """No conv table (the GPU presets): the roofline of the im2col GEMM, m = batch x
    positions = 1024, n = 16, k = 16 x 9 = 144, at the analytic efficiency of that shape."""
    from cost_models.gemm_efficiency import gemm_shape_efficiency

    record = KernelRecord("aten::convolution", KernelKind.CONV, "bfloat16",
                          (1, 4, 16, 16, 256, 9, 0), 1, flops=2 * 1024 * 16 * 144)
    s = spec()
    t = pass_seconds((record,), s, config(), 1.0, backward=False)
    compute_s = 2 * 1024 * 16 * 144 / (PEAK * gemm_shape_efficiency(s, 1024, 16, 144, "bfloat16"))
    bytes_s = (1024 * 144 + 144 * 16 + 1024 * 16) * 2 / (HBM_GBPS * 1e9)
    assert t.conv_s == pytest.approx(max(compute_s, bytes_s)) and t.conv_s > 0


def test_a_convolution_backward_without_a_table_is_one_implicit_gemm_per_gradient():
    """No conv table, a bytes-bound CPU spec (2000 GB/s, 1e18 FLOP/s so bytes bind):
    cnn-small's 16 -> 16 3x3 conv at batch 1, fp32, m = 256, n = 16, k = 144. Forward and
    each of grad_input (dy @ W^T, col2im) and grad_weight (im2col(x)^T @ dy) is one
    such GEMM: (256*144 + 144*16 + 256*16) * 4 = 173,056 bytes. A weight-only backward (a
    first conv fed the data) moves those once, a backward of both twice, and grad_bias
    adds the output gradient's 256*16*4 bytes through "sum" (live, this CPU, one
    thread, mb 16, 2026-11-25, load 2.2: forward 190 us, grad_weight 188, both 386)."""
    from ir.kernel_records import CONV_GRAD_BIAS, CONV_GRAD_INPUT, CONV_GRAD_WEIGHT

    cpu = dataclasses.replace(spec(device="cpu"), peak_flops_by_dtype=(("float32", 1e18),))
    gemm_s = (256 * 144 + 144 * 16 + 256 * 16) * 4 / (HBM_GBPS * 1e9)
    seconds = lambda r, bwd: pass_seconds((r,), cpu, cpu_config(1), 1.0, bwd).conv_s  # noqa: E731
    assert seconds(conv_record("aten::convolution", 1, 0), False) == pytest.approx(gemm_s)
    weight = conv_record("aten::convolution_backward", 1, CONV_GRAD_WEIGHT)
    assert seconds(weight, True) == pytest.approx(gemm_s)
    both = conv_record("aten::convolution_backward", 1, CONV_GRAD_INPUT | CONV_GRAD_WEIGHT)
    assert seconds(both, True) == pytest.approx(2 * gemm_s)
    all3 = conv_record("aten::convolution_backward", 1,
                       CONV_GRAD_INPUT | CONV_GRAD_WEIGHT | CONV_GRAD_BIAS)
    assert seconds(all3, True) == pytest.approx(2 * gemm_s + 256 * 16 * 4 / (HBM_GBPS * 1e9))


def test_streaming_elementwise_ops_and_batch_norm_take_their_own_measured_kinds():
    """relu and threshold_backward stream like add (measured, MEMORY_KERNEL_OF_OP's
    comment); gelu costs per element; training batch norm and its backward have their
    own points, not layer norm's."""
    cal = KernelCalibration(measured_on="made up", memory_kernels=tuple(
        MemoryKernelPoint(kind, "bfloat16", 1 * MiB, gbps) for kind, gbps in (
            ("add", 1000.0), ("gelu", 250.0), ("layer_norm", 500.0), ("batch_norm", 100.0),
            ("batch_norm_backward", 200.0))))
    seconds = {op: pass_seconds((memory(op, 1 * MiB),), spec(cal), config(), 1.0,
                                backward=False).memory_s
               for op in ("aten::relu", "aten::threshold_backward", "aten::gelu",
                          "aten::native_layer_norm", "aten::native_batch_norm",
                          "aten::native_batch_norm_backward")}
    assert seconds == pytest.approx({
        "aten::relu": MiB / 1000e9, "aten::threshold_backward": MiB / 1000e9,
        "aten::gelu": MiB / 250e9, "aten::native_layer_norm": MiB / 500e9,
        "aten::native_batch_norm": MiB / 100e9, "aten::native_batch_norm_backward": MiB / 200e9})


def test_an_embedding_bag_costs_per_call_and_per_id_where_measured():
    """(ids, bags, dim) = (8, 4, 16) at micro-batch 1 and 2, calibration forward 5 us +
    1 ns/id, backward 6 us + 30 ns/id: forward 5e-6 + 8m x 1e-9; backward 6e-6 + 8m x 30e-9
    plus the dense gradient's fill (100 x 16 x 2 bytes at the 800 GB/s copy point). Rows
    of 48 (32 wider than the probe's 16) add 32 x 2 bytes per id (bf16) at the add
    bandwidth (1000 GB/s at 1 MiB and below). Without the figures: streamed as before."""
    from cost_models.common import GB

    copy = MemoryKernelPoint("copy", "bfloat16", 1 * MiB, 800.0)
    cal = dataclasses.replace(CALIBRATION, memory_kernels=(*CALIBRATION.memory_kernels, copy),
                              embedding_bag_call_s=5e-6, embedding_bag_index_s=1e-9,
                              embedding_bag_backward_call_s=6e-6,
                              embedding_bag_backward_index_s=30e-9)
    table = 100 * 16 * 2
    fwd = KernelRecord("aten::_embedding_bag", KernelKind.MEMORY, "bfloat16", (8, 4, 16), 1,
                       weight_bytes=table, activation_bytes=448)
    bwd = KernelRecord("aten::_embedding_bag_backward", KernelKind.MEMORY, "bfloat16",
                       (8, 4, 16), 1, weight_bytes=table, activation_bytes=448)
    wide = KernelRecord("aten::_embedding_bag", KernelKind.MEMORY, "bfloat16", (8, 4, 48), 1)
    for m in (1, 2):
        cfg = config(m)
        assert pass_seconds((fwd,), spec(cal), cfg, 1.0, False).memory_s == pytest.approx(
            5e-6 + 8 * m * 1e-9)
        assert pass_seconds((bwd,), spec(cal), cfg, 1.0, True).memory_s == pytest.approx(
            6e-6 + 8 * m * 30e-9 + table / (800 * GB))
        assert pass_seconds((wide,), spec(cal), cfg, 1.0, False).memory_s == pytest.approx(
            5e-6 + 8 * m * 1e-9 + 8 * m * 32 * 2 / (1000 * GB))
    plain = pass_seconds((fwd,), spec(CALIBRATION), config(), 1.0, False)
    assert plain.memory_s == pytest.approx((table + 448) / (1000 * GB))


def test_one_bag_forward_pays_the_multi_bag_figure_less():
    """Calibration forward 5 us + 1 ns/id, multi-bag 1.2 us, backward 6 us + 30 ns/id: a
    record of (2 ids, 1 bag, 16) at micro-batch 1 prices 5 - 1.2 + 2 x 1e-9 forward; at
    micro-batch 2 (2 bags, 4 ids) 5 + 4 x 1e-9; its backward is not reduced at one bag
    (6 us + 2 x 30 ns + the fill of 100 x 16 x 2 bytes at the 800 GB/s copy point)."""
    from cost_models.common import GB

    copy = MemoryKernelPoint("copy", "bfloat16", 1 * MiB, 800.0)
    cal = dataclasses.replace(CALIBRATION, memory_kernels=(*CALIBRATION.memory_kernels, copy),
                              embedding_bag_call_s=5e-6, embedding_bag_index_s=1e-9,
                              embedding_bag_backward_call_s=6e-6,
                              embedding_bag_backward_index_s=30e-9,
                              embedding_bag_multi_bag_s=1.2e-6)
    table = 100 * 16 * 2
    fwd = KernelRecord("aten::_embedding_bag", KernelKind.MEMORY, "bfloat16", (2, 1, 16), 1,
                       weight_bytes=table)
    bwd = KernelRecord("aten::_embedding_bag_backward", KernelKind.MEMORY, "bfloat16",
                       (2, 1, 16), 1, weight_bytes=table)
    assert pass_seconds((fwd,), spec(cal), config(1), 1.0, False).memory_s == pytest.approx(
        5e-6 - 1.2e-6 + 2 * 1e-9)
    assert pass_seconds((fwd,), spec(cal), config(2), 1.0, False).memory_s == pytest.approx(
        5e-6 + 4 * 1e-9)
    assert pass_seconds((bwd,), spec(cal), config(1), 1.0, True).memory_s == pytest.approx(
        6e-6 + 2 * 30e-9 + table / (800 * GB))


def test_log_softmax_backward_is_priced_at_its_own_kind_not_softmax_backward():
    """Log-softmax's backward runs an exp per element that softmax's backward does not
    (2.5x its seconds on a CPU): where the calibration measured "log_softmax_backward" it
    prices the op, while `_softmax_backward_data` keeps "softmax_backward"; without the
    point it falls back to softmax's backward (what priced it before), then softmax."""
    from cost_models.common import GB
    from cost_models.kernel_time import memory_kind

    nbytes = 1 * MiB
    log_bwd, bwd = (KernelRecord(op, KernelKind.MEMORY, "bfloat16", (512, 1024), 1,
                                 activation_bytes=nbytes)
                    for op in ("aten::_log_softmax_backward_data", "aten::_softmax_backward_data"))
    both = dataclasses.replace(CALIBRATION, memory_kernels=(
        *CALIBRATION.memory_kernels,
        MemoryKernelPoint("softmax_backward", "bfloat16", nbytes, 400.0),
        MemoryKernelPoint("log_softmax_backward", "bfloat16", nbytes, 160.0)))
    older = dataclasses.replace(CALIBRATION, memory_kernels=(
        *CALIBRATION.memory_kernels, MemoryKernelPoint("softmax_backward", "bfloat16", nbytes,
                                                       400.0)))
    for r, cal, kind, gbps in [(log_bwd, both, "log_softmax_backward", 160.0),
                               (bwd, both, "softmax_backward", 400.0),
                               (log_bwd, older, "softmax_backward", 400.0),
                               (log_bwd, CALIBRATION, "softmax", 500.0)]:
        assert memory_kind(r, cal) == kind
        t = pass_seconds((r,), spec(cal), config(), 1.0, backward=True)
        assert t.memory_s == pytest.approx(nbytes / (gbps * GB))


def test_short_loops_masked_fill_and_softmax_backward_use_their_measured_kinds():
    """A clone of 1 MiB of bf16 (2 bytes read + 2 written per element: 262144 elements)
    in 4096 inner loops, where the calibration has "short_run" at 100 GB/s and copy at
    800: its bytes as a copy plus 4096 loops x the probe's extra seconds per loop (1 MiB
    at 100 GB/s less at 800, over 1 MiB / (2 x 2 bytes x 8) = 32768 loops); without the
    point just the copy. masked_fill and softmax backward use their own measured points,
    and without them fall back to what priced them before (add; softmax)."""
    from cost_models.common import GB
    from cost_models.kernel_time import memory_kind

    nbytes = 1 * MiB

    def record(op, loops=0):
        return KernelRecord(op, KernelKind.MEMORY, "bfloat16", (512, 1024), 1,
                            activation_bytes=nbytes, inner_loops=loops)

    copy = MemoryKernelPoint("copy", "bfloat16", nbytes, 800.0)
    measured = dataclasses.replace(CALIBRATION, memory_kernels=(
        *CALIBRATION.memory_kernels, copy,
        MemoryKernelPoint("short_run", "bfloat16", nbytes, 100.0),
        MemoryKernelPoint("masked_fill", "bfloat16", nbytes, 50.0),
        MemoryKernelPoint("softmax_backward", "bfloat16", nbytes, 400.0)))
    bare = dataclasses.replace(CALIBRATION, memory_kernels=(*CALIBRATION.memory_kernels, copy))
    per_loop_s = (nbytes / (100 * GB) - nbytes / (800 * GB)) / (nbytes / (2 * 2 * 8))
    clone = record("aten::clone", 4096)
    for cal, expected_s in ((measured, nbytes / (800 * GB) + 4096 * per_loop_s),
                            (bare, nbytes / (800 * GB))):
        assert pass_seconds((clone,), spec(cal), config(), 1.0, False).memory_s == \
            pytest.approx(expected_s)
    for r, cal, kind, gbps in [(record("aten::masked_fill"), measured, "masked_fill", 50.0),
                               (record("aten::masked_fill"), bare, "add", 1000.0),
                               (record("aten::_softmax_backward_data"), measured,
                                "softmax_backward", 400.0),
                               (record("aten::_softmax_backward_data"), bare, "softmax", 500.0)]:
        assert memory_kind(r, cal) == kind
        t = pass_seconds((r,), spec(cal), config(), 1.0, backward=False)
        assert t.memory_s == pytest.approx(nbytes / (gbps * GB))


def test_each_gemm_layout_pays_its_measured_factor_over_the_plain_table():
    # Plain 256^3 at 1e13 FLOP/s in the table; the layout probe's own plain mm ran at 2e13
    # and beside it a Linear's addmm at 1.6e13 (factor 1.25), a weight gradient at 1e13
    # (2.0), a bias-less Linear at 2e13 (1.0): each factor times the table's seconds.
    cal = dataclasses.replace(
        CALIBRATION, gemm_layout_mm=(GemmPoint(256, 256, 256, "bfloat16", 2e13),),
        gemm_linear=(GemmPoint(256, 256, 256, "bfloat16", 1.6e13),),
        gemm_weight_grad=(GemmPoint(256, 256, 256, "bfloat16", 1e13),),
        gemm_linear_nobias=(GemmPoint(256, 256, 256, "bfloat16", 2e13),))
    plain_s = 2 * 256**3 / 1e13
    addmm = dataclasses.replace(gemm(256, 256, 256), op="aten::addmm")
    wgrad = dataclasses.replace(gemm(256, 256, 256), weight_output=True)
    cases = ((addmm, False, 1.25), (wgrad, True, 2.0), (gemm(256, 256, 256), False, 1.0),
             (gemm(256, 256, 256), True, 1.0))  # backward dy @ W: the plain layout
    for record, backward, factor in cases:
        t = pass_seconds((record,), spec(cal), config(seq_len=256), 1.0, backward=backward)
        assert t.gemm_s == pytest.approx(plain_s * factor), (record.op, backward)
    # addmm's fixed excess, charged per call by the host model, is not charged again:
    # 10% of the layout's measured 2 * 256^3 / 1.6e13 s off it, factor 0.9 x 1.25
    layout_s = 2 * 256**3 / 1.6e13
    charged = dataclasses.replace(cal, host_op_excess=(HostOpExcess("aten::addmm", 0.1 * layout_s),))
    t = pass_seconds((addmm,), spec(charged), config(seq_len=256), 1.0, backward=False)
    assert t.gemm_s == pytest.approx(plain_s * 1.125)
    # without layout tables (older kits, GPU presets) every layout is the plain table's
    t = pass_seconds((addmm,), spec(CALIBRATION), config(seq_len=256), 1.0, backward=False)
    assert t.gemm_s == pytest.approx(plain_s)


def test_layout_tables_survive_the_spec_file():
    cal = dataclasses.replace(CALIBRATION, gemm_linear=(GemmPoint(64, 64, 64, "float32", 1e11),))
    again = KernelCalibration.from_dict(cal.to_dict())
    assert again.gemm_linear == cal.gemm_linear and again.gemm_weight_grad == ()
