"""Host costs a step pays per pass, not per layer (`cost_models.step_host`): the autograd
engine's start once per backward call, and a stage's first and last layers' cold ops
counted against what their rank ran just before them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cost_models.clusters import get_cluster
from cost_models.estimate import estimate
from cost_models.step_host import backward_calls, engine_start_s, placed_layers
from cost_models.synthetic import gpt_layer_graph
from ir.kernel_calibration import KernelCalibration
from ir.measure import build_layer_graph
from ir.plan import uniform_plan
from ir.strategy import Precision, Schedule
from tests.cpu_specs import two_cpu_processes
from tests.test_cold_window import MixNegGate

ENGINE_S = 1e-3  # a round figure, far above the float noise of the other terms


@pytest.mark.parametrize("schedule, pp, v, m, calls", [
    (Schedule.ONE_F_ONE_B, 2, 1, 4, {0: 4, 1: 4}),  # 2 stages x 4 micro-batches: 8 calls
    (Schedule.GPIPE, 2, 1, 4, {0: 4, 1: 4}),
    (Schedule.ONE_F_ONE_B, 1, 1, 4, {0: 4}),  # the plain loop: loss.backward() per batch
    (Schedule.INTERLEAVED, 1, 2, 4, {0: 4}),  # pp 1 runs the plain loop, stages or not
    (Schedule.INTERLEAVED, 2, 2, 4, {0: 4, 1: 4, 2: 4, 3: 4}),  # one per chunk and batch
])
def test_one_engine_call_per_backward_pass(schedule, pp, v, m, calls):
    plan = uniform_plan(8, pp=pp, micro_batch=1, global_batch=m, schedule=schedule,
                        virtual_stages=v, precision=Precision.FP32)
    assert backward_calls(plan.schedule, plan.pp, plan.num_microbatches,
                          plan.virtual_stages) == calls


def _iteration(graph, plan, engine_s: float):
    cal = KernelCalibration(measured_on="test", autograd_call_host_s=engine_s)
    return estimate(graph, plan, two_cpu_processes(cal))


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_the_step_pays_the_engine_start_per_stage_and_micro_batch(schedule):
    """2 stages x 4 micro-batches, e = ENGINE_S per call. Each stage's backward grows by e
    per micro-batch (4 calls per rank, 8 in all). GPipe's closed form, sum_r (F_r + B_r)
    + (m - 1)(max f + max b), grows by p e + (m - 1) e = 5 e. 1F1B's critical rank k grows
    by k e (ranks before) + m e + (p - 1 - k) e where its round trip shows: between m e = 4e
    and (m + p - 1) e = 5 e. The critical rank's compute grows by m e = 4 e exactly."""
    graph = gpt_layer_graph(layers=4, hidden=64, heads=4, vocab=128, seq=16)
    plan = uniform_plan(len(graph.layers), pp=2, micro_batch=1, global_batch=4,
                        schedule=schedule, precision=Precision.FP32)
    without, with_engine = _iteration(graph, plan, 0.0), _iteration(graph, plan, ENGINE_S)
    assert [s.engine_s for s in with_engine.stage_times] == [ENGINE_S, ENGINE_S]
    grown = with_engine.iteration_seconds - without.iteration_seconds
    if schedule is Schedule.GPIPE:
        assert grown == pytest.approx(5 * ENGINE_S)
    else:
        assert 4 * ENGINE_S - 1e-12 <= grown <= 5 * ENGINE_S + 1e-12
    assert with_engine.time.compute - without.time.compute == pytest.approx(4 * ENGINE_S)
    assert with_engine.time.total == pytest.approx(with_engine.iteration_seconds)


def test_no_pipeline_pays_it_once_per_micro_batch_and_gpus_not_at_all():
    """pp = 1, m = 4: four `loss.backward()` calls, 4 e. A GPU preset carries no engine
    start (its host hides under the device's queue): 0."""
    graph = gpt_layer_graph(layers=2, hidden=64, heads=4, vocab=128, seq=16)
    plan = uniform_plan(len(graph.layers), micro_batch=1, global_batch=4,
                        precision=Precision.FP32)
    grown = (_iteration(graph, plan, ENGINE_S).iteration_seconds
             - _iteration(graph, plan, 0.0).iteration_seconds)
    assert grown == pytest.approx(4 * ENGINE_S)
    assert engine_start_s(get_cluster("h100-80g")) == 0.0


