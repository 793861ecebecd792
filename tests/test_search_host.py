"""The step's host terms in the search (`planner.stage_host`): the same engine starts,
pipelining actions, tied gradient sums and placed cold counts the estimate adds
(`cost_models.estimate`, `cost_models.step_host`, `cost_models.tied_sync`), grouped as the
executor runs them: tied sums per pipeline RANK, tie groups per (owner, tensor), a
forward's entry by whether a backward ran just before it in the schedule's order."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cost_models.common import layer_configs
from cost_models.compute import layer_compute
from cost_models.estimate import estimate
from cost_models.step_host import placed_compute, placed_layers
from cost_models.synthetic import gpt_layer_graph
from cost_models.tied_memory import tied_copies
from cost_models.tied_sync import sum_traffic_bytes, tied_sum_seconds
from ir.kernel_calibration import MEMORY_KERNELS, ColdKernelPoint, KernelCalibration
from ir.plan import uniform_plan
from ir.strategy import Checkpoint, Precision, Schedule
from planner.models import load_layer_graph
from planner.search import search
from planner.search_space import OuterCandidate, SearchOptions
from planner.stage_host import StageHost
from tests.cpu_specs import two_cpu_processes
from tests.layer_graphs import layer_graph

ENGINE_S, ACTION_S = 1e-3, 2e-3  # round figures far above the float noise of the rest
COLD_L2_BYTES = 2**20  # a made-up L2: more than a tiny block's pass, so credits are > 0
TIED_SPEC = "gpt:layers=2,hidden=64,heads=4,vocab=512,seq=32"  # embedding tied to the head


def _objectives(graph, cal, micro_batch: int | None = None) -> dict[int, float]:
    """Micro-batches -> the DP objective of the search's pp 2 GPipe plan of that count
    (the least: the final front's other cuts come with theirs, `search.FRONT_PLANS`)."""
    options = SearchOptions(pp=2, tp=1, schedule=Schedule.GPIPE, micro_batch=micro_batch,
                            precision=Precision.FP32, top_k=8, no_offload=True)
    result = search(graph, two_cpu_processes(cal), 4, options, with_baselines=False)
    out: dict[int, float] = {}
    for c in result.candidates:
        m = c.plan.num_microbatches
        out[m] = min(out.get(m, c.objective_s), c.objective_s)
    return out


def test_the_search_objective_carries_engine_starts_and_actions_per_stage_and_micro_batch():
    """pp 2, GPipe, m = 4, e per backward call, a per action: each stage's T grows by
    h = e + 2a per micro-batch (one backward call, a forward and a backward action), so
    sum T + (m - 1) max T grows by (p + m - 1) h = 5 (1 + 4) ms = 25 ms. The estimate's
    GPipe form grows by the same 5 h (tests/test_step_host.py)."""
    graph = gpt_layer_graph(layers=4, hidden=64, heads=4, vocab=128, seq=16)
    bare = KernelCalibration(measured_on="test")
    cal = dataclasses.replace(bare, autograd_call_host_s=ENGINE_S,
                              pipeline_action_host_s=ACTION_S)
    without, with_host = _objectives(graph, bare, 1), _objectives(graph, cal, 1)
    assert with_host[4] - without[4] == pytest.approx(5 * (ENGINE_S + 2 * ACTION_S))


def test_the_host_terms_reorder_two_pipeline_candidates():
    """pp 2, GPipe, global batch 4: m = 4 (micro-batch 1) against m = 2 (micro-batch 2).
    Without host terms more micro-batches shrink the bubble: O4 < O2. Each micro-batch
    pays h per stage, so O4 grows by (2 + 4 - 1) h = 5 h and O2 by (2 + 2 - 1) h = 3 h: with
    h above (O2 - O4) / 2 the order flips. Priced at h = O2 - O4 (twice that threshold):
    O4' - O2' = (O4 - O2) + 2 h = O2 - O4 > 0."""
    graph = gpt_layer_graph(layers=4, hidden=64, heads=4, vocab=128, seq=16)
    bare = KernelCalibration(measured_on="test")
    plain = _objectives(graph, bare)
    assert plain[4] < plain[2]
    h = plain[2] - plain[4]  # = e + 2a with a = 0
    priced = _objectives(graph, dataclasses.replace(bare, autograd_call_host_s=h))
    assert priced[4] - plain[4] == pytest.approx(5 * h)
    assert priced[2] - plain[2] == pytest.approx(3 * h)
    assert priced[4] > priced[2]
    assert priced[4] - priced[2] == pytest.approx(plain[2] - plain[4])


def _kit() -> KernelCalibration:
    """Every step host term priced: engine, actions, cold ops both ways with the entry
    after a backward apart, the tied sum, the loop's own work (its loss on rank 1) and
    its walk over each rank's parameter tensors, the gradients' accumulation."""
    return KernelCalibration(measured_on="test", autograd_call_host_s=ENGINE_S,
                             pipeline_action_host_s=ACTION_S, forward_host_op_s=1e-9,
                             loss_sum_host_s=7e-6, optimizer_entry_host_s=1.1e-4,
                             cold_op_host_s=3e-6, cold_backward_op_host_s=2e-6,
                             cold_entry_host_s=4e-6, cold_entry_after_backward_host_s=9e-6,
                             tied_sum_host_s=5e-6, tied_sum_s_per_byte=1e-10,
                             grad_accumulate_host_s=1e-6, train_loop_param_host_s=2e-6)


def _placed_s(host, plan, a: int, b: int, r: int) -> float:
    """The placed change of stage a..b's edge layers on rank r at the plan's strategies
    (the search adds it per strategy in the stage program: `StageSolver.placed`)."""
    return sum(host.delta_s(j, plan.layer_strategies[j], placed)
               for j, (_, placed) in host.edges(a, b, r).items())


@pytest.mark.parametrize("cold_code", [False, True])
@pytest.mark.parametrize("schedule,clip", [(Schedule.GPIPE, False), (Schedule.ONE_F_ONE_B, True)])
def test_a_stage_adds_in_the_search_what_it_adds_in_the_estimate(schedule, clip, cold_code):
    """pp 2 on CPU, the embedding tied to the head (one on each rank), every term priced:
    for each rank the estimate's per-micro-batch compute + optimizer share, i.e. the
    traced layers' own compute + h(a, b, r) of the search, to the float. Rank 0 pays its
    own sum over the embedding's copy as rank 1 does over the head's (4 N bytes each).
    `cold_code`: the kit prices cold kernel code too, so the cut's edges lose the credit
    of the ops the trace's neighbours ran (`recent_ops.placed_recent_ops`) in both. A clipping
    plan's scalar all-reduce (`step_host.clip_all_reduce_s`) on both sides."""
    graph = layer_graph(TIED_SPEC, micro_batch=1, seq_len=32, dtype=torch.float32)
    n, m = len(graph.layers), 4
    plan = uniform_plan(n, pp=2, micro_batch=1, global_batch=m, schedule=schedule,
                        precision=Precision.FP32)
    kit = _kit()
    if cold_code:  # the blocks' passes at micro-batch 1 fill part of COLD_L2_BYTES
        kit = dataclasses.replace(kit, cold_kernels=tuple(ColdKernelPoint(
            kind, "float32", 10e-6, COLD_L2_BYTES) for kind in MEMORY_KERNELS))
        cut = plan.stages[1].first_layer  # blocks.1 after blocks.0's forward in the trace
        assert graph.layers[cut].recent_ops_fwd and graph.layers[cut - 1].recent_ops_bwd
    plan = dataclasses.replace(plan, clip_grad_norm=clip)
    cluster = two_cpu_processes(kit)
    configs = layer_configs(graph, plan, "cpu")
    est = estimate(graph, plan, cluster, configs=configs)
    cand = OuterCandidate(pp=2, num_microbatches=m, schedule=schedule, virtual_stages=1)

    def price(j, s, placed):
        return placed_compute(placed, s, cluster, configs[j]).total_s

    from cost_models.tied_sync import tied_grad_bytes
    host = StageHost(graph, cluster, cand, price, lambda j, name: tied_grad_bytes(
        graph.layers[j], configs[j], name=name), clip_ranks=cluster.world_size if clip else 0)
    assert tied_sum_seconds(graph, plan, cluster, 0, configs[0]) > 0  # the owner's rank too
    assert (est.stage_times[0].loop_s > estimate(graph, dataclasses.replace(
        plan, clip_grad_norm=False), cluster, configs=configs).stage_times[0].loop_s) is clip
    for r, stage in enumerate(plan.stages):
        a, b = stage.first_layer, stage.last_layer
        own = [layer_compute(graph.layers[j], plan.layer_strategies[j], cluster, configs[j])
               for j in range(a, b + 1)]
        t = est.stage_times[r]
        from_estimate = t.compute_forward_s + t.compute_backward_s + t.optimizer_s / m
        from_search = (sum(c.total_s + c.optimizer_s / m for c in own)
                       + host.stage_s(a, b, r) + _placed_s(host, plan, a, b, r))
        assert from_search == pytest.approx(from_estimate, rel=1e-12)


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize("checkpoint, engine_s, action_s", [
    (Checkpoint.NONE, ENGINE_S, ACTION_S),
    # no engine or action term to cover it: the floor is the cold terms' part alone, twice
    # per layer for the forward a full recompute reruns
    (Checkpoint.FULL, 0.0, 0.0)])
def test_no_stage_adds_less_than_the_floor_the_pruning_reads(schedule, checkpoint, engine_s,
                                                             action_s):
    """The search prunes on bounds shifted by `floor_s` (planner.stage_host): every
    stage a..b on every rank must add at least that, or a candidate could be cut wrongly.
    With a full recompute and no engine or action term, h is the placed change alone:
    it may fall below 0 (a layer's forward run warm, twice), and the floor with it.
    Measured (either schedule): the least h -71.0 us, the floor -90 us; counting the
    forward's cold terms once (-45 us, half: no engine or action term) would cut it wrongly."""
    graph = layer_graph(TIED_SPEC, micro_batch=1, seq_len=32, dtype=torch.float32)
    n, m = len(graph.layers), 4
    kit = dataclasses.replace(_kit(), autograd_call_host_s=engine_s,  # the step's once
                              pipeline_action_host_s=action_s,  # terms as the engine's
                              loss_sum_host_s=engine_s, optimizer_entry_host_s=engine_s,
                              grad_accumulate_host_s=engine_s)
    cluster = two_cpu_processes(kit)
    plan = uniform_plan(n, pp=2, micro_batch=1, global_batch=m, schedule=schedule,
                        checkpoint=checkpoint, precision=Precision.FP32)
    configs = layer_configs(graph, plan, "cpu")
    cand = OuterCandidate(pp=2, num_microbatches=m, schedule=schedule, virtual_stages=1)
    from cost_models.tied_sync import tied_grad_bytes
    host = StageHost(graph, cluster, cand, lambda j, s, placed: placed_compute(
        placed, s, cluster, configs[j]).total_s,
        lambda j, name: tied_grad_bytes(graph.layers[j], configs[j], name=name))
    spans = [(a, b, r) for a in range(n) for b in range(a, n) for r in range(2)]
    least = min(host.stage_s(a, b, r) + _placed_s(host, plan, a, b, r) for a, b, r in spans)
    if engine_s:
        assert host.floor_s > 0  # the engine start and two actions, less the cold terms
    else:
        assert host.floor_s < 0  # the cold terms' part alone
        assert least < host.floor_s / 2  # the recompute's second count is needed
    assert least >= host.floor_s


def _tie(layer, name: str, owner: int, owner_param: str, params: int):
    return dataclasses.replace(layer, tied_param_names=(name,), tied_owner_layers=(owner,),
                               tied_owner_params=(owner_param,), tied_params=params)


def test_tied_sums_group_by_rank_under_interleaving():
    """pp 2 x 2 chunks over 4 layers, one per stage: stages 0 and 2 on rank 0, 1 and 3 on
    rank 1. Layer 0 owns a shared tensor of N = 1000 elements; layer 2 (stage 2, rank 0)
    and layer 3 (stage 3, rank 1) hold copies. Rank 0 sums its two copies in one sum
    (executors.tied.TiedGradients: a rank's stage modules together): 5 us + 1e-10 s/B x
    (5 x 2 - 1) x 4000 B = 5 us + 3.6 us, charged at its last holder, layer 2; rank 1
    sums its one copy: 5 us + 1e-10 x 4 x 4000 = 6.6 us. Per stage, as before, rank 0
    would have paid two one-copy sums, 13.2 us."""
    base = gpt_layer_graph(layers=2, hidden=64, heads=4, vocab=128, seq=16)
    layers = list(base.layers)
    layers[2] = _tie(layers[2], "blocks.1.w", 0, "embed.weight", 1000)
    layers[3] = _tie(layers[3], "head.w", 0, "embed.weight", 1000)
    graph = dataclasses.replace(base, layers=tuple(layers), fingerprint="tied-interleaved")
    plan = uniform_plan(4, pp=2, virtual_stages=2, micro_batch=1, global_batch=4,
                        schedule=Schedule.INTERLEAVED, precision=Precision.FP32)
    assert [plan.stage_of(j) % 2 for j in range(4)] == [0, 1, 0, 1]
    cluster = two_cpu_processes(KernelCalibration(measured_on="test", tied_sum_host_s=5e-6,
                                                  tied_sum_s_per_byte=1e-10))
    config = layer_configs(graph, plan, "cpu")[0]
    two_copies = 5e-6 + 1e-10 * sum_traffic_bytes(2, 4000)
    sums = [tied_sum_seconds(graph, plan, cluster, j, config) for j in range(4)]
    assert sums == pytest.approx([0.0, 0.0, two_copies, 5e-6 + 1e-10 * sum_traffic_bytes(1, 4000)])
    assert two_copies == pytest.approx(8.6e-6)
    # the search's h, over the same chunks: rank 0's sum once, at its last chunk, / m
    cand = OuterCandidate(pp=2, num_microbatches=4, schedule=Schedule.INTERLEAVED,
                          virtual_stages=2)
    host = StageHost(graph, cluster, cand, lambda j, s, placed: 0.0, lambda j, name: 4000.0)
    host.with_pieces([(j, j) for j in range(4)])
    assert [host.stage_s(j, j, j % 2) * 4 for j in range(4)] == pytest.approx(sums)


def test_two_tensors_shared_by_one_owner_stay_apart():
    """Layer 0 owns two shared tensors, A and B; layer 2 holds a copy of A, layer 3 of B.
    Keyed by owner alone, both ties would read (0, 2, 3): three copies summed as one."""
    base = gpt_layer_graph(layers=2, hidden=64, heads=4, vocab=128, seq=16)
    layers = list(base.layers)
    layers[2] = _tie(layers[2], "blocks.1.a", 0, "embed.A", 10)
    layers[3] = _tie(layers[3], "head.b", 0, "embed.B", 20)
    graph = dataclasses.replace(base, layers=tuple(layers), fingerprint="two-ties-one-owner")
    assert tied_copies(graph, "blocks.1.a") == (0, 2)
    assert tied_copies(graph, "head.b") == (0, 3)


class _Owner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(8, 8))
        self.b = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return x @ self.a @ self.b


