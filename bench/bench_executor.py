"""Executor overhead: an executed plan vs the same torch.distributed parts wired by hand.

For each configuration, 4 gloo ranks train a GPT (untied head, dropout 0) with
  - "executor":  `executors.apply(model, plan, graph)` + `pm.train_step(global batch)`;
  - "by hand":   the same DeviceMesh, DTensor styles, fully_shard / replicate units,
                 pipelining schedule and AdamW written out torchtitan style, each rank
                 slicing its rows itself;
timed step by step in alternation (executor, by hand, executor, ...; the order flips every
round) so that machine load hits both alike; the figure is the median step time over all
timed steps. Target: ratio <= 1.05.

    .venv/bin/python bench/bench_executor.py [--steps 20] [--rounds 3] [--configs fsdp-tp ...]

Prints a table and writes bench/results/executor.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODEL = "gpt:layers=4,hidden=256,heads=8,vocab=2048,seq=128,dropout=0,tie_embeddings=false"
GLOBAL_BATCH = 16
WORLD = 4
TARGET_RATIO = 1.05
CONFIGS = {  # name -> uniform_plan kwargs (4 ranks)
    "fsdp-tp": dict(dp=2, tp=2, zero=3, micro_batch=8),  # FSDP2 (ZeRO-3) x Megatron TP, loss-parallel head
    "ddp": dict(dp=4, zero=0, micro_batch=4),  # replicate() per layer
    "pp-fsdp": dict(dp=2, pp=2, zero=2, micro_batch=2),  # 1F1B over 2 stages x ZeRO-2
}


# ----------------------------------------------------------------------------- by hand


def hand_written(model, config: dict, loss_fn, rank: int, stage_layers: list[list[str]]):
    """The same parts as the executor, wired directly. Returns step(inputs, target).
    stage_layers: the layer (module) names of each pipeline stage, as in the plan."""
    import contextlib

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   loss_parallel, parallelize_module)

    dp, tp, pp = config.get("dp", 1), config.get("tp", 1), config.get("pp", 1)
    mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank = rank // (dp * tp)
    dp_index = (rank % (dp * tp)) // tp
    if pp > 1:  # torchtitan-style split: top-level modules to None, blocks deleted
        keep = set(stage_layers[pp_rank])
        for key in [k for k in model.blocks if f"blocks.{k}" not in keep]:
            del model.blocks[key]
        for name in ("embed", "norm", "head"):
            if name not in keep:
                setattr(model, name, None)
    if tp > 1:
        tp_mesh = mesh["tp"]
        for block in model.blocks.values():
            parallelize_module(block, tp_mesh, {
                "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}, src_data_rank=None)
        parallelize_module(model.embed.tok, tp_mesh, RowwiseParallel(input_layouts=Replicate()),
                           src_data_rank=None)
        parallelize_module(model.head, tp_mesh, ColwiseParallel(
            output_layouts=Shard(-1), use_local_output=False), src_data_rank=None)
    dp_mesh = mesh["dp"]
    units = [m for m in (model.embed, *model.blocks.values(), model.norm, model.head)
             if m is not None]
    for unit in units:
        if config.get("zero", 0) >= 2:
            fully_shard(unit, mesh=dp_mesh, reshard_after_forward=config["zero"] == 3)
        else:
            replicate(unit, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=False)
    for unit in [*units, model]:
        unit.set_force_sum_reduction_for_comms(True)  # gloo has no AVG / PREMUL_SUM
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rows = GLOBAL_BATCH // dp

    if pp == 1:
        def step(inputs, target):
            local = slice(dp_index * rows, (dp_index + 1) * rows)
            with loss_parallel() if tp > 1 else contextlib.nullcontext():
                loss = loss_fn(model(inputs["input_ids"][local]), target[local])
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return step

    n = GLOBAL_BATCH // (dp * config.get("micro_batch", 1))
    stage = PipelineStage(model, pp_rank, pp, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = Schedule1F1B(stage, n, loss_fn=loss_fn)

    def pipeline_step(inputs, target):
        local = slice(dp_index * rows, (dp_index + 1) * rows)
        if pp_rank == 0:
            schedule.step(inputs["input_ids"][local])
        else:
            schedule.step(target=target[local], losses=[], return_outputs=False)
        optimizer.step()
        optimizer.zero_grad()
    return pipeline_step


# ----------------------------------------------------------------------------- ranks


def rank_main(rank: int, port: int, configs: list[str], steps: int, rounds: int, out: str):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=300))
    import warnings
    warnings.filterwarnings("ignore")
    from executors import apply
    from ir.plan import uniform_plan
    from ir.strategy import Precision
    from planner.models import load_layer_graph, load_model

    graph = load_layer_graph(MODEL, micro_batch=1, dtype=torch.float32)
    batch = load_model(MODEL, micro_batch=GLOBAL_BATCH, device="cpu", seed=1)
    inputs, target = batch.inputs, batch.target
    results = {}
    for name in configs:
        loaded = load_model(MODEL, micro_batch=1, device="cpu", seed=0)
        plan = uniform_plan(len(graph.layers), global_batch=GLOBAL_BATCH,
                            precision=Precision.FP32, **CONFIGS[name])
        pm = apply(loaded.module, plan, graph, loss_fn=loaded.loss_fn,
                   optimizer_kwargs={"lr": 1e-3})
        stages = [[graph.layers[j].name for j in range(st.first_layer, st.last_layer + 1)]
                  for st in plan.stages]
        hand = hand_written(load_model(MODEL, micro_batch=1, device="cpu", seed=0).module,
                            CONFIGS[name], loaded.loss_fn, rank, stages)
        runners = {"executor": lambda: pm.train_step(inputs, target),
                   "by hand": lambda: hand(inputs, target)}
        times: dict[str, list[float]] = {k: [] for k in runners}
        for run in runners.values():  # warm up: lazy init, shape inference
            run(), run()
        for i in range(rounds * steps):  # alternate step by step; flip the order each round
            order = list(runners) if (i // steps) % 2 == 0 else list(reversed(runners))
            for key in order:
                dist.barrier()
                start = time.perf_counter()
                runners[key]()
                times[key].append(time.perf_counter() - start)
        results[name] = {k: statistics.median(v) for k, v in times.items()}
        results[name]["plan"] = str(plan)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round and side")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    args = parser.parse_args()
    results_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(results_dir, exist_ok=True)
    scratch = os.path.join(results_dir, ".executor-ranks.json")
    mp.spawn(rank_main, args=(free_port(), args.configs, args.steps, args.rounds, scratch),
             nprocs=WORLD)
    with open(scratch) as f:
        results = json.load(f)
    os.unlink(scratch)
    print(f"{MODEL}, global batch {GLOBAL_BATCH}, {WORLD} gloo ranks on "
          f"{os.cpu_count()} cores, median of {args.rounds} x {args.steps} steps")
    print(f"{'config':<9} {'plan':<46} {'executor ms':>12} {'by hand ms':>11} {'ratio':>6}  ok")
    ok_all = True
    for name, r in results.items():
        r["ratio"] = r["executor"] / r["by hand"]
        ok = r["ratio"] <= TARGET_RATIO
        ok_all &= ok
        print(f"{name:<9} {r['plan']:<46} {r['executor'] * 1e3:>12.1f} "
              f"{r['by hand'] * 1e3:>11.1f} {r['ratio']:>6.3f}  {'yes' if ok else 'NO'}")
    with open(os.path.join(results_dir, "executor.json"), "w") as f:
        json.dump({"model": MODEL, "global_batch": GLOBAL_BATCH, "world_size": WORLD,
                   "target_ratio": TARGET_RATIO, "configs": results}, f, indent=2)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
