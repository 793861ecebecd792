"""Cold backward ops: a layer's backward ops that the layers whose backward runs just
before it did not run (`ir.op_count.recent_backward_ops`, the forward's window rule), what
the backward host model adds for them and for composites' inner ops
(`cost_models.host_dispatch.backward_host_seconds`, `KernelCalibration
.cold_backward_op_host_s`, `cold_backward_inner_op_host_s`), and the probe that measures
both (`cost_models.cold_backward_probes`)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch import nn

from cost_models.cold_backward_probes import (COLD_BACKWARD_CALLS, COLD_BACKWARD_COMPOSITES,
                                              cold_backward_cost,
                                              cold_backward_layers)
from cost_models.host_dispatch import backward_host_seconds, host_position_key
from cost_models.sequence_probes import ColdChain
from cost_models.layer_profile import StepNeighbours
from ir.composite_ops import inner_ops
from ir.kernel_calibration import KernelCalibration
from ir.measure import build_layer_graph, layer_graph_from_trace
from ir.op_count import COLD_WINDOW_DISTINCT_OPS, recent_backward_ops
from ir.stand_in import real_factory
from ir.trace import trace
from planner.models import load_model
from tests.test_cold_ops import Gate, Mix, Scale
from tests.test_host_split import PARTS, US, cpu, tiny_layer

PROBED = dataclasses.replace(PARTS, cold_backward_op_host_s=1.2 * US,
                             cold_backward_inner_op_host_s=0.5 * US)


def test_backward_host_prices_cold_ops_and_inner_ops_apart():
    """`tiny_layer`'s backward, 39 us (tests/test_host_split.py), 2 cold ops at 1.2 us and
    3 cold inner ops at 0.5 us: 39 + 2.4 + 1.5 = 42.9 us; none cold, 39 us."""
    layer = dataclasses.replace(tiny_layer(), cold_distinct_ops_bwd=2, cold_inner_ops_bwd=3)
    assert backward_host_seconds(layer, cpu(PROBED)) == pytest.approx(42.9 * US)
    assert backward_host_seconds(tiny_layer(), cpu(PROBED)) == pytest.approx(39 * US)


def test_a_step_that_stays_in_the_caches_prices_no_backward_op_cold():
    """mlp-small's step (12 distinct ops) stays warm: 39 us with the probe's figures, and
    with a fit that read the inner figure as 0 (a 0 price, not a switch to pricing the
    step cold); the same layer cold: 39 + 2 x 1.2 = 41.4 us with that fit."""
    layer = dataclasses.replace(tiny_layer(), cold_distinct_ops_bwd=2, cold_inner_ops_bwd=3,
                                step_warm=True)
    assert backward_host_seconds(layer, cpu(PROBED)) == pytest.approx(39 * US)
    flat_inner = dataclasses.replace(PROBED, cold_backward_inner_op_host_s=0.0)
    assert backward_host_seconds(layer, cpu(flat_inner)) == pytest.approx(39 * US)
    cold = dataclasses.replace(layer, step_warm=False)
    assert backward_host_seconds(cold, cpu(flat_inner)) == pytest.approx(41.4 * US)


def test_the_search_keys_the_two_backward_counts_apart_where_priced_apart():
    one = dataclasses.replace(tiny_layer(), cold_distinct_ops_bwd=2, cold_inner_ops_bwd=3)
    other = dataclasses.replace(tiny_layer(), cold_distinct_ops_bwd=3, cold_inner_ops_bwd=2)
    assert host_position_key(one, cpu(PROBED)) != host_position_key(other, cpu(PROBED))
    # inner ops unpriced (no figure, or the fit read 0): only the cold-op count keys
    no_inner = dataclasses.replace(PARTS, cold_backward_op_host_s=1 * US)
    same_ops = dataclasses.replace(one, cold_inner_ops_bwd=7)
    assert host_position_key(one, cpu(no_inner)) == host_position_key(same_ops, cpu(no_inner))
    assert host_position_key(one, cpu(no_inner)) != host_position_key(other, cpu(no_inner))
    assert host_position_key(one, cpu(PARTS)) == ()  # nothing cold priced


def test_the_fit_reads_both_figures_from_hand_made_chains():
    """extra = 1.2 us x cold ops + 0.5 us x inner ops, exactly: (1, 0) 1.2, (4, 0) 4.8,
    (1, 10) 6.2, (0, 4) 2.0 us."""
    chains = [ColdChain(a, 20 * US + extra, 20 * US, b)
              for a, b, extra in ((1, 0, 1.2 * US), (4, 0, 4.8 * US), (1, 10, 6.2 * US),
                                  (0, 4, 2.0 * US))]
    cost = cold_backward_cost(chains)
    assert (cost.op_s, cost.inner_op_s) == (pytest.approx(1.2 * US), pytest.approx(0.5 * US))
    assert cost.residual_s == pytest.approx(0, abs=1e-12)
    assert cost.calibration_fields() == dict(cold_backward_op_host_s=cost.op_s,
                                             cold_backward_inner_op_host_s=cost.inner_op_s)


def test_the_fit_keeps_both_figures_at_or_above_zero():
    """Inner ops that cost less than nothing (1, 10): 0.2 us, (2, 0): 2 us, (3, 0): 3 us:
    the free fit's inner figure is < 0, so the op term alone: (1 x 0.2 + 2 x 2 + 3 x 3) /
    (1 + 4 + 9) = 13.2 / 14 us per op, 0 per inner op."""
    chains = [ColdChain(a, extra, 0.0, b)
              for a, b, extra in ((1, 10, 0.2 * US), (2, 0, 2 * US), (3, 0, 3 * US))]
    cost = cold_backward_cost(chains)
    assert cost.inner_op_s == 0.0
    assert cost.op_s == pytest.approx(13.2 / 14 * US)


class _Three(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.scale, self.last = Mix(), Scale(), Gate()

    def forward(self, x):
        return self.last(self.scale(self.first(x)))


def test_the_backward_window_reaches_past_a_small_layer():
    """Forward order first (a Mix), scale, last (a Gate); backward order last, scale,
    first. last follows its own forward: sigmoid_backward and tanh_backward cold (2);
    scale after last's backward (sigmoid_backward, tanh_backward, add, detach): mul and
    threshold_backward (2); first after scale's backward (mul, threshold_backward, detach:
    3 distinct ops, below the window's 16) and, within the window, last's: tanh_backward
    and add ran, nothing cold (0; scale's alone would leave those 2 cold)."""

    # no parameters: the input requires grad, else a step runs no backward at all
    graph = build_layer_graph(_Three(), {"x": torch.randn(2, 8, requires_grad=True)},
                              dtype=torch.float32)
    assert [layer.name for layer in graph.layers] == ["first", "scale", "last"]
    assert [layer.cold_distinct_ops_bwd for layer in graph.layers] == [0, 2, 2]


def test_the_backward_window_stops_after_a_layer_of_many_ops():
    many = frozenset(f"aten.op{i}.default" for i in range(COLD_WINDOW_DISTINCT_OPS))
    near, far = frozenset({"aten.mm.default"}), frozenset({"aten.add.Tensor"})
    assert recent_backward_ops([near, far]) == near | far
    assert recent_backward_ops([many, far]) == many
    assert recent_backward_ops([]) is None


def test_calibration_json_with_and_without_the_inner_figure():
    data = json.loads(json.dumps(PROBED.to_dict()))
    assert KernelCalibration.from_dict(data) == PROBED
    del data["cold_backward_inner_op_host_s"]
    old = KernelCalibration.from_dict(data)
    assert old.cold_backward_inner_op_host_s == 0.0
    layer = dataclasses.replace(tiny_layer(), cold_distinct_ops_bwd=2, cold_inner_ops_bwd=3)
    # a kit without the inner figure prices its cold ops only: 39 + 2 x 1.2 = 41.4 us
    assert backward_host_seconds(layer, cpu(old)) == pytest.approx(41.4 * US)
    with pytest.raises(Exception, match="cold_backward_inner_op_host_s"):
        KernelCalibration.from_dict({**data, "cold_backward_inner_op_host_s": -1.0})


def test_the_probe_counts_its_chains_as_layers_are_counted():
    """The probe's chains: each unary chain's backward ops cold after the block's (at least
    one, more for longer chains); the composites' own op cold and their inner ops
    (`ir.composite_ops.inner_ops`, less those the block's backward runs) counted; seconds
    measured (> 0). Timings are not asserted: the host is shared."""
    chains = cold_backward_layers("cpu")
    assert len(chains) == len(COLD_BACKWARD_CALLS) + len(COLD_BACKWARD_COMPOSITES)
    unary, composites = chains[:len(COLD_BACKWARD_CALLS)], chains[len(COLD_BACKWARD_CALLS):]
    assert all(c.cold_inner_ops == 0 for c in unary)
    assert unary[0].cold_ops >= 1 and unary[-1].cold_ops > unary[0].cold_ops
    bag = composites[0]
    assert bag.cold_ops >= 1
    assert 3 <= bag.cold_inner_ops <= len(inner_ops(COLD_BACKWARD_COMPOSITES[0]))
    assert all(c.cold_s > 0 and c.warm_s > 0 for c in chains)


def test_a_real_step_runs_the_layers_backwards_in_reverse_graph_order():
    """t5-tiny, where every decoder block reads the encoder's output: a real step's
    autograd nodes (each given to the layer whose forward made it: gradient pre-hooks)
    run layer by layer in the reverse of the graph's order, encoder_norm's after
    decoder_embed's (after decoder_rel_bias's, decoder_blocks.0's), as
    `recent_backward_ops` takes them (`ir.measure`: the layers after, nearest first)."""
    meta = load_model("t5-tiny", 1, None, device="meta")
    graph = build_layer_graph(meta.module, meta.inputs, meta.target, meta.loss_fn)
    loaded = load_model("t5-tiny", 1, None, device="cpu", seed=0)
    modules = dict(loaded.module.named_modules())
    last_node = []  # (the highest sequence number a layer's forward made, its name)
    for layer in graph.layers:
        def hook(module, args, out, name=layer.name):
            outs = [out] if isinstance(out, torch.Tensor) else list(out)
            last_node.append((max(t.grad_fn._sequence_nr() for t in outs), name))
        modules[layer.name].register_forward_hook(hook)
    loss = loaded.loss_fn(loaded.module(**loaded.inputs), loaded.target)
    last_node.sort()
    ran, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        owner = next((name for nr, name in last_node if node._sequence_nr() <= nr), None)
        if owner is not None and not hasattr(node, "variable"):  # not a gradient sink
            node.register_prehook(lambda grad, owner=owner: ran.append(owner) and None)
        stack.extend(f for f, _ in node.next_functions)
    loss.backward()
    order = [name for k, name in enumerate(ran) if k == 0 or ran[k - 1] != name]
    assert order == [layer.name for layer in reversed(graph.layers)]


def test_after_the_last_layers_backward_the_layers_before_run_theirs():
    """last (index 2) ends the step: after its timed backward the profile runs the
    forwards of the layers before it (first, scale: the window its forward follows), then
    their backwards, scale's first, as a step runs them after last's; for a layer with
    a layer after, nothing."""
    inputs = {"x": torch.randn(2, 8, requires_grad=True)}
    traced = trace(_Three(), inputs, None, None, dtype=torch.float32)
    graph, measurer = layer_graph_from_trace(traced, inputs, None, name="three",
                                             dtype=torch.float32)
    factory = real_factory("cpu")
    for index, expected in ((2, [("forward", 0), ("forward", 1), ("backward", 1),
                                 ("backward", 0)]), (0, [])):
        neighbours = StepNeighbours(measurer, index, factory, graph.layers)
        ran, forward = [], neighbours._forward

        def recorded(j, ran=ran, forward=forward):
            ran.append(("forward", j))
            roots = forward(j)
            for root in roots:
                root.register_hook(lambda grad, j=j: ran.append(("backward", j)))
            return roots

        neighbours._forward = recorded
        neighbours.after_backward()
        assert ran == expected
