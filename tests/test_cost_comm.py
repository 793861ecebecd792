"""Communication model: alpha-beta collectives, placement, per-layer TP/DP/PP traffic."""

from __future__ import annotations

import dataclasses
import math

import pytest

from cost_models.clusters import get_cluster
from cost_models.comm import (Link, all_gather_s, all_reduce_s, all_to_all_s, broadcast_s,
                              collective_s, dp_comm_s, group_link, reduce_scatter_s,
                              replicated_tensors, ring_all_reduce_s, send_recv_s,
                              p2p_s, sp_grad_sync_s, tp_comm_s, tp_transition_s,
                              tree_all_reduce_s)
from cost_models.common import GB, StepConfig
from cost_models.model_states import bytes_per_param
from cost_models.synthetic import gpt_layer_graph
from ir.calibration_tables import BlockingWait
from ir.cluster import CollectiveFit
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Precision

LINK = Link(alpha_s=5e-6, bytes_per_s=100e9, spans_nodes=False)


def test_ring_all_reduce_formula():
    n, size = 8, 1 << 30
    expected = 2 * (n - 1) * 5e-6 + 2 * (n - 1) / n * size / 100e9
    assert ring_all_reduce_s(size, n, LINK) == pytest.approx(expected)


def test_gather_scatter_all_to_all_and_p2p_formulas():
    n, size = 16, 256 << 20
    expected = (n - 1) * 5e-6 + (n - 1) / n * size / 100e9
    assert all_gather_s(size, n, LINK) == pytest.approx(expected)
    assert reduce_scatter_s(size, n, LINK) == pytest.approx(expected)
    assert all_to_all_s(size, n, LINK) == pytest.approx(expected)
    assert send_recv_s(size, LINK) == pytest.approx(5e-6 + size / 100e9)
    assert broadcast_s(size, n, LINK) == pytest.approx(4 * (5e-6 + size / 100e9))  # log2 16
    assert broadcast_s(size, 1, LINK) == 0.0
    # Reduce-scatter + all-gather move what a ring all-reduce moves.
    assert reduce_scatter_s(size, n, LINK) + all_gather_s(size, n, LINK) == \
        pytest.approx(ring_all_reduce_s(size, n, LINK))


def test_all_reduce_takes_tree_for_small_and_ring_for_large_messages():
    n = 64
    small, large = 4096, 1 << 30
    assert tree_all_reduce_s(small, n, LINK) < ring_all_reduce_s(small, n, LINK)
    assert all_reduce_s(small, n, LINK) == tree_all_reduce_s(small, n, LINK)
    assert tree_all_reduce_s(small, n, LINK) == pytest.approx(
        2 * math.log2(n) * 5e-6 + 2 * small / 100e9)
    # Ring wins once its smaller bandwidth term outweighs its extra latency steps:
    # S > B * n * alpha * ((n - 1) - log2 n), 16 MB at n = 8 here.
    assert all_reduce_s(large, 8, LINK) == ring_all_reduce_s(large, 8, LINK)
    assert all_reduce_s(8 << 20, 8, LINK) == tree_all_reduce_s(8 << 20, 8, LINK)
    assert all_reduce_s(large, 1, LINK) == 0.0


def test_group_placement_inside_and_across_nodes():
    cluster = get_cluster("a100-80g", nodes=4)
    inside = group_link(cluster, 8, 1)
    assert not inside.spans_nodes and inside.bytes_per_s == cluster.intra_node_gbps * GB
    # DP group with TP = 8 innermost: one member per node, one NIC each.
    strided = group_link(cluster, 4, 8)
    assert strided.spans_nodes
    assert strided.bytes_per_s == pytest.approx(cluster.inter_node_gbps * GB)
    assert strided.alpha_s == cluster.inter_node_latency_s
    # All 32 ranks: 8 members per node drive 8 NICs (~190 GB/s across DGX-A100 nodes).
    wide = group_link(cluster, 32, 1)
    assert wide.bytes_per_s / GB == pytest.approx(190, rel=0.01)
    # TP = 2: 4 members per node.
    assert group_link(cluster, 16, 2).bytes_per_s == pytest.approx(
        4 * cluster.inter_node_gbps * GB)


