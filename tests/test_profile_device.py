"""`planner profile-device`: a CPU run writes a spec the other commands accept, the kernel
tables round-trip through JSON and reject bad data, `gemm_efficiency` reads them back,
and the h100-80g preset carries the committed H100 measurement."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

import torch

from cost_models import profile_device as pd
from cost_models.clusters import H100_CALIBRATION_PATH, get_cluster
from cost_models.compute import gemm_efficiency as analytic_gemm_efficiency
from cost_models.fresh_output import FRESH_OUTPUT_BYTES, fresh_pool_bytes
from cost_models.host_excess import HOST_EXCESS_OPS
from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.kernel_calibration import (APART_MEMORY_KERNELS, MEMORY_KERNELS, GemmPoint,
                                   KernelCalibration)
from planner.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# The kit's timer for the module's one profile: batches of >= 0.5 ms (not 2) and the
# median of 3 (`profile_device.MIN_BATCHES`, not 7), and one tied-sum round (not 3): the
# tests below check the spec's structure, units and plausible ranges (wide enough for a
# busy host), not a measured value. The timer's own median and batch sizing keep their
# test (test_seconds_per_call_...); grid timing took ~23 of the fixture's ~37 s of CPU
# time here at the kit's own settings (load ~14, 2026-11-26).
TEST_MIN_BATCH_S = 0.5e-3
TEST_BATCHES = pd.MIN_BATCHES
TEST_TIED_PROBE_ROUNDS = 1
# The in-sequence chains' median of 3 rounds, not 9 (`sequence_probes.SEQUENCE_ROUNDS`):
# 30 chains of 9 rounds were ~2.9 of the profile's ~19 s of CPU here (load 1.7,
# 2026-11-26); the test reads only the fitted figures' ranges, decades wide.
TEST_SEQUENCE_ROUNDS = 3
# One untimed call before the timer's sizing call, not 3 (`profile_device.WARMUP_CALLS`):
# at 64 MiB a memory point is ~10-20 ms a call, and its 3 batches of one call then ran
# after 4 untimed ones; the median of 3 and the ranges above do not need them.
TEST_WARMUP_CALLS = 1


@pytest.fixture(scope="module")
def cpu_spec_path(tmp_path_factory, shared_cpu_probes):
    """One real CPU profile (the small grid, one thread, the test timer above) for the
    whole module; its per-pass host, checkpoint and pipeline-action probes are conftest's
    one real run each (~15-40 s of the profile; profile-cluster's test reads them too),
    which device_spec writes into the spec as it would its own."""
    from cost_models import device_spec, sequence_probes, tied_sync

    path = tmp_path_factory.mktemp("profile") / "spec.json"
    # Its wall time is a benchmark's target (bench/bench_profile_device.py), not a test's.
    with pytest.MonkeyPatch.context() as patch:
        for name, probe in shared_cpu_probes.items():
            patch.setattr(device_spec, name, probe)
        patch.setattr(pd, "MIN_BATCH_S", TEST_MIN_BATCH_S)
        patch.setattr(pd, "BATCHES", TEST_BATCHES)
        patch.setattr(pd, "WARMUP_CALLS", TEST_WARMUP_CALLS)
        patch.setattr(tied_sync, "TIED_PROBE_ROUNDS", TEST_TIED_PROBE_ROUNDS)
        patch.setattr(sequence_probes, "SEQUENCE_ROUNDS", TEST_SEQUENCE_ROUNDS)
        assert main(["profile-device", "--device", "cpu", "--out", str(path)]) == 0
    return path


def test_cpu_profile_writes_a_spec_with_every_table(cpu_spec_path):
    spec = ClusterSpec.load(cpu_spec_path)
    cal = spec.kernel_calibration
    assert spec.device == "cpu" and spec.host_bound and spec.matmul_efficiency == 1.0
    # which CPU measured it: a shared VM moves between hosts (the model name, not "x86_64")
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), None)
    assert model and cal.measured_on.startswith(f"{model}, ")
    # Forward and backward per-op host costs, measured apart, with their spread noted.
    assert 0 < spec.op_overhead_s < 1e-3 and 0 < spec.backward_op_overhead_s < 1e-3
    assert f"bwd {spec.backward_op_overhead_s * 1e6:.2f} us" in spec.notes and "spread" in spec.notes
    # the forward figure is the median of the probe's rounds, their range recorded
    assert 0 < cal.op_overhead_min_s <= spec.op_overhead_s <= cal.op_overhead_max_s
    # ... both net of the autograd engine's start, which the kit records for the step to add
    # once per backward call (cost_models.step_host); ~9 us here, under a backward's ms
    assert 1e-7 < cal.autograd_call_host_s < 1e-3
    assert 1e-6 < cal.pipeline_action_host_s < 1e-3  # torch pipelining's runtime per action
    assert 1e-5 < cal.train_loop_host_s < 5e-3  # the executor's own loop (planner side)
    # Every grid shape once per CPU dtype, at a plausible rate for one core (0.1 GFLOP/s to
    # 10 TFLOP/s: a unit slip of 1e3 either way lands outside).
    shapes = {(p.m, p.n, p.k) for p in cal.gemm}
    assert shapes == set(pd.CPU_GEMM_SHAPES)
    assert {p.dtype for p in cal.gemm} == set(pd.CPU_GEMM_DTYPES)
    assert all(1e8 < p.flop_per_s < 1e13 for p in cal.gemm)
    # ... and again in each layout a layer runs (cost_models.gemm_layouts), in float32
    from cost_models.gemm_layouts import LAYOUT_SHAPES
    from ir.kernel_calibration import GEMM_LAYOUT_TABLES
    for field in GEMM_LAYOUT_TABLES.values():
        points = getattr(cal, field)
        assert {(p.m, p.n, p.k) for p in points} == set(LAYOUT_SHAPES), field
        assert all(p.dtype == "float32" and 1e8 < p.flop_per_s < 1e13 for p in points)
    # Peak per dtype is the best measured rate of that dtype.
    for dtype, peak in spec.peak_flops_by_dtype:
        assert peak == cal.best_gemm(dtype).flop_per_s
    # Each memory-bound kernel at each size; bandwidth from the best large copy or add.
    grid = [p for p in cal.memory_kernels if p.kernel not in APART_MEMORY_KERNELS]
    assert {(p.kernel, p.nbytes >= 1) for p in grid} == {(k, True) for k in MEMORY_KERNELS}
    large = sum(n > pd.CPU_SMALL_ONLY_MAX_BYTES for n in pd.CPU_MEMORY_BYTES)
    assert len(grid) == len(MEMORY_KERNELS) * len(pd.CPU_MEMORY_BYTES) \
        - len(pd.CPU_SMALL_ONLY_KINDS) * large
    # The fresh-output probe (cost_models.fresh_output) stored its points in the spec.
    fresh = [p for p in cal.memory_kernels if p.kernel == "fresh_output"]
    assert fresh and {p.nbytes for p in fresh} <= set(FRESH_OUTPUT_BYTES)
    assert cal.fresh_output_pool_bytes == fresh_pool_bytes() > 0  # the pool it rotated over
    # The per-op-kind cold-code probe (op_cold_probe): the reference and each kind, < 1 ms
    cold_kinds = {p.kind for p in cal.op_cold_code}
    assert {"reference", "gemm", "log_softmax_backward", "layer_norm_backward"} <= cold_kinds
    assert all(0 <= p.seconds < 1e-3 for p in cal.op_cold_code)
    streams = [p.gbps for p in cal.memory_kernels if p.kernel in ("copy", "add")
               and p.nbytes >= pd.HBM_MIN_MOVED_BYTES["cpu"]]
    assert spec.hbm_gbps == max(streams) and 0.1 < spec.hbm_gbps < 1e4
    # SDPA: the math path runs everywhere, and so does the dispatcher's own choice.
    assert {"math", "default"} <= {p.backend for p in cal.sdpa}
    assert all(p.forward_s > 0 and p.backward_s > 0 for p in cal.sdpa)
    assert 1e-8 < cal.launch_host_s < 1e-3 and cal.launch_device_s == 0.0
    assert cal.sustained_gemm_flop_per_s == 0.0  # no preheat on CPUs
    # Convolutions: every grid shape, each pass at a positive time, under a second each.
    assert [(p.batch, p.in_channels, p.out_channels, p.spatial, p.kernel)
            for p in cal.conv] == list(pd.CPU_CONV_SHAPES)
    assert all(0 < t < 1.0 for p in cal.conv
               for t in (p.forward_s, p.input_backward_s, p.weight_backward_s))
    # Embedding backward per index: a scatter-add of a 64-wide row, ns to us on one core.
    assert 1e-10 < cal.embedding_backward_index_s < 1e-5
    # Embedding bag: per call (beyond a dispatch) and per id, both passes.
    assert 0 < cal.embedding_bag_call_s < 1e-3 and 0 < cal.embedding_bag_backward_call_s < 1e-3
    assert 0 <= cal.embedding_bag_index_s < 1e-5 and 0 <= cal.embedding_bag_backward_index_s < 1e-5
    # The forward host cost in parts, measured by the same probe as op_overhead_s.
    # (the per-op figure is a residual after the chain's excess and autograd nodes: a few
    # tenths of a us here, 0 when a loaded host's excess probe ran slow, as CI saw once)
    assert 0 <= cal.forward_host_op_s < 1e-3 and 0 < cal.view_host_op_s < 1e-3
    assert 0 <= cal.module_call_host_s < 1e-3
    # What ops pay in sequence among distinct ones, per op per distinct op up to the knee
    # and beyond it (sequence_probes: ~250-400 ns up to 2-4, 40-90 ns beyond, here; the
    # knee below the chains' most, 48). Fitted slopes of in-order less tight-loop times,
    # floored at 0: 0 where a loaded host's two runs came out alike (the term then adds 0).
    assert 0 <= cal.in_sequence_low_op_host_s < 1e-5
    assert 0 <= cal.in_sequence_op_host_s < 1e-6
    assert 0 <= cal.in_sequence_knee_distinct_ops < 48
    # A forward started after a layer's work (cold_entry_probes: ~4 us per layer + ~2 per
    # cold op here), both written, both >= 0 (the fit clamps), under 1 ms.
    assert 0 <= cal.cold_entry_host_s < 1e-3 and 0 <= cal.cold_op_host_s < 1e-3
    assert cal.cold_entry_host_s + cal.cold_op_host_s > 0
    assert 0 <= cal.cold_entry_after_backward_host_s < 1e-3  # a step's first layer's
    # A backward run after a block's backward (cold_backward_probes: ~1.2 us per cold op,
    # ~0.6 per composite's inner op here), both written, >= 0 (the fit clamps), under 1 ms.
    assert 0 <= cal.cold_backward_op_host_s < 1e-3
    assert 0 <= cal.cold_backward_inner_op_host_s < 1e-3
    assert cal.cold_backward_op_host_s + cal.cold_backward_inner_op_host_s > 0
    # A forward op given a Python number (scalar_operand_probes: ~1.2 us a call on a float
    # tensor, ~0.5 on an int64 one here), both written, under 20 us.
    assert 0 < cal.scalar_operand_float_host_s < 20e-6
    assert 0 <= cal.scalar_operand_int_host_s < 20e-6
    # The backward in parts (views, other ops, autograd nodes) and the per-call excess of
    # every listed op (exact GELU's backward: microseconds on any CPU; the others >= 0).
    assert 0 < cal.backward_view_host_op_s < 1e-3 and 0 < cal.backward_nonview_host_op_s < 1e-3
    assert 0 <= cal.backward_node_host_s < 1e-3
    # + F.embedding_bag's Python per forward _embedding_bag (item_probes), microseconds
    assert {p.op for p in cal.host_op_excess} == {*HOST_EXCESS_OPS, "aten::_embedding_bag"}
    assert 0 <= cal.host_excess_s("aten::_embedding_bag") < 1e-3
    assert 0 < cal.host_excess_s("aten::gelu_backward") < 1e-3
    # SAC's dispatch modes per op (checkpoint_probes: ~11 us forward, ~7 in the recompute
    # here, 2026-11-25), which a GPU kit writes too
    assert 0 < cal.selective_forward_op_s < 1e-3 and 0 < cal.selective_recompute_op_s < 1e-3


def test_estimate_plan_accept_the_profiled_spec(capsys, cpu_spec_path):
    code, out, err = run(capsys, "estimate", "gpt-tiny", "--cluster", str(cpu_spec_path),
                         "--json")
    assert code == 0, err
    assert json.loads(out)["iteration_seconds"] > 0
    code, out, err = run(capsys, "plan", "gpt-tiny", "--cluster", str(cpu_spec_path),
                         "--global-batch", "4", "--json")
    assert code == 0, err


def test_spec_round_trips_through_json(cpu_spec_path, tmp_path):
    spec = ClusterSpec.load(cpu_spec_path)
    assert ClusterSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    copy = tmp_path / "copy.json"
    spec.save(copy)
    assert ClusterSpec.load(copy) == spec
    hash(spec)  # still frozen and hashable with the tables inside
    # A spec without tables writes no key for them (older readers see what they saw).
    assert "kernel_calibration" not in get_cluster("a100-80g").to_dict()


def _with_calibration(edit):
    data = get_cluster("h100-80g").to_dict()
    edit(data["kernel_calibration"])
    return data


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["gemm"][0].update(flop_per_s=-1.0), "flop_per_s must be a number > 0"),
    (lambda c: c["gemm"][0].update(m=0), "m must be a positive integer"),
    (lambda c: c["gemm"][0].update(extra=1), "unexpected keyword argument 'extra'"),
    (lambda c: c["memory_kernels"][0].update(kernel="memset"), "unknown kernel"),
    (lambda c: c["sdpa"][0].update(backend="fast"), "unknown backend"),
    (lambda c: c["sdpa"][0].update(causal="yes"), "causal must be true or false"),
    (lambda c: c.update(gemm={"m": 1}), "kernel_calibration.gemm must be a list"),
    (lambda c: c.update(launch_host_s=-1e-6), "launch_host_s must be a number >= 0"),
    (lambda c: c.update(colour="blue"), "unknown field 'colour'"),
])
def test_bad_tables_name_the_field_and_file(tmp_path, edit, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_with_calibration(edit)))
    with pytest.raises(PlannerError) as err:
        ClusterSpec.load(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_bad_spec_is_one_line_and_exit_2_from_the_cli(capsys, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_with_calibration(lambda c: c["gemm"][0].update(dtype=""))))
    code, _, err = run(capsys, "estimate", "gpt-tiny", "--cluster", str(path))
    assert code == 2 and err.count("\n") == 1 and "dtype must be a non-empty string" in err


def test_bad_cli_input(capsys, tmp_path, monkeypatch):
    assert main(["profile-device", "--device", "tpu"]) == 2  # argparse: not a device we measure
    assert capsys.readouterr().err.count("\n") == 1
    code, _, err = run(capsys, "profile-device", "--device", "cpu", "--out", str(tmp_path))
    assert code == 2 and "is a folder" in err
    code, _, err = run(capsys, "profile-device", "--device", "cpu", "--out",
                       str(tmp_path / "missing" / "spec.json"))
    assert code == 2 and "does not exist" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only host
    code, _, err = run(capsys, "profile-device", "--device", "cuda")
    assert code == 2 and "no CUDA device is visible" in err and err.count("\n") == 1


def test_gemm_efficiency_reads_the_nearest_measured_shape():
    cal = KernelCalibration(measured_on="test", gemm=(
        GemmPoint(1024, 1024, 1024, "bfloat16", 1e14),
        GemmPoint(16, 8192, 8192, "bfloat16", 1e13),
        GemmPoint(8192, 8192, 8192, "bfloat16", 4e14)))  # above peak: capped at 1
    spec = ClusterSpec.from_dict({**get_cluster("a100-80g").to_dict(),
                                  "kernel_calibration": cal.to_dict()})
    peak = spec.peak_flops("bfloat16")
    assert pd.gemm_efficiency(spec, 1024, 1024, 1024, "bfloat16") == 1e14 / peak
    assert pd.gemm_efficiency(spec, 1200, 900, 1024, "bfloat16") == 1e14 / peak
    assert pd.gemm_efficiency(spec, 8, 8192, 8192, "bfloat16") == 1e13 / peak
    assert pd.gemm_efficiency(spec, 8192, 8192, 8192, "bfloat16") == 1.0
    # No float32 table: the analytic default at the square GEMM of equal intensity; a
    # square n^3 product is its own equivalent (edge 3n^3 / 3n^2 = n).
    assert pd.gemm_efficiency(spec, 512, 512, 512, "float32") == pytest.approx(
        analytic_gemm_efficiency(512, spec.device, spec.matmul_efficiency))
    edge = 3 * 16 * 4096 * 4096 / (16 * 4096 + 4096 * 4096 + 16 * 4096)
    assert pd.gemm_efficiency(spec, 16, 4096, 4096, "float32") == pytest.approx(
        analytic_gemm_efficiency(edge, spec.device, spec.matmul_efficiency))
    with pytest.raises(PlannerError, match="positive integers"):
        pd.gemm_efficiency(spec, 0, 4, 4, "bfloat16")
    with pytest.raises(PlannerError, match="no peak FLOP/s for int8"):
        pd.gemm_efficiency(spec, 4, 4, 4, "int8")


def test_h100_preset_carries_the_committed_measurement():
    spec = get_cluster("h100-80g")
    cal = spec.kernel_calibration
    assert "H100" in cal.measured_on
    best = cal.best_gemm("bfloat16")
    # REFERENCES.md: ~790-800 TFLOP/s measured on an 8192^3 bf16 product on one H100.
    assert 700e12 < best.flop_per_s < spec.peak_flops("bfloat16")
    assert {"flash_attention", "math"} <= set(cal.sdpa_backends)
    assert 0 < cal.launch_device_s < cal.launch_host_s
    assert 0 < cal.sustained_gemm_flop_per_s <= cal.burst_gemm_flop_per_s * 1.05
    # The preset's own figures stay the datasheet's; the tables and the host's framework
    # seconds per op (an eager step's host is not free: bench_gpu_validate) were added.
    measured = ClusterSpec.load(H100_CALIBRATION_PATH)
    assert spec.hbm_gbps == 3350.0 and spec.op_overhead_s == measured.op_overhead_s > 0


def test_seconds_per_call_times_the_threads_work_not_its_waits():
    """CPU probes read the thread's CPU time (`host_probes.probe_clock`): 2 ms of spinning
    counts about 2 ms whatever else holds the cores, a 2 ms sleep next to nothing."""
    def spin(_):
        end = time.thread_time() + 0.002
        while time.thread_time() < end:
            pass

    assert 0.002 <= pd.seconds_per_call(spin, "cpu") < 0.004
    assert pd.seconds_per_call(lambda i: time.sleep(0.002), "cpu") < 0.001


@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny", "cnn-small", "dlrm-small"])
def test_cpu_gemm_grid_covers_the_zoo_shapes_within_2x(model):
    """Every GEMM a zoo layer runs at micro-batches 1 and 16 with at least
    CPU_GEMM_MIN_FLOPS has a CPU table shape within 2x in each of m, n, k (so
    `nearest_gemm` never prices a skinny product as a square)."""
    import math

    import torch

    from cost_models.kernel_time import _token_scaled_gemm
    from ir.kernel_records import KernelKind
    from planner.models import load_layer_graph

    for micro_batch in (1, 16):
        graph = load_layer_graph(model, micro_batch=micro_batch, dtype=torch.float32)
        tokens = graph.micro_batch * (graph.seq_len or 1)
        for layer in graph.layers:
            for record in (layer.kernels.forward + layer.kernels.backward) if layer.kernels else ():
                if record.kind is not KernelKind.GEMM:
                    continue
                m, n, k = _token_scaled_gemm(record.shape, 1.0, tokens, 1.0)
                if 2 * m * n * k < pd.CPU_GEMM_MIN_FLOPS:
                    continue  # dispatch-bound: priced by the per-op overhead, not a rate
                assert any(all(abs(math.log2(a / b)) <= 1.0 for a, b in zip((m, n, k), shape))
                           for shape in pd.CPU_GEMM_SHAPES), (model, layer.name, (m, n, k))


def test_gemm_rate_between_two_grid_shapes_is_their_geometric_mean():
    """(512, 64, 64) lies halfway in log2 between measured (512, 32, 64) at 1e10 FLOP/s
    and (512, 128, 64) at 4e10: both are equally near, so the rate is sqrt(1e10 * 4e10) =
    2e10 (the log-space midpoint), not whichever point sorts first. A measured shape reads
    its own rate."""
    from ir.kernel_calibration import GemmPoint, KernelCalibration

    cal = KernelCalibration(measured_on="test", gemm=(
        GemmPoint(512, 32, 64, "float32", 1e10), GemmPoint(512, 128, 64, "float32", 4e10),
        GemmPoint(4096, 4096, 4096, "float32", 9e10)))
    assert cal.gemm_flop_per_s(512, 64, 64, "float32") == pytest.approx(2e10)
    assert cal.gemm_flop_per_s(512, 128, 64, "float32") == 4e10
    assert cal.gemm_flop_per_s(512, 64, 64, "bfloat16") is None
    spec = dataclasses.replace(get_cluster("local"), peak_flops_by_dtype=(("float32", 1e11),),
                               kernel_calibration=cal)
    assert pd.gemm_efficiency(spec, 512, 64, 64, "float32") == pytest.approx(0.2)


def test_fastest_points_keeps_the_least_disturbed_reading_per_point():
    """Two passes over one grid: per point the higher rate wins (a shared host only slows
    kernels down), in the first pass's order; points differ by shape, kernel and size."""
    from ir.gemm_table import fastest_points
    from ir.kernel_calibration import GemmPoint, MemoryKernelPoint

    first = [GemmPoint(64, 64, 64, "float32", 5e10), GemmPoint(8, 8, 512, "float32", 1e9)]
    second = [GemmPoint(8, 8, 512, "float32", 3e9), GemmPoint(64, 64, 64, "float32", 2e10)]
    assert fastest_points(first, second) == [first[0], second[0]]
    copy_a = [MemoryKernelPoint("copy", "float32", 2**20, 20.0),
              MemoryKernelPoint("copy", "float32", 2**25, 10.0)]
    copy_b = [MemoryKernelPoint("copy", "float32", 2**25, 40.0),
              MemoryKernelPoint("copy", "float32", 2**20, 15.0)]
    assert fastest_points(copy_a, copy_b) == [copy_a[0], copy_b[0]]


def test_item_probes_measure_the_draw_dropout_makes_and_a_per_index_scatter():
    """The draw is timed at dropout's keep probability (0.9: a CPU's draw costs depend on
    it, see the constant), per element at a plausible rate; the scatter's per-index
    seconds are a slope, positive and below a microsecond."""
    from cost_models import item_probes

    assert item_probes.DROPOUT_KEEP_PROBABILITY == 0.9
    per_element_s = item_probes.probe_random_element_s("cpu")
    assert 1e-11 < per_element_s < 1e-6
    assert 0 < item_probes.probe_embedding_backward("cpu", "float32") < 1e-6


def test_embedding_bag_probe_is_a_line_through_two_id_counts(monkeypatch):
    """The probe's line: slope (t(512) - t(8)) / 504 per id, intercept t(8) - 8 x slope
    less the dispatch, floored at MIN_DEVICE_SHARE of t(8); fed made-up timings (forward
    10 then 20 us, then 8 ids as one bag 8.5 us, through `seconds_per_call`; on a CPU the
    backward 12 then 300 us and a tiny add 0.6 us through `cpp_calls.seconds_per_cpp_call`,
    the backward's dispatch being that add's, not the forward's `dispatch_s`): a one-bag
    forward 10 - 8.5 = 1.5 us less."""
    from cost_models import conv_probes, cpp_calls, item_probes, profile_device

    times = iter([10e-6, 20e-6, 8.5e-6])  # forward per count, then one bag
    monkeypatch.setattr(profile_device, "seconds_per_call", lambda fn, device: (
        fn(0), next(times))[1])
    backward = iter([12e-6, 300e-6])

    def cpp_timer(loops):
        assert set(loops) == {"op", "reference"}
        for loop in loops.values():
            loop(2)  # they run
        return {"op": next(backward), "reference": 0.6e-6}

    monkeypatch.setattr(cpp_calls, "seconds_per_cpp_call", cpp_timer)
    cost = item_probes.probe_embedding_bag("cpu", "float32", dispatch_s=2e-6)
    fwd_slope, bwd_slope = 10e-6 / 504, 288e-6 / 504
    assert cost.index_s == pytest.approx(fwd_slope)
    assert cost.call_s == pytest.approx(10e-6 - 8 * fwd_slope - 2e-6)
    assert cost.backward_index_s == pytest.approx(bwd_slope)
    assert cost.backward_call_s == pytest.approx(max(12e-6 - 8 * bwd_slope - 0.6e-6,
                                                     conv_probes.MIN_DEVICE_SHARE * 12e-6))
    assert cost.multi_bag_s == pytest.approx(1.5e-6)


def test_a_backward_op_timed_from_cpp_leaves_out_python_argument_parsing():
    """A backward formula calls `_embedding_bag_backward` from C++; through `torch.ops`
    from Python its 12 arguments cost ~4 us more a call (here: 10.7 against 6.7 us at 8
    ids, a tiny add 0.87 against 0.61; thread clock, load 6.5, 2026-11-26). The C++ loop
    reads the op well below the Python call and well above a tiny add (the loop is not
    optimised away); fastest of 3 rounds each, so a slow spell of a shared host does not
    decide it."""
    import torch

    from cost_models import cpp_calls
    from cost_models.host_probes import probe_clock

    aten, rows, count = torch.ops.aten, 128, 8
    weight = torch.randn(rows, 16)
    index, offsets = torch.randint(0, rows, (count,)), torch.arange(0, count, 2)
    out, offset2bag, bag_size, max_indices = aten._embedding_bag(
        weight, index, offsets, False, 0, False, None, False, -1)
    args = (torch.randn(out.shape), index, offsets, offset2bag, bag_size, max_indices, rows)
    clock, calls, python_s = probe_clock("cpu"), 200, []
    for _ in range(3):
        start = clock()
        for _ in range(calls):
            aten._embedding_bag_backward(*args[:6], rows, False, 0, False, None, -1)
        python_s.append((clock() - start) / calls)
    cpp = [cpp_calls.seconds_per_cpp_call(cpp_calls.bag_backward_loops(*args))
           for _ in range(3)]
    op_s, add_s = min(c["op"] for c in cpp), min(c["reference"] for c in cpp)
    assert 3 * add_s < op_s < 0.85 * min(python_s)


def test_embedding_bag_python_probe_is_the_functional_less_what_its_calls_price(monkeypatch):
    """`probe_embedding_bag_python_s`: per round, F.embedding_bag's seconds per call less
    torch.embedding_bag's and less what the layer's records price its other calls at
    (the offsets' arange, the ids' clone and view: `priced_calls_s`), not their own time
    from Python, which is more (1.27 + 1.48 us against 1.61 priced, 2026-11-26: the
    difference went unpriced, dlrm's tables' forwards 15-26% under); the median over
    rounds: made-up 16 and 8.6 us per call, 1.6 priced, give 5.8 us; calls cheaper than
    their parts give 0, not a negative price."""
    from cost_models import host_probes, item_probes

    def clock_reading(per_call_us):
        ticks = iter(t for _ in range(item_probes.EMBEDDING_BAG_PYTHON_ROUNDS)
                     for us in per_call_us
                     for t in (0.0, us * 1e-6 * item_probes.EMBEDDING_BAG_PYTHON_CALLS))
        return lambda device: (lambda: next(ticks))

    monkeypatch.setattr(host_probes, "probe_clock", clock_reading((16, 8.6)))
    assert item_probes.probe_embedding_bag_python_s("cpu", 1.6e-6) == pytest.approx(5.8e-6)
    monkeypatch.setattr(host_probes, "probe_clock", clock_reading((10, 8.6)))
    assert item_probes.probe_embedding_bag_python_s("cpu", 1.6e-6) == 0.0


def test_cpu_conv_grid_measures_the_zoo_convolutions_exactly():
    """Every convolution cnn-small runs at micro-batches 1, 4 and 16 is a CPU grid point
    (oneDNN's time per FLOP is not monotone in the batch there: no interpolation)."""
    import torch

    from ir.kernel_records import KernelKind
    from planner.models import load_layer_graph

    grid = {(b, c_in, c_out, spatial * spatial, kernel * kernel)
            for b, c_in, c_out, spatial, kernel in pd.CPU_CONV_SHAPES}
    seen = set()
    for micro_batch in (1, 4, 16):
        graph = load_layer_graph("cnn-small", micro_batch=micro_batch, dtype=torch.float32)
        for layer in graph.layers:
            for record in layer.kernels.forward + layer.kernels.backward:
                if record.kind is KernelKind.CONV:
                    groups, batch, c_in, c_out, positions, area, _ = record.shape
                    seen.add((groups, batch, c_in, c_out, positions, area))
    assert {(1, 3), (1, 16)} <= {(s[0], s[2]) for s in seen} and len(seen) == 6
    assert {s[1:] for s in seen} <= grid


def test_quick_gpu_grid_still_measures_past_the_l2():
    """`profile-device --device cuda --quick` failed on an H100 (2026-11-25): its two
    sizes (1 and 16 MiB) stayed inside the 50 MB L2, so no copy gave the spec's HBM rate."""
    from cost_models.profile_device import HBM_MIN_MOVED_BYTES, memory_sizes

    for quick in (False, True):
        assert max(memory_sizes("cuda", quick)) >= HBM_MIN_MOVED_BYTES["cuda"]
    assert len(memory_sizes("cuda", True)) < len(memory_sizes("cuda", False))
