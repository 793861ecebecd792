"""The search: exact against brute force, never worse than uniform, pins, CLI errors."""

from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys

import numpy as np
import torch
import pytest

from cost_models.clusters import get_cluster
from cost_models.synthetic import gpt_layer_graph
from ir.errors import PlannerError
from ir.plan import load_plan
from ir.strategy import Checkpoint, Precision, Schedule
from planner import search as S
from planner.models import load_layer_graph
from planner.search_space import SearchOptions, outer_candidates
from cost_models.pipeline import microbatches_in_flight

GiB = 2**30


# ----------------------------------------------------------------- brute-force oracle


def _stage_best(tables, layouts, transitions, a, b, k, bucket, cap, units, edge):
    """Least time of layers a..b within `units` buckets: every assignment, no DP."""
    choices = [[s for s in range(len(tables[i].strategies)) if tables[i].transient_bytes[s] <= cap]
               for i in range(a, b + 1)]
    best = math.inf
    for combo in itertools.product(*choices):
        used, t, prev = 0, 0.0, None
        for offset, s in enumerate(combo):
            table = tables[a + offset]
            used += int(np.ceil((table.state_bytes[s] + k * table.kept_bytes[s]) / bucket - 1e-9))
            t += table.time_s[s]
            layout = int(table.layout[s])
            if prev is not None:
                t += transitions[a + offset - 1][prev, layout]
            prev = layout
        if used <= units:
            best = min(best, t)
    return best + edge(a, b) if best < math.inf else math.inf


