"""A forward after the bytes its step moved since the layer last ran
(`cost_models.cold_evict_probes`): the fit beyond the knee, the probe, the forward host
term (`host_dispatch.forward_host_seconds`) and its position key, the bytes counted
(`ir.step_footprint.forward_gap_bytes`, `Layer.forward_gap_bytes`) and the spec fields."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from cost_models import cold_evict_probes as ev
from cost_models.host_dispatch import forward_host_seconds, host_position_key
from ir.kernel_calibration import KernelCalibration
from ir.kernel_records import KernelKind, KernelRecord, KernelRecords
from ir.step_footprint import forward_gap_bytes, traffic_bytes
from tests.test_cold_entry import ENTRY
from tests.test_forward_host import with_python_nodes
from tests.test_host_split import US, cpu, tiny_layer

MIB = 2**20
# A kit with the term: 0.5 us per MiB beyond 16 MiB, + 0.25 us per MiB per cold op, up to
# 64 MiB (a 32 MiB cache's knee and cap).
EVICT = dataclasses.replace(ENTRY, cold_evict_entry_s_per_byte=0.5 * US / MIB,
                            cold_evict_op_s_per_byte=0.25 * US / MIB,
                            cold_evict_knee_bytes=16.0 * MIB, cold_evict_cap_bytes=64.0 * MIB)


def _readings(points, cold_ops=(0, 4)):
    """Readings at (MiB written, extra us) for each cold-op count, extra + 2 us per MiB
    beyond the knee per cold op."""
    return [ev.EvictReading(k, int(mib * MIB), (extra + 2 * k * max(0, mib - 16)) * US)
            for k in cold_ops for mib, extra in points]


def test_the_fit_runs_through_the_knee_per_layer_and_per_cold_op():
    """A 32 MiB cache: knee 16 MiB, cap 64. On the line extra = (MiB - 16) x (1 + 2 x cold
    ops) us: (24, 32, 64) MiB at 0 and 4 cold ops -> 1 us and 2 us per MiB, no miss. With
    the per-layer term falling below 0 (extra 2 x cold ops x (MiB - 16) alone, less 1 us
    per MiB): the better single term, here the per-op one: sum(x2 y) / sum(x2^2) where x2 =
    4 x (MiB - 16) and y = 8 x (MiB - 16) - (MiB - 16) at 4 cold ops and -(MiB - 16) at
    0: (32 - 4) / 16 = 1.75 us per MiB per op."""
    line = _readings([(24, 8), (32, 16), (64, 48)])
    cost = ev.cold_evict_cost(line, llc_bytes=32 * MIB)
    assert cost.entry_s_per_byte == pytest.approx(1 * US / MIB)
    assert cost.op_s_per_byte == pytest.approx(2 * US / MIB)
    assert (cost.knee_bytes, cost.cap_bytes) == (16 * MIB, 64 * MIB)
    assert cost.residual_s == pytest.approx(0.0, abs=1e-12)
    falling = [dataclasses.replace(r, extra_s=r.extra_s - 2 * (r.written_bytes / MIB - 16) * US)
               for r in line]
    cost = ev.cold_evict_cost(falling, llc_bytes=32 * MIB)
    assert cost.entry_s_per_byte == 0.0
    assert cost.op_s_per_byte == pytest.approx(1.75 * US / MIB)
    assert cost.calibration_fields() == {
        "cold_evict_entry_s_per_byte": 0.0, "cold_evict_op_s_per_byte": cost.op_s_per_byte,
        "cold_evict_knee_bytes": 16 * MIB, "cold_evict_cap_bytes": 64 * MIB}


def test_a_forward_pays_for_the_bytes_beyond_the_knee_up_to_the_cap():
    """tiny_layer with 4 python nodes and 3 cold ops: 28 us at the ENTRY kit (its warm 18 +
    entry 4 + 3 x 2). With 40 MiB moved since it last ran: (40 - 16) x (0.5 + 3 x 0.25) =
    24 x 1.25 = 30 us more, 58 us; 10 MiB (below the knee): 28; 100 MiB (beyond the cap):
    (64 - 16) x 1.25 = 60 more, 88 us. A step whose ops stay warm: 18 us whatever the
    bytes; a kit without the figure (ENTRY, as older kits and GPU presets): 28 us."""
    layer = dataclasses.replace(with_python_nodes(tiny_layer(), 4), cold_distinct_ops_fwd=3)
    moved = {mib: dataclasses.replace(layer, forward_gap_bytes=mib * MIB) for mib in (10, 40, 100)}
    assert forward_host_seconds(moved[40], cpu(EVICT)) == pytest.approx(58 * US)
    assert forward_host_seconds(moved[10], cpu(EVICT)) == pytest.approx(28 * US)
    assert forward_host_seconds(moved[100], cpu(EVICT)) == pytest.approx(88 * US)
    warm = dataclasses.replace(moved[40], step_warm=True)
    assert forward_host_seconds(warm, cpu(EVICT)) == pytest.approx(18 * US)
    assert forward_host_seconds(moved[40], cpu(ENTRY)) == pytest.approx(28 * US)


def test_the_position_key_reads_the_priced_bytes_only_where_priced():
    """Two layers below the knee key alike (both priced 0), one beyond it apart; a kit
    without the figure keys all three alike."""
    layer = dataclasses.replace(with_python_nodes(tiny_layer(), 4), cold_distinct_ops_fwd=3)
    a, b, c = (dataclasses.replace(layer, forward_gap_bytes=mib * MIB) for mib in (1, 12, 40))
    assert host_position_key(a, cpu(EVICT)) == host_position_key(b, cpu(EVICT))
    assert host_position_key(a, cpu(EVICT)) != host_position_key(c, cpu(EVICT))
    assert host_position_key(a, cpu(ENTRY)) == host_position_key(c, cpu(ENTRY))


def _layer(forward_bytes: int, backward_bytes: int, ops: set[str]):
    """A stand-in with one forward and one backward record of these traffic bytes (part
    parameter reads, part the rest) and these forward overloads."""
    def record(total: int) -> KernelRecord:
        return KernelRecord(op="aten::add", kind=KernelKind.MEMORY, dtype="float32",
                            shape=(1,), count=2, weight_bytes=total // 8,
                            activation_bytes=total // 2 - total // 8)

    return SimpleNamespace(kernels=KernelRecords(forward=(record(forward_bytes),),
                                                 backward=(record(backward_bytes),)),
                           measured=SimpleNamespace(forward_overloads=frozenset(ops)))


def test_the_gap_is_the_backward_the_layer_after_and_the_warm_window_before():
    """Five layers (forward / backward MiB): a block of 20 distinct ops (8 / 16), a norm
    of 1 op (1 / 2), a head (4 / 8), another norm (1 / 2), a last layer (2 / 4). The
    head's window: the norm and (the norm ran fewer than 16 distinct ops) the block:
    8 + 1; then its backward 8, the layer after's 1 + 2: 20 MiB. The norm's: the block
    alone (20 ops): 8, + its backward 2 + the head's 4 + 8: 22. The first (no window):
    16 + 1 + 2 = 19. The second norm: the head, norm and block (3 distinct ops before the
    block): 4 + 1 + 8, + its backward 2 + the last's 2 + 4: 21. The last (no layer
    after): its backward 4 + the norm, head, norm and block: 1 + 4 + 1 + 8: 18."""
    block = {f"aten.op{i}" for i in range(20)}
    layers = [_layer(8 * MIB, 16 * MIB, block), _layer(1 * MIB, 2 * MIB, {"aten.norm"}),
              _layer(4 * MIB, 8 * MIB, {"aten.mm", "aten.t", "aten.norm"}),
              _layer(1 * MIB, 2 * MIB, {"aten.norm"}), _layer(2 * MIB, 4 * MIB, {"aten.x"})]
    assert traffic_bytes(layers[0].kernels.forward) == 8 * MIB
    assert [forward_gap_bytes(layers, i) / MIB for i in range(5)] == [19, 22, 20, 21, 18]


def test_calibration_json_carries_the_figures_and_loads_without_them():
    data = json.loads(json.dumps(EVICT.to_dict()))
    assert data["cold_evict_knee_bytes"] == 16 * MIB
    assert KernelCalibration.from_dict(data) == EVICT
    for field in ("cold_evict_entry_s_per_byte", "cold_evict_op_s_per_byte",
                  "cold_evict_knee_bytes", "cold_evict_cap_bytes"):
        del data[field]
    assert KernelCalibration.from_dict(data) == ENTRY
    with pytest.raises(Exception, match="cold_evict_cap_bytes"):
        KernelCalibration.from_dict({**data, "cold_evict_cap_bytes": -1.0})


def test_the_probe_counts_cold_ops_as_layers_do_and_fits_figures_at_or_above_0():
    """On this CPU with a 4 MiB 'cache' (3, 4 and 8 MiB written: quick): one reading per
    probe layer and size, cold ops exactly EVICT_COLD_OPS (the step work runs the probe
    layers' LayerNorm), extras under 1 ms either way; the fit's figures >= 0, knee 2 MiB,
    cap 8."""
    readings = ev.cold_evict_chains("cpu", llc_bytes=4 * MIB)
    assert [(r.cold_ops, r.written_bytes) for r in readings] == [
        (k, int(f * 4 * MIB)) for k in ev.EVICT_COLD_OPS for f in ev.EVICT_LLC_FRACTIONS]
    assert all(abs(r.extra_s) < 1e-3 for r in readings)
    cost = ev.cold_evict_cost(readings, llc_bytes=4 * MIB)
    assert cost.entry_s_per_byte >= 0 and cost.op_s_per_byte >= 0
    assert (cost.knee_bytes, cost.cap_bytes) == (2 * MIB, 8 * MIB)


def test_gpu_presets_carry_no_evict_figure_and_key_no_bytes():
    """The GPU presets (their measured kernel tables included) price no eviction: the
    term is 0 whatever the bytes, and the position key does not read them."""
    from cost_models.clusters import PRESETS

    layer = dataclasses.replace(with_python_nodes(tiny_layer(), 4), cold_distinct_ops_fwd=3)
    far = dataclasses.replace(layer, forward_gap_bytes=100 * MIB)
    gpus = [(name, make()) for name, make in PRESETS.items() if name != "local"]
    assert len(gpus) == 4 and all(spec.device != "cpu" for _, spec in gpus)
    for name, spec in gpus:
        cal = spec.kernel_calibration
        assert cal is None or cal.cold_evict_cap_bytes == 0, name
        assert forward_host_seconds(far, spec) == forward_host_seconds(layer, spec), name
        assert host_position_key(far, spec) == host_position_key(layer, spec), name