class _TwoShared(torch.nn.Module):
    """`owner`, one layer, holds two weights; `first` reuses one, `second` the other (as
    a tied embedding's head does), so the executor makes two tie groups (executors.tied)."""

    def __init__(self):
        super().__init__()
        self.owner = _Owner()
        self.first = torch.nn.Linear(8, 8, bias=False)
        self.second = torch.nn.Linear(8, 8, bias=False)
        self.first.weight = self.owner.a
        self.second.weight = self.owner.b

    def forward(self, x):
        return self.second(self.first(self.owner(x)))


def test_a_traced_owner_of_two_shared_tensors_gives_two_tie_groups():
    """Traced: the owner is layer 0 for both copies; the tensors' own names keep them
    apart, as `executors.tied.find_tie_groups` does by tensor identity."""
    from executors.tied import find_tie_groups
    from ir.measure import build_layer_graph

    model = _TwoShared()
    graph = build_layer_graph(model, {"x": torch.randn(2, 8)}, dtype=torch.float32)
    names = [layer.name for layer in graph.layers]
    first, second = names.index("first"), names.index("second")
    owner = graph.layers[first].tied_owner_layers[0]
    assert graph.layers[second].tied_owner_layers == (owner,)
    assert graph.layers[first].tied_owner_params != graph.layers[second].tied_owner_params
    executor = sorted(group.layers for group in find_tie_groups(model, graph))
    assert sorted((tied_copies(graph, graph.layers[j].tied_param_names[0])
                   for j in (first, second))) == executor


