"""Tensor-parallel pricing on CPU processes charges each cost once (issue 17: llama-tp2
predicted 49% above its measured step): every TP collective the executor issues once,
wait included (`comm.tp_comm_s`), each TP module's DTensor work once
(`tp_host.tp_module_seconds`, measured apart from its collectives by
`cost_models.tp_probes`), and no per-op DTensor extra on ops that run on plain tensors.

Hand derivation for llama-tiny (hidden 64, 8 heads, 4 KV heads, ffn 160, seq 32, 4
blocks, vocab 128) at tp 2, micro-batch 8, fp32 (`executors.tensor_parallel`):
  block      q, k, v, gate, up column-parallel; o, down row-parallel: 7 modules.
             Forward: one all-reduce per row-parallel output (2); backward: one per
             column-parallel input gradient (5): 7 all-reduces of b*s*h*4 =
             8*32*64*4 = 65,536 bytes.
             Under SP: per row-parallel module a reduce-scatter (its output) and an
             all-gather (its parent's input) in forward, and the same pair in backward:
             4 all-gathers + 4 reduce-scatters.
  embedding  vocab-parallel: one forward all-reduce of its output.
  head       vocab-parallel with loss_parallel: 3 forward all-reduces of per-token
             scalars, one backward all-reduce of its input gradient.
So a step of one micro-batch issues 4*7 + 1 + 4 = 33 all-reduces without SP; with SP
16 all-gathers, 16 reduce-scatters and 5 all-reduces. torch.profiler on the 2 ranks of
bench_validate's llama-tp2 plan counted the same per step (2026-11-24: 33
`_c10d_functional::all_reduce` without SP; 16 `all_gather_into_tensor`, 16
`reduce_scatter_tensor` and 5 `all_reduce` with SP blocks).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cost_models.comm import dp_comm_s, sp_grad_sync_s, tp_comm_s
from cost_models.common import StepConfig
from cost_models.compute import layer_compute
from cost_models.tp_host import tp_module_seconds
from cost_models.estimate import estimate
from cost_models.model_states import bytes_per_param
from ir.calibration_tables import BlockingWait, CalibrationTables, TpModuleOverhead
from ir.cluster import ClusterSpec, CollectiveFit
from ir.errors import PlannerError
from ir.plan import uniform_plan
from ir.strategy import Checkpoint, LayerStrategy, Precision
from planner.models import load_layer_graph

from dist_utils import spawn
from tests.cpu_specs import two_ranks_on_two_cores

US, MS = 1e-6, 1e-3
MICRO_BATCH = 8
ACTIVATION_BYTES = MICRO_BATCH * 32 * 64 * 4  # b * s * h fp32: llama-tiny's residual stream
ALPHA_S = {"all_reduce": 100 * US, "all_gather": 200 * US, "reduce_scatter": 300 * US}
BYTES_PER_S = 1e9
WAIT_S = {"all_reduce": 2 * MS, "all_gather": 3 * MS, "reduce_scatter": 4 * MS}
TP_MODULE_S = 1 * MS


def spec(waits: bool = True, modules: bool = True, dtensor_op_s: float = 15 * US
         ) -> ClusterSpec:
    """2 CPU processes on 2 cores (host_share 1); fitted collectives at 2 ranks, a wait
    per blocking collective (none per byte), a TP module figure at tp 2."""
    fits = tuple(CollectiveFit(c, "intra_node", alpha, BYTES_PER_S, 2)
                 for c, alpha in ALPHA_S.items())
    return two_ranks_on_two_cores(CalibrationTables(
        collective_fits=fits,
        tp_modules=(TpModuleOverhead(2, TP_MODULE_S),) if modules else (),
        blocking_waits=tuple(BlockingWait(c, 2, s) for c, s in WAIT_S.items())
        if waits else ()), name="cpu-tp-test", dtensor_op_overhead_s=dtensor_op_s)


@pytest.fixture(scope="module")
def graph():
    return load_layer_graph("llama-tiny", micro_batch=MICRO_BATCH, dtype=torch.float32)


def config(graph) -> StepConfig:
    return StepConfig(micro_batch=MICRO_BATCH, graph_micro_batch=MICRO_BATCH,
                      graph_dtype="float32", precision=Precision.FP32, optimizer="adamw",
                      seq_len=graph.seq_len, device_type="cpu")


def ring_all_reduce_2_s(nbytes: float) -> float:
    """2 ranks: 2(n-1)*alpha + 2(n-1)/n * S/B = 2*alpha + S/B (Patarasuk & Yuan 2009)."""
    return 2 * ALPHA_S["all_reduce"] + nbytes / BYTES_PER_S


def ring_half_2_s(collective: str, nbytes: float) -> float:
    """2 ranks: (n-1)*alpha + (n-1)/n * S/B = alpha + S/(2B)."""
    return ALPHA_S[collective] + nbytes / 2 / BYTES_PER_S


def test_a_block_pays_each_collective_once_with_its_wait(graph):
    block, cfg = graph.layers[1], config(graph)
    assert len(block.tp_candidates) == 7  # q, k, v, o, gate, up, down
    assert block.output_bytes == ACTIVATION_BYTES
    all_reduce = ring_all_reduce_2_s(ACTIVATION_BYTES) + WAIT_S["all_reduce"]
    forward, backward = tp_comm_s(block, LayerStrategy(tp=2), spec(), cfg)
    assert forward == pytest.approx(2 * all_reduce)
    assert backward == pytest.approx(5 * all_reduce)
    pair = (ring_half_2_s("all_gather", ACTIVATION_BYTES) + WAIT_S["all_gather"]
            + ring_half_2_s("reduce_scatter", ACTIVATION_BYTES) + WAIT_S["reduce_scatter"])
    forward, backward = tp_comm_s(block, LayerStrategy(tp=2, sequence_parallel=True),
                                  spec(), cfg)
    assert forward == pytest.approx(2 * pair) and backward == pytest.approx(2 * pair)


def test_a_full_recompute_issues_again_only_the_collectives_before_the_last_save(graph):
    """Non-reentrant checkpoint stops the recompute at the forward's last save
    (`ir.tp_recompute`). llama block: o_proj's all-reduce is followed by mlp_norm's saves,
    down_proj's only by the residual add (no save): the recompute issues 1 of the 2
    forward all-reduces, so backward = 5 + 1 all-reduces. Under SP it issues both
    all-gathers (q/k/v and gate/up save their gathered input) and o_proj's
    reduce-scatter: backward = 2 pairs + 2 all-gathers + 1 reduce-scatter. The
    embedding's vocab all-reduce (after its last save, the indices) and the head's
    loss-parallel ones (in the loss, outside the checkpoint) are not issued again.
    gpt-tiny: its MLP and embedding end in a dropout (a saved mask after the reduction):
    2 per block and 1 for the embedding. torch.profiler, 2 ranks, one micro-batch
    (2026-11-25): llama-tiny tp 2 issued 33 all-reduces per step plain, 37 with full (+4,
    one per block); gpt-tiny tp 2 SP 17 all-gathers, 16 reduce-scatters, 5 all-reduces
    plain, 25, 24, 6 with full (+2 each per block, +1 for the embedding)."""
    cfg = config(graph)
    block, embed, head = graph.layers[1], graph.layers[0], graph.layers[-1]
    assert [l.rowwise_before_last_save_fwd for l in graph.layers] == [0, 1, 1, 1, 1, 0, 0]
    all_reduce = ring_all_reduce_2_s(ACTIVATION_BYTES) + WAIT_S["all_reduce"]
    full = LayerStrategy(tp=2, checkpoint=Checkpoint.FULL)
    forward, backward = tp_comm_s(block, full, spec(), cfg)
    assert forward == pytest.approx(2 * all_reduce)
    assert backward == pytest.approx(6 * all_reduce)
    gather = ring_half_2_s("all_gather", ACTIVATION_BYTES) + WAIT_S["all_gather"]
    scatter = ring_half_2_s("reduce_scatter", ACTIVATION_BYTES) + WAIT_S["reduce_scatter"]
    sp_full = dataclasses.replace(full, sequence_parallel=True)
    _, backward = tp_comm_s(block, sp_full, spec(), cfg)
    assert backward == pytest.approx(2 * (gather + scatter) + 2 * gather + scatter)
    for layer in (embed, head):
        assert tp_comm_s(layer, full, spec(), cfg) == pytest.approx(
            tp_comm_s(layer, LayerStrategy(tp=2), spec(), cfg))
    gpt = load_layer_graph("gpt-tiny", micro_batch=MICRO_BATCH, dtype=torch.float32)
    # gpt's MLP and embedding end in a dropout, whose saved mask follows their reduction
    assert [l.rowwise_before_last_save_fwd for l in gpt.layers] == [1, 2, 2, 2, 2, 0, 0]
    untraced = dataclasses.replace(block, measured=dataclasses.replace(
        block.measured, rowwise_before_last_save_fwd=None))  # every forward one again
    assert tp_comm_s(untraced, full, spec(), cfg)[1] == pytest.approx(7 * all_reduce)


def test_a_block_pays_its_modules_dtensor_work_once_and_the_sp_norms_ops_only(graph):
    """7 modules x 1 ms, half in each pass. Without SP the ops outside the modules run on
    plain tensors, so the 15 us per-op DTensor extra adds nothing. With SP the two
    RMSNorms run under SequenceParallel on DTensors (`ir.dtensor_ops`), and only they
    pay it. LlamaRMSNorm's forward: pow, mean, add (eps), rsqrt, detach (rsqrt's output
    saved for backward), mul (x * r), mul (weight * y) = 7 ops; its backward: weight * y
    4 (mul, mul, sum over b and s, view to (h,)), the weight's AccumulateGrad 1 (detach),
    x * r 3 (mul, mul, sum over h), rsqrt 4 (detach, pow, mul by -1/2, mul), mean 2
    (expand, div), pow 3 (pow, mul by 2, mul), and x's two uses summed 1 (add) = 18.
    So per block 2 x 7 x 15 us = 210 us in forward, 2 x 18 x 15 us = 540 us in backward,
    and a full recompute reruns the forward's 210 us."""
    block, cfg = graph.layers[1], config(graph)
    extra_s = {False: (0.0, 0.0), True: (210 * US, 540 * US)}
    for sp in (False, True):
        strategy = LayerStrategy(tp=2, sequence_parallel=sp)
        assert tp_module_seconds(block, strategy, spec()) == pytest.approx(7 * TP_MODULE_S)
        with_modules = layer_compute(block, strategy, spec(), cfg)
        without = layer_compute(block, strategy, spec(modules=False), cfg)
        assert with_modules.forward_s - without.forward_s == pytest.approx(3.5 * TP_MODULE_S)
        assert with_modules.backward_s - without.backward_s == pytest.approx(3.5 * TP_MODULE_S)
        no_extra = layer_compute(block, strategy, spec(dtensor_op_s=0.0), cfg)
        forward_s, backward_s = extra_s[sp]
        assert with_modules.forward_s - no_extra.forward_s == pytest.approx(forward_s)
        assert with_modules.backward_s - no_extra.backward_s == pytest.approx(backward_s)
        full = dataclasses.replace(strategy, checkpoint=Checkpoint.FULL)
        assert (layer_compute(block, full, spec(), cfg).recompute_s
                - layer_compute(block, full, spec(dtensor_op_s=0.0), cfg).recompute_s
                == pytest.approx(forward_s))


