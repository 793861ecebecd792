"""The host cost of activation checkpointing: its probe's counts, its price, old specs.

Prices are derived by hand from round made-up probe figures (`PROBED`); the counts the
probe divides by and the layer IR's saved-tensor count are checked against independent
counts taken on real modules."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cost_models.checkpoint_probes import (PROBE_TENSOR_BYTES, SIZED_TENSOR_BYTES, ChainCounts,
                                          CheckpointHostCost, _chains, _counts, _input,
                                          _runner, cached_mode_ops, checkpoint_extra_seconds,
                                          rerun_ops)
from cost_models.clusters import get_cluster
from cost_models.common import StepConfig
from cost_models.compute import layer_compute
from ir.cluster import ClusterSpec
from ir.kernel_calibration import KernelCalibration
from ir.kernel_records import KernelKind, KernelRecord, KernelRecords
from ir.layer import Layer, LayerMeasurement
from ir.strategy import Checkpoint, LayerStrategy, Precision
from tests.cpu_specs import one_process_with_host_figures

US = 1e-6

# Made-up probe figures, in microseconds, round so the sums below read off by hand.
PROBED = KernelCalibration(
    measured_on="made up for the test",
    checkpoint_call_forward_s=30 * US, checkpoint_call_recompute_s=20 * US,
    checkpoint_op_forward_s=1 * US, checkpoint_op_recompute_s=2 * US,
    checkpoint_saved_forward_s=3 * US, checkpoint_saved_recompute_s=5 * US,
    selective_call_s=40 * US, selective_forward_op_s=8 * US,
    selective_forward_kept_op_s=12 * US, selective_recompute_op_s=7 * US)
NEW_FIELDS = tuple(f for f in PROBED.to_dict() if f.startswith(("checkpoint_", "selective_")))


def cpu(calibration: KernelCalibration | None) -> ClusterSpec:
    """One CPU process (host share 1): a forward op 4 us, a backward op 2 us."""
    return one_process_with_host_figures(calibration)


def block(**counts) -> Layer:
    """Forward: 2 tiny matmuls (2x8 @ 8x8, kept by SELECTIVE), one GELU over 1 MB, 2 views:
    5 ops, 4 tensors saved; `counts`: further `LayerMeasurement` counts."""
    forward = (KernelRecord("aten::mm", KernelKind.GEMM, "float32", (1, 2, 8, 8), 2,
                            saved_under_selective=True),
               KernelRecord("aten::gelu", KernelKind.MEMORY, "float32", (512, 512), 1,
                            activation_bytes=2**20),
               KernelRecord("aten::view", KernelKind.VIEW, "float32", (), 2))
    backward = (KernelRecord("aten::gelu_backward", KernelKind.MEMORY, "float32", (512, 512),
                             1, activation_bytes=2**20),)
    return Layer(name="blocks.0", kind="Block", index=0, params=0, param_bytes=0,
                 tp_params=0, input_bytes=64, output_bytes=64, structural_hash="x",
                 measured=LayerMeasurement(ops_fwd=5, ops_bwd=1, saved_tensors_fwd=4,
                                           kernels=KernelRecords(forward, backward),
                                           **counts))


# 3 of the 4 saves require grad; the last op runs after the last save (early stop)
EARLY_STOP = dict(saved_grad_tensors_fwd=3, ops_after_last_save_fwd=1)


CONFIG = StepConfig(micro_batch=1, graph_micro_batch=1, graph_dtype="float32",
                    precision=Precision.FP32, device_type="cpu")


def priced(spec, mode):
    return layer_compute(block(), LayerStrategy(checkpoint=mode), spec, CONFIG)


def test_the_machinery_prices_per_call_op_and_saved_tensor():
    """FULL forward: call 30 + 5 ops x 1 + 4 saved x 3 = 47 us; recompute: 20 + 5 x 2 +
    4 x 5 = 50 us. SELECTIVE adds half its call (20) to each pass; forward: 2 kept ops x
    12 + 3 other ops x 8 = 24 + 24, so 47 + 20 + 48 = 115 us; recompute: every op (5) x 7
    through the cached mode: 50 + 20 + 35 = 105 us. NONE adds nothing."""
    layer = block()
    assert checkpoint_extra_seconds(layer, Checkpoint.FULL, PROBED) == pytest.approx(
        (47 * US, 50 * US))
    assert checkpoint_extra_seconds(layer, Checkpoint.SELECTIVE, PROBED) == pytest.approx(
        (115 * US, 105 * US))
    assert checkpoint_extra_seconds(layer, Checkpoint.NONE, PROBED) == (0.0, 0.0)


def test_layer_compute_adds_the_machinery_on_a_probed_cpu_spec():
    """On one CPU process host and kernels add. The plain forward F = GELU's kernel + 5
    ops x 4 us. FULL: forward F + 47 us, recompute F + 50 us (the layer's forward again,
    no DP unit here). SELECTIVE: forward F + 115 us; the recompute reruns every op's host
    dispatch (5 x 4 us) and the recomputed kernels (GELU, not the kept matmuls: each
    moves (2x8 + 8x8 + 2x8) x 4 B = 384 B at 20 GB/s, 19.2 ns) plus 105 us of machinery,
    i.e. F - 38.4 ns + 105 us. Backward never changes."""
    spec = cpu(PROBED)
    none, full, sel = (priced(spec, m) for m in (Checkpoint.NONE, Checkpoint.FULL,
                                                 Checkpoint.SELECTIVE))
    plain = none.forward_s
    assert full.forward_s == pytest.approx(plain + 47 * US)
    assert full.recompute_s == pytest.approx(plain + 50 * US)
    assert sel.forward_s == pytest.approx(plain + 115 * US)
    assert sel.recompute_s == pytest.approx(plain - 2 * 19.2e-9 + 105 * US)
    assert none.backward_s == full.backward_s == sel.backward_s and none.recompute_s == 0.0


def test_the_recompute_stops_at_the_last_save_and_sac_sees_its_detaches():
    """With the IR's counts (EARLY_STOP): the recompute reruns 4 of the 5 ops, and SAC's
    cached mode sees those 4 and the 3 detaches of the saves requiring grad. FULL
    recompute: 20 + 4 ops x 2 + 4 saved x 5 = 48 us (forward unchanged, 47 us);
    SELECTIVE recompute: 48 + 20 + (4 + 3) x 7 = 117 us (forward 115 us). In
    layer_compute the rerun ops' host is 4/5 of the forward's (5 ops x 4 us): 16 us, so
    FULL's recompute is F - 4 + 48 us, SELECTIVE's F - 38.4 ns - 4 + 117 us."""
    layer = block(**EARLY_STOP)
    assert (rerun_ops(layer), cached_mode_ops(layer)) == (4, 7)
    assert checkpoint_extra_seconds(layer, Checkpoint.FULL, PROBED) == pytest.approx(
        (47 * US, 48 * US))
    assert checkpoint_extra_seconds(layer, Checkpoint.SELECTIVE, PROBED) == pytest.approx(
        (115 * US, 117 * US))
    spec, config = cpu(PROBED), CONFIG
    none, full, sel = (layer_compute(layer, LayerStrategy(checkpoint=m), spec, config)
                       for m in (Checkpoint.NONE, Checkpoint.FULL, Checkpoint.SELECTIVE))
    plain = none.forward_s
    assert full.recompute_s == pytest.approx(plain - 4 * US + 48 * US)
    assert sel.recompute_s == pytest.approx(plain - 2 * 19.2e-9 - 4 * US + 117 * US)
    # without the probe the counts change nothing: FULL's recompute is the forward
    before = cpu(KernelCalibration(measured_on="before the probe"))
    assert layer_compute(layer, LayerStrategy(checkpoint=Checkpoint.FULL), before,
                         config).recompute_s == plain


def test_a_spec_without_the_probe_prices_as_before():
    """No probe figures (a spec written before them): FULL's recompute is its forward and
    the forward gains nothing; SELECTIVE reruns only its recomputed ops' kernels and
    their dispatches: GELU + 3 ops (GELU, 2 views) x 4 us = F - 5 x 4 us - the kept
    matmuls' 2 x 19.2 ns + 3 x 4 us."""
    spec = cpu(KernelCalibration(measured_on="before the probe"))
    none, full, sel = (priced(spec, m) for m in (Checkpoint.NONE, Checkpoint.FULL,
                                                 Checkpoint.SELECTIVE))
    plain = none.forward_s
    assert full.forward_s == plain and full.recompute_s == plain
    assert sel.forward_s == plain
    assert sel.recompute_s == pytest.approx(plain - 20 * US - 2 * 19.2e-9 + 12 * US)