def test_a_stage_entry_counts_its_cold_ops_against_what_its_rank_ran_before():
    """mix | neg, gate on 2 ranks, 1F1B, 2 micro-batches (torch's order: rank 0 F0 F1 B0 B1,
    rank 1 F0 B0 F1 B1; a step's first pass follows the step before's last, a backward).
    Rank 1's forwards each follow its backward, which ends in neg's (aten.neg): neg's one
    forward op is warm, 0 cold (model order counted it against mix: 1). Rank 0: F0 after
    mix's backward (relu and tanh cold: 2), F1 after mix's forward (0): mean 1 (model order:
    2, its own backward). Mix's backward: B0 after F1 (mix's forward warm: threshold_backward
    and tanh_backward cold, 2), B1 after B0 (0): mean 1. Gate, inside its stage, keeps its
    count (1); last on the last stage, its backward B0 follows F0 (gate's and, within the
    window, neg's forward ops warm: sigmoid_backward and tanh_backward cold, 2), B1 follows
    F1 and, the window still open (5 distinct ops), B0: 0; mean 1 (model order: 2). The
    window stops at the step's start: the optimizer step ran there.
    Priced at c per cold op, the stages' forwards move by exactly those counts."""
    # no parameters: the input requires grad, else a step runs no backward at all
    graph = build_layer_graph(MixNegGate(), {"x": torch.randn(2, 8, requires_grad=True)},
                              dtype=torch.float32)
    mix, neg, gate = graph.layers
    assert mix.backward_overloads >= {"aten.threshold_backward.default",
                                      "aten.tanh_backward.default"}
    assert neg.forward_overloads == {"aten.neg.default"} <= neg.backward_overloads
    assert [l.cold_distinct_ops_fwd for l in graph.layers] == [2, 1, 1]  # model order
    plan = uniform_plan(3, pp=2, micro_batch=1, global_batch=2, stage_boundaries=(1,),
                        precision=Precision.FP32)
    placed = placed_layers(graph, plan)

    def forwards(passes):  # (share, after a backward, cold forward ops) per kind of pass
        return [(share, l.forward_after_backward, l.cold_distinct_ops_fwd) for share, l in passes]
    # mix: F0 after a backward (2 cold), F1 after F0 (0); neg: both after a backward
    assert forwards(placed[0]) == [(0.5, False, 0.0), (0.5, True, 2.0)]
    assert forwards(placed[1]) == [(1.0, True, 0.0)]
    assert forwards(placed[2]) == [(1.0, False, 1)]  # inside its stage: as traced
    cold_bwd_mix = len(mix.backward_overloads - mix.forward_overloads) / 2
    assert all(l.cold_distinct_ops_bwd == pytest.approx(cold_bwd_mix) for _, l in placed[0])
    after_forward = gate.forward_overloads | neg.forward_overloads  # the window: both
    cold_b0 = len(gate.backward_overloads - after_forward)
    assert cold_b0 == 2  # sigmoid_backward, tanh_backward
    assert placed[2][0][1].cold_distinct_ops_bwd == pytest.approx((cold_b0 + 0) / 2)

    cold_s = 1e-3
    base = KernelCalibration(measured_on="test", forward_host_op_s=1e-9)
    cold = dataclasses.replace(base, cold_op_host_s=cold_s)
    plain = estimate(graph, plan, two_cpu_processes(base))
    priced = estimate(graph, plan, two_cpu_processes(cold))
    moved = [c.compute_forward_s - p.compute_forward_s
             for c, p in zip(priced.stage_times, plain.stage_times)]
    assert moved == pytest.approx([1.0 * cold_s, (0.0 + 1.0) * cold_s])


