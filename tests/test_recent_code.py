"""Cold kernel code read at the work between (`ir.op_count.recent_code_bytes`,
`cost_models.cold_kernel`): an op the work just before a pass ran (the layers before's
forwards; for a backward, its own forward and its backward window's passes) is charged by
the bytes run since then where they are fewer than the pass's own; other ops as before."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from torch import nn

from ir.kernel_calibration import ColdKernelPoint
from ir.kernel_records import KernelKind, KernelRecord
from ir.op_count import recent_code_bytes

from cost_models.cold_kernel import cold_kernel_seconds, recent_code_credit_seconds
from cost_models.compute import layer_compute
from cost_models.host_dispatch import host_position_key
from cost_models.step_host import placed_compute, placed_layers
from ir.plan import uniform_plan
from ir.strategy import Checkpoint, LayerStrategy, Precision, Schedule
from planner.stage_host import _passes_key
from tests.test_cold_entry import NormHead, _measured
from tests.test_kernel_sequence import BASE, config, spec


def mem(op: str, activation: int, weight: int = 0, count: int = 1) -> KernelRecord:
    return KernelRecord(f"aten::{op}", KernelKind.MEMORY, "float32", (8,), count,
                        weight_bytes=weight, activation_bytes=activation)


MM = KernelRecord("aten::mm", KernelKind.GEMM, "float32", (1, 8, 8, 8), 1,
                  weight_bytes=300, activation_bytes=400)
MM_BWD = dataclasses.replace(MM, weight_bytes=10, activation_bytes=20)


def layer(forward, backward):
    return SimpleNamespace(kernels=SimpleNamespace(forward=tuple(forward),
                                                   backward=tuple(backward)),
                           measured=SimpleNamespace(forward_overloads=frozenset({"f"}),
                                                    backward_overloads=frozenset({"b"})))


# layer 0: add, gelu forward; gelu_backward, add backward. layer 1 (the last): mm, gelu,
# mul forward; mm, mul, add (twice), sum backward.
LAYERS = [layer([mem("add", 1000), mem("gelu", 2000)], [mem("gelu_backward", 600),
                                                        mem("add", 70)]),
          layer([MM, mem("gelu", 500), mem("mul", 50)],
                [MM_BWD, mem("mul", 6), mem("add", 8, count=2), mem("sum", 5)])]


def test_the_bytes_since_each_op_last_ran_in_the_work_between():
    """By hand (bytes per call x count; (op, weight bytes, activation bytes)):
    - layer 0's forward follows nothing: none.
    - layer 1's forward follows layer 0's: gelu ran last there, nothing after it; before
      gelu here, mm (300 weight, 400 activation). mul never ran: absent; mm is no memory op.
    - layer 0's backward follows its forward, layer 1's forward and layer 1's backward (its
      window): add ran in layer 1's backward, sum (5) after it; gelu_backward before it
      here (600). gelu_backward ran nowhere: absent.
    - layer 1's backward (the last layer's) follows its own forward alone: mul ran last
      there (nothing after); mm's (10, 20) before it here. add and sum ran nowhere."""
    assert recent_code_bytes(LAYERS, 0) == {"recent_ops_fwd": (),
                                            "recent_ops_bwd": (("aten::add", 0, 605),)}
    assert recent_code_bytes(LAYERS, 1) == {"recent_ops_fwd": (("aten::gelu", 300, 400),),
                                            "recent_ops_bwd": (("aten::mul", 10, 20),)}


L2 = 1000  # bytes the made-up points' probe evicted
COLD = (ColdKernelPoint("gelu", "float32", 20e-6, L2),
        ColdKernelPoint("add", "float32", 4e-6, L2))
PASS = (mem("gelu", 3000), mem("add", 500))  # 3500 bytes: past the L2, both ops in full


def test_an_op_run_just_before_pays_for_the_bytes_since_not_the_pass_own():
    """gelu ran 250 bytes ago: a quarter of its point; add, not run before, in full; an op
    run longer ago than the pass's own bytes pays for the pass's own (in full here)."""
    cluster = spec(dataclasses.replace(BASE, cold_kernels=COLD))
    own = cold_kernel_seconds(PASS, cluster, config(), 1.0)
    assert own == pytest.approx(24e-6)
    assert cold_kernel_seconds(PASS, cluster, config(), 1.0, {"aten::gelu": 250}) == \
        pytest.approx(20e-6 * 0.25 + 4e-6)
    assert cold_kernel_seconds(PASS, cluster, config(), 1.0, {"aten::gelu": 9000}) == \
        pytest.approx(own)