def test_measured_fits_replace_the_spec_figures():
    cluster = get_cluster("a100-80g").with_calibration(
        collective_fits=(CollectiveFit("all_reduce", "intra_node", 1e-3, 1e9),))
    size = 1e8
    assert collective_s("all_reduce", size, 8, cluster) == pytest.approx(
        2 * 7 * 1e-3 + 2 * 7 / 8 * size / 1e9)
    # Other collectives keep the spec's link.
    plain = get_cluster("a100-80g")
    assert collective_s("all_gather", size, 8, cluster) == collective_s("all_gather", size, 8,
                                                                        plain)


@pytest.fixture()
def block_and_config():
    graph = gpt_layer_graph(layers=1, hidden=4096, heads=32, vocab=1024, seq=2048)
    config = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="bfloat16",
                        seq_len=2048)
    return graph.layers[1], config


def test_megatron_tp_two_all_reduces_each_way(block_and_config):
    block, config = block_and_config
    cluster = get_cluster("h100-80g")
    sbh2 = 2048 * 4096 * 2  # one b*s*h activation in bf16
    ar = collective_s("all_reduce", sbh2, 8, cluster)
    fwd, bwd = tp_comm_s(block, LayerStrategy(tp=8), cluster, config)
    assert fwd == pytest.approx(2 * ar) and bwd == pytest.approx(2 * ar)
    # Sequence parallel: all-gather + reduce-scatter in place of each all-reduce.
    fwd_sp, bwd_sp = tp_comm_s(block, LayerStrategy(tp=8, sequence_parallel=True), cluster,
                               config)
    ag = collective_s("all_gather", sbh2, 8, cluster)
    rs = collective_s("reduce_scatter", sbh2, 8, cluster)
    assert fwd_sp == pytest.approx(2 * (ag + rs)) and bwd_sp == pytest.approx(2 * (ag + rs))
    # Full recompute repeats the forward's all-reduces in backward.
    _, bwd_ckpt = tp_comm_s(block, LayerStrategy(tp=8, checkpoint=Checkpoint.FULL), cluster,
                            config)
    assert bwd_ckpt == pytest.approx(4 * ar)
    assert tp_comm_s(block, LayerStrategy(), cluster, config) == (0.0, 0.0)


def test_sequence_parallel_reduces_replicated_gradients_once_per_step(block_and_config):
    block, config = block_and_config
    cluster = get_cluster("h100-80g")
    per_param = bytes_per_param(Precision.FP32, "adamw")
    assert replicated_tensors(block) == 4  # ln1 and ln2 weight and bias
    grad_bytes = (block.params - block.tp_params) * per_param.grads
    fp32 = dataclasses.replace(config, precision=Precision.FP32)
    sp = LayerStrategy(tp=8, sequence_parallel=True)
    # Not wrapped: the executor's one bucketed all-reduce.
    assert sp_grad_sync_s(block, sp, cluster, fp32, per_param) == \
        pytest.approx(collective_s("all_reduce", grad_bytes, 8, cluster))
    # Inside a DP unit FSDP2 reduces tensor by tensor.
    in_unit = dataclasses.replace(sp, dp=2)
    assert sp_grad_sync_s(block, in_unit, cluster, fp32, per_param) == \
        pytest.approx(4 * collective_s("all_reduce", grad_bytes / 4, 8, cluster))
    # Without SP the replicated parameters see the whole sequence: nothing to reduce.
    assert sp_grad_sync_s(block, LayerStrategy(tp=8), cluster, fp32, per_param) == 0.0


def test_zero_traffic_volumes(block_and_config):
    block, _ = block_and_config
    cluster = get_cluster("h100-80g")
    per_param = bytes_per_param(Precision.BF16_MIXED, "adamw")
    psi = block.params * 2  # bytes of bf16 parameters (= bf16 gradients)
    ar = collective_s("all_reduce", psi, 8, cluster)
    ag = collective_s("all_gather", psi, 8, cluster)
    rs = collective_s("reduce_scatter", psi, 8, cluster)

    def comm(mode):
        return dp_comm_s(block, LayerStrategy(dp=8, dp_mode=mode), cluster, per_param)

    # Gradients are reduced once per iteration (micro-batches accumulate without sync).
    assert comm(DPMode.REPLICATE) == (0.0, 0.0, pytest.approx(ar), 0.0)  # 2 psi per step
    # ZeRO-1 as the executor runs it (executors.zero1): the all-reduce, then after the
    # optimizer step one all-gather of the bf16 parameters from the flat shards (3 psi).
    assert comm(DPMode.ZERO1) == (0.0, 0.0, pytest.approx(ar), pytest.approx(ag))
    assert comm(DPMode.ZERO2) == (0.0, 0.0, pytest.approx(rs + ag), 0.0)  # 2 psi per step
    # ZeRO-3: gathers in every forward and backward, one reduce-scatter per step.
    assert comm(DPMode.ZERO3) == (pytest.approx(ag), pytest.approx(ag), pytest.approx(rs), 0.0)


