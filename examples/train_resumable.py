"""Train with checkpoints every K steps and pick up from the newest one after a failure.

Under torchrun's elastic agent a dead rank makes the agent stop the others and start
every rank again (up to --max-restarts times); each start resumes from the newest
complete checkpoint — under whatever plan and world size this start has:

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 \\
        examples/train_resumable.py --ckpt-dir ckpt --save-every 3 --steps 8
    # fault drill: rank 1 kills itself (SIGKILL) at step 5 of the first attempt
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 \\
        examples/train_resumable.py --ckpt-dir ckpt --save-every 3 --steps 8 --kill-at-step 5
    # hang drills: rank 1 freezes at step 3 (the watchdog ends the job after 10 s), or
    # runs ZeRO-3 while rank 0 runs DDP (both ranks fail at once, naming the two plans)
    torchrun --standalone --nproc-per-node 2 examples/train_resumable.py --ckpt-dir ckpt \\
        --stop-at-step 3 --stall-limit-s 10
    torchrun --standalone --nproc-per-node 2 examples/train_resumable.py --ckpt-dir ckpt \\
        --zero-on-rank 1:3

The global batch of step k is drawn from seed 1000 + k on every rank, so the step count
in the checkpoint is the data position. Rank 0 appends one JSON line per step to
--losses-out: {"attempt": TORCHELASTIC_RESTART_COUNT, "step": k, "loss": ...}.
Bad input (a partial or corrupted checkpoint, a plan that does not fit the job) is one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from executors import init_distributed  # noqa: E402
from ir.errors import PlannerError  # noqa: E402
from ir.plan import uniform_plan  # noqa: E402
from ir.strategy import Precision  # noqa: E402
from planner.api import auto_parallel  # noqa: E402
from planner.models import load_layer_graph, load_model  # noqa: E402

SEED = 1234  # model weights, the same on every rank and every attempt
BATCH_SEED = 1000  # global batch k: seed BATCH_SEED + k
# AdamW with eps 1e-4 (tests/test_exec_plans.py: keeps plans within 1e-5 of one process)
OPTIMIZER_KWARGS = {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}


def _rank_stage(text: str) -> tuple[int, int]:
    rank, _, stage = text.partition(":")
    if not (rank.isdigit() and stage in ("0", "1", "2", "3")):
        raise argparse.ArgumentTypeError(f"{text!r} is not RANK:STAGE, e.g. 1:3")
    return int(rank), int(stage)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt:layers=4,hidden=64,heads=4,vocab=128,seq=32,dropout=0")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3])
    p.add_argument("--ckpt-dir", required=True, help="folder of step-N checkpoints")
    p.add_argument("--save-every", type=int, default=3, help="checkpoint every K steps")
    p.add_argument("--resume", default=None,
                   help="a checkpoint folder to start from (default: newest in --ckpt-dir)")
    p.add_argument("--kill-at-step", type=int, default=None,
                   help="fault drill: --kill-rank SIGKILLs itself before this step, first attempt only")
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--stop-at-step", type=int, default=None,
                   help="fault drill: --kill-rank SIGSTOPs itself (freezes) before this step")
    p.add_argument("--zero-on-rank", default=None, metavar="RANK:STAGE", type=_rank_stage,
                   help="fault drill: this rank plans with this ZeRO stage, unlike the others")
    p.add_argument("--pg-timeout-s", type=float, default=None,
                   help="process-group timeout (default PLANNER_PG_TIMEOUT_S or 600)")
    p.add_argument("--stall-limit-s", type=float, default=None,
                   help="seconds a rank may stop making progress (default "
                        "PLANNER_STALL_LIMIT_S or 300)")
    p.add_argument("--losses-out", default=None, help="rank 0 appends JSON lines here")
    return p.parse_args(argv)


def global_batch(spec: str, rows: int, seq_len: int, step: int):
    loaded = load_model(spec, micro_batch=rows, seq_len=seq_len, device="cpu",
                        seed=BATCH_SEED + step)
    return loaded.inputs, loaded.target


def train(args) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    # namespaces store keys per restart attempt (see its docstring)
    init_distributed(timeout_s=args.pg_timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    zero = args.zero
    if args.zero_on_rank:
        drill_rank, drill_zero = args.zero_on_rank
        zero = drill_zero if rank == drill_rank else zero
    loaded = load_model(args.model, micro_batch=1, seq_len=args.seq_len, device="cpu", seed=SEED)
    layers = len(load_layer_graph(args.model, 1, args.seq_len, torch.float32).layers)
    if world % (args.tp * args.pp):
        raise PlannerError(f"--tp {args.tp} x --pp {args.pp} does not divide the world size "
                           f"{world}: launch a multiple of {args.tp * args.pp} processes")
    dp = world // (args.tp * args.pp)
    plan = uniform_plan(layers, tp=args.tp, pp=args.pp, dp=dp, zero=zero,
                        micro_batch=args.global_batch // (dp * args.pp),
                        global_batch=args.global_batch, precision=Precision.FP32)
    example = global_batch(args.model, 1, args.seq_len, 0)
    ap = auto_parallel(loaded.module, example, loss_fn=loaded.loss_fn,
                       optimizer=torch.optim.AdamW, optimizer_kwargs=OPTIMIZER_KWARGS,
                       plan=plan, precision=Precision.FP32, global_batch=args.global_batch,
                       stall_limit_s=args.stall_limit_s)
    start = ap.resume(args.resume or args.ckpt_dir)
    if rank == 0:
        print(f"attempt {attempt}: {world} ranks, {plan}, starting at step {start}", flush=True)
    for step in range(start, args.steps):
        if args.kill_at_step == step and attempt == 0:
            # Every rank has finished (and rank 0 logged) the step before: the drill's
            # losses then do not depend on how fast torchrun's monitor kills rank 0.
            dist.barrier()
        if (args.kill_at_step == step and attempt == 0 and rank == args.kill_rank):
            print(f"rank {rank}: fault drill, killing myself before step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if args.stop_at_step == step and rank == args.kill_rank:
            print(f"rank {rank}: fault drill, freezing (SIGSTOP) before step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        loss = ap.train_step(global_batch(args.model, args.global_batch, args.seq_len, step))
        if rank == 0 and args.losses_out:
            with open(args.losses_out, "a") as fh:
                fh.write(json.dumps({"attempt": attempt, "step": step, "loss": loss}) + "\n")
        if (step + 1) % args.save_every == 0:
            ap.save(args.ckpt_dir)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        train(args)
    except PlannerError as exc:
        print(f"train_resumable: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