@pytest.mark.parametrize("schedule, pp, v, shares", [
    # GPipe F0..F3 then B0..B3: only the step's first forward follows a backward
    (Schedule.GPIPE, 2, 1, {0: 0.25, 1: 0.25}),
    # 1F1B, rank 0: F0 F1 B0 F2 B1 F3 B2 B3 (F0, F2, F3 after a backward); rank 1:
    # F0 B0 F1 B1 ...: every forward after a backward
    (Schedule.ONE_F_ONE_B, 2, 1, {0: 0.75, 1: 1.0}),
    # the plain loop: F B F B ...
    (Schedule.ONE_F_ONE_B, 1, 1, {0: 1.0}),
    # interleaved rank 0: F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 ...:
    # chunk 0 F.0 (the step's first) and F.3 after a backward, chunk 1 F.2 and F.3
    (Schedule.INTERLEAVED, 2, 2, {0: 0.5, 2: 0.5}),
])
def test_a_forward_follows_a_backward_as_the_schedule_orders_them(schedule, pp, v, shares):
    """The share of each stage's first layer's forwards that follow a backward, m = 4."""
    graph = gpt_layer_graph(layers=6, hidden=64, heads=4, vocab=128, seq=16)
    plan = uniform_plan(len(graph.layers), pp=pp, virtual_stages=v, micro_batch=1,
                        global_batch=4, schedule=schedule, precision=Precision.FP32)
    cluster = two_cpu_processes(KernelCalibration(measured_on="test",
                                                  cold_entry_after_backward_host_s=9e-6))
    placed = placed_layers(graph, plan, cluster)
    for stage, share in shares.items():
        first = plan.stages[stage].first_layer
        after = sum(s for s, layer in placed[first] if layer.forward_after_backward)
        assert after == pytest.approx(share)
    inner = plan.stages[0].first_layer + 1  # inside a stage: after its neighbour's forward
    assert [layer.forward_after_backward for _, layer in placed[inner]] == [False]


