"""CPU offload (ZeRO-Offload): executed, priced, searched where only it fits, serialized.

(a) a plan mixing offloaded ZeRO-3 layers with plain ZeRO-3/ZeRO-2 ones, on 2 gloo ranks,
    equals single-device training (tests/test_exec_plans.py's harness and tolerances);
(b) the PCIe copies and the host optimizer step of one layer, pinned to hand-computed
    values of the formulas of cost_models/offload.py (Ren et al. 2021's data flow);
(c) llama3-8b on two A100-40GB: no plan fits without offload, the search offloads, and
    the memory report shows the host bytes;
(d) a plan with offloaded layers survives its JSON round trip; old plans load.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from cost_models.clusters import get_cluster
from cost_models.comm import layer_comm
from cost_models.common import StepConfig
from cost_models.compute import layer_compute
from cost_models.estimate import estimate
from cost_models.memory import plan_memory
from cost_models.model_states import bytes_per_param
from cost_models.offload import host_step_seconds
from ir.errors import PlannerError
from ir.plan import PlanDocument, plan_from_dict, plan_to_dict
from ir.strategy import Checkpoint, DPMode, LayerStrategy, Precision, Stage
from planner.models import load_layer_graph
from planner.search import search
from planner.search_space import SearchOptions

from dist_utils import spawn
from test_exec_plans import (GPT, assert_matches_reference, batches_of, graph_of,
                             per_layer_plan, reference)
from tests.layer_graphs import layer_graph


def offload_mix(graph):
    """dp=2 in 2 micro-batches: odd layers offloaded ZeRO-3, layer 2 ZeRO-2, the rest ZeRO-3."""
    n = len(graph.layers)
    strategies = tuple(
        LayerStrategy(dp=2, dp_mode=DPMode.ZERO2) if j == 2 else
        LayerStrategy(dp=2, dp_mode=DPMode.ZERO3, offload=j % 2 == 1,
                      checkpoint=Checkpoint.FULL if j == 3 else Checkpoint.NONE)
        for j in range(n))
    return per_layer_plan((Stage(0, n - 1, 2),), strategies, num_microbatches=2)


# ------------------------------------------------------------------------- (a) execution


def train_and_report(rank: int, world_size: int, payload: list) -> dict:
    """Each entry on every rank: losses, final parameters (rank 0) and which FSDP2 units
    hold their shards offloaded."""
    from torch.distributed.fsdp import FSDPModule

    from executors import apply, full_state_dict
    from test_exec_plans import build_model, optimizer_kwargs

    out = {}
    for name, spec, plan, graph, batches in payload:
        model, loss_fn = build_model(spec)
        pm = apply(model, plan, graph, loss_fn=loss_fn, optimizer=torch.optim.AdamW,
                   optimizer_kwargs=optimizer_kwargs())
        groups = [m._get_fsdp_state()._fsdp_param_group for m in model.modules()
                  if isinstance(m, FSDPModule)]
        offloaded = [all(p.offload_to_cpu for p in g.fsdp_params) for g in groups if g]
        on_host = {id(p.sharded_param) for g in groups if g for p in g.fsdp_params
                   if p.offload_to_cpu}
        # per optimizer param group: (holds offloaded shards, holds others, steps fused)
        steps = [(any(id(p) in on_host for p in g["params"]),
                  any(id(p) not in on_host for p in g["params"]), bool(g.get("fused")))
                 for g in pm.optimizer.param_groups]
        losses = [pm.train_step(inputs, target) for inputs, target in batches]
        state = full_state_dict(pm)
        out[name] = {"losses": losses, "state": state if rank == 0 else None,
                     "offloaded": offloaded, "steps": steps}
    return out


@pytest.fixture(scope="module")
def offload_runs() -> dict:
    graph = graph_of(GPT)
    fp32 = offload_mix(graph)
    bf16 = dataclasses.replace(fp32, precision=Precision.BF16_MIXED)
    bf16_plain = dataclasses.replace(bf16, layer_strategies=tuple(
        dataclasses.replace(s, offload=False) for s in bf16.layer_strategies))
    payload = [(name, GPT, plan, graph, batches_of(GPT))
               for name, plan in (("fp32", fp32), ("bf16", bf16), ("bf16-plain", bf16_plain))]
    return spawn(train_and_report, 2, payload, timeout_s=240)[0]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_offloaded_plan_matches_single_device(offload_runs):
    plan = offload_mix(graph_of(GPT))
    got = offload_runs["fp32"]
    # every layer holds parameters and is one FSDP2 unit; the offloaded ones hold CPU shards
    assert got["offloaded"] == [s.offload for s in plan.layer_strategies]
    assert_matches_reference(got, *reference(GPT))


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_offloaded_shards_step_with_fused_cpu_adamw(offload_runs):
    """What cost_models/offload.py prices: the host shards step in torch's fused CPU
    AdamW; the device-resident ones keep the optimizer as the user built it."""
    for name in ("fp32", "bf16"):
        steps = offload_runs[name]["steps"]
        assert any(host for host, _, _ in steps), name
        for host, other, fused in steps:
            assert not (host and other), steps  # never mixed in one group
            assert fused == host, steps
    assert all(not fused for _, _, fused in offload_runs["bf16-plain"]["steps"])


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_offload_under_bf16_mixed_equals_the_same_plan_without(offload_runs):
    """MixedPrecisionPolicy casts the fp32 shard to bf16 after the H2D copy either way, so
    offloading changes where states live, not the forward and backward arithmetic; only
    the host shards' AdamW runs torch's fused kernel, which rounds its last bits
    differently from the single-tensor one (fp32 relative error ~1e-7 per step)."""
    got, plain = offload_runs["bf16"], offload_runs["bf16-plain"]
    assert any(got["offloaded"]) and not any(plain["offloaded"])
    torch.testing.assert_close(got["losses"], plain["losses"], rtol=1e-6, atol=0)
    for name, tensor in plain["state"].items():
        torch.testing.assert_close(got["state"][name], tensor, rtol=1e-6, atol=1e-7,
                                   msg=name)


def test_offload_policy_is_fsdp2_cpu_offload():
    from torch.distributed.fsdp import CPUOffloadPolicy

    from executors.data_parallel import offload_policy

    assert isinstance(offload_policy(LayerStrategy(dp=2, dp_mode=DPMode.ZERO3, offload=True)),
                      CPUOffloadPolicy)
    assert not isinstance(offload_policy(LayerStrategy(dp=2, dp_mode=DPMode.ZERO3)),
                          CPUOffloadPolicy)


# ------------------------------------------------------------------------- (b) pricing


# A GPT block of hidden 1024: 12 h^2 + 13 h = 12,596,224 parameters (Narayanan et al. 2021).
BLOCK = "gpt:layers=2,hidden=1024,heads=16,vocab=1024,seq=128"
BLOCK_PARAMS = 12 * 1024**2 + 13 * 1024


def test_offload_time_formulas_match_hand_computed_values():
    """Ren et al. 2021 sec. 4.2: the fp32 shard crosses PCIe before each all-gather and its
    gradient after the reduce-scatter; the CPU Adam step streams 7 x 4 bytes per element
    over the node's host memory bus, shared by its ranks. a100-40g: PCIe Gen4 x16
    (16 GT/s x 16 lanes x 128/130 / 8 = 31.51 GB/s), 2 x 8 channels of DDR4-3200
    (409.6 GB/s), 8 GPUs per node. One GPT block at dp 8: a 1,574,528-parameter shard."""
    cluster = get_cluster("a100-40g")
    assert cluster.pcie_gbps == pytest.approx(31.5077, rel=1e-4)
    assert cluster.host_memory_gbps == pytest.approx(409.6)
    layer = load_layer_graph(BLOCK, micro_batch=1, seq_len=128).layers[1]
    assert layer.params == BLOCK_PARAMS and not layer.tied_params
    off = LayerStrategy(dp=8, dp_mode=DPMode.ZERO3, offload=True)
    plain = dataclasses.replace(off, offload=False)
    config = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="float32",
                        precision=Precision.BF16_MIXED, optimizer="adamw", seq_len=None,
                        device_type="cuda")
    per_param = bytes_per_param(config.precision, config.optimizer)
    shard_bytes = BLOCK_PARAMS / 8 * 4  # fp32 shard: 6,298,112 B
    pcie_s = shard_bytes / 31.5077e9
    assert pcie_s == pytest.approx(199.89e-6, rel=1e-4)
    a, b = layer_comm(layer, off, cluster, config, per_param), \
        layer_comm(layer, plain, cluster, config, per_param)
    assert a.dp_forward_s - b.dp_forward_s == pytest.approx(pcie_s, rel=1e-4)  # H2D, forward
    assert a.dp_backward_s - b.dp_backward_s == pytest.approx(pcie_s, rel=1e-4)  # H2D, backward
    assert a.dp_step_s - b.dp_step_s == pytest.approx(pcie_s, rel=1e-4)  # D2H of the gradient
    # Host Adam: 1,574,528 x 28 B over 409.6 / 8 = 51.2 GB/s per rank = 861.07 us.
    host_s = BLOCK_PARAMS / 8 * 28 / (409.6e9 / 8)
    assert host_s == pytest.approx(861.07e-6, rel=1e-4)
    assert host_step_seconds(layer, off, cluster, "adamw") == pytest.approx(host_s, rel=1e-9)
    # SGD's host shards step foreach (DTensor runs no fused SGD): 8 streams with momentum
    assert host_step_seconds(layer, off, cluster, "sgd-momentum") == pytest.approx(
        host_s * 8 / 7, rel=1e-9)
    # The layer's optimizer time is that host step (plus per-op dispatch, which the GPU
    # presets do not price: op_overhead_s = 0) instead of the device's HBM-bound step
    # (1,574,528 x 28 B / 1.6 TB/s = 27.6 us).
    assert cluster.op_overhead_s == 0
    assert layer_compute(layer, off, cluster, config).optimizer_s == pytest.approx(host_s)
    assert layer_compute(layer, plain, cluster, config).optimizer_s < host_s / 10
    # Without the host figures the formulas have nothing to divide by: not offered, and
    # an offloaded plan on such a spec is an error that names the missing fields.
    bare = dataclasses.replace(cluster, pcie_gbps=0.0)
    assert not bare.offload_known and cluster.offload_known
    with pytest.raises(PlannerError, match="pcie_gbps"):
        layer_comm(layer, off, bare, config, per_param)


# ------------------------------------------------------------- (c) fits only with offload


@pytest.fixture(scope="module")
def llama8b():
    return layer_graph("llama3-8b", micro_batch=1, seq_len=None)


def test_llama8b_on_two_a100_40g_fits_only_with_offload(llama8b):
    """8.0e9 parameters hold 16 B each under mixed AdamW in the executor (fp32 weights,
    fp32 gradients, 2 fp32 moments): ZeRO-3 over 2 GPUs leaves 64 GB per GPU of a 40 GB
    device; offloaded, those 128 GB sit in the node's 1 TB of host memory."""
    cluster = get_cluster("a100-40g").with_nodes(devices_per_node=2)
    options = SearchOptions(precision=Precision.BF16_MIXED, optimizer="adamw")
    without = search(llama8b, dataclasses.replace(cluster, pcie_gbps=0.0), 2, options,
                     with_baselines=False)
    assert without.best is None
    found = search(llama8b, cluster, 2, options, with_baselines=False)
    assert found.best is not None
    plan = found.best.plan
    offloaded = [s for s in plan.layer_strategies if s.offload]
    assert offloaded and all(s.dp_mode is DPMode.ZERO3 for s in offloaded)
    memory = plan_memory(llama8b, plan, cluster)
    assert memory.fits
    host = max(s.host_bytes for s in memory.stages)
    # at least the offloaded layers' 16 B / parameter over 2 ranks sits on the host
    assert host > 0.5 * 16 * sum(l.params for l in llama8b.layers) / 2
    assert memory.to_json()["stages"][0]["host_bytes"] == memory.stages[0].host_bytes
    # The estimate prices what offload costs: host step and PCIe copies make it slower
    # than the same plan without offload (which does not fit).
    est = estimate(llama8b, plan, cluster)
    plain = dataclasses.replace(plan, layer_strategies=tuple(
        dataclasses.replace(s, offload=False) for s in plan.layer_strategies))
    est_plain = estimate(llama8b, plain, cluster)
    assert est.iteration_seconds > est_plain.iteration_seconds
    assert not est_plain.memory.fits


