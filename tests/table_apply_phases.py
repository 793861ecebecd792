"""Spawned ranks for tests/test_table_apply.py: `auto_parallel` on the small DLRM of
tests/sharded_dlrm.py, searched (no plan given) and with a given mixed placement (also on
a meta-built model), 3 steps each, reporting losses, shards, optimizer state and dense
parameters; and a checkpoint saved at one world size and resumed at another (`phase`)."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from executors import meta_init
from executors.sparse_optimizer import SparseOptimizerSpec
from ir.embedding_tables import PlacedTable
from planner.api import auto_parallel
from planner.zoo import dlrm
from tests import sharded_dlrm as S

DENSE = {"sgd": (torch.optim.SGD, {"lr": S.LR["sgd"]}),
         "rowwise_adagrad": (torch.optim.Adagrad, {"lr": S.LR["rowwise_adagrad"]}),
         "adam": (torch.optim.Adam, {"lr": S.LR["adam"]})}


def build(kind: str, world: int, plan=None, meta: bool = False,
          max_grad_norm: float | None = None):
    """auto_parallel on the test DLRM; `meta`: built on the meta device (no rank ever
    holds a whole table: each makes its shards with the row initializer)."""
    if meta:
        with meta_init():
            model = S.build_model()
    else:
        model = S.build_model()
    cls, kwargs = DENSE[kind]
    example = S.DATA.batch(0, S.GLOBAL_BATCH // world)
    return auto_parallel(model, example, loss_fn=dlrm.loss_fn, optimizer=cls,
                         optimizer_kwargs=kwargs, cluster="local", global_batch=S.GLOBAL_BATCH,
                         sparse_optimizer=SparseOptimizerSpec(kind, S.LR[kind]), plan=plan,
                         table_init=S.table_init if meta else None,
                         max_grad_norm=max_grad_norm)


def mixed(plan, world: int):
    """`plan` with the tables placed as tests/sharded_dlrm.py's "mixed" (every sharding)."""
    by_name = {p.table: p for p in S.placements("mixed", world)}
    tables = tuple(PlacedTable(t.table, by_name[t.table.name]) for t in plan.embeddings.tables)
    return dataclasses.replace(plan, embeddings=dataclasses.replace(plan.embeddings,
                                                                    tables=tables))


def record_dense_grads(ap) -> list[dict]:
    """Each step's dense gradients (reduced, whole), taken as the optimizer steps: the
    train step clears them after."""
    grads, opt = [], ap.parallel.optimizer
    real = opt.step

    def step(*args, **kwargs):
        grads.append(S.dense_grads(ap.module))
        return real(*args, **kwargs)
    opt.step = step
    return grads


def report(ap, losses) -> dict:
    pm = ap.parallel
    dense = {n: (p.detach().full_tensor() if isinstance(p, DTensor) else p.detach().clone())
             for n, p in pm.module.named_parameters() if not n.startswith("tables.")}
    return {"losses": losses, "shards": S.shard_report(pm.tables, pm.sparse_optimizer),
            "dense": dense, "placements": [str(t) for t in ap.plan.embeddings.tables],
            "plan": str(ap.plan), "modules": {n: type(m).__name__
                                              for n, m in pm.tables.modules.items()}}


def phase(rank: int, world: int, payload: dict) -> dict:
    """`payload["runs"]`: (optimizer kind, "searched" | "mixed" | "meta" | "clipped")
    trained 3 steps each from the start ("clipped": mixed, clipped to S.CLIP_MAX_NORMS,
    each step's norm kept); then `payload["checkpoint"]`: kind, resume (a folder or None), steps, and
    save_after (save once that many steps are done, None: no save)."""
    out = {}
    for kind, given in payload.get("runs", ()):
        ap = build(kind, world)
        if rank == 0 and "doc" not in out:
            from ir.plan import plan_to_dict
            out["doc"] = plan_to_dict(ap.document)
        clip = S.CLIP_MAX_NORMS if given == "clipped" else None
        if given in ("mixed", "meta", "clipped"):  # the searched plan, every sharding instead
            ap = build(kind, world, plan=mixed(ap.plan, world), meta=given == "meta",
                       max_grad_norm=clip[0] if clip else None)
        grads, losses, norms = record_dense_grads(ap), [], []
        for step in range(S.STEPS):
            if clip:
                ap.parallel.max_grad_norm = clip[step]
            losses.append(ap.train_step(S.DATA.batch(step, S.GLOBAL_BATCH)))
            norms.append(ap.last_grad_norm)
        out[(kind, given)] = {**report(ap, losses), "grads": grads, "norms": norms}
    c = payload.get("checkpoint")
    if c:
        ap = build(c["kind"], world)
        ap = build(c["kind"], world, plan=mixed(ap.plan, world))
        start = ap.resume(c["resume"]) if c.get("resume") else 0
        losses = []
        for step in range(start, start + c["steps"]):
            losses.append(ap.train_step(S.DATA.batch(step, S.GLOBAL_BATCH)))
            if c.get("save_after") == step + 1:
                out["saved"] = ap.save(c["directory"])
        out["checkpoint"] = {"start": start, "losses": losses}
    dist.barrier()
    return out
