"""`planner estimate`, `planner memory` and `planner profile-cluster` end to end."""

from __future__ import annotations

import dataclasses
import json

import pytest

import torch

from cost_models.estimate import estimate
from ir.cluster import ClusterSpec, collective_ceiling_bytes_per_s
from ir.plan import uniform_plan
from ir.strategy import DPMode, Precision
from planner.models import load_layer_graph
from planner.cli import main
from tests.layer_graphs import commands_trace_once


@pytest.fixture(scope="module", autouse=True)
def trace_once():
    """Each zoo model the commands here trace, traced once (`commands_trace_once`)."""
    with commands_trace_once():
        yield


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_estimate_json_contract(capsys):
    code, out, _ = run(capsys, "estimate", "gpt-tiny", "--cluster", "h100-80g", "--tp", "2",
                       "--pp", "2", "--micro-batch", "2", "--global-batch", "16", "--json")
    assert code == 0
    d = json.loads(out)
    for key, kind in [("iteration_seconds", float), ("samples_per_second", float),
                      ("tflops_per_device", float), ("mfu", float)]:
        assert isinstance(d[key], kind)
    assert set(d["time"]) >= {"compute", "tp_comm", "dp_comm", "pp_comm", "bubble"}
    mem = d["memory"]
    assert isinstance(mem["peak_bytes"], int) and isinstance(mem["device_bytes"], int)
    assert mem["fits"] is True and len(mem["stages"]) == 2
    stage = mem["stages"][0]
    assert isinstance(stage["stage"], int) and isinstance(stage["peak_bytes"], int)
    assert set(stage["breakdown"]) == {"params", "grads", "optimizer", "activations",
                                       "buffers", "overhead"}
    assert sum(stage["breakdown"].values()) == stage["peak_bytes"]
    assert d["world_size"] == 8  # dp defaults to world / (tp * pp) = 2
    assert sum(d["time"].values()) == pytest.approx(d["iteration_seconds"])


def test_estimate_table_and_local_default_precision(capsys):
    code, out, _ = run(capsys, "estimate", "gpt-tiny")
    assert code == 0
    assert "fp32" in out.splitlines()[0]  # local: CPU, fp32 by default
    assert "iteration" in out and "MFU" in out and "fits:" in out


def test_memory_json_chart_and_does_not_fit(capsys, tmp_path):
    chart = tmp_path / "memory.png"
    code, out, _ = run(capsys, "memory", "gpt3-175b", "--cluster", "a100-80g", "--tp", "8",
                       "--chart", str(chart))
    assert code == 0 and chart.stat().st_size > 1000
    assert "does not fit: needs " in out and "GiB of 80.0 GiB on stage 0" in out
    assert "--pp 8 --nodes 8" in out  # what would make it fit
    code, out, _ = run(capsys, "memory", "gpt-tiny", "--cluster", "a100-80g", "--json")
    d = json.loads(out)
    assert set(d) >= {"peak_bytes", "device_bytes", "fits", "stages"}


