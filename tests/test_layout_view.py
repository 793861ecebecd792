"""Figures memoised by a strategy's layout view are the full strategy's.

`layer_memo.layout_view` keys `activations.layer_activations`, `comm.tp_comm_s` and the
TP host figures `compute.layer_compute` reads (`tp_host`) on a strategy's TP degree, SP
flag and checkpoint mode alone, so strategies that differ only
in DP degree, DP mode or offload share one entry inside a `memo_scope`. Each figure is
checked, for every strategy in turn (the memo filled by the ones before), against the
uncached body run with the whole strategy: a view that dropped a field those bodies read
would hand one strategy another's figure.
"""

from __future__ import annotations

import pytest
import torch

from cost_models import activations, comm, tp_host
from cost_models.clusters import get_cluster
from cost_models.common import StepConfig
from cost_models.layer_memo import layout_view, memo_scope
from ir.strategy import Checkpoint, DPMode, LayerStrategy
from tests.layer_graphs import layer_graph

TP_HOST = [tp_host.tp_module_seconds, tp_host.vocab_edge_seconds, tp_host.dtensor_op_seconds,
           tp_host.selective_tp_seconds, tp_host.selective_tp_forward_seconds]


@pytest.fixture(scope="module")
def gpt():
    return layer_graph("gpt3-350m", 1, None, torch.bfloat16)


def _strategies() -> list[LayerStrategy]:
    out = []
    for tp in (1, 2, 4):
        for sp in ((False, True) if tp > 1 else (False,)):
            for checkpoint in Checkpoint:
                for dp in (1, 2):
                    for mode in DPMode:
                        for offload in ((False, True) if mode is DPMode.ZERO3 else (False,)):
                            out.append(LayerStrategy(tp, dp, mode, sp, checkpoint, offload))
    return out


def test_view_keyed_figures_are_the_whole_strategys(gpt):
    # the local CPU spec has the TP host figures (a GPU spec prices most of them 0)
    cluster = get_cluster("local")
    configs = [StepConfig(micro_batch=b, graph_micro_batch=1, graph_dtype=gpt.dtype,
                          device_type="cuda") for b in (1, 4)]
    strategies = _strategies()
    with memo_scope():
        for _ in range(2):  # the second round from the memo
            for layer in (*gpt.layers[:3], *gpt.layers[-2:]):  # embedding, blocks, head
                for config in configs:
                    for s in strategies:
                        assert activations.layer_activations(layer, s, config) == \
                            activations._layer_activations.uncached(layer, s, config), (layer.name, s)
                        assert comm.tp_comm_s(layer, s, cluster, config) == \
                            comm._tp_comm_s.uncached(layer, s, cluster, config), (layer.name, s)
                        for fn in TP_HOST:  # as layer_compute calls them
                            assert fn(layer, layout_view(s), cluster) == \
                                fn.uncached(layer, s, cluster), (fn.__name__, layer.name, s)


def test_one_view_per_layout_and_checkpoint():
    strategies = _strategies()
    views = {layout_view(s) for s in strategies}
    assert len(views) == len({(s.tp, s.sequence_parallel, s.checkpoint) for s in strategies})
    for s in strategies:
        assert layout_view(s) is layout_view(LayerStrategy(
            s.tp, 1, DPMode.REPLICATE, s.sequence_parallel, s.checkpoint))
