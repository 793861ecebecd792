"""A GPU gets a preset's figures only by the exact name torch reports for that board,
and its host's per-op figure is the median of repeated readings with their range, read
again by `planner validate` before a run (review of 2026-11-25: any "GH200" took h200's
figures, an H100 PCIe the SXM board's; the H100 host read 19.4/25.4/33.2 us an op on
three loans)."""

import dataclasses
import statistics
from types import SimpleNamespace

import pytest
import torch

from cost_models import clusters, device_spec
from cost_models.clusters import get_cluster, preset_for_device
from cost_models.host_probes import HostOpCost


def test_presets_map_by_the_exact_device_name():
    assert preset_for_device("NVIDIA H100 80GB HBM3") == "h100-80g"
    assert preset_for_device("NVIDIA A100-SXM4-40GB") == "a100-40g"
    assert preset_for_device("NVIDIA A100-SXM4-80GB") == "a100-80g"
    assert preset_for_device("NVIDIA H200") == "h200"
    # other boards of the same chips: other clocks, power, HBM and links
    assert preset_for_device("NVIDIA H100 PCIe") is None
    assert preset_for_device("NVIDIA GH200 480GB") is None
    assert preset_for_device("NVIDIA H200 NVL") is None
    assert preset_for_device("NVIDIA A100 80GB PCIe") is None


READINGS_S = [30e-6, 20e-6, 25e-6]  # one fake pass of the host probe
# one fake reading of the per-kind probe (`host_probes.host_op_seconds_by_pass`)
HOST_KINDS = HostOpCost(30e-6, 20e-6, (29e-6, 31e-6), (19e-6, 21e-6), 49, 192,
                        function_op_s=28e-6, module_call_s=9e-6, view_op_s=3e-6,
                        backward_view_op_s=1.5e-6, backward_nonview_op_s=27e-6,
                        backward_node_s=6e-6, function_nograd_op_s=26e-6,
                        view_nograd_op_s=1.5e-6, forward_node_s=4e-6, parts_measured=True)


def _gpu_spec(monkeypatch, capsys, name: str):
    """spec_from_calibration's GPU branch on a fake device called `name`, fed the
    committed H100 tables (their copies pass the HBM threshold)."""
    props = SimpleNamespace(name=name, total_memory=96 * 2**30)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(clusters, "host_op_rounds_s", lambda device: list(READINGS_S))
    sac = SimpleNamespace(calibration_fields=lambda: {})
    monkeypatch.setattr(device_spec, "checkpoint_host_seconds", lambda device: sac)
    monkeypatch.setattr(device_spec, "host_op_seconds_by_pass", lambda device: HOST_KINDS)
    cal = get_cluster("h100-80g").kernel_calibration
    spec = device_spec.spec_from_calibration("cuda", cal, "profiled")
    return spec, capsys.readouterr().err


def test_a_gpu_without_a_preset_says_so_and_takes_its_own_peaks(monkeypatch, capsys):
    spec, err = _gpu_spec(monkeypatch, capsys, "NVIDIA GH200 480GB")
    assert err.strip() == ("no preset for 'NVIDIA GH200 480GB': peak FLOP/s = best measured, "
                           "links from h100-80g's")
    assert "no preset for 'NVIDIA GH200 480GB'" in spec.notes
    h200 = get_cluster("h200")
    assert spec.peak_flops_by_dtype != h200.peak_flops_by_dtype and spec.matmul_efficiency == 1
    cal = spec.kernel_calibration
    assert spec.peak_flops("bfloat16") == cal.best_gemm("bfloat16").flop_per_s


def test_a_named_gpu_takes_its_preset_and_the_host_figure_is_a_median_with_range(
        monkeypatch, capsys):
    spec, err = _gpu_spec(monkeypatch, capsys, "NVIDIA H100 80GB HBM3")
    assert err == ""
    assert spec.peak_flops_by_dtype == get_cluster("h100-80g").peak_flops_by_dtype
    passes = READINGS_S * device_spec.HOST_PROBE_PASSES
    assert spec.op_overhead_s == statistics.median(passes) == 25e-6
    cal = spec.kernel_calibration
    assert (cal.op_overhead_min_s, cal.op_overhead_max_s) == (20e-6, 30e-6)
    assert "host 25.00 us an op (median of 9 rounds, 20.00-30.00" in spec.notes


def test_a_gpu_spec_carries_the_host_per_kind(monkeypatch, capsys):
    """profile-device --device cuda records the per-kind host figures as the CPU kit does
    (`HostOpCost.calibration_fields`), the single per-op figure kept beside them."""
    spec, _ = _gpu_spec(monkeypatch, capsys, "NVIDIA H100 80GB HBM3")
    cal = spec.kernel_calibration
    assert (cal.view_host_op_s, cal.forward_host_op_s, cal.module_call_host_s,
            cal.forward_node_host_s) == (1.5e-6, 26e-6, 9e-6, 4e-6)
    assert (cal.backward_view_host_op_s, cal.backward_nonview_host_op_s,
            cal.backward_node_host_s) == (1.5e-6, 27e-6, 6e-6)
    assert spec.op_overhead_s == 25e-6
    assert "per view 1.50 us, per op 26.00" in spec.notes


def test_validate_rereads_the_host_figure_on_a_gpu(monkeypatch):
    from planner.commands.validate import drift_line
    from planner.trial import predict

    gpu = get_cluster("h100-80g")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert predict.host_op_reading(gpu) is None  # a GPU spec, no GPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    devices = []
    monkeypatch.setattr(predict, "host_op_rounds_s",
                        lambda device: devices.append(device) or list(READINGS_S))
    reading = predict.host_op_reading(gpu)
    assert devices == ["cuda"] and reading == (gpu.op_overhead_s, 25e-6)
    slowdown = predict.machine_slowdown(reading)
    assert slowdown == pytest.approx(25e-6 / gpu.op_overhead_s)
    line = drift_line(slowdown, 0.3, reading)
    assert f"(25.00 us an op here now, {gpu.op_overhead_s * 1e6:.2f} in the spec)" in line
    # a CPU spec is read on the CPU, and not where the run takes the GPUs
    assert predict.host_op_reading(dataclasses.replace(gpu, device="cpu")) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = dataclasses.replace(gpu, device="cpu")
    assert predict.host_op_reading(cpu) == (cpu.op_overhead_s, 25e-6)
    assert devices[-1] == "cpu"
