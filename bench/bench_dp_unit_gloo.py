"""The DP-unit probe on gloo with FSDP2's default collectives (what it timed before) and
with the executor's (`ir.gloo_collectives`, what it times now), and what the difference
moves in the estimate of a ZeRO-3 plan.

    .venv/bin/python bench/bench_dp_unit_gloo.py [--nproc 2] [--rounds 5]

Each of --nproc gloo ranks builds the probe's stacks (`dp_unit_probe.dp_probe_stack`)
for ZeRO-2 and ZeRO-3, units of 6 and 24 tensors, with FSDP2's default collectives
("old") and with `use_gloo_collectives` ("new"), and times each with the probe's own
`_added_step_s` (a median of DP_UNIT_STEPS pairs against the plain stack), old and new
alternately, --rounds rounds; a figure is the median round, per unit, mean over ranks.
Separately, over a few steps of each new stack, it reads the thread CPU each
`GlooAllGather` call spends outside its gloo `all_gather` (the storage aliases made and
emptied: what the old probe left unpriced) and counts the calls per unit and step;
calls x that ("direct") is what new - old should read. (`GlooReduceScatter` adds nothing:
`reduce_scatter_in_place` is timed whole by the collective probes and left out of a unit
in both; FSDP2's default all-gather is one call to `all_gather_single`.)

Then gpt-tiny, ZeRO-3 over --nproc ranks on `local`, is estimated with the old and the
new readings' DP-unit lines (`host_overhead_fit.unit_line`); the step's change is set
beside units x direct x the host stretch (`common.host_figure_share`).

Read on 2026-11-26, 2 ranks, load 8.9 -> 7.6, 15 rounds: new - old 34.6 / 32.0 us a
ZeRO-2 unit (6 / 24 tensors; direct 28.3 / 33.1), 52.6 / 85.0 a ZeRO-3 unit (direct
56.8 / 70.8: two all-gathers of ~28-35 us each); gpt-tiny's step +417 us against
7 units x 63.8 us direct = 447 us. On 2 shared cores only paired figures mean anything:
the table gives the load. Writes
bench/results/dp_unit_gloo.json; exits 1 when new - old and direct differ by more than
AGREEMENT_TOLERANCE_S per unit at either mode's mean over sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dist_utils import spawn  # noqa: E402
from planner.fmt import table  # noqa: E402

MODES = ("ZERO2", "ZERO3")
DIRECT_STEPS = 10  # steps of a new stack read for the aliases' CPU, after one warm-up
# new - old may miss the direct figure by this much per unit: the probe's median pairs
# read a few us apart run to run on 2 shared cores (this bench, 2026-11-26)
AGREEMENT_TOLERANCE_S = 10e-6
MODEL, SEQ_LEN = "gpt-tiny", 32


def _stack(mesh, mode, blocks: int, gloo: bool):
    import ir.gloo_collectives as gc
    from cost_models.dp_unit_probe import dp_probe_stack

    if gloo:
        return dp_probe_stack(mesh, mode, blocks)
    install, gc.use_gloo_collectives = gc.use_gloo_collectives, lambda unit: None
    try:  # FSDP2's default collectives: the old probe's units
        return dp_probe_stack(mesh, mode, blocks)
    finally:
        gc.use_gloo_collectives = install


def _alias_cpu(stack, x) -> tuple[float, float]:
    """(thread CPU s per GlooAllGather call outside its gloo all_gather, calls a step)."""
    import ir.gloo_collectives as gc

    clock, outside, calls, inner = time.thread_time, [0.0], [0], [0.0]
    plain_gather, plain_call = dist.all_gather, gc.GlooAllGather.__call__

    def gather(*args, **kwargs):
        start = clock()
        try:
            return plain_gather(*args, **kwargs)
        finally:
            inner[0] += clock() - start

    def call(self, *args, **kwargs):
        before, start = inner[0], clock()
        try:
            return plain_call(self, *args, **kwargs)
        finally:
            outside[0] += clock() - start - (inner[0] - before)
            calls[0] += 1

    stack(x).sum().backward()  # warm-up
    dist.all_gather, gc.GlooAllGather.__call__ = gather, call
    try:
        for _ in range(DIRECT_STEPS):
            dist.barrier()
            stack(x).sum().backward()
    finally:
        dist.all_gather, gc.GlooAllGather.__call__ = plain_gather, plain_call
    return outside[0] / max(calls[0], 1), calls[0] / DIRECT_STEPS


def _rank(rank: int, world_size: int, rounds: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from cost_models.clusters import OP_OVERHEAD_WIDTH, _one_thread
    from cost_models.dp_unit_probe import DP_UNIT_BLOCKS, DP_UNITS, _added_step_s
    from ir.strategy import DPMode

    mesh = init_device_mesh("cpu", (world_size,))
    x = torch.randn(2, OP_OVERHEAD_WIDTH)
    out = {}
    with _one_thread():
        for blocks in DP_UNIT_BLOCKS:
            plain = _stack(mesh, None, blocks, False)
            tensors = len(list(plain[0].parameters()))
            for name in MODES:
                mode = DPMode[name]
                stacks = {"old": _stack(mesh, mode, blocks, False),
                          "new": _stack(mesh, mode, blocks, True)}
                reads = {"old": [], "new": []}
                for r in range(rounds):
                    for key in (("old", "new") if r % 2 else ("new", "old")):
                        reads[key].append(_added_step_s(plain, stacks[key], x) / DP_UNITS)
                alias_s, calls = _alias_cpu(stacks["new"], x)
                out[(name, tensors)] = {"old": statistics.median(reads["old"]),
                                        "new": statistics.median(reads["new"]),
                                        "alias_s": alias_s, "calls": calls / DP_UNITS}
    return out


def _estimate_move(by_key: dict, nproc: int) -> dict:
    """gpt-tiny ZeRO-3 over nproc on `local`: the step with each reading's DP-unit line."""
    from cost_models.clusters import get_cluster
    from cost_models.common import host_figure_share
    from cost_models.estimate import estimate
    from cost_models.host_overhead_fit import unit_line
    from cost_models.model_states import has_dp_unit
    from ir.calibration_records import DpOverhead
    from ir.calibration_tables import CalibrationTables
    from ir.plan import uniform_plan
    from ir.strategy import DPMode, Precision
    from planner.models import load_layer_graph

    graph = load_layer_graph(MODEL, micro_batch=2, seq_len=SEQ_LEN, dtype=torch.float32)
    plan = uniform_plan(len(graph.layers), dp=nproc, zero=3, precision=Precision.FP32,
                        micro_batch=2, global_batch=2 * nproc)
    local = get_cluster("local", gpus_per_node=nproc)
    steps = {}
    for key in ("old", "new"):
        rows = []
        for name in MODES:
            (few, few_s), (many, many_s) = sorted((t, r[key]) for (m, t), r in by_key.items()
                                                  if m == name)
            rows.append(DpOverhead(DPMode[name], None, *unit_line(few, few_s, many, many_s)))
        tables = CalibrationTables(dp_overheads=tuple(rows), host_figures_clock="thread_cpu")
        spec = dataclasses.replace(local, calibration=tables)
        steps[key] = estimate(graph, plan, spec).iteration_seconds
    units = sum(has_dp_unit(layer, s, plan.precision)
                for layer, s in zip(graph.layers, plan.layer_strategies))
    zero3 = [r for (m, _), r in by_key.items() if m == "ZERO3"]
    direct = statistics.fmean(r["calls"] * r["alias_s"] for r in zero3)
    return {"old_step_s": steps["old"], "new_step_s": steps["new"], "units": units,
            "host_share": host_figure_share(spec),
            "direct_s": units * direct * host_figure_share(spec)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                      "dp_unit_gloo.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    results = spawn(_rank, args.nproc, args.rounds, timeout_s=1200)
    us = 1e6
    by_key = {k: {f: statistics.fmean(r[k][f] for r in results) for f in results[0][k]}
              for k in results[0]}
    rows, failed = [], []
    for (name, tensors), r in by_key.items():
        direct = r["calls"] * r["alias_s"]
        rows.append([name, tensors, f"{us * r['old']:.1f}", f"{us * r['new']:.1f}",
                     f"{us * (r['new'] - r['old']):.1f}", f"{r['calls']:.1f}",
                     f"{us * r['alias_s']:.1f}", f"{us * direct:.1f}"])
    for name in MODES:
        mine = [r for (m, _), r in by_key.items() if m == name]
        moved = statistics.fmean(r["new"] - r["old"] for r in mine)
        direct = statistics.fmean(r["calls"] * r["alias_s"] for r in mine)
        if abs(moved - direct) > AGREEMENT_TOLERANCE_S:
            failed.append(f"{name}: new - old {us * moved:.1f} us a unit, direct "
                          f"{us * direct:.1f}")
    move = _estimate_move(by_key, args.nproc)
    print(f"{args.nproc} gloo ranks, load {load_before:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"{args.rounds} rounds; us per unit per forward+backward, mean over ranks")
    print(table(["mode", "tensors", "old", "new", "new - old", "AG calls", "alias/AG",
                 "direct"], rows, right=set(range(1, 8))))
    print(f"{MODEL} ZeRO-3 x {args.nproc} on local: step {1e3 * move['old_step_s']:.3f} -> "
          f"{1e3 * move['new_step_s']:.3f} ms (+{us * (move['new_step_s'] - move['old_step_s']):.1f}"
          f" us); {move['units']} units x direct x host share {move['host_share']:.2f} = "
          f"{us * move['direct_s']:.1f} us")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"bench": "dp_unit_gloo", "torch": torch.__version__, "nproc": args.nproc,
                   "load": [load_before, os.getloadavg()[0]],
                   "rows": [{"mode": m, "tensors": t, **r} for (m, t), r in by_key.items()],
                   "estimate": move}, fh, indent=2)
    print(f"wrote {args.out}" + (f"; target missed: {'; '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