def test_a_stage_entry_after_a_forward_of_other_code_is_priced_as_a_cold_entry():
    """A stage's first layer keeps the trace's `same_code_before` (the layer before it in
    the model) only where its rank ran that code just before. gpt-tiny on 3 GPipe ranks,
    stages [embed, blocks.0], [blocks.1, blocks.2], [blocks.3, norm, head]: blocks.3 was
    traced after blocks.2 (same code), but 3 of its 4 forwards run right after the head's
    forward (GPipe's F F F F) and so pay the cold entry read at its `after_ops`, not the
    same-code one (the trace's count kept it at 1.4 us where the kit read 10: a forward
    under-priced by 8.6 us); blocks.1's follow blocks.2's, the same code."""
    from cost_models.host_dispatch import cold_entry_seconds
    from ir.kernel_points import ColdEntryPoint
    from planner.models import load_layer_graph

    graph = load_layer_graph("gpt-tiny", micro_batch=1, seq_len=32, dtype=torch.float32)
    names = [l.name for l in graph.layers]
    first_block, last_block = names.index("blocks.1"), names.index("blocks.3")
    assert graph.layers[first_block].same_code_before and graph.layers[last_block].same_code_before
    plan = uniform_plan(len(names), pp=3, micro_batch=1, global_batch=4, schedule=Schedule.GPIPE,
                        stage_boundaries=(first_block, last_block), precision=Precision.FP32)
    placed = placed_layers(graph, plan)

    def after_forward(j):
        return [(share, l.same_code_before) for share, l in placed[j]
                if not l.forward_after_backward]
    assert after_forward(last_block) == [(0.75, False)]  # after the head's forward
    assert after_forward(first_block) == [(0.75, True)]  # after blocks.2's

    entry_s, same_code_s = 10e-6, 1.4e-6
    cal = KernelCalibration(measured_on="test", cold_entry_same_code_host_s=same_code_s,
                            cold_entry_points=(ColdEntryPoint(0, False, entry_s, 0.0),
                                               ColdEntryPoint(0, True, entry_s, 0.0)))
    layer = next(l for share, l in placed[last_block] if not l.forward_after_backward)
    assert layer.cold_distinct_ops_fwd == 0
    assert cold_entry_seconds(layer, cal) == pytest.approx(entry_s)
    assert cold_entry_seconds(graph.layers[last_block], cal) == pytest.approx(same_code_s)


def test_warm_ops_reach_back_over_small_passes_but_not_over_the_optimizer_step():
    """Rank 0 of pp 2, two chunks: chunk 0 (stage 0) one layer of ops {a, b} forward and
    {ga} backward, chunk 1 (stage 2) one of {c} and {gc}. Passes F0.0, F1.0, B1.0, B0.0:
    F1.0 follows F0.0 ({a, b}); B1.0 follows F1.0 and, the window open, F0.0 ({a, b, c});
    the step's first, F0.0, follows the step before's last pass, B0.0, alone ({ga})."""
    from cost_models.pipeline_ops import PassOp
    from cost_models.step_host import warm_before
    from tests.cpu_specs import linear_layer

    def layer(fwd, bwd):
        measured = dataclasses.replace(linear_layer().measured, forward_overloads=frozenset(fwd),
                                       backward_overloads=frozenset(bwd))
        return dataclasses.replace(linear_layer(), measured=measured)

    spans = [[layer("ab", ["ga"])], [], [layer("c", ["gc"])], []]  # stages 0..3; rank 0's
    ops = [PassOp(True, 0, 0), PassOp(True, 1, 0), PassOp(False, 1, 0), PassOp(False, 0, 0)]
    assert warm_before(ops, 1, spans, 2, 0) == {"a", "b"}
    assert warm_before(ops, 2, spans, 2, 0) == {"a", "b", "c"}
    assert warm_before(ops, 3, spans, 2, 0) == {"gc", "c", "a", "b"}
    assert warm_before(ops, 0, spans, 2, 0) == {"ga"}


def test_a_pipeline_pays_its_runtime_per_action_and_the_plain_loop_does_not():
    """2 stages x 4 micro-batches, GPipe, a per action: 16 actions (each stage a forward
    and a backward per micro-batch). Each stage's f and b grow by a, so the closed form
    sum_r (F_r + B_r) + (m - 1)(max f + max b) grows by 2 p a + 2 (m - 1) a = 10 a. The
    plain loop (pp 1) runs no action: unchanged."""
    from cost_models.step_host import pipeline_actions

    graph = gpt_layer_graph(layers=4, hidden=64, heads=4, vocab=128, seq=16)
    action_s = 1e-3
    piped = uniform_plan(len(graph.layers), pp=2, micro_batch=1, global_batch=4,
                         schedule=Schedule.GPIPE, precision=Precision.FP32)
    plain = uniform_plan(len(graph.layers), micro_batch=1, global_batch=4,
                         precision=Precision.FP32)
    def actions(plan):
        return pipeline_actions(plan.schedule, plan.pp, plan.num_microbatches,
                                plan.virtual_stages)
    assert actions(piped) == {0: 8, 1: 8} and actions(plain) == {}
    cal = KernelCalibration(measured_on="test", pipeline_action_host_s=action_s)
    bare = KernelCalibration(measured_on="test")
    for plan, grown in ((piped, 10 * action_s), (plain, 0.0)):
        with_runtime = estimate(graph, plan, two_cpu_processes(cal))
        without = estimate(graph, plan, two_cpu_processes(bare))
        assert with_runtime.iteration_seconds - without.iteration_seconds == pytest.approx(
            grown, abs=1e-12)