def test_old_json_loads_with_zeros_and_the_fields_round_trip():
    again = KernelCalibration.from_dict(json.loads(json.dumps(PROBED.to_dict())))
    assert again == PROBED and len(NEW_FIELDS) == 13
    old = {k: v for k, v in PROBED.to_dict().items() if k not in NEW_FIELDS}
    legacy = KernelCalibration.from_dict(old)
    assert all(getattr(legacy, f) == 0.0 for f in NEW_FIELDS)
    assert checkpoint_extra_seconds(block(), Checkpoint.SELECTIVE, legacy) == (0.0, 0.0)


def test_selective_call_prices_its_measured_halves_and_old_specs_the_sum_halved():
    """A probe that measured SELECTIVE's call as 10 us forward and 30 us recompute (sum 40,
    as PROBED's legacy `selective_call_s`) prices those halves: forward 47 + 10 + 48 = 105
    us, recompute 50 + 30 + 35 = 115 us (against 115 / 105 from the sum halved). A spec
    with only the sum (written before the halves) prices 20 / 20 as before; one with the
    halves round-trips through JSON and its sum stays what older readers see."""
    halves = dataclasses.replace(PROBED, selective_call_forward_s=10 * US,
                                 selective_call_recompute_s=30 * US)
    assert checkpoint_extra_seconds(block(), Checkpoint.SELECTIVE, halves) == pytest.approx(
        (105 * US, 115 * US))
    assert halves.selective_call_halves() == pytest.approx((10 * US, 30 * US))
    assert PROBED.selective_call_halves() == pytest.approx((20 * US, 20 * US))
    assert KernelCalibration.from_dict(json.loads(json.dumps(halves.to_dict()))) == halves
    old = {k: v for k, v in halves.to_dict().items()
           if k not in ("selective_call_forward_s", "selective_call_recompute_s")}
    assert KernelCalibration.from_dict(old).selective_call_halves() == pytest.approx(
        (20 * US, 20 * US))


