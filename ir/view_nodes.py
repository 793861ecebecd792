"""Counting a layer's fx nodes that dispatch only views: each is a line of the generated
forward that calls a view from Python (`x.view`, `transpose`, a slice), where the views
a function or a module dispatches come from C++ (F.linear's t, matmul's reshapes). The
host model prices each such node's Python call on top of its views
(`cost_models.host_dispatch.forward_host_seconds`, `KernelCalibration
.python_view_host_op_s`); `ir.graph_measurer` takes the count per layer
(`LayerMeasurement.python_view_nodes_fwd`).
"""

from __future__ import annotations

from torch import fx

from ir.kernel_recorder import KernelRecorder
from ir.kernel_records import KernelRecord
from ir.op_count import PYTHON_NODE_OPS, _node_ops


class ViewCountingRecorder(KernelRecorder):
    """A forward's `KernelRecorder` that also keeps a running count of the views it
    recorded that the host dispatches as views (`KernelRecord.host_view`: an allocation is
    an op), for `view_nodes`."""

    def __init__(self, weight_keys: set):
        super().__init__(weight_keys)
        self.views = 0

    def add(self, record: KernelRecord) -> None:
        if record.host_view:
            self.views += record.count
        super().add(record)


# call_module nodes too: a leaf module whose forward only reshapes (`nn.Flatten`,
# `nn.Unflatten`) calls its view from Python
VIEW_NODE_OPS = (*PYTHON_NODE_OPS, "call_module")


def view_nodes(nodes: list[fx.Node], started: dict[fx.Node, int], total_ops: int,
               started_views: dict[fx.Node, int], total_views: int) -> int:
    """Call nodes among `nodes` that dispatched ops, all of them views (from the op and
    view counts when each started, `started` / `started_views`, and after the last): a
    line of the generated forward that calls a view from Python (`x.view`, `transpose`,
    a slice), where a function's or a module's views come from C++ (F.linear's t).
    `cost_models.host_dispatch.forward_host_seconds` prices each one's Python call."""
    ends = [started_views[n] for n in nodes[1:]] + [total_views]
    return sum(1 for (n, ops), end in zip(_node_ops(nodes, started, total_ops), ends)
               if n.op in VIEW_NODE_OPS and ops > 0 and end - started_views[n] == ops)