def oracle(graph, cluster, cand, options, global_batch):
    tables, layouts = S._price(graph, cluster, cand, options, global_batch, None, {}, prune=False)
    pruned, _ = S._price(graph, cluster, cand, options, global_batch, None, {})
    if any(not t.strategies for t in tables):
        return math.inf
    stage_devices = cluster.world_size // cand.pp
    samples = global_batch // cand.num_microbatches
    budget = (cluster.device_memory_bytes - cluster.runtime_overhead_bytes
              - S.DP_BUCKETS_IN_FLIGHT * S.DP_BUCKET_BYTES)
    scale_batch = max(1, samples // stage_devices)
    cache = {}
    crossing = S._crossing_bytes(graph, cache)
    transitions = S._transitions(graph, cluster, options, layouts, scale_batch, cache, crossing)
    scale = S._config(graph, options, cluster, scale_batch).activation_scale
    edges = S._edge_costs(crossing, cluster, stage_devices, scale)
    edge = lambda a, b: S._stage_edges_s(edges, a, b)  # noqa: E731
    units, p, m, v = options.memory_buckets, cand.pp, cand.num_microbatches, cand.virtual_stages
    best = math.inf
    for cap in S._transient_caps(pruned, options.transient_levels):
        usable = budget - cap
        if usable <= 0:
            continue
        bucket = usable / units / v
        if v > 1:
            pieces = S._even_chunks(graph, pruned, p * v)
            if pieces is None:
                continue
            per_rank = [0.0] * p
            for i, (a, b) in enumerate(pieces):
                k = microbatches_in_flight(Schedule.INTERLEAVED, p, i % p, m, v)
                per_rank[i % p] += _stage_best(tables, layouts, transitions, a, b, k, bucket,
                                               cap, units, edge)
            worst = max(per_rank)
            if worst < math.inf:
                best = min(best, m * worst + (sum(per_rank) - worst) / v)
            continue
        n = len(graph.layers)
        for cuts in itertools.combinations(graph.cut_points, p - 1):
            bounds = [0] + [c + 1 for c in cuts] + [n]
            times = [_stage_best(tables, layouts, transitions, bounds[r], bounds[r + 1] - 1,
                                 microbatches_in_flight(cand.schedule, p, r, m), bucket, cap,
                                 units, edge) for r in range(p)]
            best = min(best, sum(times) + (m - 1) * max(times))
    return best


def _instances(count: int, seed: int = 0):
    rng = random.Random(seed)
    made = 0
    while made < count:
        heads = rng.choice([2, 4])
        graph = gpt_layer_graph(layers=rng.randint(1, 3), hidden=heads * rng.choice([16, 32]),
                                heads=heads, vocab=rng.choice([64, 128]), seq=rng.choice([16, 32]))
        world = rng.choice([2, 2, 4])
        cluster = get_cluster("a100-80g", nodes=1, gpus_per_node=world)
        # Keep brute force cheap: a handful of strategies per layer, every dimension
        # still searched somewhere (ZeRO stages, SP, checkpointing, TP, PP, schedule).
        options = SearchOptions(
            zero=rng.choice([None, 0, 3]) if world == 2 else rng.choice([0, 3]),
            no_checkpoint=rng.random() < 0.5,
            sequence_parallel=rng.choice([None, False]) if world == 2 else False,
            memory_buckets=rng.choice([16, 32]), precision=Precision.BF16_MIXED)
        # Budgets from generous to tight, so memory binds in some instances.
        per_layer = sum(l.params for l in graph.layers) * 16 / world
        budget = int(cluster.runtime_overhead_bytes + S.DP_BUCKETS_IN_FLIGHT * S.DP_BUCKET_BYTES
                     + per_layer * rng.choice([0.6, 1.0, 2.0, 50.0]))
        cluster = _with_memory(cluster, budget)
        yield graph, cluster, options, rng.choice([4, 8])
        made += 1


def _with_memory(cluster, nbytes):
    import dataclasses

    return dataclasses.replace(cluster, device_memory_bytes=nbytes)


def test_dynamic_program_equals_brute_force_on_50_random_instances():
    compared = infeasible = 0
    for graph, cluster, options, batch in _instances(50):
        for cand in outer_candidates(graph, cluster.world_size, batch, options):
            tables, layouts = S._price(graph, cluster, cand, options, batch, None, {})
            if any(not t.strategies for t in tables):
                continue
            got = S._solve(graph, cluster, cand, tables, layouts, options, batch, {}, {})
            want = oracle(graph, cluster, cand, options, batch)
            if got is None:
                assert want == math.inf, (str(cand), want)
                infeasible += 1
            else:
                assert math.isclose(got[0], want, rel_tol=1e-9), (str(cand), got[0], want)
            compared += 1
    assert compared >= 50 and infeasible >= 1  # the budgets make some candidates infeasible


# ------------------------------------------------------------------- quality checks


@pytest.mark.parametrize("model,cluster,nodes,batch,budget", [
    ("gpt:layers=8,hidden=1024,heads=16,vocab=32000,seq=1024", "a100-80g", 1, 32, None),
    ("gpt:layers=8,hidden=1024,heads=16,vocab=32000,seq=1024", "a100-40g", 1, 64, 12),
    ("llama:layers=8,hidden=1024,heads=16,kv_heads=4,ffn=2816,vocab=32000,seq=1024", "h100-80g", 2, 64, None),
])
def test_never_worse_than_any_uniform_baseline(model, cluster, nodes, batch, budget):
    from planner.models import load_layer_graph
    import torch

    graph = load_layer_graph(model, 1, None, torch.bfloat16)
    spec = get_cluster(cluster, nodes=nodes)
    options = SearchOptions(memory_budget_bytes=budget * GiB if budget else None)
    result = S.search(graph, spec, batch, options)
    assert result.best is not None and len(result.baselines) == 3
    for base in result.baselines:
        if base.candidate is not None:
            assert result.best.estimate.iteration_seconds <= \
                base.candidate.estimate.iteration_seconds * (1 + 1e-9), base.name
    assert result.best.estimate.memory.fits


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


def test_plan_cli_writes_a_plan_that_estimate_and_show_accept(tmp_path):
    out = tmp_path / "plan.json"
    r = planner("plan", "gpt-tiny", "--cluster", "a100-80g", "--global-batch", "16",
                "--tp", "2", "--pp", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = load_plan(out)
    assert doc.plan.pp == 2 and {s.tp for s in doc.plan.layer_strategies} == {2}
    est = planner("estimate", "--plan", str(out), "--json")
    assert est.returncode == 0, est.stderr
    assert math.isclose(json.loads(est.stdout)["iteration_seconds"],
                        doc.predicted["iteration_seconds"], rel_tol=1e-9)
    show = planner("show", str(out), "--chart", str(tmp_path / "plan.png"))
    assert show.returncode == 0 and (tmp_path / "plan.png").stat().st_size > 1000


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
def test_bad_plan_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "plan.json"
    r = planner(*args, "--out", str(out))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
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
