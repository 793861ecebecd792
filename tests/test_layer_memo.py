"""The search's per-layer memos give what the uncached code gives.

`cost_models.layer_memo.per_layer` keeps a figure per (layer, cluster) object inside a
search's `memo_scope`; `gemm_efficiency` keeps a calibration's GEMM rates and
`kernel_loops.measured` its kernel kinds. Each is checked against the function it
wraps, asked twice (the second answer from the memo), over arguments it must tell
apart: the blocks that pay cold ops and those that do not, two clusters, two
calibrations. tests/test_search_pinned.py pins whole searches.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cost_models import activations, checkpoint_probes, comm, host_dispatch, step_temporaries
from cost_models.common import StepConfig
from cost_models.clusters import get_cluster
from cost_models.layer_memo import memo_scope
from ir.kernel_calibration import KernelCalibration
from ir.layer import TPStyle
from ir.strategy import Checkpoint
from tests.layer_graphs import layer_graph

MEMOISED = [host_dispatch.forward_host_seconds, host_dispatch.backward_host_seconds,
            step_temporaries._tensor_splits, comm.replicated_tensors,
            comm.sp_input_grad_reductions, checkpoint_probes.rerun_ops]


@pytest.fixture(scope="module")
def gpt():
    return layer_graph("gpt3-350m", 1, None, torch.bfloat16)


def _cold_cpu():
    """The local CPU spec with a kit that prices cold ops: the first block's forward
    costs more than a middle one's (tests/test_search_caches.py)."""
    local = get_cluster("local")
    return dataclasses.replace(local, kernel_calibration=dataclasses.replace(
        local.kernel_calibration or KernelCalibration(measured_on="t"), forward_host_op_s=1e-6,
        cold_op_host_s=2e-6, cold_backward_op_host_s=1e-6))


def test_per_layer_figures_in_a_scope_are_the_uncached_ones(gpt):
    clusters = [_cold_cpu(), get_cluster("a100-80g", nodes=2)]
    configs = [StepConfig(micro_batch=b, graph_micro_batch=1, graph_dtype=gpt.dtype,
                          device_type=device) for b in (1, 4) for device in ("cpu", "cuda")]
    with memo_scope():
        for _ in range(2):  # the second round from the memo
            for cluster in clusters:
                for layer in gpt.layers:
                    for fn in MEMOISED:
                        args = (layer, cluster) if fn.__name__.endswith("host_seconds") \
                            else (layer,)
                        assert fn(*args) == fn.uncached(*args)
                    for style in TPStyle:
                        assert comm.input_grad_reductions(layer, style) == \
                            comm.input_grad_reductions.uncached(layer, style)
                    for mode in Checkpoint:
                        args = (layer, mode, cluster.kernel_calibration)
                        assert checkpoint_probes.checkpoint_extra_seconds(*args) == \
                            checkpoint_probes.checkpoint_extra_seconds.uncached(*args)
                    for config in configs:
                        for fn in (activations.scaled_saved_bytes, activations.logits_bytes):
                            assert fn(layer, config) == fn.uncached(layer, config)
    first, middle = gpt.layers[1], gpt.layers[2]  # the first block pays cold ops
    cold, a100 = clusters
    with memo_scope():
        assert host_dispatch.forward_host_seconds(first, cold) != \
            host_dispatch.forward_host_seconds(middle, cold)  # layers told apart
        assert host_dispatch.forward_host_seconds(first, cold) != \
            host_dispatch.forward_host_seconds(first, a100)  # clusters told apart
        assert activations.scaled_saved_bytes(first, configs[0]) != \
            activations.scaled_saved_bytes(first, configs[2])  # configs told apart


def test_a_scope_is_the_searchs_alone(gpt):
    """Outside a scope nothing is kept; a nested scope shares the outer one's entries,
    which go with the outer scope."""
    from cost_models import layer_memo

    cluster = _cold_cpu()
    layer = gpt.layers[1]
    host_dispatch.forward_host_seconds(layer, cluster)
    assert layer_memo._scope is None
    with memo_scope():
        host_dispatch.forward_host_seconds(layer, cluster)
        outer = layer_memo._scope
        with memo_scope():
            assert layer_memo._scope is outer
        assert layer_memo._scope is outer
    assert layer_memo._scope is None


def test_gemm_rates_are_kept_per_calibration_and_shape():
    from cost_models.gemm_efficiency import _table_rate
    from ir.kernel_points import GemmPoint

    points = (GemmPoint(1024, 1024, 1024, "bfloat16", 2e14),
              GemmPoint(4096, 4096, 4096, "bfloat16", 6e14),
              GemmPoint(1024, 1024, 1024, "float32", 5e13))
    a = KernelCalibration(measured_on="a", gemm=points)
    b = dataclasses.replace(a, gemm=(GemmPoint(1024, 1024, 1024, "bfloat16", 3e14),)
                            + points[1:])
    for cal in (a, b, a):  # a again: from the kept rates
        for m, n, k in ((1024, 1024, 1024), (2048, 2048, 2048), (8192, 512, 4096)):
            for dtype in ("bfloat16", "float32", "float16"):
                assert _table_rate(cal, m, n, k, dtype) == cal.gemm_flop_per_s(m, n, k, dtype)
    assert _table_rate(a, 1024, 1024, 1024, "bfloat16") != \
        _table_rate(b, 1024, 1024, 1024, "bfloat16")  # the check can tell them apart


def test_measured_kernel_kinds_are_kept_per_calibration():
    from cost_models.kernel_loops import measured
    from ir.kernel_calibration import MemoryKernelPoint

    a = KernelCalibration(measured_on="a", memory_kernels=(
        MemoryKernelPoint("copy", "float32", 2**20, 20.0),
        MemoryKernelPoint("short_run", "float32", 2**10, 2.0)))
    b = dataclasses.replace(a, memory_kernels=a.memory_kernels[:1])
    for cal in (a, b, a, None):
        for kernel in ("copy", "short_run", "add"):
            assert measured(cal, kernel) == (cal is not None and any(
                p.kernel == kernel for p in cal.memory_kernels))
    assert measured(a, "short_run") != measured(b, "short_run")


def test_a_memoised_function_takes_keywords_in_and_out_of_a_scope():
    """Outside a scope it is the plain function (review: keywords raised TypeError); inside
    one a keyword call runs the function rather than keying on positions."""
    from cost_models.layer_memo import memo_scope, per_layer

    calls = []

    @per_layer
    def scaled(value, factor=2):
        calls.append((value, factor))
        return value * factor

    assert scaled(value=3, factor=5) == 15
    with memo_scope():
        assert scaled(3) == scaled(3) == 6 and scaled(value=3, factor=4) == 12
    assert calls == [(3, 5), (3, 2), (3, 4)]