def test_the_runtime_probe_reads_a_plausible_figure(cpu_pipeline_action_probe):
    """torch pipelining's per-action host work on this CPU: ~30-35 us here (2026-11-25,
    load 7); between 1 us (a few Python calls) and 1 ms (more than the probe's layers), or 0
    where a busy host left every attempt reading no extra (then it says so on stderr).
    The reading is conftest's one real `pipeline_action_host_s("cpu")`."""
    seconds = cpu_pipeline_action_probe
    assert seconds == 0.0 or 1e-6 < seconds < 1e-3


def test_micro_batches_after_the_first_pay_each_tensors_accumulation():
    """pp = 1, m = 4, g per parameter tensor: 3 of the 4 backwards add into every .grad:
    the step grows by 3 (T g + 3 x 4 bytes x params / the kit's add rate), T the model's
    tensors (tied copies included), the kernel only where the kit measured adds; m = 1
    steals every gradient (nothing more), and a GPU preset prices none of it."""
    from cost_models.step_host import grad_accumulation_s

    graph = gpt_layer_graph(layers=2, hidden=64, heads=4, vocab=128, seq=16)
    accumulate_s = 1e-3
    from ir.kernel_points import MemoryKernelPoint

    gbps = 2.0  # one point: every size at it
    bare = KernelCalibration(measured_on="test",
                             memory_kernels=(MemoryKernelPoint("add", "float32", 1 << 20, gbps),))
    tensors = sum(len(l.param_names) + len(l.tied_param_names) for l in graph.layers)
    params = sum(l.params + l.tied_params for l in graph.layers)
    kernel_s = 3 * 4 * params / (gbps * 1e9)
    for cal, m, grown in ((bare, 4, 3 * (tensors * accumulate_s + kernel_s)), (bare, 1, 0.0),
                          (dataclasses.replace(bare, memory_kernels=()), 4,
                           3 * tensors * accumulate_s)):
        plan = uniform_plan(len(graph.layers), micro_batch=1, global_batch=m,
                            precision=Precision.FP32)
        cluster = two_cpu_processes(dataclasses.replace(cal, grad_accumulate_host_s=accumulate_s))
        priced = estimate(graph, plan, cluster).iteration_seconds
        bare_s = estimate(graph, plan, two_cpu_processes(cal)).iteration_seconds
        assert priced - bare_s == pytest.approx(grown, rel=1e-9, abs=1e-12)
    assert tensors > 0
    assert grad_accumulation_s(get_cluster("h100-80g"), graph.layers, 4) == 0.0


def test_the_accumulation_probe_reads_a_plausible_figure():
    """AccumulateGrad's add into an existing .grad, per tensor: 0.4-1.1 us here (one thread,
    2026-11-25, load 2-5); between 0 (a busy host can read the two ways alike) and 20 us
    (more than a few ops' dispatch)."""
    from cost_models.step_loop_probes import grad_accumulate_host_s

    assert 0.0 <= grad_accumulate_host_s("cpu") < 2e-5