def test_module_figures_are_cpu_time_stretched_by_the_core_share(graph):
    """The probe reads CPU time on the calling thread; 4 processes on 2 cores take turns,
    so 7 modules x 1 ms stretch to 14 ms (host_share 2), as the per-op figures do."""
    block = graph.layers[1]
    shared = dataclasses.replace(spec(), devices_per_node=4)
    assert shared.host_share == 2.0
    assert tp_module_seconds(block, LayerStrategy(tp=2), shared) == pytest.approx(14 * MS)


@pytest.mark.parametrize("sequence_parallel, waits_s", [
    (False, 33 * WAIT_S["all_reduce"]),
    (True, 5 * WAIT_S["all_reduce"] + 18 * WAIT_S["all_gather"] + 16 * WAIT_S["reduce_scatter"])])
def test_a_step_pays_the_waits_of_the_collectives_the_executor_issues(graph, sequence_parallel,
                                                                      waits_s):
    """The whole step's TP traffic moves by exactly one wait per collective the executor
    issues (module docstring), the TP modules by 30 x 1 ms (28 in blocks, embedding and
    head), and nothing else moves. With SP blocks, two more all-gathers: the last block's
    sequence-split output gathered for the final norm, forward and backward (`executors.
    layout`; the profile counted 2 `c10d::allgather_` per step); and SP's once-per-step
    norm-gradient all-reduce (one per block: 4 waits) is TP traffic too."""
    plan = uniform_plan(len(graph.layers), tp=2, sequence_parallel=sequence_parallel,
                        micro_batch=MICRO_BATCH, global_batch=MICRO_BATCH,
                        precision=Precision.FP32)
    full = estimate(graph, plan, spec())
    no_waits = estimate(graph, plan, spec(waits=False))
    no_modules = estimate(graph, plan, spec(modules=False))
    step_sync = 4 * WAIT_S["all_reduce"] if sequence_parallel else 0.0
    assert full.time.tp_comm - no_waits.time.tp_comm == pytest.approx(waits_s + step_sync)
    assert full.time.compute == pytest.approx(no_waits.time.compute)
    assert full.time.compute - no_modules.time.compute == pytest.approx(30 * TP_MODULE_S)
    assert full.time.tp_comm == pytest.approx(no_modules.time.tp_comm)