def test_host_memory_is_a_wall(llama8b):
    """The same offloaded plan on a node with too little host memory does not fit."""
    cluster = get_cluster("a100-40g").with_nodes(devices_per_node=2)
    plan = search(llama8b, cluster, 2, SearchOptions(), with_baselines=False).best.plan
    small = dataclasses.replace(cluster, host_memory_bytes=64 * 2**30)
    memory = plan_memory(llama8b, plan, small)
    assert memory.peak_bytes <= memory.device_bytes and not memory.fits
    assert "host memory" in memory.shortfall()


# --------------------------------------------------------------------- (d) representation


def test_offload_strategy_validation_and_str():
    s = LayerStrategy(tp=1, dp=4, dp_mode=DPMode.ZERO3, offload=True)
    assert str(s) == "tp1·dp4·z3·off"
    with pytest.raises(ValueError, match="zero3"):
        LayerStrategy(dp=4, dp_mode=DPMode.ZERO2, offload=True)


def test_plan_json_round_trip_with_offload():
    graph = graph_of(GPT)
    plan = offload_mix(graph)
    doc = PlanDocument(plan, "gpt-tiny", graph.fingerprint, tuple(l.name for l in graph.layers),
                       {"name": "local"})
    data = json.loads(json.dumps(plan_to_dict(doc)))
    assert [layer["offload"] for layer in data["layers"]] == [s.offload for s in
                                                              plan.layer_strategies]
    assert plan_from_dict(data).plan == plan
    for layer in data["layers"]:  # a plan written before offload existed loads unchanged
        del layer["offload"]
    old = plan_from_dict(data).plan
    assert old.layer_strategies == tuple(dataclasses.replace(s, offload=False)
                                         for s in plan.layer_strategies)


def test_cli_says_offload_is_needed_and_shows_host_bytes(capsys, tmp_path):
    """`planner plan` refuses without offload and names the knob; with it, the plan's
    strategy table marks the offloaded layers and `planner memory` has a host column."""
    from planner.cli import main

    argv = ["plan", "llama3-8b", "--cluster", "a100-40g", "--gpus-per-node", "2",
            "--global-batch", "2"]
    assert main([*argv, "--no-offload"]) == 2
    assert "allow CPU offload (drop --no-offload)" in capsys.readouterr().err
    out = tmp_path / "plan.json"
    assert main([*argv, "--out", str(out)]) == 0
    assert "3+off" in capsys.readouterr().out
    assert main(["memory", "--plan", str(out)]) == 0
    text = capsys.readouterr().out
    assert "host GiB" in text and "offloaded to host memory" in text
