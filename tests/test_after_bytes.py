"""`Layer.after_bytes` (`ir.op_count.step_between`): the kernel bytes of the work a step
runs between a layer's backward and its next forward, the window `after_ops` counts."""

from __future__ import annotations

from ir.op_count import kernel_bytes
from tests.test_cold_entry import NormHead, _measured


def test_graphs_count_the_bytes_the_work_between_moves():
    """`after_bytes` sums the kernel bytes (records' `total_bytes`, forward and backward)
    of the layers whose ops `after_ops` sums (`NormHead`: the next block's, the norm's
    and the head's, the head's, the last block's and the norm's for the head), each a
    layer's whole records; a position-free layer has none."""
    graph, _ = _measured(NormHead())
    moved = [kernel_bytes(layer) for layer in graph.layers]
    assert all(b > 0 for b in moved)
    assert moved[0] == sum(r.total_bytes for r in graph.layers[0].kernels.forward
                           + graph.layers[0].kernels.backward)
    assert [layer.after_bytes for layer in graph.layers] == [
        moved[1], moved[2], moved[3] + moved[4], moved[4], moved[2] + moved[3]]
    assert graph.layers[1].position_free().after_bytes == 0
