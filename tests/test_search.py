"""The search: the fastest plan that fits among every plan, pins, CLI errors."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import subprocess
import sys

import pytest
import torch

from cost_models.clusters import get_cluster
from cost_models.estimate import estimate
from cost_models.memory import DP_BUCKET_BYTES, DP_BUCKETS_IN_FLIGHT
from cost_models.synthetic import gpt_layer_graph
from ir.legality import layout_change_problem, linked_runs
from ir.plan import ParallelPlan, load_plan
from ir.strategy import Checkpoint, Schedule, Stage
from planner import search as S
from planner.models import load_layer_graph
from planner.search_space import (SearchOptions, layer_strategies, model_tp_degrees,
                                  outer_candidates)

# ----------------------------------------------------------------- brute-force oracle
# The oracle shares nothing with the search but the space it searches: it lists every
# plan of that space (search_space's legal strategies per layer, every stage cut, every
# micro-batch count, the IR's layout rules) and prices each one through the public cost
# model alone (cost_models.estimate.estimate: time and the full memory walk).


def _every_plan(graph, cluster, batch, options):
    """Every plan of the space: (pp, m) outer choices x stage cuts x per-layer strategies."""
    n = len(graph.layers)
    for cand in outer_candidates(graph, cluster.world_size, batch, options):
        devices = cluster.world_size // cand.pp
        samples = batch // cand.num_microbatches
        degrees = model_tp_degrees(graph, devices, options.max_tp)
        per_layer = [layer_strategies(layer, devices, samples, options, graph.seq_len, degrees)
                     for layer in graph.layers]
        for cuts in itertools.combinations(graph.cut_points, cand.pp - 1):
            bounds = [0] + [c + 1 for c in cuts] + [n]
            stages = tuple(Stage(bounds[r], bounds[r + 1] - 1, devices) for r in range(cand.pp))
            first_of_stage = set(bounds[:-1])
            for combo in itertools.product(*per_layer):
                # Inside a stage neighbours must be able to re-split (ir.legality); a
                # pipeline boundary re-splits nothing, but a linked run shares one degree.
                if any(j not in first_of_stage
                       and layout_change_problem(graph, j, combo[j - 1].tp, combo[j].tp)
                       for j in range(1, n)):
                    continue
                if any(len({combo[i].tp for i in range(a, b + 1)}) > 1
                       for a, b in linked_runs(graph)):
                    continue
                yield ParallelPlan(
                    stages=stages, layer_strategies=combo, global_batch=batch,
                    micro_batch=batch // (cand.num_microbatches * max(s.dp for s in combo)),
                    num_microbatches=cand.num_microbatches, schedule=cand.schedule,
                    precision=options.precision, optimizer=options.optimizer)


def _priced(graph, cluster, batch, options):
    """(seconds, peak bytes, plan) of every plan of the space, priced by `estimate` alone
    (a plan's time and peak do not depend on how much memory the device has)."""
    out = []
    for plan in _every_plan(graph, cluster, batch, options):
        est = estimate(graph, plan, cluster)
        out.append((est.iteration_seconds, est.memory.peak_bytes, plan))
    return out


def _tiny_instances(count: int, seed: int = 0):
    """Tiny GPTs on 2 devices, 1F1B (the oracle lists every cut; the interleaved search
    cuts at equal compute only)."""
    rng = random.Random(seed)
    for _ in range(count):
        heads = rng.choice([2, 4])
        layers = rng.choice([1, 2])
        graph = gpt_layer_graph(layers=layers, hidden=heads * rng.choice([16, 32]), heads=heads,
                                vocab=rng.choice([64, 128]), seq=rng.choice([16, 32]))
        cluster = get_cluster("a100-80g", nodes=1, gpus_per_node=2)
        options = SearchOptions(
            schedule=Schedule.ONE_F_ONE_B, zero=rng.choice([0, 3]) if layers == 2 else None,
            no_checkpoint=layers == 2 or rng.random() < 0.3,
            # CPU offload left out: with its states on the host, an offloaded plan's device
            # bytes are mostly the transient reserves the program counts conservatively, and
            # one such plan needing 61% of a budget was passed over (open, wt-offload)
            no_offload=True,
            memory_buckets=rng.choice([32, 128]))
        yield graph, cluster, options, rng.choice([4, 8])


@pytest.fixture(scope="module")
def spaces():
    """Eight tiny instances with every plan of their space priced (about 9,000 plans)."""
    return [(graph, cluster, options, batch, _priced(graph, cluster, batch, options))
            for graph, cluster, options, batch in _tiny_instances(8)]


def _with_memory(cluster, nbytes):
    import dataclasses

    return dataclasses.replace(cluster, device_memory_bytes=int(nbytes))


# The search keeps DP buckets in reserve (cost_models.memory): memory it never fills.
RESERVE_BYTES = DP_BUCKETS_IN_FLIGHT * DP_BUCKET_BYTES


def _budgets(cluster, priced):
    """Devices whose memory beyond the runtime overhead and the reserve is what the
    smallest, 5th, 30th and 70th percentile and largest plan of the space need."""
    peaks = sorted(peak for _, peak, _ in priced)
    for q in (0.0, 0.05, 0.3, 0.7, 1.0):
        need = peaks[min(len(peaks) - 1, int(q * len(peaks)))]
        yield need, _with_memory(cluster, need + RESERVE_BYTES)


def test_the_walks_floor_never_exceeds_the_walk(spaces):
    """Every rank of every 40th plan of the spaces: the floors its layers add up, with its
    pipeline buffers, are at most what the walk holds at its peak (less the overhead);
    each floor figure is something the walk holds at the end of a forward."""
    from cost_models.common import layer_configs
    from cost_models.memory import layer_memory, plan_memory
    from cost_models.pipeline import microbatches_in_flight
    from cost_models.walk_floor import forward_after_backward, walk_floor_row
    from planner.layer_tables import buffers_floor

    closest = 0.0
    for graph, cluster, options, batch, priced in spaces:
        for _, _, plan in priced[::40]:
            configs = layer_configs(graph, plan, cluster.device)
            held = forward_after_backward(plan.schedule, plan.pp, plan.num_microbatches)
            cand = next(c for c in outer_candidates(graph, cluster.world_size, batch, options)
                        if (c.pp, c.num_microbatches) == (plan.pp, plan.num_microbatches))
            layouts = sorted({(s.tp, s.sequence_parallel) for s in plan.layer_strategies})
            buffers = buffers_floor(graph, cluster, options, cand, layouts, batch, {})
            for r, (stage, walked) in enumerate(zip(plan.stages, plan_memory(
                    graph, plan, cluster, configs).stages)):
                k = microbatches_in_flight(plan.schedule, plan.pp, r, plan.num_microbatches)
                floor = 0.0 if buffers is None else buffers(
                    stage.first_layer, stage.last_layer == len(graph.layers) - 1)
                for j in range(stage.first_layer, stage.last_layer + 1):
                    layer, s = graph.layers[j], plan.layer_strategies[j]
                    state, kept = walk_floor_row(layer, s, configs[j],
                                                 layer_memory(layer, s, configs[j]), held)
                    floor += state + k * kept
                live = walked.peak_bytes - walked.overhead
                assert floor <= live, f"{plan} rank {r}: floor {floor} > walk {live}"
                closest = max(closest, floor / live)
    assert closest > 0.9  # the floor is close to the walk somewhere: the check can fail


def test_the_floors_at_a_backward_never_exceed_the_walk(spaces):
    """Every 20th plan without a pipeline: the floor at each layer's backward
    (`planner.point_floor`, from the rows the search prices) is at most what the walk
    holds at its peak, less the overhead; at some point it is the walk exactly."""
    from cost_models.memory import plan_memory
    from planner.layer_tables import price_layers
    from planner.point_floor import point_floor_bytes

    exact = 0
    for graph, cluster, options, batch, priced in spaces:
        tables_of = {}
        for _, _, plan in [p for p in priced if p[2].pp == 1][::20]:
            cand = next(c for c in outer_candidates(graph, cluster.world_size, batch, options)
                        if (c.pp, c.num_microbatches) == (plan.pp, plan.num_microbatches))
            if cand not in tables_of:
                tables_of[cand] = price_layers(graph, cluster, cand, options, batch, None, {},
                                               prune=False)[0]
            live = plan_memory(graph, plan, cluster).peak_bytes - cluster.runtime_overhead_bytes
            floors = [point_floor_bytes(tables_of[cand], list(plan.layer_strategies), j)
                      for j in range(len(graph.layers))]
            assert max(floors) <= live, f"{plan}: floors {floors} > walk {live}"
            exact += max(floors) == live
    assert exact > 0  # the floor is the walk somewhere: the check can fail


def test_search_finds_the_fastest_of_every_plan_when_memory_is_ample(spaces):
    """With room for any plan, the search's choice is the fastest plan of the space by the
    full cost model: nothing the oracle lists beats it."""
    for graph, cluster, options, batch, priced in spaces:
        roomy = _with_memory(cluster, max(peak for _, peak, _ in priced) * 2)
        result = S.search(graph, roomy, batch, options)
        best_s, _, best_plan = min(priced, key=lambda r: r[0])
        got = estimate(graph, result.best.plan, roomy)
        assert math.isclose(got.iteration_seconds, result.best.estimate.iteration_seconds,
                            rel_tol=1e-12)
        assert math.isclose(got.iteration_seconds, best_s, rel_tol=1e-9), (
            f"{graph.model} batch {batch}: {best_plan} takes {best_s} s, the search's "
            f"{result.best.plan} {got.iteration_seconds} s")


def test_under_a_binding_budget_the_search_plan_fits_and_is_the_best_it_admits(spaces):
    """Budgets from "only the smallest plan fits" to "all fit": the search's plan fits the
    device by the full memory walk and no plan that fits the device is faster than it
    claims; where nothing fits, it finds nothing. Of the plans that fit within the
    budget less the reserve, it passes over only ones that need most of it (since the
    program adds up the walk's floors, none at all: the next test)."""
    found = 0
    for graph, cluster, options, batch, priced in spaces:
        overhead = cluster.runtime_overhead_bytes
        for need, device in _budgets(cluster, priced):
            fit_device = [t for t, peak, _ in priced if peak <= device.device_memory_bytes]
            result = S.search(graph, device, batch, options)
            got_s = math.inf  # nothing found: every plan within the budget is passed over
            if result.best is not None:
                got = estimate(graph, result.best.plan, device)
                assert got.memory.fits, (str(result.best.plan), got.memory.shortfall())
                got_s = got.iteration_seconds
                assert got_s >= min(fit_device) * (1 - 1e-9)
                found += 1
            for t, peak, plan in priced:
                if peak <= need and t < got_s * (1 - 1e-9):  # fits less the reserve, faster
                    assert peak - overhead >= 2 / 3 * (need - overhead), (
                        f"{plan} needs {peak - overhead} of {need - overhead} bytes beyond "
                        f"the overhead and was passed over for {result.best}")
    assert found >= 20


@pytest.mark.xfail(strict=True, reason=(
    "known, 5 of the 40 budgets (was 14): none a memory miss; each passes over a plan "
    "that fits and that the estimate prices 0.01-0.4% faster but the program's objective "
    "prices slower than the plan it returns (mixed TP / DP layouts, a checkpointed "
    "first layer), e.g. 22.518 us by the objective, 22.482 by the estimate, against "
    "22.500 for all ZeRO-2: the program hides each layer's DP traffic behind its own "
    "compute (`layer_tables._price`), the estimate a stage's behind the stage's "
    "(`estimate.stage_time`), and a sum of maxima exceeds the maximum of sums (that "
    "plan's per-layer exposure: +0.080 us)"))
def test_every_plan_the_search_rejects_as_over_budget_really_is(spaces):
    """At every budget, no plan whose walk fits within it is faster than the search's.
    1F1B's program adds up the walk's floors (`cost_models.walk_floor`), which admit every
    such plan, so where its optimum walks within the budget it is exact (before the
    floors, 34 of these 40 budgets missed a faster plan: the program counted states,
    every kept activation and a transient cap at once, 1.47 MB for a 2-stage GPT whose
    walk peaks at 1.29 MB). Without a pipeline it solves again at the floors of a
    backward (`planner.point_floor`), not at a lowered budget (which passed a fitting
    plan over at 9 more: 2.49 MB budget, a plan walking 2.495 MB at 77.6 us, none found)."""
    for graph, cluster, options, batch, priced in spaces:
        for need, device in _budgets(cluster, priced):
            result = S.search(graph, device, batch, options)
            got = result.best.estimate.iteration_seconds if result.best else math.inf
            faster = [plan for t, peak, plan in priced if peak <= need
                      and t < got * (1 - 1e-9)]
            assert not faster, f"{faster[0]} fits and is faster than {result.best}"


# ------------------------------------------------------------------- quality checks


def test_pinned_degrees_are_respected():
    graph = gpt_layer_graph(layers=4, hidden=64, heads=4, vocab=128, seq=32)
    cluster = get_cluster("a100-80g", nodes=1)
    options = SearchOptions(tp=2, pp=2, zero=1)
    result = S.search(graph, cluster, 16, options)
    plan = result.best.plan
    assert plan.pp == 2 and all(s.tp == 2 for s in plan.layer_strategies)
    assert all(s.dp_mode.stage == 1 for s in plan.layer_strategies)


# ------------------------------------------------------------------------------ CLI


def planner(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def planner_main(capsys, *args) -> tuple[int, str, str]:
    """`planner.cli.main` in this process, not a fresh interpreter (torch imported again:
    ~2.5 s of CPU each); `python -m planner.cli` itself runs in test_plan_cli's `plan`."""
    from planner.cli import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_cli_writes_a_plan_that_estimate_and_show_accept(tmp_path, capsys):
    out = tmp_path / "plan.json"
    r = planner("plan", "gpt-tiny", "--cluster", "a100-80g", "--global-batch", "16",
                "--tp", "2", "--pp", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = load_plan(out)
    assert doc.plan.pp == 2 and {s.tp for s in doc.plan.layer_strategies} == {2}
    code, stdout, stderr = planner_main(capsys, "estimate", "--plan", str(out), "--json")
    assert code == 0, stderr
    assert math.isclose(json.loads(stdout)["iteration_seconds"],
                        doc.predicted["iteration_seconds"], rel_tol=1e-9)
    code, _, stderr = planner_main(capsys, "show", str(out), "--chart", str(tmp_path / "plan.png"))
    assert code == 0 and (tmp_path / "plan.png").stat().st_size > 1000, stderr


BAD_PLAN_INPUTS = [
    (["plan", "gpt-huge", "--cluster", "a100-80g", "--global-batch", "8"], "unknown model"),
    (["plan", "gpt-tiny", "--cluster", "a100-80g", "--global-batch", "12", "--dp", "8",
      "--micro-batch", "1"], "global batch 12 is not divisible"),
    (["plan", "gpt3-175b", "--cluster", "a100-80g", "--global-batch", "8", "--no-pp",
      "--no-checkpoint", "--uniform"], "no plan fits"),
    (["plan", "gpt-tiny", "--cluster", "a100-80g", "--global-batch", "8", "--no-pp", "--pp",
      "2"], "--no-pp contradicts --pp 2"),
    (["plan", "gpt-tiny", "--cluster", "a100-80g", "--global-batch", "8", "--memory-budget",
      "0.001"], "no plan fits"),
]


@pytest.mark.parametrize("args,message", BAD_PLAN_INPUTS, ids=[m for _, m in BAD_PLAN_INPUTS])
def test_bad_plan_input_is_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    """In this process (the entry point itself runs as a command above): status 2, one
    line on stderr, no plan file."""
    from planner.cli import main

    out = tmp_path / "plan.json"
    status = main([*args, "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert not out.exists()


def _resolves(dotted: str) -> bool:
    """`name` (an attribute of planner.search) or a dotted module path plus attributes."""
    import importlib

    import planner.search as module

    parts = dotted.split(".")
    if len(parts) == 1:
        return hasattr(module, dotted)
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False


def test_the_docstring_names_only_what_exists():
    """The search's module docstring writes the recurrences out and names the function
    behind each term; every `name` it cites must exist (it once cited `_stage_cost`)."""
    import re

    import planner.search as module

    cited = set(re.findall(r"`([A-Za-z_][\w.]*)`", module.__doc__))
    assert {"stage_program._extend", "partition.partition", "layer_tables.transitions",
            "_pipeline_tp_groups"} <= cited
    missing = [n for n in sorted(cited) if not (_resolves(n) or _resolves(f"planner.{n}"))]
    assert not missing, f"planner/search.py's docstring names what does not exist: {missing}"
    assert not _resolves("_stage_cost")  # the check can fail


def test_a_pinned_checkpoint_excludes_the_ddp_baseline():
    """DDP runs without checkpointing: `--checkpoint full` excludes it instead of failing
    the whole search ("--no-checkpoint contradicts --checkpoint full")."""
    from planner.baselines import baselines

    graph = load_layer_graph("gpt-tiny", micro_batch=1, dtype=torch.bfloat16)
    cluster = get_cluster("a100-80g")
    found = {b.name: b for b in baselines(graph, cluster, 16,
                                          SearchOptions(checkpoint=Checkpoint.FULL))}
    assert found["DDP"].excluded_by == "--checkpoint"
    assert found["ZeRO-3 (FSDP)"].candidate is not None


@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny"])
def test_uniform_sequence_parallel_runs_sp_wherever_it_applies(model):
    """`--uniform --sequence-parallel`: the same degrees on every layer and SP on every
    layer where it applies; embeddings, norms and heads never offer SP, so requiring the
    same flag everywhere found no plan."""
    from ir.legality import sequence_parallel_applies

    graph = load_layer_graph(model, micro_batch=1, dtype=torch.bfloat16)
    cluster = get_cluster("a100-80g", nodes=1)
    result = S.search(graph, cluster, 8, SearchOptions(uniform=True, sequence_parallel=True))
    assert result.best is not None
    strategies = result.best.plan.layer_strategies
    assert len({(s.tp, s.dp, s.dp_mode, s.checkpoint, s.offload) for s in strategies}) == 1
    sp_able = [layer.sequence_parallel_ok for layer in graph.layers]
    assert any(sp_able) and not all(sp_able)  # both kinds are present
    for layer, s in zip(graph.layers, strategies):
        assert s.tp > 1 and s.sequence_parallel == layer.sequence_parallel_ok
        assert sequence_parallel_applies(layer, s) == layer.sequence_parallel_ok


def test_uniform_sequence_parallel_plans_from_the_cli(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, _, stderr = planner_main(capsys, "plan", "llama-tiny", "--cluster", "a100-80g",
                                   "--global-batch", "8", "--uniform", "--sequence-parallel",
                                   "--out", str(out))
    assert code == 0, stderr
    plan = load_plan(out).plan
    assert {s.tp for s in plan.layer_strategies} != {1}
    assert any(s.sequence_parallel for s in plan.layer_strategies)


def test_the_megatron_baseline_with_sequence_parallel_is_priced():
    """The baselines search uniformly: with `--tp 2 --sequence-parallel` Megatron's TP x DP
    grid point (SP inside the blocks) is a real plan, not 'no legal configuration'."""
    from planner.baselines import baselines, least_memory

    graph = load_layer_graph("gpt-tiny", micro_batch=1, dtype=torch.bfloat16)
    cluster = get_cluster("a100-80g", nodes=1)
    options = SearchOptions(tp=2, sequence_parallel=True)
    found = {b.name: b for b in baselines(graph, cluster, 8, options)}
    megatron = found["Megatron TPxPPxDP"].candidate
    assert megatron is not None and any(s.sequence_parallel for s in megatron.plan.layer_strategies)
    peak_bytes, plan = least_memory(graph, cluster, 8, dataclasses.replace(options, uniform=True))
    assert peak_bytes is not None and any(s.sequence_parallel for s in plan.layer_strategies)


# ------------------------------------------------- the oracle where host terms are priced
# On a100-80g above every step host term is 0. Here a CPU kit prices each of them (engine
# start, pipelining actions, cold ops both ways, a forward's entry after a backward, the
# tied copies' sum), in round figures a few times a tiny layer's compute so they decide.

def _cpu_kit_cluster(processes: int):
    """`processes` CPU processes on 2 cores (host share processes / 2), every host term
    priced (built as tests/cpu_specs.py builds its specs)."""
    from ir.cluster import ClusterSpec
    from ir.kernel_calibration import KernelCalibration

    kit = KernelCalibration(measured_on="test", autograd_call_host_s=2e-4,
                            pipeline_action_host_s=1e-4, forward_host_op_s=1e-9,
                            cold_op_host_s=3e-5, cold_backward_op_host_s=2e-5,
                            cold_entry_host_s=4e-5, cold_entry_after_backward_host_s=9e-5,
                            tied_sum_host_s=5e-5, tied_sum_s_per_byte=1e-9)
    return ClusterSpec(
        name=f"cpu-kit{processes}", device="cpu", num_nodes=1, devices_per_node=processes,
        device_memory_bytes=2**34, peak_flops_by_dtype=(("float32", 1e11),), hbm_gbps=20.0,
        intra_node_gbps=10.0, inter_node_gbps=1.0, intra_node_latency_s=1e-5,
        inter_node_latency_s=1e-4, runtime_overhead_bytes=0, matmul_efficiency=1.0,
        op_overhead_s=1e-6, host_cores=2, kernel_calibration=kit)


TIED_GPT = "gpt:layers=2,hidden=64,heads=4,vocab=512,seq=32"  # head tied to the embedding
UNTIED_LLAMA = "llama:layers=2,hidden=64,heads=4,vocab=256,seq=32"


def _cpu_cases():
    """(spec, processes, pp, schedule, pins): 2 and 4 processes, pp 1 and 2, GPipe and
    1F1B, tied and not, and pp 2 with TP 2 on 4 processes, without SP, with it, and
    searched: there a stage's sends depend on its edge layers' layouts (each TP rank sends
    the whole activation at dp 1's micro-batch, or its 1/t share under SP; the search
    once priced every cut at TP 1's: on tiny GPT, GPipe, without SP, 12.544 ms against
    the estimate's 12.549). The interleaved schedule is left out: its search cuts at
    equal compute only (`planner.uniform.even_chunks`), so the oracle cannot list its
    space without the search's own code."""
    for spec in (TIED_GPT, UNTIED_LLAMA):
        for processes in (2, 4):
            # 4 processes: TP 1 and ZeRO-3 keep the space small (the 2-process cases try TP)
            pins = dict(zero=0) if processes == 2 else dict(zero=3, tp=1)
            yield spec, processes, 1, Schedule.ONE_F_ONE_B, pins
            for schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
                yield spec, processes, 2, schedule, pins
        for sp in (False, True, None):
            for schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
                yield spec, 4, 2, schedule, dict(zero=0, tp=2, sequence_parallel=sp)


def _composed_s(est, m: int) -> float:
    """The search's objective composed over the estimate's own stage times: sum T +
    (m-1) max T, T_r rank r's forward + backward per micro-batch plus its once-a-step
    terms / m (`planner.search`'s t(i, s))."""
    times = [t.forward_s + t.backward_s
             + (t.optimizer_s + t.dp_step_s + t.tp_step_s + t.dp_after_step_s) / m
             for t in est.stage_times]
    return sum(times) + (m - 1) * max(times)


def _relayout_after_tp(graph, plan) -> bool:
    """Whether the plan changes layout (TP degree or SP) after a layer with TP > 1 inside
    a stage: a re-layout priced at the layer's own micro-batch, samples / its dp (see
    `test_a_relayout_after_a_tp_layer_is_priced_at_its_micro_batch`)."""
    from ir.legality import sequence_parallel_applies

    def layout(j):
        s = plan.layer_strategies[j]
        return s.tp, sequence_parallel_applies(graph.layers[j], s)
    return any(plan.layer_strategies[j].tp > 1 and layout(j) != layout(j + 1)
               and plan.stage_of(j) == plan.stage_of(j + 1)
               for j in range(len(graph.layers) - 1))


@pytest.mark.parametrize("spec, processes, pp, schedule, pins", list(_cpu_cases()),
                         ids=lambda x: str(x).split(":")[0])
def test_with_every_host_term_priced_the_search_is_estimates_best_up_to_its_composition(
        spec, processes, pp, schedule, pins):
    """Every plan of the space priced by the estimate alone, and composed from the
    estimate's stage times as the search's objective O = sum T + (m-1) max T
    (`_composed_s`):

    1. each candidate's DP objective is O of its plan (the host terms, the tied sums and
       the placed cold counts priced per stage exactly as the estimate prices them), and
       the least of them is the least O of the space: the program is exact on O (a
       re-layout after a TP > 1 layer included: `_relayout_after_tp`);
    2. the search's plan is one the oracle lists, and it loses to the estimate's best b
       by at most the gap between the estimate's pipeline form and O: with s* the least-O
       candidate, est(search) <= est(s*) = [est(s*) - O(s*)] + O(s*) and O(s*) <= O(b),
       so est(search) - est(b) <= max(0, est(s*) - O(s*)) + (O(b) - est(b)). With pp 1
       both gaps are 0 (m T either way): the search must find the best exactly.

    Measured: llama 4 processes pp 2 1F1B, the estimate's best cuts (0, 2), (3, 4) at
    11.574 ms; the search returns (0, 0), (1, 4) at 11.864 ms, the least O (the best is
    dominated on both sum T and max T: a slow first rank hides the second's round trip in
    its warm-up, which no (sum, max) front sees). Tiny GPT 2 processes pp 2 1F1B needed
    the final front's other cuts (`search.FRONT_PLANS`): the estimate's best, 6.935 ms,
    was O's 2nd; the search had returned 7.519 ms. Tiny GPT 2 processes pp 1 needed the
    tied sums per gradient layout (`test_with_tp_the_tied_sum_on_local_shards_is_found`)
    and the ZeRO-3 baseline kept out under --zero 0 (it had returned a plan outside the
    space)."""
    from ir.strategy import Precision

    graph = load_layer_graph(spec, micro_batch=1, seq_len=32, dtype=torch.float32)
    cluster = _cpu_kit_cluster(processes)
    options = SearchOptions(pp=pp, schedule=schedule, no_checkpoint=True, no_offload=True,
                            precision=Precision.FP32, **pins)
    rows = []  # (estimate's seconds, O, plan) of every plan of the space
    for plan in _every_plan(graph, cluster, 8, options):
        est = estimate(graph, plan, cluster)
        rows.append((est.iteration_seconds, _composed_s(est, plan.num_microbatches), plan))
    best_s, best_o, best_plan = min(rows, key=lambda r: r[0])
    result = S.search(graph, cluster, 8, options)
    for c in result.candidates:
        composed_s = _composed_s(c.estimate, c.plan.num_microbatches)
        assert c.objective_s == pytest.approx(composed_s, rel=1e-12), str(c.plan)
    least = min(result.candidates, key=lambda c: c.objective_s)
    least_o = min(o for _, o, _ in rows)
    assert least.objective_s == pytest.approx(least_o, rel=1e-12)
    assert any(plan == result.best.plan for _, _, plan in rows), result.best.plan
    got_s = estimate(graph, result.best.plan, cluster).iteration_seconds
    slack_s = max(0.0, least.estimate.iteration_seconds - least.objective_s) + best_o - best_s
    if pp == 1:
        assert slack_s == pytest.approx(0.0, abs=1e-12 * best_s)
    assert got_s <= (best_s + slack_s) * (1 + 1e-12), (
        f"{best_plan} takes {best_s} s, the search's {result.best.plan} {got_s} s")


def test_the_final_fronts_other_cuts_let_the_estimate_pick_its_best():
    """Tiny GPT (head tied), 2 CPU processes, pp 2, 1F1B, TP 1: the estimate's best plan
    cuts (0, 2), (3, 4), m 2, at 6.935 ms, while O's best cuts (0, 1), (2, 4) at 7.519
    ms by the estimate (its 1F1B form lets the slow first rank hide the second's round
    trip; O = sum T + (m-1) max T cannot). With the final (sum, max) front's next cuts
    priced too (`search.FRONT_PLANS`) the search returns the estimate's best exactly."""
    from ir.strategy import Precision

    graph = load_layer_graph(TIED_GPT, micro_batch=1, seq_len=32, dtype=torch.float32)
    cluster = _cpu_kit_cluster(2)
    options = SearchOptions(pp=2, schedule=Schedule.ONE_F_ONE_B, no_checkpoint=True,
                            no_offload=True, precision=Precision.FP32, zero=0, tp=1)
    best_s, _, best_plan = min(_priced(graph, cluster, 8, options), key=lambda r: r[0])
    assert [(s.first_layer, s.last_layer) for s in best_plan.stages] == [(0, 2), (3, 4)]
    result = S.search(graph, cluster, 8, options)
    assert result.best.plan == best_plan
    assert result.best.estimate.iteration_seconds == pytest.approx(best_s, rel=1e-12)
    assert best_s == pytest.approx(6.935e-3, rel=1e-3)


def test_with_tp_the_tied_sum_on_local_shards_is_found():
    """Tiny GPT (head tied), 2 CPU processes, pp 1, TP allowed: the estimate prices the
    tied copies' sum on the local shards where every copy sits on one rank in one
    gradient layout (`cost_models.tied_memory.tied_local_fraction`): its best plan runs
    embedding and head at TP 2, the sum on half the gradient, at 4.828 ms. Priced on the
    full gradient alone, the search put the head at TP 1 (5.345 ms); solved once more per
    shared layout (`planner.stage_host.tied_variants`) it finds the best exactly."""
    from ir.strategy import Precision

    graph = load_layer_graph(TIED_GPT, micro_batch=1, seq_len=32, dtype=torch.float32)
    cluster = _cpu_kit_cluster(2)
    options = SearchOptions(pp=1, schedule=Schedule.ONE_F_ONE_B, no_checkpoint=True,
                            no_offload=True, precision=Precision.FP32, zero=0)
    best_s, _, best_plan = min(_priced(graph, cluster, 8, options), key=lambda r: r[0])
    assert [s.tp for s in best_plan.layer_strategies][0::4] == [2, 2]  # embedding, head
    assert best_s == pytest.approx(4.828e-3, rel=1e-3)
    got = S.search(graph, cluster, 8, options).best.estimate.iteration_seconds
    assert got == pytest.approx(best_s, rel=1e-9)


def test_a_relayout_after_a_tp_layer_is_priced_at_its_micro_batch():
    """Tiny GPT, TP 2 + SP, micro-batch 2 on 2 CPU processes: the best plan re-lays out
    after a TP 2 layer, whose own micro-batch is samples / its dp = 2 / 1 = 2, not the
    samples / 2 devices = 1 the search once priced it at: 3.28 us under (65,536 B at
    20 GB/s, half the SP -> replicated all-gather's bytes). Both now price
    `cost_models.estimate.relayout_s` at the source layer's micro-batch, so the search's
    objective is the estimate's stage times composed, exactly."""
    from ir.strategy import Precision

    graph = load_layer_graph(TIED_GPT, micro_batch=1, seq_len=32, dtype=torch.float32)
    cluster = _cpu_kit_cluster(2)
    options = SearchOptions(pp=1, tp=2, sequence_parallel=True, micro_batch=2, zero=0,
                            schedule=Schedule.ONE_F_ONE_B, no_checkpoint=True,
                            no_offload=True, precision=Precision.FP32)
    best = S.search(graph, cluster, 8, options, with_baselines=False).best
    assert _relayout_after_tp(graph, best.plan)
    assert best.objective_s == pytest.approx(
        _composed_s(best.estimate, best.plan.num_microbatches), rel=1e-12)


# Binding budgets (less the reserve) under which the search checkpoints a stage's edge
# layer, 2 CPU processes, pp 2: once the 10th or 30th percentile of the space's peaks;
# re-derived when the memory wall came to add up the walk's floor (`cost_models.walk_floor`),
# under which llama GPipe at 2456064 and gpt GPipe at 2965504 found no plan (the strict
# xfail's residue, test_every_plan_the_search_rejects_as_over_budget_really_is): now 0.9x
# and 1.1x those, where every or most candidates checkpoint an edge layer.
CHECKPOINTED_EDGES = [(UNTIED_LLAMA, Schedule.GPIPE, 2207744),
                      (UNTIED_LLAMA, Schedule.ONE_F_ONE_B, 1674496),
                      (TIED_GPT, Schedule.GPIPE, 3260416)]


@pytest.mark.parametrize("spec, schedule, need_bytes", CHECKPOINTED_EDGES,
                         ids=lambda x: str(x).split(":")[0])
def test_a_checkpointed_edge_layers_placed_change_is_priced_at_its_strategy(
        spec, schedule, need_bytes):
    """A stage's first and last layers as placed cost other than as traced (cold ops,
    a forward after a backward: `planner.stage_host`), and a checkpointed layer pays the
    change twice (its recompute reruns the forward's host). The search once priced it
    at each layer's fastest strategy, not checkpointed: where memory made it checkpoint
    an edge layer, its objective missed the estimate's stage times composed (llama, GPipe:
    10.442 ms against 10.692). Priced per strategy in the stage program
    (`stage_program.StageSolver.placed`), every candidate's objective is the composition."""
    from ir.strategy import Precision

    graph = load_layer_graph(spec, micro_batch=1, seq_len=32, dtype=torch.float32)
    cluster = _with_memory(_cpu_kit_cluster(2), need_bytes + RESERVE_BYTES)
    options = SearchOptions(pp=2, schedule=schedule, no_checkpoint=False, no_offload=True,
                            precision=Precision.FP32, zero=0)
    result = S.search(graph, cluster, 8, options, with_baselines=False)
    edges = [c for c in result.candidates if any(
        c.plan.layer_strategies[j].checkpoint is not Checkpoint.NONE
        for s in c.plan.stages for j in (s.first_layer, s.last_layer))]
    assert edges, "no candidate checkpoints an edge layer: the case tests nothing"
    for c in result.candidates:
        assert c.objective_s == pytest.approx(
            _composed_s(c.estimate, c.plan.num_microbatches), rel=1e-12), str(c.plan)


def test_a_plan_no_floor_admits_gets_at_most_fit_rounds_of_lowered_budgets(monkeypatch):
    """Without a pipeline, `_solve_fitting` tries the floors at a backward first
    (`planner.point_floor`), then lowers the budget at most FIT_ROUNDS times: where no
    point floor rejects the plan at the first round, the point rounds left over must not
    turn into lowered-budget solves (they did: POINT_ROUNDS + FIT_ROUNDS - 1 of them).
    Every solve here returns a plan the walk rejects, so the count is the rounds'."""
    from types import SimpleNamespace

    solves = []
    monkeypatch.setattr(S, "memory_budget_bytes", lambda cluster, options: 100.0)
    monkeypatch.setattr(S, "_solve", lambda *args, **kwargs: solves.append(args) or (
        1.0, SimpleNamespace(layer_strategies=()), []))
    monkeypatch.setattr(S, "model_layer_configs", lambda *args: None)
    monkeypatch.setattr(S, "plan_memory", lambda *args: SimpleNamespace(
        fits=False, peak_bytes=200.0))
    monkeypatch.setattr(S, "next_point", lambda *args: None)
    cand = SimpleNamespace(virtual_stages=1, pp=1)
    cluster = SimpleNamespace(runtime_overhead_bytes=0.0, device="cpu")
    stats = SimpleNamespace(refits=0)
    assert S._solve_fitting(None, cluster, cand, [object()] * 4, None,
                            SimpleNamespace(memory_buckets=32),
                            8, {}, stats, math.inf, {}) is None
    assert len(solves) == 1 + S.FIT_ROUNDS
