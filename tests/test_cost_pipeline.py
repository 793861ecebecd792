"""Pipeline schedules and the whole estimate: bubble, imbalance, breakdown, MFU."""

from __future__ import annotations

import dataclasses

import pytest

from cost_models.clusters import get_cluster
from cost_models.compute import gemm_efficiency, layer_compute, tp_compute_fraction
from cost_models.compute_profile import ComputeProfile
from cost_models.common import StepConfig
from cost_models.dp_copies import dp_copy_pass_seconds
from cost_models.estimate import estimate
from cost_models.pipeline import pipeline_time
from cost_models.synthetic import gpt_layer_graph
from ir.errors import PlannerError
from ir.plan import uniform_plan
from ir.strategy import Checkpoint, LayerStrategy, Precision, Schedule


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 8), (8, 64)])
def test_bubble_is_p_minus_1_over_m(schedule, p, m):
    t = pipeline_time([1.0] * p, [2.0] * p, m, schedule)
    assert t.bubble_fraction == pytest.approx((p - 1) / m)
    assert t.iteration_s == pytest.approx((m + p - 1) * 3.0)


def test_interleaved_bubble_shrinks_by_v():
    p, m, v = 4, 8, 2
    t = pipeline_time([1.0] * p, [2.0] * p, m, Schedule.INTERLEAVED, virtual_stages=v)
    assert t.bubble_fraction == pytest.approx((p - 1) / (v * m))


def test_stage_imbalance_sets_the_steady_state():
    t = pipeline_time([1.0, 2.0, 1.0], [2.0, 4.0, 2.0], 10, Schedule.ONE_F_ONE_B)
    assert t.critical_rank == 1
    assert t.steady_s == pytest.approx(10 * 6.0)
    # By hand: rank 1 starts at 1, does its two warm-up forwards (to 5), waits until 6 for
    # the first backward (rank 2: forward 3-4, backward 4-6), then works 60 s without a
    # gap; rank 0's last backward adds 2. Not the flow-shop 3 + 6 + 3 + 9 * 6 = 66: rank
    # 2's round trip (3 s) hides behind rank 1's second warm-up forward except for 1 s.
    assert t.iteration_s == pytest.approx(1 + 4 + 1 + 10 * 6.0 - 4 + 2)
    with pytest.raises(PlannerError):
        pipeline_time([1.0], [1.0, 2.0], 4, Schedule.GPIPE)


@pytest.fixture(scope="module")
def gpt3():
    return gpt_layer_graph(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048)


def test_estimate_breakdown_sums_and_mfu_is_plausible(gpt3):
    cluster = get_cluster("a100-80g", nodes=128)
    plan = uniform_plan(len(gpt3.layers), tp=8, pp=8, dp=16, zero=1, global_batch=1536,
                        checkpoint=Checkpoint.SELECTIVE, sequence_parallel=True)
    est = estimate(gpt3, plan, cluster)
    assert est.time.total == pytest.approx(est.iteration_seconds)
    assert est.samples_per_second == pytest.approx(1536 / est.iteration_seconds)
    # Korthikanti et al. 2022 report 52-56% MFU for this setting; the model should be close.
    assert 0.4 < est.mfu < 0.65
    assert est.tflops_per_device == pytest.approx(est.mfu * 312, rel=1e-9)
    assert est.memory.fits
    d = est.to_json()
    assert set(d["time"]) == {"compute", "tp_comm", "dp_comm", "pp_comm", "bubble", "optimizer"}
    assert set(d["memory"]["stages"][0]["breakdown"]) == {
        "params", "grads", "optimizer", "activations", "buffers", "overhead"}