def test_the_shifted_lower_bounds_stay_below_every_objective_found():
    """Pruning reads `_lower_bound` + `bound_shift_s(floor)`: with every host term priced
    (engine, actions, cold ops, entries, tied sums) no candidate the search solved may
    score below its own bound, or a better one could have been pruned."""
    from planner.layer_tables import memory_budget_bytes, price_layers
    from planner.lower_bound import bound_budget_bytes
    from planner.search import _lower_bound
    from planner.stage_host import bound_shift_s, stage_host

    graph = layer_graph(TIED_SPEC, micro_batch=1, seq_len=32, dtype=torch.float32)
    cluster = two_cpu_processes(_kit())
    options = SearchOptions(precision=Precision.FP32, top_k=50, no_offload=True)
    result = search(graph, cluster, 8, options, with_baselines=False)
    assert {c.outer.pp for c in result.candidates} == {1, 2}
    for c in result.candidates:
        tables, _ = price_layers(graph, cluster, c.outer, options, 8, None, {})
        budget = bound_budget_bytes(c.outer, tables, memory_budget_bytes(cluster, options))
        host = stage_host(graph, cluster, c.outer, tables, options, 8, None, None)
        bound = _lower_bound(c.outer, tables, budget) + bound_shift_s(c.outer, host.floor_s)
        assert bound <= c.objective_s * (1 + 1e-12)
        assert bound_shift_s(c.outer, host.floor_s) > 0  # the engine starts at least


