"""Train a GPT with a parallel plan: searched by the planner, read from a plan file, or
built from flags — then run with `executors.apply` on torch.distributed.

One process (CPU, or one GPU):
    python examples/train_gpt.py
Several processes on this machine (4 CPU processes on gloo; on a GPU box, 4 GPUs on NCCL):
    torchrun --nproc-per-node 4 examples/train_gpt.py
    torchrun --nproc-per-node 4 examples/train_gpt.py --uniform --tp 2 --pp 2
    torchrun --nproc-per-node 4 examples/train_gpt.py --plan plan.json   # from `planner plan`
Several nodes (run the same line on every node; here 2 nodes x 8 GPUs):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        examples/train_gpt.py --model gpt3-1.3b --cluster h100-80g --global-batch 64 --seq-len 1024
The search sees the job as nodes x LOCAL_WORLD_SIZE devices, so TP groups (consecutive
ranks, and torchrun numbers a node's ranks consecutively) stay inside a node; rank 0
prints each rank's node and checks it.

Rank 0 plans (the local cluster's speed is measured, so ranks could disagree) and
broadcasts the plan; every rank builds the same model from the same seed, applies the
plan, and trains on the same global batches, each keeping its own share. The data is a
synthetic "counting" language (each sequence steps through the vocabulary with its own
start and stride), so the loss visibly falls within a few dozen steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from executors import apply, global_batch_indices, init_distributed  # noqa: E402
from ir.plan import ParallelPlan, layer_groups, load_plan, uniform_plan  # noqa: E402
from ir.strategy import Checkpoint, Precision, Schedule  # noqa: E402
from planner.models import load_layer_graph, load_model  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt-tiny", help="zoo preset, family:overrides or hf:config.json")
    p.add_argument("--seq-len", type=int, default=None, help="default: the model's context")
    p.add_argument("--global-batch", type=int, default=16, help="samples per optimizer step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--log-every", type=int, default=5, help="print the loss every N steps")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=[x.value for x in Precision], default=None,
                   help="default: bf16-mixed on GPUs, fp32 on CPU")
    p.add_argument("--plan", default=None, help="a plan JSON written by `planner plan --out`")
    p.add_argument("--cluster", default=None,
                   help="cluster preset or spec JSON for the search (default: local on CPU, "
                        "h100-80g on GPUs)")
    p.add_argument("--uniform", action="store_true",
                   help="skip the search: one strategy for every layer, from the flags below")
    g = p.add_argument_group("strategy flags (pins for the search, or the uniform plan)")
    g.add_argument("--tp", type=int, default=None)
    g.add_argument("--pp", type=int, default=None)
    g.add_argument("--zero", type=int, default=None, choices=[0, 1, 2, 3])
    g.add_argument("--checkpoint", default=None, choices=[c.value for c in Checkpoint])
    g.add_argument("--sequence-parallel", action="store_true", default=None)
    g.add_argument("--micro-batch", type=int, default=None)
    g.add_argument("--schedule", default=None, choices=[s.value for s in Schedule])
    g.add_argument("--virtual-stages", type=int, default=1)
    return p.parse_args()


def make_plan(args, graph, world: int, precision: Precision) -> ParallelPlan:
    """The plan on rank 0: a file, a uniform plan from flags, or the planner's search."""
    if args.plan:
        doc = load_plan(args.plan)
        doc.check_model(graph)
        doc.check_world_size(world)
        return doc.plan
    schedule = Schedule(args.schedule) if args.schedule else None
    if not args.uniform:
        try:
            from cost_models.clusters import get_cluster
            from planner.search import search
            from planner.search_space import SearchOptions
        except ImportError:
            search = None
        if search is not None:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            name = args.cluster or ("h100-80g" if torch.cuda.is_available() else "local")
            cluster = get_cluster(name, nodes=world // local, gpus_per_node=local)
            options = SearchOptions(
                tp=args.tp, pp=args.pp, zero=args.zero, micro_batch=args.micro_batch,
                checkpoint=Checkpoint(args.checkpoint) if args.checkpoint else None,
                sequence_parallel=args.sequence_parallel, schedule=schedule,
                precision=precision)
            result = search(graph, cluster, args.global_batch, options)
            if result.best is None:
                raise SystemExit("no plan fits; try `planner plan` for the diagnosis")
            return result.best.plan
    tp, pp = args.tp or 1, args.pp or 1
    dp = world // (tp * pp)
    # one micro-batch without a pipeline; 2 x pp of them to keep a pipeline busy
    micro_batch = args.micro_batch or max(1, args.global_batch // (dp * (2 * pp if pp > 1 else 1)))
    return uniform_plan(len(graph.layers), tp=tp, pp=pp, dp=dp,
                        zero=args.zero or 0, micro_batch=micro_batch,
                        global_batch=args.global_batch,
                        checkpoint=Checkpoint(args.checkpoint or "none"),
                        sequence_parallel=bool(args.sequence_parallel),
                        schedule=schedule or Schedule.ONE_F_ONE_B, precision=precision,
                        virtual_stages=args.virtual_stages)


def tp_groups_within_nodes(plan: ParallelPlan, node_of_rank: list[int]) -> bool:
    """Whether every layer's TP group runs on one node (TP traffic stays on NVLink)."""
    return all(len({node_of_rank[r] for r in group}) == 1
               for j in range(len(plan.layer_strategies))
               for group in layer_groups(plan, j).tp_groups)


def counting_data(num_samples: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """(N, T + 1) token sequences start, start + stride, ... (mod vocab)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (num_samples, 1), generator=gen)
    stride = torch.randint(1, 4, (num_samples, 1), generator=gen)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore", message=r".*returned a view tensor.*")  # FSDP2 notice
    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    precision = Precision(args.precision) if args.precision else (
        Precision.BF16_MIXED if torch.cuda.is_available() else Precision.FP32)

    loaded = load_model(args.model, micro_batch=1, seq_len=args.seq_len, device="cpu",
                        seed=args.seed)
    seq_len = loaded.inputs["input_ids"].shape[1]
    graph = load_layer_graph(args.model, micro_batch=1, seq_len=seq_len,
                             dtype=getattr(torch, precision.compute_dtype))
    box = [make_plan(args, graph, world, precision) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)  # one plan for everyone
    plan = box[0]
    nodes = [None] * world  # torchrun's GROUP_RANK: which launcher (node) runs each rank
    dist.all_gather_object(nodes, int(os.environ.get("GROUP_RANK", 0)))
    if rank == 0:
        print(f"{graph.model}: {graph.num_params:,} parameters, {len(graph.layers)} layers, "
              f"{world} processes, {plan}")
        print(f"node of each rank: {nodes}; TP groups inside one node: "
              f"{'yes' if tp_groups_within_nodes(plan, nodes) else 'NO'}")
        for stage_index, stage in enumerate(plan.stages):
            names = [f"{graph.layers[j].name}={plan.layer_strategies[j]}"
                     for j in range(stage.first_layer, stage.last_layer + 1)]
            print(f"  stage {stage_index} (ranks {list(plan.stage_ranks(stage_index))}): "
                  + ", ".join(names))

    pm = apply(loaded.module, plan, graph, loss_fn=loaded.loss_fn,
               optimizer_kwargs={"lr": args.lr}, example_inputs=loaded.inputs)
    vocab = int(loaded.config.vocab if hasattr(loaded.config, "vocab")
                else loaded.config.vocab_size)
    data = counting_data(64 * args.global_batch, seq_len, vocab, args.seed)
    batches = iter(())
    epoch = 0
    for step in range(1, args.steps + 1):
        indices = next(batches, None)
        if indices is None:
            batches = global_batch_indices(len(data), args.global_batch, epoch=epoch, seed=args.seed)
            epoch, indices = epoch + 1, next(batches)
        tokens = data[indices]  # the GLOBAL batch, identical on every rank
        start = time.perf_counter()
        loss = pm.train_step({"input_ids": tokens[:, :-1]}, tokens[:, 1:])
        seconds = time.perf_counter() - start
        if rank == 0 and (step == 1 or step % args.log_every == 0 or step == args.steps):
            print(f"step {step:4d}  loss {loss:.6f}  {seconds * 1e3:7.1f} ms/step", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