# ---- the probe: DTensor's stack against the same collectives on plain tensors ----------


def _probe_stacks(rank: int, world_size: int, payload) -> dict:
    """Per stack: gloo all-reduces per forward+backward (torch.profiler) and the output
    and input gradient after copying the DTensor stack's local shards into the manual one."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.profiler import ProfilerActivity, profile

    from cost_models.tp_probes import OP_OVERHEAD_WIDTH_TP, _dtensor_stack, _manual_stack

    mesh = init_device_mesh("cpu", (world_size,))
    width = OP_OVERHEAD_WIDTH_TP * world_size
    torch.manual_seed(0)  # the same weights on every rank: DTensor keeps each rank's shard
    dtensor, manual = _dtensor_stack(mesh, width), _manual_stack(mesh, width)
    with torch.no_grad():
        for pair, block in zip(manual, dtensor):
            local = {name: p.to_local() if isinstance(p, DTensor) else p
                     for name, p in block.named_parameters()}
            pair.colwise.weight.copy_(local["0.weight"])
            pair.colwise.bias.copy_(local["0.bias"])
            pair.rowwise.weight.copy_(local["2.weight"])
            pair.bias.copy_(local["2.bias"])
    x = torch.randn(2, width, generator=torch.Generator().manual_seed(1))
    out = {}
    for name, stack in (("dtensor", dtensor), ("manual", manual)):
        inputs = x.clone().requires_grad_()
        stack(inputs).sum().backward()  # warm-up: DTensor's sharding caches fill
        inputs = x.clone().requires_grad_()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            y = stack(inputs)
            y.sum().backward()
        calls = sum(e.count for e in prof.key_averages() if e.key == "gloo:all_reduce")
        out[name] = (calls, y.detach(), inputs.grad)
    return out


def test_the_tp_probe_compares_dtensor_with_the_same_collectives_on_plain_tensors():
    """Both stacks issue the same all-reduces (4 blocks: 4 forward at the row-parallel
    outputs, 4 backward at the column-parallel input gradients, the input now needing
    one) and compute the same: their time difference holds DTensor's work and no
    collective. A plain reference stack without collectives (the old probe) issues 0."""
    for rank in spawn(_probe_stacks, 2, timeout_s=300):
        (d_calls, d_y, d_grad), (m_calls, m_y, m_grad) = rank["dtensor"], rank["manual"]
        assert d_calls == m_calls == 8
        torch.testing.assert_close(m_y, d_y)
        torch.testing.assert_close(m_grad, d_grad)


# ---- the wait in DTensor's form: TP collectives pay it, DP collectives keep theirs -----

# A TP all-reduce as DTensor issues it waits 3 ms + 1 ms/MiB here, the plain call 2 ms.
TP_WAIT_S, TP_WAIT_S_PER_BYTE = 3 * MS, 1 * MS / 2**20


def dtensor_spec() -> ClusterSpec:
    """`spec()` plus an all-reduce wait measured in DTensor's form (none for the
    all-gather and reduce-scatter: they fall back to the plain call's wait)."""
    tables = dataclasses.replace(spec().calibration, tp_blocking_waits=(
        BlockingWait("all_reduce", 2, TP_WAIT_S, TP_WAIT_S_PER_BYTE),))
    return dataclasses.replace(spec(), calibration=tables)