def test_a_traced_block_after_a_block_pays_less_cold_code_than_the_first():
    """NormHead's blocks.1 follows blocks.0, which ran its ops: its forward is priced its
    credit (`recent_code_credit_seconds`, > 0) below the same layer with no work before
    recorded (`position_free`); a kit without cold points credits nothing."""
    graph, _ = _measured(NormHead())
    block = graph.layers[1]
    assert block.recent_ops_fwd and all(op.startswith("aten::") for op, _, _ in
                                        block.recent_ops_fwd)
    assert block.position_free().recent_ops_fwd == ()
    l2 = max(sum(r.total_bytes for r in block.kernels.forward), 1)  # own bytes fill it
    cluster = spec(dataclasses.replace(BASE, cold_kernels=tuple(
        ColdKernelPoint(kind, "float32", 10e-6, l2) for kind in ("add", "gelu", "copy",
                                                                  "sum", "layer_norm"))))
    credit_fwd, _ = recent_code_credit_seconds(block, cluster, config(), 1.0)
    assert credit_fwd > 0
    free = dataclasses.replace(block, recent_ops_fwd=(), recent_ops_bwd=())
    priced, unplaced = (layer_compute(x, LayerStrategy(), cluster, config())
                        for x in (block, free))
    assert unplaced.forward_s - priced.forward_s == pytest.approx(credit_fwd)
    assert recent_code_credit_seconds(block, spec(BASE), config(), 1.0) == (0.0, 0.0)


def test_the_search_prices_apart_layers_whose_work_before_differs():
    """`host_position_key` tells a block with recent ops from the same block without them
    where the kit prices cold code (the search shares one table per key), not where not."""
    graph, _ = _measured(NormHead())
    block = graph.layers[1]
    free = dataclasses.replace(block, recent_ops_fwd=(), recent_ops_bwd=())
    cold = spec(dataclasses.replace(BASE, cold_kernels=COLD))
    assert host_position_key(block, cold) != host_position_key(free, cold)
    assert host_position_key(block, spec(BASE)) == host_position_key(free, spec(BASE))


def _cold_code_only(block):
    """A kit that prices cold kernel code and no cold op on the host (placement still runs:
    `step_host.prices_cold_ops`); `block`'s own forward bytes fill each point's L2."""
    l2 = max(sum(r.total_bytes for r in block.kernels.forward), 1)
    return spec(dataclasses.replace(BASE, cold_kernels=tuple(
        ColdKernelPoint(kind, "float32", 10e-6, l2) for kind in (
            "add", "gelu", "copy", "sum", "layer_norm"))))


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_a_stage_cut_leaves_its_edges_no_credit_from_the_other_rank(schedule):
    """NormHead on 2 ranks, blocks.0 alone on the first: blocks.1's forward follows no
    blocks.0 forward on its rank (the rank's own backward or forward ran before it), and
    blocks.0's backward none of blocks.1's passes: both placed without the trace's recent
    ops (no credit: the price before it), whatever the schedule. blocks.2, inside its
    stage, keeps them; so does every layer without a pipeline."""
    graph, _ = _measured(NormHead())
    first, last = graph.layers[1], graph.layers[0]
    cluster = _cold_code_only(first)
    assert first.recent_ops_fwd and first.recent_ops_bwd and last.recent_ops_bwd
    plan = uniform_plan(5, pp=2, micro_batch=1, global_batch=2, stage_boundaries=(1,),
                        precision=Precision.FP32, schedule=schedule)
    placed = placed_layers(graph, plan, cluster)
    assert all(l.recent_ops_fwd == () for _, l in placed[1])
    assert all(l.recent_ops_bwd == () for _, l in placed[0])
    assert placed[2] == ((1.0, graph.layers[2]),)
    # blocks.1's backward runs right after blocks.2's on its rank: the trace's hold
    assert all(l.recent_ops_bwd == graph.layers[1].recent_ops_bwd for _, l in placed[1])
    priced = placed_compute(placed[1], LayerStrategy(), cluster, config())
    traced = layer_compute(first, LayerStrategy(), cluster, config())
    credit_fwd, _ = recent_code_credit_seconds(first, cluster, config(), 1.0)
    assert credit_fwd > 0
    assert priced.forward_s - traced.forward_s == pytest.approx(credit_fwd)
    whole = uniform_plan(5, pp=1, micro_batch=1, global_batch=2, precision=Precision.FP32)
    alone = placed_layers(graph, whole, cluster)
    assert [(p[-1][1].recent_ops_fwd, p[-1][1].recent_ops_bwd) for p in alone] == [
        (l.recent_ops_fwd, l.recent_ops_bwd) for l in graph.layers]


def test_a_recompute_forward_runs_after_a_backward_without_the_forward_credit():
    """A full recompute reruns the forward right after the layer after's backward, not
    after the layers before's forwards: it is priced as the layer with no recent ops,
    while its first forward keeps the credit."""
    graph, _ = _measured(NormHead())
    block = graph.layers[1]
    free = dataclasses.replace(block, recent_ops_fwd=(), recent_ops_bwd=())
    cluster = _cold_code_only(block)
    full = LayerStrategy(checkpoint=Checkpoint.FULL)
    priced, unplaced = (layer_compute(x, full, cluster, config()) for x in (block, free))
    assert priced.forward_s < unplaced.forward_s
    assert priced.recompute_s == pytest.approx(unplaced.recompute_s)


