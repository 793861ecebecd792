"""One rank of a validate trial inside a bench's own process: the world-1 gloo group and
the `RankPayload` that `planner.trial.rank._build` builds a plan's model from, as
`planner validate` makes them (bench_step_terms, bench_offcore, bench_recompute_terms)."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist


def start_one_rank_group() -> None:
    """A world-1 gloo group on a free localhost port, one intra-op thread
    (`planner.trial.run.RANK_THREADS`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)


def one_rank_payload(doc, plan_path: str, graph, steps: int):
    """The plan's one-rank `RankPayload`: global batches of 8 samples' worth, no memory or
    loss checks."""
    from ir.plan import plan_to_json
    from planner.models import plan_model_spec
    from planner.trial.records import RankPayload
    from planner.trial.reference import global_batches

    model = plan_model_spec(doc, None)
    return RankPayload(plan_json=plan_to_json(doc), plan_path=plan_path, model=model,
                       seq_len=doc.seq_len, graph=graph,
                       batches=global_batches(model, doc.plan.global_batch, doc.seq_len, 8),
                       memory_steps=0, steps=steps, backend="gloo", check_steps=0,
                       threads=1, memory_detail=0)