@pytest.mark.parametrize("argv, message", [
    (["estimate", "gpt-tiny", "--cluster", "h100"], "unknown cluster 'h100'"),
    (["estimate", "gpt-tiny", "--tp", "3"], "--tp 3 x --pp 1 = 3 does not divide"),
    (["estimate", "gpt-tiny", "--cluster", "h100-80g", "--tp", "8"],
     "does not divide heads=4: use a TP degree in [1, 2, 4]"),
    (["estimate", "gpt-tiny", "--cluster", "h100-80g", "--dp", "16"], "add --nodes"),
    (["estimate", "gpt-tiny", "--cluster", "h100-80g", "--sequence-parallel"],
     "--sequence-parallel needs --tp > 1"),
    (["estimate", "gpt-tiny", "--cluster", "h100-80g", "--global-batch", "12"],
     "--global-batch 12 is not a multiple of --dp 8"),
    (["estimate", "gpt-tiny", "--cluster", "h100-80g", "--micro-batch", "0"],
     "--micro-batch must be >= 1"),
    (["estimate", "gpt-tiny", "--schedule", "interleaved"], "needs --pp > 1"),
    (["estimate", "gpt-tiny", "--plan", "missing.json"], "does not exist"),
    (["estimate", "--plan", "missing.json", "--tp", "2"], "--tp cannot be combined with --plan"),
    (["estimate"], "name a MODEL"),
    (["estimate", "nosuchmodel"], "unknown model"),
    (["memory", "gpt-tiny", "--cluster", "missing.json"], "cannot read cluster spec"),
])
def test_cli_errors_are_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert err.startswith("planner: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_plan_file_is_priced(capsys, tmp_path):
    from cost_models.clusters import get_cluster
    from ir.plan import PlanDocument, save_plan, uniform_plan
    from planner.models import load_layer_graph

    graph = load_layer_graph("gpt-tiny")
    cluster = get_cluster("h100-80g")
    plan = uniform_plan(len(graph.layers), tp=2, dp=4, zero=3, global_batch=8)
    doc = PlanDocument(plan, graph.model, graph.fingerprint, tuple(l.name for l in graph.layers),
                       cluster.to_dict())
    path = tmp_path / "plan.json"
    save_plan(doc, path)
    code, out, err = run(capsys, "estimate", "--plan", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["world_size"] == 8


# The ranks' host probes at fewer steps for this test (medians of 7, not 20; of 3 blocking
# rounds, not 7): the DP units' steps were ~36% of a rank's time and the TP/SP module and
# selective probes' ~27% (2 ranks, load ~15, 2026-11-26). What the test reads of them is
# structure and signs; the DP units' sum > 0 is FSDP2's hooks, ~0.4 ms a unit against
# a plain stack (dp_unit_probe._added_step_s), far outside a 7-step median's noise. The
# optimizer probe, whose DTensor > plain > 0 order is checked, keeps its own steps.
FEWER_STEPS = 7
FEWER_BLOCKING_ROUNDS = 3
CLUSTER_TEST_SETTINGS = {("cost_models.dp_unit_probe", "DP_UNIT_STEPS"): FEWER_STEPS,
                         ("cost_models.tp_probes", "TP_PROBE_STEPS"): FEWER_STEPS,
                         ("cost_models.block_probes", "TP_PROBE_STEPS"): FEWER_STEPS,
                         ("cost_models.collective_probes", "BLOCKING_PROBE_ROUNDS"):
                             FEWER_BLOCKING_ROUNDS}


def test_profile_cluster_spec_is_accepted_by_estimate(capsys, tmp_path, monkeypatch,
                                                      shared_cpu_probes):
    # The per-pass host, checkpoint and pipeline-action probes are conftest's one real
    # run each (profile-device and other files read them too): ~15-40 s of this test's
    # parent side; their readings still go through profile_cluster into the spec below.
    import cost_models.profile_cluster as profile_cluster
    from forked_settings import start_ranks_with

    for name, probe in shared_cpu_probes.items():
        monkeypatch.setattr(profile_cluster, name, probe)
    start_ranks_with(monkeypatch, profile_cluster, CLUSTER_TEST_SETTINGS)
    spec_path = tmp_path / "spec.json"
    # up to 4 MiB: below ~1 MiB the largest gloo messages are still latency-bound on a
    # busy host and the bandwidth is not in the data (profile-cluster refuses to guess)
    code, out, err = run(capsys, "profile-cluster", "--nproc", "2", "--max-bytes", "4M",
                         "--out", str(spec_path))
    assert code == 0, err
    spec = ClusterSpec.load(spec_path)
    assert spec.world_size == 2 and spec.device == "cpu"
    tables = spec.calibration
    assert {f.collective for f in tables.collective_fits} == {
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"}
    ceiling = collective_ceiling_bytes_per_s(spec.hbm_gbps)
    assert all(0 < f.bytes_per_s <= ceiling and f.alpha_s >= 0 for f in tables.collective_fits)
    # Host figures a CPU spec measures: per-op and DTensor overhead, DP units, cores.
    assert spec.op_overhead_s > 0 and spec.dtensor_op_overhead_s > 0 and spec.host_cores >= 1
    # Backward per-op host cost, measured apart (not the op_overhead_s fallback).
    assert spec.backward_op_overhead_s is not None and 0 < spec.backward_op_overhead_s < 1e-3
    # The executor's own training loop, which the command adds (planner.train_loop_probe).
    assert 1e-5 < spec.kernel_calibration.train_loop_host_s < 5e-3
    assert {(r.mode, r.group_size) for r in tables.dp_overheads} == {
        (mode, size) for mode in DPMode for size in (None, 2)}
    assert tables.dp_overhead(DPMode.ZERO3, 2) == dataclasses.replace(
        tables.dp_overhead(DPMode.ZERO3), group_size=2)  # 2 = the node
    assert sum(r.per_unit_s + r.per_tensor_s for r in tables.dp_overheads) > 0
    assert [r.group_size for r in tables.tp_modules] == [2]
    assert [r.group_size for r in tables.sp_groups] == [2]  # tp_probes.sp_group_seconds
    assert all(r.seconds >= 0 for r in tables.sp_groups)
    # vocab_probes and tp_probes.selective_seconds: two rows each (forward/backward; module/group)
    for field, rows in (("vocab_embedding", tables.vocab_embeddings),
                        ("loss_parallel", tables.loss_parallels),
                        ("selective", tables.tp_selectives)):
        assert len(rows) == 2 and {r.group_size for r in rows} == {2}, field
        assert all(r.seconds >= 0 for r in rows), field
    # The wait of a blocking call between computing processes, per collective; send/recv
    # between the pair.
    assert {(r.collective, r.group_size) for r in tables.blocking_waits} == {
        (c, 2) for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                         "send_recv")}
    # The optimizer step per tensor, every optimizer, plain and on DTensors; the DTensor
    # loop dispatches through DTensor on every op, so it costs more.
    assert {(r.optimizer, r.on_dtensor) for r in tables.optimizer_steps} == {
        (name, on_dtensor) for name in ("adamw", "adam", "sgd", "sgd-momentum")
        for on_dtensor in (False, True)}
    assert tables.optimizer_seconds_per_tensor("adamw", on_dtensor=True) > \
        tables.optimizer_seconds_per_tensor("adamw", on_dtensor=False) > 0
    code, out, err = run(capsys, "estimate", "gpt-tiny", "--cluster", str(spec_path),
                         "--micro-batch", "2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["world_size"] == 2 and d["time"]["optimizer"] > 0
    # DDP on two processes: the DP units' host overhead is in the compute time. A unit's
    # figures are >= 0; 0 where the priced collectives (blocking wait included) hold its
    # whole reading (host_overhead_fit.dp_unit_overhead), and then it adds nothing.
    single = ClusterSpec.from_dict({**spec.to_dict(), "dp_unit_overhead_s": {},
                                    "dp_tensor_overhead_s": {}, "dp_param_overhead_s": {}})
    graph = load_layer_graph("gpt-tiny", micro_batch=2, dtype=torch.float32)
    plan = uniform_plan(len(graph.layers), global_batch=4, dp=2, precision=Precision.FP32)
    assert all(r.per_unit_s >= 0 and r.per_tensor_s >= 0 for r in tables.dp_overheads)
    replicate = tables.dp_overhead(DPMode.REPLICATE, 2)
    with_units = estimate(graph, plan, spec).time.compute
    without = estimate(graph, plan, single).time.compute
    assert with_units >= without
    assert (with_units > without) == (replicate.per_unit_s + replicate.per_tensor_s
                                      + replicate.per_param_s > 0)


@pytest.mark.parametrize("argv", [
    ("gpt-tiny", "--cluster", "h100-80g", "--tp", "2", "--pp", "2", "--micro-batch", "2",
     "--global-batch", "16", "--checkpoint", "selective", "--sequence-parallel"),
    ("llama-tiny", "--cluster", "a100-80g", "--dp", "8", "--checkpoint", "full",
     "--global-batch", "16"),
])
def test_compute_by_kernel_class_adds_up_to_compute(capsys, argv):
    """`estimate --json`'s compute_by_class splits the critical rank's compute: every part
    >= 0, their sum the compute line; GEMMs and memory-bound kernels both there, and the
    recomputation a checkpointing plan pays."""
    code, out, _ = run(capsys, "estimate", *argv, "--json")
    assert code == 0
    d = json.loads(out)
    parts = d["compute_by_class"]
    assert all(v >= 0 for v in parts.values()), parts
    assert sum(parts.values()) == pytest.approx(d["time"]["compute"], rel=1e-9)
    assert parts["gemm"] > 0 and parts["memory"] > 0 and parts["recompute"] > 0
    # 2 micro-batches a replica: the second adds into the first's gradients
    assert parts["accumulation"] > 0
    code, out, _ = run(capsys, "estimate", *argv)
    assert "  GEMMs" in out and "  recomputation" in out