def test_sacs_forward_per_op_is_read_at_the_layers_tensor_bytes():
    """SAC's caching mode per op, probed at the tiny chains' tensors (2 x 8 fp32, 64 B: 8 us
    per recomputed op, 12 per kept one) and per recomputed op at a zoo block's (256 x 64
    fp32, 64 KiB: 16 us, so 8 more, which a kept op pays too: 20), read at the layer's
    output bytes at the step's micro-batch, linear between.
    block() outputs 64 B at micro-batch 1: SELECTIVE's forward 115 us as before. At
    micro-batch 1024 (64 KiB): 47 (FULL's) + 20 (call) + 2 kept x 20 + 3 ops x 16 = 155 us;
    halfway in bytes (32800 B, micro-batch 1025 of an IR traced at 2): 2 x 16 + 3 x 12,
    135 us; the recompute and FULL never change; layer_compute's SELECTIVE forward is the
    plain one + 155 us at 64 KiB; a calibration without the sized figures prices 115."""
    sized = dataclasses.replace(PROBED, selective_forward_op_sized_s=16 * US)
    assert (PROBE_TENSOR_BYTES, SIZED_TENSOR_BYTES) == (64, 65536)
    layer = block()

    def config(micro_batch, traced=1):
        return dataclasses.replace(CONFIG, micro_batch=micro_batch, graph_micro_batch=traced)

    def extra(cal, cfg, mode=Checkpoint.SELECTIVE):
        return checkpoint_extra_seconds(layer, mode, cal, cfg)

    assert extra(sized, config(1)) == pytest.approx((115 * US, 105 * US))
    assert extra(sized, config(1024)) == pytest.approx((155 * US, 105 * US))
    assert extra(sized, config(1025, traced=2)) == pytest.approx((135 * US, 105 * US))
    assert extra(sized, config(4096)) == pytest.approx((155 * US, 105 * US))  # flat beyond
    assert extra(PROBED, config(1024)) == pytest.approx((115 * US, 105 * US))
    assert extra(sized, config(1024), Checkpoint.FULL) == pytest.approx((47 * US, 50 * US))
    spec = cpu(sized)
    none, sel = (layer_compute(layer, LayerStrategy(checkpoint=m), spec, config(1024))
                 for m in (Checkpoint.NONE, Checkpoint.SELECTIVE))
    assert sel.forward_s == pytest.approx(none.forward_s + 155 * US)


