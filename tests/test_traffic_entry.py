"""A forward's entry by the bytes the work between moves (`Layer.after_bytes`,
`ir.op_count.step_between`), its probe (`cold_entry_probes.cold_entry_traffic_points`),
the points a kit keeps (`ColdTrafficPoint`) and the term that reads them
(`host_dispatch.traffic_entry_seconds`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cost_models import cold_entry_probes as ce
from cost_models.host_dispatch import (forward_host_seconds, host_position_key,
                                       traffic_entry_seconds)
from ir.errors import PlannerError
from ir.kernel_calibration import KernelCalibration
from ir.kernel_points import ColdTrafficPoint
from ir.op_count import kernel_bytes
from tests.test_cold_entry import POINTS, NormHead, _measured
from tests.test_forward_host import with_python_nodes
from tests.test_host_split import US, cpu, tiny_layer

MIB = 1 << 20
# 2 us + 0.5 per cold op after 1 MiB more than the probe's block, 4 + 1 after 4 MiB
TRAFFIC = dataclasses.replace(POINTS, cold_entry_traffic_points=(
    ColdTrafficPoint(4 * MIB, 4 * US, 1 * US), ColdTrafficPoint(1 * MIB, 2 * US, 0.5 * US)))


def test_graphs_count_the_bytes_the_work_between_moves():
    """`after_bytes` sums the kernel bytes (records' `total_bytes`, forward and backward)
    of the layers whose ops `after_ops` sums (`NormHead`: the next block's, the norm's
    and the head's, the head's, the last block's and the norm's for the head), each a
    layer's whole records."""
    graph, _ = _measured(NormHead())
    moved = [kernel_bytes(layer) for layer in graph.layers]
    assert all(b > 0 for b in moved)
    assert moved[0] == sum(r.total_bytes for r in graph.layers[0].kernels.forward
                           + graph.layers[0].kernels.backward)
    assert [layer.after_bytes for layer in graph.layers] == [
        moved[1], moved[2], moved[3] + moved[4], moved[4], moved[2] + moved[3]]
    assert graph.layers[1].position_free().after_bytes == 0


def test_the_entry_adds_the_traffic_points_read_at_the_bytes_between():
    """3 cold ops on the line from nothing at 0 bytes through the points (sorted by
    bytes), flat beyond the last: 0 at 0; half a MiB 1 + 3 x 0.25 = 1.75 us; 1 MiB 2 +
    1.5 = 3.5; 2.5 MiB 3 + 2.25 = 5.25; 4 MiB and 100, 4 + 3 = 7. The forward adds it
    to `cold_entry_seconds`' figure; a step that stays warm (`step_warm`) and a kit
    without points add none; the position key tells the bytes apart only where the kit
    has points; the points travel in the JSON."""
    layer = dataclasses.replace(with_python_nodes(tiny_layer(), 4), cold_distinct_ops_fwd=3,
                                after_ops=100)

    def at(moved, kit=TRAFFIC):
        return traffic_entry_seconds(dataclasses.replace(layer, after_bytes=moved), kit) / US

    assert [at(b) for b in (0, MIB // 2, MIB, 5 * MIB // 2, 4 * MIB, 100 * MIB)] == \
        pytest.approx([0, 1.75, 3.5, 5.25, 7, 7])
    assert at(100 * MIB, POINTS) == 0.0
    far = dataclasses.replace(layer, after_bytes=100 * MIB)
    assert (forward_host_seconds(far, cpu(TRAFFIC)) - forward_host_seconds(far, cpu(POINTS))
            == pytest.approx(7 * US))
    warm = dataclasses.replace(far, step_warm=True)
    assert forward_host_seconds(warm, cpu(TRAFFIC)) == pytest.approx(
        forward_host_seconds(warm, cpu(POINTS)))
    keys = [host_position_key(dataclasses.replace(layer, after_bytes=b), cpu(kit))
            for kit in (TRAFFIC, POINTS) for b in (MIB, 4 * MIB)]
    assert keys[0] != keys[1] and keys[2] == keys[3]
    assert KernelCalibration.from_dict(json.loads(json.dumps(TRAFFIC.to_dict()))) == TRAFFIC
    with pytest.raises(PlannerError, match="after_bytes"):
        ColdTrafficPoint(-1, 0.0, 0.0)
    with pytest.raises(PlannerError, match="entry_s"):
        ColdTrafficPoint(MIB, -1.0, 0.0)


def test_the_probe_reads_a_point_per_size_that_never_falls():
    """Two sizes, few runs: a point at each size in order, entry and slope >= 0 and not
    below the smaller size's (more traffic evicts no less)."""
    points = ce.cold_entry_traffic_points("cpu", sizes=(MIB // 4, 4 * MIB), runs=8)
    assert [p.after_bytes for p in points] == [MIB // 4, 4 * MIB]
    assert all(p.entry_s >= 0 and p.op_s >= 0 for p in points)
    assert points[1].entry_s >= points[0].entry_s and points[1].op_s >= points[0].op_s
