"""One spawned 4-rank job runs every multi-rank check of the sharded tables (a spawn
costs ~40 s of imports on a loaded 2-core machine; the steps take a fraction of a
second): the 4-rank equivalence runs, a checkpoint at 4 ranks, a regroup to 2 ranks
(ranks 2 and 3 wait) for the 2-rank runs and the resume, a regroup to 4 for the second
resume, and the memory phase under RLIMIT_AS. The 2-rank group also runs the clipped
runs (`HybridTrainer(max_grad_norm=)`, max_norm per step `S.CLIP_MAX_NORMS`)."""

from __future__ import annotations

import ctypes
import os
import resource
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from executors.embedding_checkpoint import load_sharded, save_sharded
from executors.hybrid_step import HybridTrainer
from executors.sharded_embedding import apply_table_placements
from executors.sparse_optimizer import SparseOptimizerSpec, SparseRowOptimizer
from ir.embedding_tables import TablePlacement, TableSharding as K, dlrm_table_bound, init_table_rows
from ir.errors import PlannerError
from planner.zoo import dlrm
from planner.zoo.criteo_data import CriteoSynthetic
from tests import sharded_dlrm as S

ELASTIC_STEPS = 6  # saved after 2 (4 ranks), resumed for 2 on 2 ranks, saved, resumed on 4
ELASTIC_OPTIMIZER = "adam"  # the most state: per-element moments, a step count, dense Adam

# Memory phase: each rank may grow its address space by TABLE_BUDGET_BYTES over its
# footprint when the phase starts; the tables total 3x that, so no rank could hold them
# all, and each rank holds 3/4 of its budget (bench/bench_sharded_memory.py: GB scale).
TABLE_BUDGET_BYTES = 64 << 20
MEMORY_CONFIG = dlrm.Config(num_tables=4, rows_per_table=393_216, embedding_dim=32,
                            bottom_mlp=(32,), top_mlp=(32,), lookups_per_table=4)
MEMORY_BATCH = 64
MEMORY_STEPS = 2


def regroup(rank: int, world: int, port: int) -> bool:
    """Leave the current process group and join a `world`-rank one (ranks >= world sit
    out); True when this rank is in the new group."""
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank >= world:
        return False
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    return True


def elastic_placements(world: int) -> list[TablePlacement]:
    everyone = tuple(range(world))
    t = S.names()
    return [TablePlacement(t[0], K.REPLICATED, everyone),
            TablePlacement(t[1], K.ROW_HASH, everyone),  # 4 ring shards, then 2, then 4
            TablePlacement(t[2], K.COLUMN_WISE, everyone[::-1]),
            TablePlacement(t[3], K.ROW_RANGE, everyone),
            TablePlacement(t[4], K.TABLE_WISE, (world - 1,))]


def _elastic_trainer(rank: int, world: int):
    model = S.build_model()
    for module in model.tables.values():
        module.to("meta")
    tables = apply_table_placements(model, elastic_placements(world), init=S.table_init)
    kind = ELASTIC_OPTIMIZER
    opt = SparseRowOptimizer(tables, SparseOptimizerSpec(kind, lr=S.LR[kind]))
    return HybridTrainer(model, tables, S.dense_optimizer(kind, tables.dense_parameters(model)),
                         opt, dlrm.loss_fn)


def _train(trainer, rank: int, world: int, steps: range) -> list[float]:
    return [trainer.step(*S.DATA.batch(k, S.GLOBAL_BATCH, part=(rank, world)), S.GLOBAL_BATCH)
            for k in steps]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


# glibc raises its mmap threshold after each large free (up to 32 MiB), after which
# freed temporaries stay in the heap and count against RLIMIT_AS; a fixed 1 MiB
# threshold (mallopt M_MMAP_THRESHOLD = -3, M_TRIM_THRESHOLD = -1) returns them.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _FIXED_THRESHOLD_BYTES = -1, -3, 1 << 20


def _return_freed_memory_to_the_os() -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(_M_MMAP_THRESHOLD, _FIXED_THRESHOLD_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, _FIXED_THRESHOLD_BYTES)