def test_the_probe_writes_both_halves_and_their_sum():
    """`CheckpointHostCost.calibration_fields`: the fitted forward and recompute calls
    (3 and 5 us) as the new fields, 8 us as `selective_call_s`; every other field as is."""
    cost = CheckpointHostCost(1 * US, 2 * US, 3 * US, 4 * US, 5 * US, 6 * US,
                              selective_call_forward_s=3 * US,
                              selective_call_recompute_s=5 * US,
                              selective_forward_op_s=7 * US, selective_forward_kept_op_s=9 * US,
                              selective_recompute_op_s=11 * US)
    fields = cost.calibration_fields()
    assert fields["selective_call_s"] == pytest.approx(8 * US)
    assert (fields["selective_call_forward_s"], fields["selective_call_recompute_s"]) == (
        3 * US, 5 * US)
    assert set(fields) == set(NEW_FIELDS)
    cal = dataclasses.replace(PROBED, **fields)
    assert cal.selective_call_halves() == (3 * US, 5 * US)


def test_a_gpu_spec_without_the_probe_prices_as_before():
    """A GPU spec without the host probe of checkpointing (the h100-80g preset's tables less
    its figures, as written before `profile-device --device cuda` ran the probe): FULL's
    recompute is its forward."""
    spec = get_cluster("h100-80g")
    spec = dataclasses.replace(spec, kernel_calibration=dataclasses.replace(
        spec.kernel_calibration, **{f: 0.0 for f in NEW_FIELDS}))
    config = dataclasses.replace(CONFIG, device_type="cuda")
    full = layer_compute(block(), LayerStrategy(checkpoint=Checkpoint.FULL), spec, config)
    assert full.recompute_s == full.forward_s


def test_the_probe_counts_ops_kept_ops_and_saves_of_its_chains():
    """Per unit of each chain (ops, kept, saved, saved requiring grad): add saves nothing;
    mul saves its other operand (no grad); layer norm its input (grad), mean and rstd; a
    matmul (x @ w, w needing no gradient) saves w and is kept by SELECTIVE. The block
    unit: layer_norm 1 op (3 saves, 1 grad), linear on 3-D view/t/addmm/view 4 (saves
    both addmm operands, grad; addmm kept), transpose 1, scale 1, softmax 1 (saves its
    output, grad) and the output's detach 1, dropout empty_like/bernoulli_/div_/mul 4
    (saves the mask), transpose 1, gelu 1 (saves its input, grad), add 1: 16 ops, 1 kept,
    8 saves, 5 grad. The tail: `sin`, one op saving its input (grad), which
    the early stop skips (the input is saved before it runs); the block's input view one
    more op."""
    chains = _chains(torch)
    per_unit = {"add": (1, 0, 0, 0), "mul": (1, 0, 1, 0), "layer_norm": (1, 0, 3, 1),
                "mm": (1, 1, 1, 0), "block": (16, 1, 8, 5)}
    for name, (ops, kept, saved, grad) in per_unit.items():
        short, long = _counts(torch, chains[name], 2), _counts(torch, chains[name], 6)
        head = 1 if name == "block" else 0
        for n, counts in ((2, short), (6, long)):
            detaches = n if name == "block" else 0  # softmax's saved output
            assert counts == ChainCounts(n * ops + 1 + head, n * kept, n * saved + 1,
                                         n * grad + 1, 1, detaches), (name, n)


