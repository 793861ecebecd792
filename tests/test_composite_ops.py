"""Inner ops of composite ops (ir.composite_ops): what the CPU profiler sees inside an
embedding bag's backward or a mean's forward, counted cold after a layer that ran none of
them, not after one that ran the same composite, and priced beside the layer's own cold
ops."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from cost_models.host_dispatch import backward_host_seconds
from ir.composite_ops import cold_inner_ops_bwd, cold_inner_ops_fwd, inner_ops
from tests.test_host_split import PARTS, US, cpu, tiny_layer

BAG = "aten._embedding_bag_backward.default"


def _measured(backward, forward=()):
    return SimpleNamespace(backward_overloads=frozenset(backward),
                           forward_overloads=frozenset(forward))


def test_an_embedding_bags_backward_runs_its_sort_and_scan_inside():
    # ATen's _embedding_bag_dense_backward (CPU, mode sum) sorts the indices, counts them
    # with a cumsum and adds the rows with index_add_: none seen by a dispatch mode
    inner = inner_ops(BAG)
    assert {"aten::sort", "aten::cumsum", "aten::index_add_"} <= inner
    assert "aten::_embedding_bag_backward" not in inner  # the op itself, seen outside
    assert inner_ops("aten.mm.default") == frozenset()


def test_cold_inner_ops_are_those_the_layer_after_did_not_run():
    layer = _measured([BAG, "aten.detach.default"], forward=["aten._embedding_bag.default"])
    inner = len(inner_ops(BAG))
    assert cold_inner_ops_bwd(layer, frozenset({"aten.mm.default"})) == inner
    # after a layer that ran sort and cumsum at top level: two fewer
    after = frozenset({"aten.mm.default", "aten.sort.default", "aten.cumsum.default"})
    assert cold_inner_ops_bwd(layer, after) == inner - 2
    # after another table's backward: the same composite, nothing cold
    assert cold_inner_ops_bwd(layer, frozenset({BAG})) == 0
    # the last layer: after its own forward, which runs none of them
    assert cold_inner_ops_bwd(layer, None) == inner
    assert cold_inner_ops_bwd(_measured(["aten.mm.default"]), frozenset()) == 0


def test_the_traced_dlrm_counts_the_last_tables_inner_ops_only():
    from bench.bench_kernel_model import traced_graph

    graph = traced_graph("dlrm-small", 1)[0]
    by_name = {l.name: l for l in graph.layers}
    # tables.0-2 run their backward after another table's: no inner op cold; tables.3
    # after top_mlp's, which runs no sort, cumsum or index_add_
    assert [by_name[f"tables.{i}"].cold_inner_ops_bwd for i in range(3)] == [0, 0, 0]
    assert by_name["tables.3"].cold_inner_ops_bwd >= 3
    assert by_name["tables.3"].host_position[1] == (by_name["tables.3"].cold_distinct_ops_bwd
                                                    + by_name["tables.3"].cold_inner_ops_bwd)


def test_backward_host_prices_inner_ops_at_their_own_figure():
    """`tiny_layer`'s backward, 39 us (tests/test_host_split.py), 2 cold ops at 1 us and 3
    cold inner ops at 0.5 us: 42.5 us; a kit with no inner figure (or one the fit read as
    0) prices the inner ops at 0, not at the cold-op figure: 41 us; neither, 39 us."""
    layer = dataclasses.replace(tiny_layer(), cold_distinct_ops_bwd=2, cold_inner_ops_bwd=3)
    cold = dataclasses.replace(PARTS, cold_backward_op_host_s=1 * US,
                               cold_backward_inner_op_host_s=0.5 * US)
    assert backward_host_seconds(layer, cpu(cold)) == pytest.approx(42.5 * US)
    no_inner = dataclasses.replace(cold, cold_backward_inner_op_host_s=0.0)
    assert backward_host_seconds(layer, cpu(no_inner)) == pytest.approx(41 * US)
    assert backward_host_seconds(layer, cpu(PARTS)) == pytest.approx(39 * US)


MEAN = "aten.mean.dim"


def test_a_means_forward_runs_its_sum_and_div_inside_counted_cold_after_other_code():
    # ATen's CPU mean.dim is a sum, then a div_ by the count (and a `to`): one op to a
    # dispatch mode; none of its own instance's drawing is counted inside it
    inner = inner_ops(MEAN)
    assert {"aten::sum", "aten::div_"} <= inner
    assert "aten::mean" not in inner and "aten::normal_" not in inner
    layer = _measured(["aten.addmm.default"], forward=[MEAN, "aten.addmm.default"])
    assert cold_inner_ops_fwd(layer, frozenset({"aten.convolution.default"})) == len(inner)
    # after a layer that ran a mean (its norm's): nothing cold; after one that summed: one fewer
    assert cold_inner_ops_fwd(layer, frozenset({MEAN})) == 0
    assert cold_inner_ops_fwd(layer, frozenset({"aten.sum.dim_IntList"})) == len(inner) - 1
    assert cold_inner_ops_fwd(_measured([], forward=["aten.mm.default"]), frozenset()) == 0


def test_the_traced_cnns_head_counts_its_pools_inner_ops_among_its_cold_forward_ops():
    from bench.bench_kernel_model import traced_graph

    head = traced_graph("cnn-small", 1)[0].layers[-1]
    # its distinct forward ops the blocks did not run (5: mean, addmm, t, _log_softmax,
    # nll_loss_forward, as bench_kernel_model read them) + the mean's inner ops
    assert head.cold_distinct_ops_fwd == 5 + len(inner_ops(MEAN))
