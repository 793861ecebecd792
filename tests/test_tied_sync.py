"""The tied copies' gradient sum after backward (cost_models.tied_sync): the bytes it
moves counted by hand and by a dispatch mode on the executor's own sync, priced once per
tie group and stage, in the step's estimate, and nowhere a kit did not measure it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cost_models.clusters import get_cluster
from cost_models.common import layer_configs
from cost_models.estimate import estimate
from cost_models.tied_memory import tied_copies, tied_local_fraction
from cost_models.tied_sync import (TIED_SUM_FIELDS, probe_tied_sum, sum_traffic_bytes,
                                   tied_sum_seconds)
from executors.tied import TiedGradients
from ir.kernel_calibration import KernelCalibration
from ir.plan import uniform_plan
from ir.strategy import Precision
from planner.models import load_layer_graph
from tests.cpu_specs import one_cpu_process

SPEC = "gpt:layers=2,hidden=64,heads=4,vocab=512,seq=32"  # embedding tied to the head
TIED_PARAMS = 512 * 64  # vocab x hidden
GRAD_BYTES = TIED_PARAMS * 4  # fp32 gradients: 131072
CALL_S, PER_BYTE_S = 2e-6, 1e-10


def _graph():
    return load_layer_graph(SPEC, micro_batch=1, seq_len=32, dtype=torch.float32)


def _cluster(call_s: float = CALL_S, per_byte_s: float = PER_BYTE_S, **small):
    return one_cpu_process(KernelCalibration(measured_on="test", tied_sum_host_s=call_s,
                                             tied_sum_s_per_byte=per_byte_s, **small))


class _Bytes(TorchDispatchMode):
    """Bytes of the tensors each op reads (inputs it does not write) and writes (its
    outputs), 0-dim ones left out."""

    def __init__(self):
        super().__init__()
        self.moved = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        written = [a.alias_info is not None and a.alias_info.is_write
                   for a in func._schema.arguments]
        read = [a for a, w in zip(args, written) if not w]
        for t in read + [out]:
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                self.moved += t.numel() * t.element_size()
        return out


def test_sum_traffic_by_hand_and_as_the_executor_runs_it():
    # 0 + g1: 2N; + g2: 3N; two copy_: 2N each -> 9N; three copies: 2 + 3 + 3 + 3 x 2 = 14N
    assert sum_traffic_bytes(2, 1000) == 9000
    assert sum_traffic_bytes(3, 1000) == 14000
    assert sum_traffic_bytes(1, 1000) == 4000  # a stage holding one copy: 0 + g, copy_
    for copies in (1, 2, 3):  # executors.tied.TiedGradients.sync's own loop, counted
        params = [torch.nn.Parameter(torch.zeros(250)) for _ in range(copies)]
        for p in params:
            p.grad = torch.ones(250)
        sync = TiedGradients.__new__(TiedGradients)
        sync._groups = [([(torch.nn.ParameterDict({"w": p}), ("w",)) for p in params],
                         None, copies)]
        with _Bytes() as mode:
            sync.sync()
        assert mode.moved == sum_traffic_bytes(copies, 1000)
        assert all(torch.equal(p.grad, torch.full((250,), float(copies))) for p in params)


def test_priced_once_per_group_and_stage_at_its_last_holder():
    graph = _graph()
    head = len(graph.layers) - 1
    assert graph.layers[head].tied_params == TIED_PARAMS
    plan = uniform_plan(len(graph.layers))
    config = layer_configs(graph, plan, "cpu")[head]
    cluster = _cluster()
    # 2 us + 1e-10 s/B x 9 x 131072 B = 2e-6 + 1.179648e-4 = 1.199648e-4
    assert tied_sum_seconds(graph, plan, cluster, head, config) == pytest.approx(1.199648e-4)
    assert all(tied_sum_seconds(graph, plan, cluster, j, config) == 0.0
               for j in range(head))
    # ZeRO-3 over 4: sync sums the local quarter shards: 2e-6 + 1e-10 x 9 x 32768
    zero3 = uniform_plan(len(graph.layers), dp=4, zero=3)
    assert tied_sum_seconds(graph, zero3, cluster, head, config) == pytest.approx(
        2e-6 + 2.949120e-5)
    # head alone in its stage: 0 + g and copy_ of the full gradient, 2e-6 + 1e-10 x 4 x 131072
    split = uniform_plan(len(graph.layers), pp=2)
    assert split.stage_of(0) != split.stage_of(head)
    assert tied_sum_seconds(graph, split, cluster, head, config) == pytest.approx(
        2e-6 + 5.24288e-5)


def test_gradients_up_to_the_fresh_pages_threshold_read_the_warm_line():
    small = {"tied_sum_small_host_s": 1e-6, "tied_sum_small_s_per_byte": 2e-11}
    graph = _graph()  # 131072 gradient bytes: the warm line, 1e-6 + 2e-11 x 9 x 131072
    head = len(graph.layers) - 1
    plan = uniform_plan(len(graph.layers))
    config = layer_configs(graph, plan, "cpu")[head]
    assert tied_sum_seconds(graph, plan, _cluster(**small), head, config) == pytest.approx(
        1e-6 + 2.359296e-5)
    # 32768 x 512 x 4 = 67108864 bytes, above 32 MiB: the cold line, 2e-6 + 1e-10 x 9 x that
    big = load_layer_graph("gpt:layers=1,hidden=512,heads=4,vocab=32768,seq=32",
                           micro_batch=1, seq_len=32, dtype=torch.float32)
    head = len(big.layers) - 1
    plan = uniform_plan(len(big.layers))
    config = layer_configs(big, plan, "cpu")[head]
    assert tied_sum_seconds(big, plan, _cluster(**small), head, config) == pytest.approx(
        2e-6 + 0.0603979776)


def test_the_step_estimate_carries_it_once():
    graph = _graph()
    plan = uniform_plan(len(graph.layers), micro_batch=1, global_batch=4,
                        precision=Precision.FP32)
    with_sum = estimate(graph, plan, _cluster())
    without = estimate(graph, plan, _cluster(0.0, 0.0))
    # once a step (4 micro-batches), in the optimizer's share: 1.199648e-4
    assert with_sum.time.optimizer - without.time.optimizer == pytest.approx(1.199648e-4)
    assert with_sum.iteration_seconds - without.iteration_seconds == pytest.approx(1.199648e-4)


def test_unmeasured_kits_and_gpu_presets_price_no_sum():
    graph = _graph()
    head = len(graph.layers) - 1
    plan = uniform_plan(len(graph.layers))
    config = layer_configs(graph, plan, "cpu")[head]
    old = KernelCalibration.from_dict({"measured_on": "a kit of 2026-11-24"})
    assert (old.tied_sum_host_s, old.tied_sum_s_per_byte) == (0.0, 0.0)
    for cluster in (one_cpu_process(old), one_cpu_process(None), get_cluster("h100-80g")):
        assert tied_sum_seconds(graph, plan, cluster, head, config) == 0.0


def test_probe_reads_a_cost_per_byte():
    figures = probe_tied_sum()
    call_s, per_byte_s, small_call_s, small_per_byte_s = figures
    assert call_s >= 0.0 and small_call_s >= 0.0
    # 2 x 96 MiB summed and written back moves 864 MiB: faster than 0.1 GB/s on any CPU
    # this runs on; so does the warm line's 216 MiB. Each is a slope between two sizes,
    # floored at 0, that a slow spell on a loaded host can flatten (CI): no strict floor
    assert 0.0 <= per_byte_s < 1e-8 and 0.0 <= small_per_byte_s < 1e-8
    kit = dataclasses.replace(KernelCalibration(measured_on="test"),
                              **dict(zip(TIED_SUM_FIELDS, figures)))
    assert kit.tied_sum_small_s_per_byte == small_per_byte_s


def test_the_owner_counts_among_a_ties_holders():
    # the head names its copy "head.weight", the embedding owns "embed.tok.weight": the
    # holders come from Layer.tied_owner_layers, so an owner in another stage sends sync
    # down the full path (executors.tied: cross-stage groups sum full gradients)
    graph = _graph()
    head = len(graph.layers) - 1
    assert graph.layers[head].tied_owner_layers == (0,)
    assert tied_copies(graph, "head.weight") == (0, head)
    assert tied_local_fraction(graph, uniform_plan(len(graph.layers), dp=4, zero=3),
                               head) == 0.25
    assert tied_local_fraction(graph, uniform_plan(len(graph.layers), dp=4, zero=3, pp=2),
                               head) == 1.0