def test_tp_collectives_pay_the_dtensor_form_wait_and_dp_keeps_the_plain_one(graph):
    """Block at tp 2: 2 forward and 5 backward all-reduces of 65,536 bytes, each
    2*100 us + 65,536 B / 1 GB/s + (3 ms + 65,536/2**20 * 1 ms = 3.0625 ms). Under SP the
    all-gathers and reduce-scatters have no DTensor-form row: 3 ms and 4 ms as before.
    The same block at dp 2 syncs its gradients with a plain all-reduce: 2 ms wait."""
    block, cfg = graph.layers[1], config(graph)
    all_reduce = 2 * 100 * US + 65_536 / 1e9 + 3 * MS + 0.0625 * MS
    forward, backward = tp_comm_s(block, LayerStrategy(tp=2), dtensor_spec(), cfg)
    assert forward == pytest.approx(2 * all_reduce)
    assert backward == pytest.approx(5 * all_reduce)
    sp = LayerStrategy(tp=2, sequence_parallel=True)
    assert tp_comm_s(block, sp, dtensor_spec(), cfg) == pytest.approx(tp_comm_s(block, sp,
                                                                                 spec(), cfg))
    grad_bytes = block.params * 4  # fp32 gradients, one replica's
    per_param = bytes_per_param(Precision.FP32, "adamw")
    step_s = dp_comm_s(block, LayerStrategy(dp=2), dtensor_spec(), per_param)[2]
    assert step_s == pytest.approx(2 * 100 * US + grad_bytes / 1e9 + WAIT_S["all_reduce"])