def memory_phase(rank: int, world: int, c: dlrm.Config = MEMORY_CONFIG,
                 budget_bytes: int = TABLE_BUDGET_BYTES) -> dict:
    """Tables of config `c` (4 tables), built shard by shard on the meta device, trained
    MEMORY_STEPS steps with each rank's address space capped at its start + budget."""
    table_bytes = c.rows_per_table * c.embedding_dim * 4
    _return_freed_memory_to_the_os()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM (peak RSS) to the current RSS (Linux >= 4.0)
    rss_start_kib, vm_start_kib = _status_kib("VmRSS"), _status_kib("VmSize")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = vm_start_kib * 1024 + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        with torch.device("meta"):
            model = dlrm.DLRM(c)
        for part in (model.bottom_mlp, model.top_mlp):  # the dense part is small: real
            part.to_empty(device="cpu")
            torch.manual_seed(0)
            for layer in part:
                if isinstance(layer, torch.nn.Linear):
                    torch.nn.init.normal_(layer.weight, 0.0, 0.1)
                    torch.nn.init.zeros_(layer.bias)
        t = [f"tables.{i}" for i in range(c.num_tables)]
        everyone = tuple(range(world))
        placements = [TablePlacement(t[0], K.ROW_RANGE, everyone),
                      TablePlacement(t[1], K.ROW_HASH, everyone),
                      TablePlacement(t[2], K.COLUMN_WISE, everyone),
                      TablePlacement(t[3], K.ROW_RANGE, everyone[::-1])]

        def init(table, rows, c0, c1):
            return init_table_rows(table.name, 11, rows, c0, c1, table.dim,
                                   dlrm_table_bound(table.rows))

        tables = apply_table_placements(model, placements, init=init)
        opt = SparseRowOptimizer(tables, SparseOptimizerSpec("rowwise_adagrad", lr=0.05))
        trainer = HybridTrainer(model, tables, torch.optim.SGD(tables.dense_parameters(model),
                                                               lr=0.05), opt, dlrm.loss_fn)
        data = CriteoSynthetic(rows_per_table=(c.rows_per_table,) * c.num_tables,
                               lookups_per_table=c.lookups_per_table, seed=5)
        losses = [trainer.step(*data.batch(k, MEMORY_BATCH, part=(rank, world)), MEMORY_BATCH)
                  for k in range(MEMORY_STEPS)]
        held = {n: tuple(m.weight.shape) for n, m in tables.modules.items()}
        held_bytes = sum(m.weight.numel() * 4 for m in tables.modules.values())
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    return {"losses": losses, "held_shapes": held, "held_bytes": held_bytes,
            "tables_bytes": table_bytes * c.num_tables, "table_bytes": table_bytes,
            "cap_bytes": cap, "budget_bytes": budget_bytes,
            "rss_start_bytes": rss_start_kib * 1024,
            "peak_rss_bytes": _status_kib("VmHWM") * 1024}


class _Lookups(torch.nn.Module):
    """nn.Embedding (no pooling) and a mean EmbeddingBag fed flat ids with offsets."""

    def __init__(self):
        super().__init__()
        self.token = torch.nn.Embedding(50, 6)
        self.bag = torch.nn.EmbeddingBag(50, 6, mode="mean")