def test_a_kit_that_timed_the_loop_cold_prices_it_in_place_of_the_warm_ops():
    """`train_loop_host_s` (one micro-batch holding the loss, its all-reduce included)
    replaces the loop's warm ops and the all-reduce; the other micro-batches' loss ops are
    priced per op as before, and a kit without it keeps the old price. The estimate of a
    plain 1-rank plan moves by exactly the difference."""
    from cost_models.host_dispatch import host_op_seconds
    from cost_models.step_host import LOSS_OPS_PER_MICROBATCH, STEP_LOOP_OPS, step_loop_s

    loss_sum_s, loop_s = 1e-5, 4e-4
    old = two_cpu_processes(KernelCalibration(measured_on="test", loss_sum_host_s=loss_sum_s))
    new = two_cpu_processes(KernelCalibration(measured_on="test", loss_sum_host_s=loss_sum_s,
                                              train_loop_host_s=loop_s))
    op_s, share = host_op_seconds(old), old.host_share
    old_s = ((STEP_LOOP_OPS + LOSS_OPS_PER_MICROBATCH) * op_s + loss_sum_s) * share
    assert step_loop_s(old, 1, True, "sgd") == pytest.approx(old_s)
    assert step_loop_s(new, 1, True, "sgd") == pytest.approx(loop_s * share)
    assert step_loop_s(new, 4, True, "sgd") == pytest.approx(
        (loop_s + 3 * LOSS_OPS_PER_MICROBATCH * op_s) * share)
    assert step_loop_s(new, 4, False, "sgd") == pytest.approx(
        (loop_s - LOSS_OPS_PER_MICROBATCH * op_s) * share)
    graph = gpt_layer_graph(layers=2, hidden=64, heads=4, vocab=128, seq=16)
    plan = uniform_plan(len(graph.layers), micro_batch=1, global_batch=1,
                        precision=Precision.FP32, optimizer="sgd")
    moved = estimate(graph, plan, new).iteration_seconds - estimate(
        graph, plan, old).iteration_seconds
    assert moved == pytest.approx(loop_s * share - old_s, rel=1e-6)


def test_the_train_loop_probe_reads_a_plausible_figure():
    """The real train_step's loop around one Linear, cold, beyond its forward, loss,
    backward and optimizer step: 0.32-0.37 ms here (2026-11-25, load 9-11); over 10 us
    (its ~20 ops alone) and under 5 ms (far more than a one-Linear step)."""
    from planner.train_loop_probe import train_loop_host_s

    assert 1e-5 < train_loop_host_s("cpu") < 5e-3


@pytest.mark.parametrize("model, first, own_window", [("llama-tiny", "blocks.2", False),
                                                     ("cnn-small", "head", True)])
def test_a_placed_stage_counts_its_cold_ops_as_the_trace_does_composites_inside(
        model, first, own_window):
    # A stage starting at a block whose RMSNorm runs a `mean` (or at cnn-small's head, its
    # pool a `mean`): its placed forwards count the mean's inner ops cold as the trace
    # does (`ir.composite_ops.cold_ops_fwd`), and its last layer's backwards their
    # composites' (`cold_ops_bwd`), each pass against what ran before it on its rank
    from bench.bench_kernel_model import traced_graph
    from cost_models.pipeline_ops import rank_ops
    from cost_models.step_host import place_rank, warm_before
    from ir.composite_ops import cold_ops_bwd, cold_ops_fwd
    from ir.op_count import cold_distinct_ops

    layers = traced_graph(model, 1)[0].layers
    a, b = next(i for i, l in enumerate(layers) if l.name == first), len(layers) - 1
    pp, rank, m = 2, 1, 2
    ops = rank_ops(Schedule.GPIPE, pp, rank, m, 1)
    placed = place_rank(layers, {rank: (a, b)}, Schedule.GPIPE, pp, rank, m, 1)
    warm = [warm_before(ops, i, {rank: layers[a:b + 1]}, pp, rank) for i in range(len(ops))]
    fwd = sorted(cold_ops_fwd(layers[a], w) for w, op in zip(warm, ops) if op.forward)
    assert sorted(l.cold_distinct_ops_fwd for _, l in placed[a]) == fwd
    # the mean's inner ops are among them: a count of distinct ops alone is fewer
    assert max(fwd) > max(cold_distinct_ops(layers[a], w) for w in warm)
    bwd = [cold_ops_bwd(layers[b], w) for w, op in zip(warm, ops) if not op.forward]
    last = placed[b][0][1]
    for field in ("cold_distinct_ops_bwd", "cold_inner_ops_bwd"):
        assert getattr(last, field) == sum(c[field] for c in bwd) / len(bwd)
    # a head alone runs its loss backward's inner ops cold in one of its two backwards
    # (the second follows its own, in the window): fewer than the trace's 1; behind
    # four layers' backwards (llama) its own falls out of the window: as traced
    assert (last.cold_inner_ops_bwd < layers[b].cold_inner_ops_bwd) == own_window