def test_sp_norm_gradients_pay_the_wait_of_the_form_the_executor_reduces_them_in(graph):
    """llama block at tp 2 + SP: its 2 RMSNorm weights (64 fp32 each: 256 B, 512 B
    together) have Partial gradients. Inside a DP unit (dp 2) each is redistributed on
    its own, a funcol all-reduce (torch.profiler, gpt-tp2-dp2-sp on 4 gloo ranks: 16
    `_c10d_functional::all_reduce` of 64 floats per step, 4 per block): 2 x (2 * 100 us
    + 256 B / 1 GB/s + 3 ms + 256 / 2**20 * 1 ms). Outside one (dp 1, fp32) the executor
    buckets them into one `dist.all_reduce`: 2 * 100 us + 512 B / 1 GB/s + the plain 2 ms."""
    block, cfg = graph.layers[1], config(graph)
    per_param = bytes_per_param(Precision.FP32, "adamw")
    in_unit = sp_grad_sync_s(block, LayerStrategy(tp=2, dp=2, sequence_parallel=True),
                             dtensor_spec(), cfg, per_param)
    assert in_unit == pytest.approx(2 * (200 * US + 256 / 1e9 + 3 * MS + 256 / 2**20 * MS))
    bucketed = sp_grad_sync_s(block, LayerStrategy(tp=2, sequence_parallel=True),
                              dtensor_spec(), cfg, per_param)
    assert bucketed == pytest.approx(200 * US + 512 / 1e9 + WAIT_S["all_reduce"])


def test_a_spec_without_dtensor_form_waits_prices_tp_as_before(graph, tmp_path):
    """An older spec file (no "tp_blocking_wait_s") loads and prices TP with the plain
    wait (`ring + 2 ms`); a spec with the new table keeps it through JSON."""
    data = spec().to_dict()
    for key in ("tp_blocking_wait_s", "tp_blocking_wait_s_per_byte"):
        data.pop(key, None)
    old = ClusterSpec.from_dict(data)
    assert old.calibration.tp_blocking_waits == ()
    forward, _ = tp_comm_s(graph.layers[1], LayerStrategy(tp=2), old, config(graph))
    assert forward == pytest.approx(2 * (2 * 100 * US + 65_536 / 1e9 + 2 * MS))
    path = tmp_path / "spec.json"
    dtensor_spec().save(str(path))
    loaded = ClusterSpec.load(str(path)).calibration
    assert loaded.tp_blocking_waits == dtensor_spec().calibration.tp_blocking_waits
    assert loaded.tp_blocking_wait_seconds("all_reduce", 2, 2**20) == pytest.approx(4 * MS)


@pytest.mark.parametrize("fields, message", [
    ({"tp_blocking_wait_s": {"allreduce@2": 1e-3}}, "tp_blocking_wait_s key 'allreduce@2'"),
    ({"tp_blocking_wait_s_per_byte": {"all_reduce@2": 1e-9}},
     "tp_blocking_wait_s_per_byte key 'all_reduce@2' has no tp_blocking_wait_s entry")])
def test_a_bad_dtensor_form_wait_is_refused_naming_its_field(fields, message):
    with pytest.raises(PlannerError, match=message):
        ClusterSpec.from_dict({**spec().to_dict(), **fields})