class _Pair(torch.nn.Module):
    """x @ a @ b over two weights given to it."""

    def __init__(self, a: torch.nn.Parameter, b: torch.nn.Parameter):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return x @ self.a @ self.b


class _OneHolderOfTwo(torch.nn.Module):
    """`owner` holds two 8 x 8 weights; `both`, one layer, reuses the two of them, so the
    executor makes two tie groups over the same two layers (executors.tied)."""

    def __init__(self):
        super().__init__()
        self.owner = _Owner()
        self.both = _Pair(self.owner.a, self.owner.b)

    def forward(self, x):
        return self.both(self.owner(x))


def test_two_tensors_copied_into_one_layer_are_two_sums():
    """The executor sums each shared tensor on its own (`TiedGradients.sync`, groups by
    tensor identity). Layer `both` copies A and B, 64 elements each: two groups of two
    copies, each 5 us + 1e-10 s/B x (5 x 2 - 1) x 256 B = 5.2304 us, 10.4608 us a step.
    Counted together (one group of 128 elements) it was 5 us + 1e-10 x 9 x 512 = 5.4608
    us: one call's overhead short."""
    from executors.tied import find_tie_groups
    from ir.measure import build_layer_graph
    from cost_models.tied_memory import tie_groups
    from cost_models.tied_sync import tied_sum_seconds

    model = _OneHolderOfTwo()
    graph = build_layer_graph(model, {"x": torch.randn(2, 8)}, dtype=torch.float32)
    both = [layer.name for layer in graph.layers].index("both")
    assert graph.layers[both].tied_param_numels == (64, 64)
    groups = tie_groups(graph)
    assert len(groups) == 2 == len(find_tie_groups(model, graph))
    assert {g.holders for g in groups} == {(0, both)}
    plan = uniform_plan(len(graph.layers), pp=1, micro_batch=2, global_batch=2,
                        precision=Precision.FP32)
    cluster = dataclasses.replace(two_cpu_processes(KernelCalibration(
        measured_on="test", tied_sum_host_s=5e-6, tied_sum_s_per_byte=1e-10)),
        devices_per_node=1, host_cores=1)
    config = layer_configs(graph, plan, "cpu")[both]
    assert tied_sum_seconds(graph, plan, cluster, both, config) == pytest.approx(10.4608e-6)


