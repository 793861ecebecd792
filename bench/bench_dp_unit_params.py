"""What a data-parallel unit adds as its parameters grow, and what the whole gpt-tiny adds
wrapped as the executor wraps it, against the DP-unit price (issue 17: multi-rank plans
predicted 27-46% under their steps; `DpOverhead.per_param_s`).

On --nproc gloo ranks (one thread each), with the probe's own reading
(`dp_unit_probe._added_step_s`: the calling thread's CPU over the plain model's, the
collectives left out, the median of DP_UNIT_STEPS pairs):
  sweep   replicate units of 4 probe blocks (24 tensors) at widths WIDTHS: ms a unit
          against its parameters (the probe's narrow units hold ~0.6K);
  model   gpt-tiny (micro-batch 4, head untied: FSDP2 units share no parameter) with
          every layer a replicate unit and the model the root, all with the executor's
          `sum_reduction`, against the plain model; beside it the same units priced by
          `DpOverhead.seconds` from `dp_unit_probe.dp_unit_seconds` read in the same
          processes just before, with and without the per-parameter part.

    .venv/bin/python bench/bench_dp_unit_params.py [--nproc 2] [--rounds 5]

Read on 2026-11-26 14:01 UTC (2 ranks, load 2.1-2.3, other sessions' timings beside):
sweep 1.40 / 1.69 / 2.77 / 5.0 ms a unit at 0.6K / 34K / 133K / 528K parameters; model
7.7 ms against 7.5 priced (6.7 without the per-parameter part). This script at 14:12,
load 2.7 -> 2.8: sweep 1.24-1.31 / 1.43-1.49 / 1.84 / 4.24-4.30 ms; model 8.07-8.10 ms
against 7.49-7.61 priced (6.12-6.19 without). Prints a table with the load;
informative, not judged.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from dist_utils import spawn  # noqa: E402
from planner.fmt import table  # noqa: E402

WIDTHS = (8, 64, 128, 256)  # the probe's narrow width (OP_OVERHEAD_WIDTH) up to its wide one
SWEEP_BLOCKS = 4  # the probe's larger narrow unit: 24 tensors
MODEL, MICRO_BATCH = "gpt-tiny", 4  # bench_validate's gpt-ddp2: 8 samples over 2 ranks


def _wrapped_model(base, mesh):
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard

    from ir.gloo_collectives import sum_reduction

    model = copy.deepcopy(base)
    units = [model.embed, *model.blocks.values(), model.norm, model.head]
    for layer in units:
        sum_reduction(replicate(layer, mesh=mesh), mesh)
    sum_reduction(fully_shard(model, mesh=mesh, reshard_after_forward=False), mesh)
    return model, units


def _rank(rank: int, world_size: int, rounds: int) -> dict:
    import torch
    from torch import nn
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh

    from cost_models.clusters import _one_thread, _overhead_block
    from cost_models.dp_unit_probe import DP_UNITS, _added_step_s, dp_unit_seconds
    from cost_models.host_overhead_fit import dp_unit_overhead
    from ir.gloo_collectives import sum_reduction
    from ir.strategy import DPMode
    from planner.models import load_model

    mesh = init_device_mesh("cpu", (world_size,))
    out = {"sweep": []}
    line = {r.mode: r for r in dp_unit_overhead({world_size: dp_unit_seconds(mesh)})
            if r.group_size == world_size}[DPMode.REPLICATE]
    with _one_thread():
        for width in WIDTHS:
            def stack():
                return nn.Sequential(*[nn.Sequential(*[_overhead_block(width)
                                                       for _ in range(SWEEP_BLOCKS)])
                                       for _ in range(DP_UNITS)])
            plain, wrapped = stack(), stack()
            for unit in [*wrapped, wrapped]:
                sum_reduction(replicate(unit, mesh=mesh), mesh)
            x = torch.randn(2, width)
            reads = [_added_step_s(plain, wrapped, x) / DP_UNITS for _ in range(rounds)]
            out["sweep"].append((sum(p.numel() for p in plain[0].parameters()),
                                 statistics.median(reads)))
        loaded = load_model(MODEL, micro_batch=MICRO_BATCH, device="cpu", seed=0)
        base = loaded.module
        base.head.weight = nn.Parameter(base.head.weight.detach().clone())  # untied
        wrapped, units = _wrapped_model(base, mesh)
        ids = loaded.inputs["input_ids"]
        reads = [_added_step_s(base, wrapped, ids) for _ in range(rounds)]
        sizes = [(len(list(u.parameters())), sum(p.numel() for p in u.parameters()))
                 for u in units]
        out["model"] = (statistics.median(reads),
                        sum(line.seconds(t, p) for t, p in sizes),
                        sum(line.seconds(t) for t, _ in sizes))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    ranks = spawn(_rank, args.nproc, args.rounds, timeout_s=1800)
    load_end = os.getloadavg()[0]
    rows = [[params, *(f"{r['sweep'][i][1] * 1e3:.3f}" for r in ranks)]
            for i, (params, _) in enumerate(ranks[0]["sweep"])]
    print(table(["params a unit", *(f"rank {k} ms a unit" for k in range(args.nproc))], rows))
    print(table(["rank", "model added ms", "priced ms", "priced without per-param ms"],
                [[k, *(f"{s * 1e3:.2f}" for s in r["model"])] for k, r in enumerate(ranks)]))
    print(f"load {load_start:.2f} -> {load_end:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
