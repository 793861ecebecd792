"""Cold backward ops priced by the work between a layer's forward and its backward: the
kit's `ColdBackwardPoint`s (`cost_models.cold_backward_probes.cold_backward_calibration`:
after one Linear's and a block's forward and backward), read at a layer's
`Layer.backward_after_ops` (`ir.op_count.step_between`) by `host_dispatch
.backward_host_seconds` through the forward's reader (`host_dispatch.read_points`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cost_models.cold_backward_probes import cold_backward_calibration
from cost_models.host_dispatch import backward_host_seconds, host_position_key
from ir.kernel_calibration import KernelCalibration
from ir.kernel_points import ColdBackwardPoint
from ir.errors import PlannerError
from tests.test_cold_backward_window import PROBED
from tests.test_cold_entry import NormHead, _measured
from tests.test_host_split import US, cpu, tiny_layer

# a block's figures alone (PROBED: 1.2 us a cold op, 0.5 an inner op) and points, unsorted
POINTS = dataclasses.replace(PROBED, cold_backward_points=(
    ColdBackwardPoint(115, 3 * US, 1.5 * US), ColdBackwardPoint(17, 0.5 * US, 0.25 * US)))


def test_the_cold_ops_are_read_off_the_points_at_the_windows_work():
    """`tiny_layer`'s backward, 39 us, 2 cold ops and 4 inner: at 0 or 17 ops 39 + 2 x 0.5
    + 4 x 0.25 = 41 us; at 66 (half way) 39 + 3.5 + 3.5 = 46; at 115 or 300, 39 + 6 + 6 =
    51. A kit without points: the block's single figures, 39 + 2.4 + 2 = 43.4 anywhere; a
    step that stays warm, 39. The position key tells the work apart only with points; the
    points travel in the calibration's JSON."""
    layer = dataclasses.replace(tiny_layer(), cold_distinct_ops_bwd=2, cold_inner_ops_bwd=4)

    def at(ops, kit=POINTS, **changes):
        return backward_host_seconds(dataclasses.replace(layer, backward_after_ops=ops,
                                                         **changes), cpu(kit)) / US

    assert [at(ops) for ops in (0, 17, 66, 115, 300)] == pytest.approx([41, 41, 46, 51, 51])
    assert at(17, PROBED) == at(300, PROBED) == pytest.approx(43.4)
    assert at(300, step_warm=True) == pytest.approx(39)
    keys = [host_position_key(dataclasses.replace(layer, backward_after_ops=ops), cpu(kit))
            for kit in (POINTS, PROBED) for ops in (17, 115)]
    assert keys[0] != keys[1] and keys[2] == keys[3]
    assert KernelCalibration.from_dict(json.loads(json.dumps(POINTS.to_dict()))) == POINTS
    with pytest.raises(PlannerError, match="op_s"):
        ColdBackwardPoint(17, -1.0, 0.0)


def test_graphs_count_the_work_of_the_backward_window():
    """`NormHead` (3 `Wide` blocks, a norm, a head): a block before a block, the next
    block's forward + backward ops (its 20 distinct backward ops fill the window); the last
    block, the norm's and the head's (their 7 do not); the norm, the head's; the head (the
    last), the layers before in its forward window, as `after_ops` counts them, and their
    forwards again (the profile runs them before its forward)."""
    graph, _ = _measured(NormHead())
    both = [layer.ops_fwd + layer.ops_bwd for layer in graph.layers]
    again = graph.layers[2].ops_fwd + graph.layers[3].ops_fwd
    assert [layer.backward_after_ops for layer in graph.layers] == [
        both[1], both[2], both[3] + both[4], both[4], graph.layers[-1].after_ops + again]
    assert graph.layers[-1].after_ops == both[2] + both[3]


def test_a_block_between_costs_a_cold_op_more_than_a_linear():
    """The probe's two points (one thread, its chains' medians): a Linear's forward and
    backward are fewer ops than a block's and leave the chain's backward ops warmer (0.5 vs
    3.3 us a cold op here, 2026-11-25, load 4.8: a ratio far beyond the host's noise)."""
    fields = cold_backward_calibration("cpu")
    small, block = fields["cold_backward_points"]
    assert small.after_ops < block.after_ops
    assert small.op_s < block.op_s
    assert fields["cold_backward_op_host_s"] == block.op_s