def test_the_loop_walks_every_parameter_tensor_of_the_rank():
    """`train_step`'s `reduce_partial_grads(module.parameters())` visits every parameter
    tensor of the rank once a step (2.5 us each in a gpt-tiny step, bench_step_terms):
    `train_loop_param_host_s` per tensor beyond the loop probe's own Linear's two; a kit
    without it prices none. The one-rank estimate moves by exactly that; with two
    pipeline ranks each walks its own stage's tensors."""
    from cost_models.step_host import TRAIN_LOOP_PROBE_PARAM_TENSORS, param_walk_s

    per_tensor_s = 1e-4  # a round figure, far above the float noise of the other terms
    old = two_cpu_processes(KernelCalibration(measured_on="test", train_loop_host_s=4e-4))
    new = two_cpu_processes(KernelCalibration(measured_on="test", train_loop_host_s=4e-4,
                                              train_loop_param_host_s=per_tensor_s))
    graph = gpt_layer_graph(layers=2, hidden=64, heads=4, vocab=128, seq=16)
    tensors = sum(len(layer.param_names) for layer in graph.layers)
    assert tensors > TRAIN_LOOP_PROBE_PARAM_TENSORS
    walk_s = (tensors - TRAIN_LOOP_PROBE_PARAM_TENSORS) * per_tensor_s * new.host_share
    assert param_walk_s(old, graph.layers) == 0.0
    assert param_walk_s(new, graph.layers) == pytest.approx(walk_s)
    plan = uniform_plan(len(graph.layers), micro_batch=1, global_batch=1,
                        precision=Precision.FP32, optimizer="sgd")
    moved = estimate(graph, plan, new).iteration_seconds - estimate(
        graph, plan, old).iteration_seconds
    assert moved == pytest.approx(walk_s, rel=1e-6)
    plan2 = uniform_plan(len(graph.layers), pp=2, micro_batch=1, global_batch=2,
                         precision=Precision.FP32, optimizer="sgd")
    grown = [a.optimizer_s - b.optimizer_s for a, b in zip(
        estimate(graph, plan2, new).stage_times, estimate(graph, plan2, old).stage_times)]
    spans = [graph.layers[s.first_layer:s.last_layer + 1] for s in plan2.stages]
    by_hand = [(sum(len(l.param_names) for l in span) - TRAIN_LOOP_PROBE_PARAM_TENSORS)
               * per_tensor_s * new.host_share for span in spans]
    assert grown == pytest.approx(by_hand, rel=1e-6)


def test_the_parameter_walk_counts_the_tied_copies_the_module_holds():
    """gpt-tiny ties its head to the embedding; `executors.tied.untie` gives the head its
    own copy, so `reduce_partial_grads(module.parameters())` walks one tensor per
    registered name (68 unique, 69 named): the walk counts every name, not the unique."""
    from cost_models.step_host import TRAIN_LOOP_PROBE_PARAM_TENSORS, param_walk_s
    from planner.models import load_layer_graph, load_model

    graph = load_layer_graph("gpt-tiny", micro_batch=1, seq_len=32, dtype=torch.float32)
    module = load_model("gpt-tiny", micro_batch=1, seq_len=32).module
    named = len(list(module.named_parameters(remove_duplicate=False)))
    assert named == len(list(module.parameters())) + 1  # the tie
    cluster = two_cpu_processes(KernelCalibration(measured_on="test", train_loop_host_s=4e-4,
                                                  train_loop_param_host_s=1e-4))
    assert param_walk_s(cluster, graph.layers) == pytest.approx(
        (named - TRAIN_LOOP_PROBE_PARAM_TENSORS) * 1e-4 * cluster.host_share)


def test_the_parameter_walk_probe_reads_a_plausible_figure():
    """`reduce_partial_grads` per parameter tensor after a step's layers ran: 0.7 us warm
    here, 2.5 us inside a gpt-tiny step (2026-11-26, load 6-8); over 0.1 us (a Python
    loop's turn) and under 20 us (more than a few ops' dispatch)."""
    from planner.train_loop_probe import train_loop_param_host_s

    assert 1e-7 < train_loop_param_host_s("cpu") < 2e-5