def test_the_probe_hands_its_chains_a_layer_input_as_a_step_has_it():
    """The probe's input is a middle layer's (`ir.stand_in.step_input`): an activation
    requiring grad, not a leaf, so no pass's backward ends in an input AccumulateGrad that
    no checkpointed layer of a step runs (the profile and the kernel records take a layer's
    input alike); the leaf beneath gets no gradient under any mode."""
    from ir.stand_in import is_step_input

    chain = _chains(torch)["mul"]
    for mode in Checkpoint:
        x = _input(torch)
        assert x.requires_grad and not x.is_leaf and is_step_input(x.grad_fn)
        forward, backward = _runner(torch, chain, 2, mode)
        forward(x)
        backward()
        assert x.grad_fn.next_functions[0][0].variable.grad is None, mode


class _Names(TorchDispatchMode):
    """The ATen ops dispatched while it is entered, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _recompute_dispatches(module, early_stop: bool) -> tuple[list[str], list[str]]:
    """(forward, recompute) op names dispatched while `module`'s FULL forward and then
    its recompute run on CPU: a dispatch mode entered inside the checkpointed function
    sees the ops and the recompute pack hook's detaches (the oracle: torch's own
    recompute, counted)."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    runs = []

    def run(x):
        with _Names() as names:
            runs.append(names)
            return module(x)

    with set_checkpoint_early_stop(early_stop):
        y = checkpoint(run, torch.randn(2, 32, 64, requires_grad=True), use_reentrant=False)
        y.sum().backward()
    forward, recompute = runs
    return forward.names, recompute.names


def test_the_ir_counts_what_a_real_blocks_recompute_reruns():
    """gpt-tiny's block traced on meta against the real block on CPU: `saved_tensors_fwd`
    is the number of pack calls of its forward (a hook counting them); the ops its FULL
    recompute dispatches under early stop are `rerun_ops` plus a detach per save
    requiring grad (`saved_grad_tensors_fwd`), the count SAC's cached mode sees
    (`cached_mode_ops`); the forward's ops from the last save on are not rerun (the last
    dropout's mul and the residual add: `ops_after_last_save_fwd`), which they are
    without early stop. Known and stated: the plain forward's detach of softmax's saved
    output (in `ops_fwd`) is made by neither checkpointed pass."""
    from ir.measure import layer_graph_from_trace
    from ir.trace import trace
    from planner.models import load_model

    loaded = load_model("gpt-tiny", 2, None, device="meta")
    traced = trace(loaded.module, loaded.inputs, loaded.target, loaded.loss_fn,
                   dtype=torch.float32)
    graph, _ = layer_graph_from_trace(traced, loaded.inputs, loaded.target,
                                      name=loaded.name, dtype=torch.float32)
    layer = graph.layer("blocks.0")
    real = load_model("gpt-tiny", 2, None, device="cpu", seed=0).module.blocks["0"].train()
    calls = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: calls.append(1) or t,
                                                  lambda t: t):
        real(torch.randn(2, 32, 64, requires_grad=True))
    assert layer.saved_tensors_fwd == len(calls) > 0
    x = torch.randn(2, 32, 64, requires_grad=True)
    with _Names() as plain:
        real(x)
    forward, recompute = _recompute_dispatches(real, early_stop=True)
    unmodelled = plain.names.count("detach") - forward.count("detach")
    detaches = recompute.count("detach")
    rerun = len(recompute) - detaches
    assert unmodelled == 1 and len(plain.names) == layer.ops_fwd
    assert (detaches, rerun + unmodelled) == (layer.saved_grad_tensors_fwd, rerun_ops(layer))
    assert len(forward) - rerun == layer.ops_after_last_save_fwd == 2
    assert detaches + rerun + unmodelled == cached_mode_ops(layer)
    _, everything = _recompute_dispatches(real, early_stop=False)
    assert len(everything) - detaches == len(forward)



PINS = dict(no_pp=True, tp=1, dp=1, micro_batch=8)