def lookup_variants(rank: int, world: int) -> dict:
    """Sharded nn.Embedding (ROW_HASH) and mean EmbeddingBag with offsets (COLUMN_WISE,
    then ROW_RANGE): outputs and row gradients against the unsharded modules run on the
    global batch here (largest absolute differences)."""
    errors = {}
    for bag_kind in (K.COLUMN_WISE, K.ROW_RANGE):
        torch.manual_seed(1)
        full = _Lookups()
        sharded = _Lookups()
        sharded.load_state_dict(full.state_dict())
        everyone = tuple(range(world))
        tables = apply_table_placements(sharded, [
            TablePlacement("token", K.ROW_HASH, everyone[::-1]),
            TablePlacement("bag", bag_kind, everyone)])
        g = torch.Generator().manual_seed(2)
        tokens = torch.randint(0, 50, (world, 3, 5), generator=g)  # (ranks, B, seq)
        lengths = torch.randint(0, 4, (world, 4), generator=g)  # bag sizes, empty bags too
        ids = [torch.randint(0, 50, (int(n.sum()),), generator=g) for n in lengths]
        offsets = [torch.cumsum(n, 0) - n for n in lengths]
        probe_t, probe_b = torch.randn(world, 3, 5, 6, generator=g), torch.randn(world, 4, 6, generator=g)
        out_t = sharded.token(tokens[rank])
        out_b = sharded.bag(ids[rank], offsets[rank])
        ((out_t * probe_t[rank]).sum() + (out_b * probe_b[rank]).sum()).backward()
        ref_t = full.token(tokens.reshape(-1, 5)).view(world, 3, 5, 6)
        ref_b = torch.cat([full.bag(i, o) for i, o in zip(ids, offsets)]).view(world, 4, 6)
        ((ref_t * probe_t).sum() + (ref_b * probe_b).sum()).backward()
        for name, out, ref in (("token", out_t, ref_t[rank]), ("bag", out_b, ref_b[rank])):
            module = tables.modules[name]
            shard = module.shard
            rows = module.local_ids if module.local_ids is not None else \
                torch.arange(shard.row_start, shard.row_stop)
            grad = module.weight.grad.coalesce().to_dense()
            want = getattr(full, name).weight.grad[rows, shard.col_start:shard.col_stop]
            errors[f"{name}/{bag_kind}"] = max(float((out - ref).detach().abs().max()),
                                               float((grad - want).abs().max()))
    return errors


def disagreement(rank: int, world: int) -> str | None:
    """Rank 1 hashes tables.2 where the others split it by range: every rank refuses."""
    chosen = S.placements("row_range", world)
    if rank == 1:
        chosen[2] = TablePlacement("tables.2", K.ROW_HASH, tuple(range(world)))
    try:
        apply_table_placements(S.build_model(), chosen, init=S.table_init)
    except PlannerError as exc:
        return str(exc)
    return None


def all_phases(rank: int, world: int, payload: dict) -> dict:
    assert world == 4
    ckpt = payload["checkpoint_dir"]
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return round(clock[-1] - clock[-2], 2)

    out: dict = {"eq4": S.sharded_worker(rank, 4, payload["runs"][4])}
    seconds = out["seconds"] = {"eq4": lap()}
    out["lookup_variants"] = lookup_variants(rank, 4)
    out["disagreement"] = disagreement(rank, 4)
    out["straight"] = _train(_elastic_trainer(rank, 4), rank, 4, range(ELASTIC_STEPS))
    trainer = _elastic_trainer(rank, 4)
    resumed = _train(trainer, rank, 4, range(2))
    first = save_sharded(trainer, ckpt, step=2)
    again = _elastic_trainer(rank, 4)  # the same layout reloaded: bit for bit
    load_sharded(again, first)
    out["roundtrip_equal"] = all(
        torch.equal(a[2], b[2]) and all(torch.equal(a[3][k], b[3][k]) for k in a[3])
        for a, b in zip(S.shard_report(trainer.tables, trainer.sparse_optimizer).values(),
                        S.shard_report(again.tables, again.sparse_optimizer).values()))
    seconds["checkpoint_at_4"] = lap()
    if regroup(rank, 2, payload["ports"][0]):
        out["eq2"] = S.sharded_worker(rank, 2, payload["runs"][2])
        out["clip2"] = S.sharded_worker(rank, 2, payload["clip_runs"], S.CLIP_MAX_NORMS)
        two = _elastic_trainer(rank, 2)
        out["resumed_at_step"] = [load_sharded(two, first)]
        resumed += _train(two, rank, 2, range(2, 4))
        save_sharded(two, ckpt, step=4)
    seconds["at_2"] = lap()
    regroup(rank, 4, payload["ports"][1])
    four = _elastic_trainer(rank, 4)
    second = os.path.join(ckpt, "step-00000004")
    out.setdefault("resumed_at_step", []).append(load_sharded(four, second))
    resumed_tail = _train(four, rank, 4, range(4, ELASTIC_STEPS))
    out["resumed"] = resumed + resumed_tail if rank < 2 else None
    out["resumed_tail"] = resumed_tail
    seconds["resume_at_4"] = lap()
    out["memory"] = memory_phase(rank, 4)
    seconds["memory"] = lap()
    return out