def test_the_search_keys_placed_passes_by_their_recent_ops():
    """Two placements of one layer that differ only in the recent ops price apart in the
    search's cache (`stage_host._passes_key`), as the estimate prices them."""
    graph, _ = _measured(NormHead())
    block = graph.layers[1]
    free = dataclasses.replace(block, recent_ops_fwd=(), recent_ops_bwd=())
    assert _passes_key(((1.0, block),)) != _passes_key(((1.0, free),))


class Act(nn.Module):
    """A Linear and one activation: two distinct forward ops, far below the window."""

    def __init__(self, act: nn.Module):
        super().__init__()
        self.fc, self.act = nn.Linear(8, 8), act

    def forward(self, x):
        return self.act(self.fc(x))


class GeluCut(nn.Module):
    """gelu in layers.0, layers.1 and layers.3, tanh in layers.2, then a head: cut before
    layers.2, gelu runs on stage 1 only in its second layer."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Act(a) for a in (nn.GELU(), nn.GELU(), nn.Tanh(),
                                                     nn.GELU()))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _gelu_ops(ops) -> set[str]:
    return {op for op, _, _ in ops if op == "aten::gelu" or op == "aten::gelu_backward"}


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_an_interior_layer_gets_no_credit_for_what_only_the_other_rank_ran(schedule):
    """GeluCut on 2 ranks. Cut before layers.2: in the trace layers.3's forward window
    (tanh's 2 ops, then layers.1's) holds gelu, run last in layers.1, on rank 0; placed,
    the window stops at its stage's first layer: no gelu credit. Cut before layers.3:
    layers.1's backward window (layers.2, then layers.3's, whose backward ran
    gelu_backward) holds gelu_backward; placed, it stops at layers.2, its stage's last:
    none. Each placed layer's recent ops are those counted on its stage's layers alone, and
    the search's placed layers (`StageHost.edges`) are the estimate's."""
    from planner.search_space import OuterCandidate
    from planner.stage_host import StageHost

    graph, _ = _measured(GeluCut())
    assert [l.name for l in graph.layers] == [f"layers.{i}" for i in range(4)] + ["head"]
    assert _gelu_ops(graph.layers[3].recent_ops_fwd) == {"aten::gelu"}
    assert _gelu_ops(graph.layers[1].recent_ops_bwd) == {"aten::gelu_backward"}
    cluster = _cold_code_only(graph.layers[3])
    cand = OuterCandidate(pp=2, num_microbatches=2, schedule=schedule, virtual_stages=1)
    host = StageHost(graph, cluster, cand, lambda j, s, p: 0.0, lambda j, name: 0.0)
    for cut, j, field in ((2, 3, "recent_ops_fwd"), (3, 1, "recent_ops_bwd")):
        plan = uniform_plan(5, pp=2, micro_batch=1, global_batch=2, stage_boundaries=(cut,),
                            precision=Precision.FP32, schedule=schedule)
        placed = placed_layers(graph, plan, cluster)
        a, b = (cut, 4) if j >= cut else (0, cut - 1)
        counted = recent_code_bytes(list(graph.layers[a:b + 1]), j - a)[field]
        assert all(getattr(l, field) == counted for _, l in placed[j])
        assert not _gelu_ops(counted)
        for (a, b), r in (((0, cut - 1), 0), ((cut, 4), 1)):
            assert {i: p for i, (_, p) in host.edges(a, b, r).items()} == {
                i: placed[i] for i in range(a, b + 1) if placed[i] != ((1.0, graph.layers[i]),)}
        assert j in host.edges(*((cut, 4, 1) if j >= cut else (0, cut - 1, 0)))



def test_the_solver_shifts_every_placed_layer_of_a_stage_interior_ones_included(monkeypatch):
    """A stage's placed layers (`StageHost.edges`) hold interior ones where a recent-ops
    window is clipped at a cut (GeluCut's layers.3 cut before layers.2): the solver
    shifts each by its placed change as the estimate prices it, not the edges alone. A
    host placing only layers.2, inside stage 1..3, by SHIFT_S on every strategy: the
    stage's least time is the plain one + SHIFT_S."""
    from planner import search as S
    from planner.search_space import SearchOptions
    from tests.cpu_specs import two_cpu_processes

    made = []

    class Kept(S.StageSolver):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(S, "StageSolver", Kept)
    graph, _ = _measured(GeluCut())
    cluster = two_cpu_processes(_cold_code_only(graph.layers[3]).kernel_calibration)
    S.search(graph, cluster, 2, SearchOptions(pp=1, no_checkpoint=True, no_offload=True,
                                              precision=Precision.FP32, zero=0, tp=1),
             with_baselines=False)
    shift_s = 1e-3

    class Host:
        def edges(self, a, b, r):
            return {2: ("placed apart", None)}

        def delta_s(self, j, strategy, placed):
            return shift_s

    solver = made[0]
    solver.host = Host()
    u = solver.units_within(1, 3)
    plain, _ = solver.least(solver.node(1, 3, 1.0), u)
    shifted, _ = solver.least(solver.placed(1, 3, 1.0, 0), u)
    assert shifted == pytest.approx(plain + shift_s, rel=1e-12)