def _uniform(graph, cluster, mode, precision):
    """The search's best plan with every layer pinned to checkpointing `mode`."""
    from planner.search import search
    from planner.search_space import SearchOptions

    options = SearchOptions(uniform=True, checkpoint=mode, precision=precision, **PINS)
    return search(graph, cluster, 8, options, with_baselines=False).best


def test_the_search_proposes_selective_where_it_pays():
    """On an H100 whose host is free (no per-op or checkpoint figures: host time hides
    under kernels) a block's selective recompute skips its matmuls: cheaper than FULL. On a
    device whose memory admits SELECTIVE's peak but not NONE's (halfway, plus the DP buckets
    the search holds in reserve) the free search checkpoints the blocks selectively. With
    the H100 host the preset measured (SAC's dispatch mode ~41 us an op), this small model's
    SELECTIVE costs more than FULL, as llama3.2-1b's did there (341.6 against 205.9 ms a
    step at micro-batch 1: bench/gpu_measured/h100_steps_2026-11-25.json)."""
    from cost_models.checkpoint_probes import CHECKPOINT_FIELDS
    from cost_models.memory import DP_BUCKET_BYTES, DP_BUCKETS_IN_FLIGHT
    from planner.models import load_layer_graph
    from planner.search import search
    from planner.search_space import SearchOptions

    graph = load_layer_graph("gpt:layers=2,hidden=256,heads=4,seq=512,vocab=128",
                             micro_batch=8, dtype=torch.bfloat16)
    measured = dataclasses.replace(get_cluster("h100-80g"), num_nodes=1, devices_per_node=1)
    sel, full = (_uniform(graph, measured, mode, Precision.BF16_MIXED).estimate
                 for mode in (Checkpoint.SELECTIVE, Checkpoint.FULL))
    assert sel.iteration_seconds > full.iteration_seconds
    cluster = dataclasses.replace(measured, op_overhead_s=0.0, kernel_calibration=dataclasses.replace(
        measured.kernel_calibration, **dict.fromkeys(CHECKPOINT_FIELDS, 0.0)))
    none, sel, full = (_uniform(graph, cluster, mode, Precision.BF16_MIXED).estimate
                       for mode in (Checkpoint.NONE, Checkpoint.SELECTIVE, Checkpoint.FULL))
    assert sel.iteration_seconds < full.iteration_seconds
    assert sel.memory.peak_bytes < none.memory.peak_bytes
    budget = ((none.memory.peak_bytes + sel.memory.peak_bytes) // 2
              + DP_BUCKETS_IN_FLIGHT * DP_BUCKET_BYTES)
    small = dataclasses.replace(cluster, device_memory_bytes=int(budget))
    best = search(graph, small, 8, SearchOptions(**PINS), with_baselines=False).best
    # The first block is checkpointed selectively; the last may stay whole: its kept
    # activations are freed as the backward starts, so the walk (what the search now
    # solves on) peaks at about the same either way. None is checkpointed fully.
    modes = [s.checkpoint for layer, s in zip(graph.layers, best.plan.layer_strategies)
             if layer.kind == "Block"]
    assert modes[0] is Checkpoint.SELECTIVE and Checkpoint.FULL not in modes, modes


def test_on_a_probed_cpu_the_search_weighs_sacs_host_cost():
    """gpt-tiny on one CPU process: its blocks' matmuls are tiny, so what SELECTIVE saves
    (their kernels in the recompute) is less than SAC's dispatch modes cost per op
    (PROBED: 8 + 7 us per op, ~70 ops a block): the search prices the all-FULL plan
    faster than the all-SELECTIVE one. Without the probe (a spec before it) SELECTIVE
    was priced as its recomputed ops alone and came out faster."""
    from planner.models import load_layer_graph

    graph = load_layer_graph("gpt-tiny", micro_batch=8, dtype=torch.float32)

    def seconds(spec, mode):
        return _uniform(graph, spec, mode, Precision.FP32).estimate.iteration_seconds

    probed, before = cpu(PROBED), cpu(KernelCalibration(measured_on="before the probe"))
    assert seconds(probed, Checkpoint.FULL) < seconds(probed, Checkpoint.SELECTIVE)
    assert seconds(before, Checkpoint.SELECTIVE) < seconds(before, Checkpoint.FULL)