def test_tp_transition_costs():
    cluster = get_cluster("h100-80g")
    size = 1 << 24
    assert tp_transition_s(size, 4, 4, False, False, cluster) == 0.0
    assert tp_transition_s(size, 4, 2, False, False, cluster) == 0.0  # a local slice
    assert tp_transition_s(size, 2, 8, False, False, cluster) == pytest.approx(
        collective_s("all_gather", 4 * size, 4, cluster, stride=2))
    assert tp_transition_s(size, 4, 4, True, False, cluster) == pytest.approx(
        collective_s("all_gather", size, 4, cluster))


def test_blocking_calls_add_the_measured_wait(block_and_config):
    block, config = block_and_config
    h100 = get_cluster("h100-80g")
    ms = 1e-3
    waits = tuple(BlockingWait(collective, 2, k * ms) for k, collective in enumerate(
        ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"), start=1))
    slow = h100.with_calibration(blocking_waits=waits)
    # Each TP collective the layer waits on pays the wait once per call.
    fwd, bwd = tp_comm_s(block, LayerStrategy(tp=2), h100, config)
    fwd_w, bwd_w = tp_comm_s(block, LayerStrategy(tp=2), slow, config)
    assert fwd_w - fwd == pytest.approx(2 * ms) and bwd_w - bwd == pytest.approx(2 * ms)
    sp = LayerStrategy(tp=2, sequence_parallel=True)
    assert tp_comm_s(block, sp, slow, config)[0] - tp_comm_s(block, sp, h100, config)[0] == \
        pytest.approx(2 * (2 + 3) * ms)
    assert p2p_s(1e6, slow, 8) - p2p_s(1e6, h100, 8) == pytest.approx(5 * ms)
    # ZeRO-1's parameter all-gather blocks after the step; on GPUs the gradient all-reduce
    # is not a blocking call (it runs on FSDP2's reduce stream) and pays no wait.
    per_param = bytes_per_param(Precision.BF16_MIXED, "adamw")
    zero1 = LayerStrategy(dp=2, dp_mode=DPMode.ZERO1)
    *_, step, after = dp_comm_s(block, zero1, slow, per_param)
    *_, step0, after0 = dp_comm_s(block, zero1, h100, per_param)
    assert step == step0 and after - after0 == pytest.approx(2 * ms)
    # Unmeasured sizes, and GPUs' presets, wait nothing extra.
    assert tp_comm_s(block, LayerStrategy(tp=4), slow, config) == \
        tp_comm_s(block, LayerStrategy(tp=4), h100, config)


def test_cpu_gradient_syncs_block_and_pay_the_wait_of_their_size(block_and_config):
    """On CPU processes FSDP2's gradient all-reduce / reduce-scatter blocks the backward
    (no streams): each layer's sync pays the measured wait at its gradient's bytes; so do
    ZeRO-2/3's parameter all-gathers (FSDP2's unshard waits on them), 5 ms each here:
    ZeRO-2's one a step with the sync, ZeRO-3's before each forward and backward."""
    block, _ = block_and_config
    cpu = get_cluster("local")
    ms = 1e-3
    waits = (BlockingWait("all_reduce", 2, 0.2 * ms, 1e-9),
             BlockingWait("reduce_scatter", 2, 0.1 * ms, 2e-9),
             BlockingWait("all_gather", 2, 5 * ms, 0.0))
    slow = cpu.with_calibration(blocking_waits=waits)
    per_param = bytes_per_param(Precision.FP32, "adamw")
    grad_bytes = block.params * per_param.grads
    gather_s = 5 * ms
    for mode, wait, step_gather_s, pass_gather_s in (
            (DPMode.REPLICATE, waits[0], 0.0, 0.0), (DPMode.ZERO1, waits[0], 0.0, 0.0),
            (DPMode.ZERO2, waits[1], gather_s, 0.0), (DPMode.ZERO3, waits[1], 0.0, gather_s)):
        strategy = LayerStrategy(dp=2, dp_mode=mode)
        fwd, bwd, step, _ = dp_comm_s(block, strategy, slow, per_param)
        fwd0, bwd0, step0, _ = dp_comm_s(block, strategy, cpu, per_param)
        assert step - step0 == pytest.approx(wait.seconds + grad_bytes * wait.seconds_per_byte
                                             + step_gather_s)
        assert (fwd - fwd0, bwd - bwd0) == pytest.approx((pass_gather_s, pass_gather_s))


def test_vocab_parallel_head_reduces_its_loss_scalars():
    graph = gpt_layer_graph(layers=1, hidden=4096, heads=32, vocab=1024, seq=2048)
    head = graph.layers[-1]
    config = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="bfloat16",
                        seq_len=2048)
    cluster = get_cluster("h100-80g")
    fwd, bwd = tp_comm_s(head, LayerStrategy(tp=8), cluster, config)
    # loss_parallel's max, sum-of-exp and target-logit all-reduces: latency only.
    assert fwd == pytest.approx(3 * collective_s("all_reduce", 0, 8, cluster)) and fwd > 0
    assert bwd == pytest.approx(collective_s("all_reduce", head.input_bytes, 8, cluster))


def test_vocab_parallel_head_reduces_only_the_hidden_states_gradient():
    """gpt zoo (h 16, s 16, micro-batch 2, fp32): the head takes the hidden states
    (2*16*16*4 = 2048 bytes) and the integer labels (2*16*8 = 256 bytes, no gradient).
    Its backward all-reduces the gradient of the hidden states only: 2048 bytes."""
    import torch

    from planner.models import load_layer_graph

    graph = load_layer_graph("gpt:layers=1,hidden=16,heads=2,vocab=64,seq=16", micro_batch=2,
                             seq_len=16, dtype=torch.float32)
    head = graph.layer("head")
    assert (head.input_bytes, head.gradless_input_bytes) == (2048 + 256, 256)
    config = StepConfig(micro_batch=2, graph_micro_batch=2, graph_dtype="float32",
                        precision=Precision.FP32)
    cluster = get_cluster("h100-80g")
    _, bwd = tp_comm_s(head, LayerStrategy(tp=2), cluster, config)
    assert bwd == pytest.approx(collective_s("all_reduce", 2048, 2, cluster), rel=1e-9)


def test_a_column_parallel_module_fed_the_data_reduces_no_input_gradient():
    """MLP blocks (fc1 32 -> 128 colwise, fc2 128 -> 32 rowwise) on float data
    (4, 8, 32), fp32, TP 2. Forward: fc2's all-reduce of (4*8*32)*4 = 4096 bytes in each
    block. Backward: blocks.1's fc1 all-reduces its input's gradient (4096 bytes); blocks.0's
    fc1 reads the data, which requires no grad, so autograd never runs DTensor's from_local
    backward (2 gloo ranks, torch 2.x: no `_c10d_functional.all_reduce` in its backward, one
    when the input requires grad): 0 collectives."""
    import torch
    from torch import nn

    from ir.measure import build_layer_graph

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)

        def forward(self, x):
            return x + self.fc2(self.act(self.fc1(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block(), Block()])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x.sum()

    graph = build_layer_graph(Model(), {"x": torch.randn(4, 8, 32)}, dtype=torch.float32)
    first, second = graph.layer("blocks.0"), graph.layer("blocks.1")
    assert (first.gradless_tp_inputs, second.gradless_tp_inputs) == (("fc1",), ())
    cluster = get_cluster("h100-80g")
    config = StepConfig(micro_batch=4, graph_micro_batch=4, graph_dtype="float32",
                        precision=Precision.FP32)
    ar = collective_s("all_reduce", 4 * 8 * 32 * 4, 2, cluster)
    assert tp_comm_s(first, LayerStrategy(tp=2), cluster, config) == pytest.approx((ar, 0.0))
    assert tp_comm_s(second, LayerStrategy(tp=2), cluster, config) == pytest.approx((ar, ar))