def test_on_idle_cores_the_cpu_dp_sync_is_exposed_whole_in_estimate_and_search():
    """gpt-tiny, dp 2 replicated, FP32, 2 CPU processes on 8 cores (idle share 0.75):
    every DP call blocks the main thread (FSDP2 issues its reduce with async_op False on
    gloo: `estimate.overlap_efficiency`), so none hides behind backward. A block's
    all-reduce: 49,984 fp32 parameters = 199,936 B, a ring of 2: 2 (n-1)/n x 199,936 B at
    1 GB/s + 2 x 100 us latency = 399.9 us; the 7 units 2.2412 ms in all, exposed whole
    (hidden at 0.75 behind the 6.53 ms backward it had read 0). The search's objective
    for its plan is the estimate's, composed, to the float."""
    from tests.test_cost_host import cpu_spec
    from tests.test_search import _composed_s

    graph = load_layer_graph("gpt-tiny", micro_batch=2, dtype=torch.float32)
    cluster = cpu_spec(host_cores=8)
    assert (cluster.devices_per_node, cluster.host_cores) == (2, 8)  # 6 of 8 cores idle
    plan = uniform_plan(len(graph.layers), dp=2, zero=0, micro_batch=2, global_batch=4,
                        precision=Precision.FP32)
    stage = estimate(graph, plan, cluster).stage_times[0]
    assert stage.compute_backward_s > 2.2412e-3 / 0.75  # the old overlap hid it all
    assert stage.dp_step_s == pytest.approx(2.2412e-3, rel=1e-4)
    options = SearchOptions(pp=1, tp=1, zero=0, micro_batch=2, no_checkpoint=True,
                            no_offload=True, precision=Precision.FP32)
    best = search(graph, cluster, 4, options, with_baselines=False).best
    assert best.plan == plan
    assert best.objective_s == pytest.approx(_composed_s(best.estimate, 1), rel=1e-12)


class _Single(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return x @ self.w


class _TwoOwnersOneCopier(torch.nn.Module):
    """`first` owns A, `second` owns B, `both` copies A and B: two tie groups whose
    holders differ, (first, both) and (second, both), with one copy layer between them."""

    def __init__(self):
        super().__init__()
        self.first, self.second = _Single(), _Single()
        self.both = _Pair(self.first.w, self.second.w)

    def forward(self, x):
        return self.both(self.second(self.first(x)))


def test_each_tie_group_reads_its_own_holders_for_the_local_share():
    """pp 2 cut after `first`, ZeRO-3 dp 2: A's holders sit on two ranks (sync sums full
    gradients: share 1), B's on rank 1 alone in one layout (sync sums the local shards:
    1 / dp 2 = 0.5). Both groups' first copy is `both`; reading the holders of the copy's
    first tensor for B too gave it A's share, 1."""
    from ir.measure import build_layer_graph
    from cost_models.tied_memory import tie_groups, tied_local_fraction

    graph = build_layer_graph(_TwoOwnersOneCopier(), {"x": torch.randn(2, 8)},
                              dtype=torch.float32)
    names = [layer.name for layer in graph.layers]
    both = names.index("both")
    plan = uniform_plan(len(graph.layers), dp=2, zero=3, pp=2, micro_batch=1,
                        global_batch=4, precision=Precision.FP32,
                        stage_boundaries=(names.index("second"),))
    shares = {tuple(names[k] for k in group.holders):
              tied_local_fraction(graph, plan, group.copy, group.name)
              for group in tie_groups(graph)}
    assert shares == {("first", "both"): 1.0, ("second", "both"): 0.5}
