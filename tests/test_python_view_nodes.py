"""A layer's fx nodes that dispatch only views, counted per layer (`ir.view_nodes`), the
probe that prices a view called from Python beside a C++ caller's
(`cost_models.host_excess.internal_dispatch_seconds`), and the forward host model's term
for them (`cost_models.host_dispatch.forward_host_seconds`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cost_models import host_excess, host_probes
from cost_models.host_dispatch import forward_host_seconds
from cost_models.host_excess import INTERNAL_LONG, INTERNAL_SHORT, InternalDispatch, \
    view_graph_module
from ir.cluster import ClusterSpec
from ir.measure import build_layer_graph
from tests.test_forward_host import FORWARD_PARTS, with_python_nodes
from tests.test_host_split import US, cpu, tiny_layer
from tests.test_internal_dispatch import _profiled_names


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.flat = nn.Flatten(1)
        self.out = nn.Parameter(torch.randn(4, 12))

    def forward(self, x):  # x: (2, 3, 8)
        h = self.proj(x)                 # module: addmm and its views from C++ (not counted)
        rows = h.shape[0]                # dispatches nothing (a python node, not a view node)
        h = h.view(rows, 3, 2, 4)        # 1 view node
        h = h.transpose(1, 2)            # 2
        h = h.reshape(rows, 2, 12)       # not contiguous: a copy, not only views
        first = h[:, :1]                 # 3 (slice)
        y = F.linear(h, self.out)        # its t and views from C++: not counted
        w = self.proj.weight             # an attribute read: no node dispatch
        z = first.unsqueeze(0)           # 4
        return y.sum() + z.sum() + self.flat(h).sum() + w.sum()  # flat: a module, 5


def block_graph():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x)

    return build_layer_graph(Net(), {"x": torch.randn(2, 3, 8)}, dtype=torch.float32)


def test_view_only_nodes_are_counted_per_layer():
    """Counted by hand in `Block.forward`: view, transpose, the slice, unsqueeze and the
    Flatten module dispatch only views (5); the Linear module, F.linear, the
    non-contiguous reshape (a clone), `x.shape` and the sums do not."""
    layer = next(layer for layer in block_graph().layers if layer.name == "block")
    assert layer.python_view_nodes_fwd == 5


def test_the_view_chain_calls_one_view_per_node():
    """`view_graph_module(n)` dispatches n `aten::view`s (the profiler sees each), so the
    probe's slope over nodes is one Python-called view each."""
    x = torch.randn(host_excess.EXCESS_ROWS, host_excess.EXCESS_WIDTH)
    for n in (INTERNAL_SHORT, INTERNAL_LONG):
        module = view_graph_module(n)
        assert _profiled_names(lambda: module(x)).count("aten::view") == n


def test_real_probe_reads_both_view_figures_in_units():
    """A Python-called view pays its binding and its generated line on top of the C++
    dispatch (0.63 against 0.34 us here, thread clock, 2026-11-25). Units only: both are
    slopes floored at 0 that a loaded host can flatten, so neither their order nor a
    strict 0 is asserted; under 10 us (a unit slip of 1e3 lands outside)."""
    probe = host_excess.internal_dispatch_seconds("cpu")
    assert 0 <= probe.view_s < 10 * US and 0 <= probe.python_view_s < 10 * US


def test_forward_host_adds_each_view_node_s_python_call():
    """`tiny_layer`'s forward priced at 18 us (test_forward_host's hand computation) with 4
    python nodes; with 3 view-only nodes on a kit whose Python view is 1.25 us against
    its C++ 0.5: + 3 x 0.75 = 20.25 us; a kit without the figure prices as before, and
    one whose Python figure read below the C++ one adds nothing (never a negative)."""
    layer = dataclasses.replace(with_python_nodes(tiny_layer(), 4), measured=dataclasses.replace(
        with_python_nodes(tiny_layer(), 4).measured, python_view_nodes_fwd=3))
    kit = dataclasses.replace(FORWARD_PARTS, python_view_host_op_s=1.25 * US)
    assert forward_host_seconds(layer, cpu(kit)) == pytest.approx(20.25 * US)
    assert forward_host_seconds(layer, cpu(FORWARD_PARTS)) == pytest.approx(18 * US)
    below = dataclasses.replace(FORWARD_PARTS, python_view_host_op_s=0.25 * US)
    assert forward_host_seconds(layer, cpu(below)) == pytest.approx(18 * US)
    spec = ClusterSpec.from_json(cpu(kit).to_json())  # the figure round-trips
    assert spec.kernel_calibration.python_view_host_op_s == 1.25 * US


def test_per_pass_probe_names_both_view_figures(monkeypatch, few_host_op_rounds):
    """`host_op_seconds_by_pass` hands the internal probe's C++ view figure to the kit's
    `view_host_op_s` and its Python one to `python_view_host_op_s` (stand-ins 0.3 and
    0.9 us)."""
    internal = InternalDispatch(op_s=0.7 * US, view_s=0.3 * US, python_view_s=0.9 * US)
    monkeypatch.setattr(host_excess, "internal_dispatch_seconds", lambda device: internal)
    fields = host_probes.host_op_seconds_by_pass("cpu").calibration_fields()
    assert fields["view_host_op_s"] == 0.3 * US
    assert fields["python_view_host_op_s"] == 0.9 * US