def test_recompute_and_schedules_cost_what_they_should(gpt3):
    cluster = get_cluster("a100-80g", nodes=128)
    kw = dict(tp=8, pp=8, dp=16, global_batch=1536)
    none = estimate(gpt3, uniform_plan(98, **kw), cluster)
    full = estimate(gpt3, uniform_plan(98, checkpoint=Checkpoint.FULL, **kw), cluster)
    # Full recompute adds one forward: compute grows by about a third (Narayanan: 96 vs 72).
    assert full.time.compute / none.time.compute == pytest.approx(96 / 72, rel=0.05)
    inter = estimate(gpt3, uniform_plan(98, schedule=Schedule.INTERLEAVED, virtual_stages=2,
                                        stage_boundaries=None, **kw), cluster)
    assert inter.time.bubble < none.time.bubble
    with pytest.raises(PlannerError, match="multiple of pp"):
        estimate(gpt3, uniform_plan(98, tp=8, pp=8, dp=16, global_batch=16 * 12,
                                    schedule=Schedule.INTERLEAVED, virtual_stages=2), cluster)


def test_compute_model():
    assert gemm_efficiency(8192, "H100-SXM5-80GB", 0.82) == pytest.approx(0.795, abs=0.01)
    assert gemm_efficiency(128, "H100-SXM5-80GB", 0.82) < 0.5 * 0.82
    graph = gpt_layer_graph(layers=1, hidden=4096, heads=32, vocab=1024, seq=2048)
    block = graph.layers[1]
    cluster = get_cluster("h100-80g")
    config = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="bfloat16",
                        seq_len=2048)
    base = layer_compute(block, LayerStrategy(), cluster, config)
    # less its bf16 unit's copies (cost_models.dp_copies: forward only, at any micro-batch)
    copy_s = dp_copy_pass_seconds(block, LayerStrategy(), cluster, config)[0]
    assert copy_s > 0
    assert base.backward_s == pytest.approx(2 * (base.forward_s - copy_s), rel=0.05)
    # The matmuls run near the measured ~80% of peak at this size.
    assert block.flops_fwd / (base.forward_s - copy_s) / 989e12 == pytest.approx(0.75, abs=0.06)
    tp4 = layer_compute(block, LayerStrategy(tp=4), cluster, config)
    assert tp4.forward_s < base.forward_s / 3
    assert tp_compute_fraction(block, LayerStrategy(tp=4)) == pytest.approx(0.25, abs=0.001)
    full = layer_compute(block, LayerStrategy(checkpoint=Checkpoint.FULL), cluster, config)
    assert full.recompute_s == pytest.approx(base.forward_s - copy_s)
    sel = layer_compute(block, LayerStrategy(checkpoint=Checkpoint.SELECTIVE), cluster, config)
    assert 0 < sel.recompute_s < 0.2 * base.forward_s  # attention core only
    doubled = layer_compute(block, LayerStrategy(), cluster,
                            dataclasses.replace(config, micro_batch=2))
    assert doubled.forward_s - copy_s == pytest.approx(2 * (base.forward_s - copy_s), rel=0.05)


def test_measured_profile_overrides_the_analytic_model():
    graph = gpt_layer_graph(layers=2, hidden=256, heads=4, vocab=512, seq=128)
    block = graph.layers[1]
    profile = ComputeProfile.from_dict({
        "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16",
        "layers": [{"name": "x", "structural_hash": block.structural_hash,
                    "forward_seconds": 0.01, "backward_seconds": 0.02, "micro_batch": 1}]})
    cluster = get_cluster("h100-80g")
    config = StepConfig(micro_batch=4, graph_micro_batch=1, graph_dtype="bfloat16",
                        seq_len=128)
    t = layer_compute(block, LayerStrategy(tp=2), cluster, config, profile)
    share = tp_compute_fraction(block, LayerStrategy(tp=2))
    copy_s = dp_copy_pass_seconds(block, LayerStrategy(tp=2), cluster, config)[0]
    assert t.forward_s == pytest.approx(0.01 * 4 * share + copy_s)
    assert t.backward_s == pytest.approx(0.02 * 4 * share)
    profile.check_matches(cluster, "bfloat16")
    with pytest.raises(PlannerError, match="measured on"):
        profile.check_matches(get_cluster("a100-80g"), "bfloat16")
    with pytest.raises(PlannerError, match="ran in bfloat16"):
        profile.check_matches(cluster, "float32")
    plan = uniform_plan(4, precision=Precision.BF16_MIXED)
    assert estimate(graph, plan, cluster, profile).iteration_seconds > 0.03 * 2
