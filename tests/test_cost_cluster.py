"""Cluster specs: presets, JSON round trip, validation, and the measured profile-cluster."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from cost_models.clusters import get_cluster, preset_names
from cost_models.collective_fit import fit_alpha_beta, message_sizes, smaller_group_sizes
from cost_models.collective_probes import BLOCKING_PROBE_SIZES
from cost_models.host_overhead_fit import blocking_wait, dp_unit_overhead
from cost_models.comm import Link, all_gather_s, broadcast_s, ring_all_reduce_s, send_recv_s
from ir.calibration_tables import (BlockingWait, CalibrationTables, DpOverhead,
                                   OptimizerStepCost, TpModuleOverhead)
from ir.cluster import COLLECTIVES, ClusterSpec, CollectiveFit
from ir.errors import PlannerError
from ir.strategy import DPMode

R, Z2, Z3 = DPMode.REPLICATE, DPMode.ZERO2, DPMode.ZERO3


def test_presets_carry_datasheet_numbers():
    a100 = get_cluster("a100-80g")
    assert (a100.num_nodes, a100.devices_per_node, a100.world_size) == (1, 8, 8)
    assert a100.peak_flops("bfloat16") == 312e12
    assert a100.device_memory_bytes == 80 * 2**30
    assert 200 <= a100.intra_node_gbps <= 230  # REFERENCES: all-reduce busbw in a node
    assert get_cluster("a100-40g").device_memory_bytes == 40 * 2**30
    h100 = get_cluster("h100-80g", nodes=4)
    assert h100.world_size == 32 and h100.peak_flops("bfloat16") == 989e12
    assert get_cluster("h200").device_memory_bytes > 140e9
    assert get_cluster("h200").hbm_gbps == 4800
    with pytest.raises(PlannerError, match="no peak FLOP/s for float8"):
        h100.peak_flops("float8")


def test_local_preset_is_measured():
    local = get_cluster("local")
    assert local.device == "cpu" and local.world_size == 1
    assert local.peak_flops("float32") > 1e9
    assert local.device_memory_bytes > 2**30
    two = get_cluster("local", gpus_per_node=2)
    assert two.world_size == 2
    assert two.device_memory_bytes == local.device_memory_bytes // 2


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(PlannerError) as err:
        get_cluster("h100")
    for name in preset_names():
        assert name in str(err.value)
    with pytest.raises(PlannerError, match="--nodes must be >= 1"):
        get_cluster("h200", nodes=0)


def test_json_round_trip_and_atomic_save(tmp_path):
    spec = get_cluster("h100-80g", nodes=2).with_calibration(
        collective_fits=(CollectiveFit("all_reduce", "intra_node", 1e-5, 2e11, 8),))
    path = tmp_path / "spec.json"
    spec.save(path)
    assert ClusterSpec.load(path) == spec
    assert os.listdir(tmp_path) == ["spec.json"]  # no temporary left behind
    data = json.loads(path.read_text())
    assert data["schema"] == "planner.cluster/v1"
    assert data["peak_flops_by_dtype"]["bfloat16"] == 989e12
    assert get_cluster(str(path), nodes=4).world_size == 32
    hash(spec)  # frozen and hashable


@pytest.mark.parametrize("edit, message", [
    ({"devices_per_node": 0}, "devices_per_node must be a positive integer"),
    ({"intra_node_gbps": "fast"}, "'intra_node_gbps' must be a number"),
    ({"peak_flops_by_dtype": {}}, "peak_flops_by_dtype is empty"),
    ({"matmul_efficiency": 1.5}, "matmul_efficiency must be in"),
    ({"colour": "blue"}, "unknown field 'colour'"),
    ({"collective_fits": [{"collective": "gossip", "scope": "intra_node",
                           "alpha_s": 0, "bytes_per_s": 1}]}, "unknown collective"),
    ({"blocking_wait_s": {"allreduce@2": 1e-3}}, "blocking_wait_s key 'allreduce@2' must be"),
    ({"blocking_wait_s": {"all_reduce@2": -1.0}}, "blocking_wait_s[all_reduce@2] must be"),
])
def test_bad_specs_name_the_field_and_file(tmp_path, edit, message):
    data = get_cluster("a100-80g").to_dict()
    data.update(edit)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlannerError) as err:
        ClusterSpec.load(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_calibration_tables_are_typed_records_in_the_old_file_shape():
    tables = CalibrationTables(
        collective_fits=(CollectiveFit("all_to_all", "intra_node", 1e-5, 1e9, 2),),
        dp_overheads=(DpOverhead(Z3, None, 3e-3, 1e-4), DpOverhead(Z3, 2, 1e-3, 2e-4)),
        optimizer_steps=(OptimizerStepCost("adamw", False, 7e-5),
                         OptimizerStepCost("adamw", True, 3e-4)),
        tp_modules=(TpModuleOverhead(2, 1e-3),),
        blocking_waits=(BlockingWait("all_reduce", 2, 5e-4),))
    spec = get_cluster("local").with_calibration(**{
        f.name: getattr(tables, f.name) for f in dataclasses.fields(tables)})
    data = json.loads(spec.to_json())
    # The file keeps the keys older specs were written with, and reads back the same.
    assert data["dp_unit_overhead_s"] == {"zero3": 3e-3, "zero3@2": 1e-3}
    assert data["dp_tensor_overhead_s"] == {"zero3": 1e-4, "zero3@2": 2e-4}
    assert data["optimizer_tensor_overhead_s"] == {"adamw": 7e-5, "adamw@dtensor": 3e-4}
    assert data["blocking_wait_s"] == {"all_reduce@2": 5e-4}
    assert data["blocking_wait_s_per_byte"] == {"all_reduce@2": 0.0}
    assert ClusterSpec.from_dict(data) == spec and spec.calibration == tables
    assert tables.optimizer_seconds_per_tensor("adamw", on_dtensor=True) == 3e-4
    assert tables.optimizer_seconds_per_tensor("sgd", on_dtensor=False) is None
    # Short forms (profile-cluster prints them); the exact form is the dataclass repr.
    assert [str(r) for r in tables.dp_overheads] == [
        "zero3@node: 3.00ms+0.100ms/tensor+0.00ns/param",
        "zero3@dp2: 1.00ms+0.200ms/tensor+0.00ns/param"]
    assert str(tables.optimizer_steps[1]) == "adamw@dtensor: 300us/tensor"
    assert str(tables.tp_modules[0]) == "tp2: 1.00ms/module"
    assert str(tables.blocking_waits[0]) == "all_reduce@2: 0.50ms+0.00ms/MiB"
    assert repr(tables.blocking_waits[0]) == ("BlockingWait(collective='all_reduce', "
                                              "group_size=2, seconds=0.0005, "
                                              "seconds_per_byte=0.0)")
    # One validation per record: the constructor and the file reader raise the same error.
    for bad, key, value in [
            (lambda: DpOverhead("zero3", 2, 1e-3, 0.0), None, None),  # a string, not DPMode
            (lambda: DpOverhead(Z3, 0, 1e-3, 0.0), "dp_unit_overhead_s", {"zero3@0": 1e-3}),
            (lambda: DpOverhead(Z3, 2, -1.0, 0.0), "dp_unit_overhead_s", {"zero3@2": -1.0}),
            (lambda: OptimizerStepCost("adamw", True, -1.0), "optimizer_tensor_overhead_s",
             {"adamw@dtensor": -1.0}),
            (lambda: TpModuleOverhead(2, -1.0), "tp_module_overhead_s", {"2": -1.0}),
            (lambda: BlockingWait("gossip", 2, 0.0), "blocking_wait_s", {"gossip@2": 0.0}),
            (lambda: BlockingWait("all_reduce", 1, 0.0), "blocking_wait_s",
             {"all_reduce@1": 0.0})]:
        with pytest.raises(PlannerError) as direct:
            bad()
        if key is not None:
            with pytest.raises(PlannerError) as read:
                ClusterSpec.from_dict({**data, key: value})
            assert str(direct.value) in str(read.value)
    for key, value, message in [
            ("dp_unit_overhead_s", {"zero4": 1e-3}, "key 'zero4' must be MODE or MODE@GROUP"),
            ("dp_unit_overhead_s", {"zero3@x": 1e-3}, "key 'zero3@x' must be MODE"),
            ("dp_param_overhead_s", {"zro3@2": 1e-9}, "key 'zro3@2' has no dp_unit_overhead"),
            ("dp_param_overhead_s", {"zero3@2": -1e-9}, r"dp_param_overhead_s\[zero3@2\] must be"),
            ("optimizer_tensor_overhead_s", {"adamw@gpu": 1e-3}, "must be OPTIMIZER or"),
            ("blocking_wait_s", {"all_reduce": 1e-3}, "must be COLLECTIVE@GROUP_SIZE")]:
        with pytest.raises(PlannerError, match=message):
            ClusterSpec.from_dict({**data, key: value})
    with pytest.raises(PlannerError, match="lists .* twice"):
        CalibrationTables(tp_modules=(TpModuleOverhead(2, 1.0), TpModuleOverhead(2, 2.0)))


def test_missing_field_and_bad_json(tmp_path):
    data = get_cluster("a100-80g").to_dict()
    del data["hbm_gbps"]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlannerError, match="missing field 'hbm_gbps'"):
        ClusterSpec.load(path)
    path.write_text("{not json")
    with pytest.raises(PlannerError, match="not valid JSON"):
        ClusterSpec.load(path)
    with pytest.raises(PlannerError, match="cannot read cluster spec"):
        ClusterSpec.load(tmp_path / "absent.json")


def test_alpha_beta_fit_recovers_a_known_line():
    sizes = message_sizes(1024, 64 << 20)
    assert sizes[0] == 1024 and sizes[-1] == 64 << 20 and len(sizes) == 9
    n, alpha, bandwidth = 4, 20e-6, 3e9
    times = [2 * (n - 1) * alpha + 2 * (n - 1) / n * s / bandwidth for s in sizes]
    got_alpha, got_bw = fit_alpha_beta("all_reduce", n, sizes, times)
    assert got_alpha == pytest.approx(alpha, rel=1e-6)
    assert got_bw == pytest.approx(bandwidth, rel=1e-6)
    # A broadcast's fit is in the binomial-tree form comm.broadcast_s prices.
    times = [broadcast_s(s, n, Link(alpha, bandwidth, False)) for s in sizes]
    assert fit_alpha_beta("broadcast", n, sizes, times) == pytest.approx((alpha, bandwidth))
    with pytest.raises(PlannerError):
        message_sizes(1024, 512)


def test_probe_group_sizes_are_the_powers_of_two_below_the_node():
    assert smaller_group_sizes(2) == [] and smaller_group_sizes(8) == [2, 4]
    assert smaller_group_sizes(6) == [2]


def test_dp_unit_figures_split_per_unit_and_per_tensor():
    ms = 1e-3
    few, many = (6, 160), (24, 640)  # (tensors, parameters) of the probe's narrow units
    measured = {4: {R: {few: 2.0 * ms, many: 3.8 * ms}, Z2: {few: 3 * ms, many: 3 * ms},
                    Z3: {few: 4 * ms, many: 2 * ms}},
                2: {R: {few: 1.0 * ms, many: 1.9 * ms}, Z2: {few: ms, many: ms},
                    Z3: {few: 2 * ms, many: 5 * ms}}}
    got = {(r.mode, r.group_size): r for r in dp_unit_overhead(measured)}
    # The line through (6, 2.0 ms) and (24, 3.8 ms): 0.1 ms a tensor, 1.4 ms a unit.
    assert got[R, 4].per_tensor_s == pytest.approx(0.1 * ms)
    assert got[R, 4].per_unit_s == pytest.approx(1.4 * ms)
    assert got[R, None] == dataclasses.replace(got[R, 4], group_size=None)  # the whole node
    assert got[DPMode.ZERO1, 2].per_unit_s == got[R, 2].per_unit_s  # ZeRO-1 runs replicate units
    # A noisy probe that falls with size: the non-negative least-squares line is flat at
    # the two readings' mean (not the smaller unit's reading, not a negative slope).
    assert got[Z3, 4].per_tensor_s == 0 and got[Z3, 4].per_unit_s == pytest.approx(3 * ms)
    assert got[Z2, 4].per_tensor_s == 0 and got[Z2, 4].per_unit_s == pytest.approx(3 * ms)
    assert got[Z3, 2].per_unit_s == pytest.approx(ms) and \
        got[Z3, 2].per_tensor_s == pytest.approx(ms / 6)
    # The spec's lookup: the group size measured, else the whole node's, else zeros.
    tables = CalibrationTables(dp_overheads=tuple(got.values()))
    assert tables.dp_overhead(Z3, 2) is got[Z3, 2]
    assert tables.dp_overhead(Z3, 8) is got[Z3, None]
    assert CalibrationTables().dp_overhead(Z3, 2).seconds(10) == 0.0


def test_dp_unit_figures_that_rise_steeply_go_through_the_origin():
    """Readings proportional to the tensor count: the non-negative least-squares line
    through both points (no per-unit part the probe resolves), not the line through the
    smaller unit with its intercept clipped to 0 (which over-prices that unit)."""
    few, many = (6, 160), (24, 640)
    measured = {2: {R: {few: 2e-3, many: 3e-3}, Z2: {few: 2e-3, many: 3e-3},
                    Z3: {few: 1e-3, many: 10e-3}}}
    got = {(r.mode, r.group_size): r for r in dp_unit_overhead(measured)}
    assert got[Z3, 2].per_unit_s == 0.0
    assert got[Z3, 2].per_tensor_s == pytest.approx((6 * 1e-3 + 24 * 10e-3) / (36 + 576))


def test_dp_unit_figures_are_kept_as_measured_whatever_the_collectives_cost():
    """The probe's readings are CPU time outside the unit's collectives
    (`dp_unit_probe.dp_unit_seconds`), so no collective price is taken out: readings of 1.0
    and 1.9 ms at 6 and 24 tensors give 0.7 ms a unit + 0.05 ms a tensor (0.9 / 18), the
    line through them. (The fit once took the probe's priced all-reduce, 2 alpha + the
    blocking wait, out of wall-clock readings; at latency-bound sizes that left 0 per
    unit.) A negative reading (noise: the thread clock's pairs can dip below 0 on a
    unit that costs nothing) counts as 0."""
    ms = 1e-3
    few, many = (6, 160), (24, 640)
    measured = {2: {R: {few: 1.0 * ms, many: 1.9 * ms}, Z2: {few: -0.1 * ms, many: -0.2 * ms},
                    Z3: {few: 1.0 * ms, many: 1.0 * ms}}}
    got = {(r.mode, r.group_size): r for r in dp_unit_overhead(measured)}
    assert got[R, 2].per_unit_s == pytest.approx(0.7 * ms)
    assert got[R, 2].per_tensor_s == pytest.approx(0.05 * ms)
    assert got[R, 2].seconds(12) == pytest.approx(0.7 * ms + 12 * 0.05 * ms)
    assert got[Z2, 2].per_unit_s == 0.0 and got[Z2, 2].per_tensor_s == 0.0
    assert got[Z3, 2].per_unit_s == pytest.approx(ms) and got[Z3, 2].per_tensor_s == 0.0


def test_blocking_wait_leaves_out_the_priced_call():
    ms = 1e-3
    small, large = BLOCKING_PROBE_SIZES
    fits = {(c, n): CollectiveFit(c, "intra_node", 0.1 * ms, 1e9, n)
            for c in COLLECTIVES for n in (2, 4)}
    measured = {4: {"all_gather": [(small, 2.0 * ms), (large, 2.0 * ms)],
                    "send_recv": [(small, 3.0 * ms), (large, 3.0 * ms)],
                    "broadcast": [(small, 0.0), (large, 0.0)]},
                2: {"all_gather": [(small, 1.0 * ms), (large, 1.0 * ms)]}}
    waits = blocking_wait(measured, fits)
    got = {f"{r.collective}@{r.group_size}": r for r in waits}
    link = Link(0.1 * ms, 1e9, False)
    # What the probe call took beyond the fitted price of its message at that group size:
    # the same reading at both sizes leaves a wait that falls as the price rises, which
    # the non-negative line takes as a constant (the mean of the two).
    for key, n, seconds in (("all_gather@4", 4, 2 * ms), ("all_gather@2", 2, ms)):
        mean = seconds - (all_gather_s(small, n, link) + all_gather_s(large, n, link)) / 2
        assert got[key].seconds == pytest.approx(mean) and got[key].seconds_per_byte == 0.0
    # Send/recv is between a pair whatever the world; a call faster than its price waits 0.
    assert got["send_recv@2"].seconds == pytest.approx(
        3 * ms - (send_recv_s(small, link) + send_recv_s(large, link)) / 2)
    assert got["broadcast@4"].at(large) == 0.0
    spec = get_cluster("local").with_calibration(blocking_waits=waits)
    assert ClusterSpec.from_json(spec.to_json()) == spec
    assert spec.to_dict()["blocking_wait_s"] == {k: r.seconds for k, r in got.items()}
    assert spec.calibration.blocking_wait_seconds("all_gather", 4) == got["all_gather@4"].seconds
    assert spec.calibration.blocking_wait_seconds("all_gather", 8) == 0.0  # not measured


def test_blocking_wait_is_the_line_through_two_sizes():
    """Synthetic readings: fitted price + (0.3 ms + bytes / 200 MB/s) of wait at two sizes
    gives that line back; the lookup answers for any message size."""
    small, large = BLOCKING_PROBE_SIZES
    fit = CollectiveFit("all_reduce", "intra_node", 50e-6, 2e9, 2)
    link = Link(fit.alpha_s, fit.bytes_per_s, False)
    fixed_s, per_byte_s = 0.3e-3, 1 / 200e6
    measured = {2: {"all_reduce": [(n, ring_all_reduce_s(n, 2, link) + fixed_s + n * per_byte_s)
                                   for n in (large, small)]}}  # any order
    (wait,) = blocking_wait(measured, {("all_reduce", 2): fit})
    assert wait.seconds == pytest.approx(fixed_s) and wait.seconds_per_byte == pytest.approx(
        per_byte_s)
    tables = CalibrationTables(blocking_waits=(wait,))
    assert tables.blocking_wait_seconds("all_reduce", 2, 4e6) == pytest.approx(
        fixed_s + 4e6 * per_byte_s)
    # A wait below the price at the small size reads 0 there: the line goes through the
    # origin (least squares through both points), never a negative intercept.
    measured[2]["all_reduce"] = [(small, 0.0), (large, ring_all_reduce_s(large, 2, link) + 1e-3)]
    (wait,) = blocking_wait(measured, {("all_reduce", 2): fit})
    assert wait.seconds == 0.0 and wait.seconds_per_byte == pytest.approx(
        large * 1e-3 / (small ** 2 + large ** 2))
    with pytest.raises(PlannerError, match="readings at two message sizes"):
        blocking_wait({2: {"all_reduce": [(small, 1e-3)]}}, {("all_reduce", 2): fit})


def test_a_spec_with_one_blocking_wait_number_loads_as_a_constant():
    """Specs written before the per-byte line hold one number per key: a constant wait;
    a per-byte entry without its zero-byte one is refused, naming the key."""
    data = get_cluster("local").to_dict()
    del data["blocking_wait_s_per_byte"]
    data["blocking_wait_s"] = {"all_reduce@2": 5e-4}
    spec = ClusterSpec.from_dict(data)
    assert spec.calibration.blocking_waits == (BlockingWait("all_reduce", 2, 5e-4, 0.0),)
    assert spec.calibration.blocking_wait_seconds("all_reduce", 2, 16 * 2**20) == 5e-4
    with pytest.raises(PlannerError, match="key 'all_reduce@4' has no blocking_wait_s entry"):
        ClusterSpec.from_dict({**data, "blocking_wait_s_per_byte": {"all_reduce@4": 1e-9}})
    with pytest.raises(PlannerError, match=r"blocking_wait_s_per_byte\[all_reduce@2\] must be"):
        ClusterSpec.from_dict({**data, "blocking_wait_s_per_byte": {"all_reduce@2": -1e-9}})


def test_dp_unit_figures_add_a_per_parameter_part_from_the_wide_unit():
    """The probe's narrow units (6 and 24 tensors of 8-wide blocks: 160 and 640 parameters)
    give the per-unit and per-tensor line; its wide unit (6 tensors of a 256-wide block)
    the part that grows with the unit's parameters (FSDP2's copies of parameters and
    gradients: 2 gloo ranks read 1.40 ms a 24-tensor unit of 640 parameters and 5.0 ms
    one of 528K, 2026-11-26). Here 3.0 ms at 6 tensors and 100,160 parameters against
    1.0 ms at 160: 2 ms over 100,000 parameters, 20 ns each; none without a wide unit."""
    ms = 1e-3
    measured = {2: {R: {(6, 160): 1.0 * ms, (24, 640): 1.9 * ms, (6, 100_160): 3.0 * ms},
                    Z2: {(6, 160): 1.0 * ms, (24, 640): 1.9 * ms, (6, 100_160): 0.5 * ms},
                    Z3: {(6, 160): 1.0 * ms, (24, 640): 1.9 * ms}}}
    got = {(r.mode, r.group_size): r for r in dp_unit_overhead(measured)}
    assert got[R, 2].per_unit_s == pytest.approx(0.7 * ms)
    assert got[R, 2].per_tensor_s == pytest.approx(0.05 * ms)
    assert got[R, 2].per_param_s == pytest.approx(20e-9)
    assert got[R, 2].seconds(12, 50_000) == pytest.approx(0.7 * ms + 0.6 * ms + 1.0 * ms)
    assert got[Z2, 2].per_param_s == 0.0  # a wide unit read below the narrow: noise, none
    assert got[Z3, 2].per_param_s == 0.0
    # the spec file keeps it (older specs without the key read 0)
    tables = CalibrationTables(dp_overheads=tuple(got.values()))
    data = json.loads(get_cluster("local").with_calibration(
        dp_overheads=tables.dp_overheads).to_json())
    assert data["dp_param_overhead_s"]["replicate@2"] == pytest.approx(20e-9)
    assert ClusterSpec.from_dict(data).calibration.dp_overhead(R, 2) == got[R, 2]
    # a key only the per-parameter table lists is refused, not dropped
    with pytest.raises(PlannerError, match="key 'replicate@4' has no dp_unit_overhead_s"):
        ClusterSpec.from_dict({**data, "dp_param_overhead_s": {"replicate@4": 9e-9}})
    del data["dp_param_overhead_s"]
    assert ClusterSpec.from_dict(data).calibration.dp_overhead(R, 2).per_param_s == 0.0
