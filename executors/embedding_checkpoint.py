"""DCP checkpoints of a model with sharded tables, resharded on load to any world size and
placement (the elastic case: a job saved on 4 ranks resumes on 2, and back on 4).

    save_sharded(trainer, "ckpt", step=2)             # every rank: ckpt/step-00000002/
    step = load_sharded(trainer, "ckpt/step-00000002")   # any ranks, any placements

One flat DCP state dict; each table is saved as its GLOBAL tensor, every holder writing
its shard as a chunk at the shard's global offsets (ShardedTensor metadata), so DCP can
serve any other layout from the chunks that overlap it:
  tables/<t>/weight        (rows, dim): row ranges (row_start, 0) or column blocks (0, col_start)
  tables/<t>/sum_sq        (rows,): row-wise Adagrad; column-wise tables save it once (shard 0)
  tables/<t>/exp_avg, exp_avg_sq   (rows, dim): Adam's moments, laid out as the weight
  tables/<t>/step          Adam's step count (the same on every rank)
  dense/<name>, dense_optim/<name>/<key>   the data-parallel part and its optimizer
  meta/step
ROW_HASH shards are no box of the tensor: their rows are scattered by the ring. They are
saved in a canonical layout instead: row_shard_bounds over the table's ranks, the rows
moved to their range holder by one all_to_all_single (ids, then values) before the save;
loading reads the new canonical ranges and moves each row to its ring owner. A replicated
table is saved by rank 0. The files, marker and digests are `executors.checkpoint`'s
(`save_state`, `open_checkpoint`, `load_state`): a damaged checkpoint is refused, whole.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard as ChunkShard
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import (ShardedTensorMetadata,
                                                              TensorProperties)

from executors.checkpoint import load_state, open_checkpoint, save_state
from executors.hybrid_step import HybridTrainer
from executors.sharded_embedding import ReplicatedEmbedding, ShardedEmbedding, ShardedTables
from executors.sparse_optimizer import SparseRowOptimizer
from ir.embedding_tables import TableSharding, row_shard_bounds
from ir.errors import PlannerError

@contextmanager
def sharded_tensor_quiet():
    """ShardedTensor is deprecated in favour of DTensor, but DTensor's Shard(0) splits rows
    torch.chunk-wise (ceil), not as row_shard_bounds / ROW_HASH ranks hold them; DCP still
    reads and writes ShardedTensor chunks, so its warning is silenced here only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Please use DTensor instead", FutureWarning)
        yield


def _chunked(layout: list[tuple[int, tuple, tuple]], values: torch.Tensor,
             global_size: tuple[int, ...]):
    """This rank's chunk of a global tensor laid out as `layout` ((rank, offsets, sizes)
    of every chunk, non-overlapping, covering it): a ShardedTensor, whose metadata DCP
    reads to save the chunk at its offsets or fill it from whatever chunks were saved;
    the plain tensor when one chunk is the whole; None when this rank has no chunk."""
    rank = dist.get_rank()
    if not any(r == rank for r, _, _ in layout):
        return None
    if len(layout) == 1:
        return values
    metas = [ShardMetadata(list(offsets), list(sizes), f"rank:{r}/cpu")
             for r, offsets, sizes in layout]
    local = [ChunkShard(values, m) for (r, _, _), m in zip(layout, metas) if r == rank]
    meta = ShardedTensorMetadata(metas, torch.Size(global_size),
                                 TensorProperties(dtype=values.dtype, layout=torch.strided,
                                                  requires_grad=False,
                                                  memory_format=torch.contiguous_format,
                                                  pin_memory=False))
    return ShardedTensor._init_from_local_shards_and_global_metadata(local, meta)


def _exchange_rows(ids: torch.Tensor, values: list[torch.Tensor], dest: torch.Tensor
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Send row `ids` with their `values` rows to rank `dest` each (a world collective);
    returns what this rank received, sorted by id."""
    world = dist.get_world_size()
    order = torch.argsort(dest, stable=True)
    send_counts = torch.bincount(dest, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    sends, recvs = send_counts.tolist(), recv_counts.tolist()
    out_ids = ids.new_empty(sum(recvs))
    dist.all_to_all_single(out_ids, ids[order].contiguous(), recvs, sends)
    out_values = []
    for v in values:
        width = math.prod(v.shape[1:])  # elements per row (1 for a per-row state)
        rows = v[order].reshape(len(ids), width)  # (n, width): one row per id (n may be 0)
        got = v.new_empty(sum(recvs) * width)
        dist.all_to_all_single(got, rows.reshape(-1), [c * width for c in recvs],
                               [c * width for c in sends])
        out_values.append(got.view(sum(recvs), *v.shape[1:]))
    by_id = torch.argsort(out_ids)
    return out_ids[by_id], [v[by_id] for v in out_values]


def _canonical_range(module: ShardedEmbedding) -> tuple[int, int] | None:
    """The rows this rank holds in a ROW_HASH table's canonical (range) layout."""
    ranks = module.placement.ranks
    if module.rank not in ranks:
        return None
    return row_shard_bounds(module.table.rows, len(ranks))[ranks.index(module.rank)]


def _range_holders(module: ShardedEmbedding, ids: torch.Tensor) -> torch.Tensor:
    ranks = module.placement.ranks
    starts = torch.tensor([b[0] for b in row_shard_bounds(module.table.rows, len(ranks))])
    return torch.tensor(ranks)[torch.searchsorted(starts, ids, right=True) - 1]


def _table_tensors(tables: ShardedTables, sparse: SparseRowOptimizer,
                   name: str) -> dict[str, torch.Tensor]:
    """weight and the optimizer's per-row slots of table `name` on this rank."""
    module = tables.modules[name]
    state = sparse.state[name]
    return {"weight": module.weight.detach(),
            **{k: v for k, v in state.items() if k != "step"}}


def trainer_key(name: str, slot: str) -> str:
    """HybridTrainer checkpoints: tables/<t>/<slot>."""
    return f"tables/{name}/{slot}"


def model_key(name: str, slot: str) -> str:
    """ParallelModel checkpoints (`executors.checkpoint`): the model's own parameter name,
    model/<t>.weight, and its optimizer slots optim/<t>.weight/<slot>, as for any
    parameter, so the checkpoint reads like the unsharded model's."""
    return f"model/{name}.weight" if slot == "weight" else f"optim/{name}.weight/{slot}"


def _global_size(module, tensor: torch.Tensor) -> tuple[int, ...]:
    return (module.table.rows,) if tensor.dim() == 1 else (module.table.rows, module.table.dim)


def _layout(module, rows_only: bool, loading: bool) -> list[tuple[int, tuple, tuple]]:
    """(rank, offsets, sizes) of every chunk of one table tensor (`rows_only`: a per-row
    state of shape (rows,)). A replicated table, and the row state of a column-wise one,
    is one whole chunk: saved by one rank, loaded by every holder."""
    rows, dim = module.table.rows, module.table.dim

    def box(rank, r0, r1, c0, c1):
        return (rank, (r0,), (r1 - r0,)) if rows_only else (rank, (r0, c0), (r1 - r0, c1 - c0))

    if isinstance(module, ReplicatedEmbedding):
        ranks = module.placement.ranks if loading else (0,)
        return [box(r, 0, rows, 0, dim) for r in ranks]
    kind = module.placement.sharding
    if kind is TableSharding.ROW_HASH:
        ranks = module.placement.ranks
        return [box(r, r0, r1, 0, dim)
                for r, (r0, r1) in zip(ranks, row_shard_bounds(rows, len(ranks)))]
    if kind is TableSharding.COLUMN_WISE and rows_only:
        holders = [s.rank for s in module.shards] if loading else [module.shards[0].rank]
        return [box(r, 0, rows, 0, dim) for r in holders]
    return [box(s.rank, s.row_start, s.row_stop, s.col_start, s.col_stop) for s in module.shards]


def _entry(module, values: torch.Tensor, loading: bool):
    """The state-dict value of this rank's chunk of one table tensor, or None."""
    layout = _layout(module, values.dim() == 1, loading)
    rank = dist.get_rank()
    size = _global_size(module, values)
    if loading and len({(o, s) for _, o, s in layout}) == 1:  # one whole chunk, many readers
        layout = [entry for entry in layout if entry[0] == rank]
    return _chunked(layout, values, size)


def table_state(tables: ShardedTables, sparse: SparseRowOptimizer, key=trainer_key) -> dict:
    """This rank's chunks of every table tensor (weights and optimizer slots) for a DCP
    save, keyed by `key(table, slot)` (a collective: ROW_HASH rows move to their
    canonical range holders first)."""
    state: dict = {}
    for name, module in tables.modules.items():
        tensors = _table_tensors(tables, sparse, name)
        canonical = {}
        if isinstance(module, ShardedEmbedding) and module.placement.sharding is TableSharding.ROW_HASH:
            ids = module.local_ids if module.local_ids is not None else torch.empty(0, dtype=torch.int64)
            keys = list(tensors)
            got_ids, got = _exchange_rows(ids, [tensors[k] for k in keys], _range_holders(module, ids))
            canonical = dict(zip(keys, got))
            bounds = _canonical_range(module)
            expected = 0 if bounds is None else bounds[1] - bounds[0]
            if len(got_ids) != expected:
                raise RuntimeError(f"table {name}: {len(got_ids)} rows reached the canonical "
                                   f"range {bounds}, not {expected}")
        with sharded_tensor_quiet():
            for slot, tensor in tensors.items():
                entry = _entry(module, canonical.get(slot, tensor), loading=False)
                if entry is not None:
                    state[key(name, slot)] = entry
        adam_step = sparse.state[name].get("step")
        if adam_step is not None:
            state[key(name, "step")] = adam_step
    return state


def state_for_save(trainer: HybridTrainer, step: int) -> dict:
    state = table_state(trainer.tables, trainer.sparse_optimizer)
    names = _dense_names(trainer)
    for p, n in names.items():
        state[f"dense/{n}"] = p.detach()
        for key, value in trainer.dense_optimizer.state.get(p, {}).items():
            state[f"dense_optim/{n}/{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    state["meta/step"] = torch.tensor(step, dtype=torch.int64)
    return state


def _dense_names(trainer: HybridTrainer) -> dict:
    tables = trainer.tables.parameter_ids()
    return {p: n for n, p in trainer.model.named_parameters() if id(p) not in tables}


def _placements_text(trainer: HybridTrainer) -> str:
    return "; ".join(f"{n}: {m.placement.sharding} {list(m.placement.ranks)}"
                     for n, m in trainer.tables.modules.items())


def save_sharded(trainer: HybridTrainer, directory: str, step: int | None = None,
                 keep: int | None = None) -> str:
    """Save on every rank (a collective); returns the folder `step-N/`."""
    step = trainer.steps if step is None else step
    with sharded_tensor_quiet():
        return save_state(state_for_save(trainer, step), directory, step,
                          _placements_text(trainer), keep)


def _load_buffer(module, template: torch.Tensor) -> torch.Tensor | None:
    """A zero buffer for this rank's chunk of one table tensor (ROW_HASH: its canonical
    range), or None when it loads none."""
    layout = _layout(module, template.dim() == 1, loading=True)
    sizes = [s for r, _, s in layout if r == dist.get_rank()]
    if not sizes:
        return None
    return template.new_zeros(sizes[0])


def table_targets(tables: ShardedTables, sparse: SparseRowOptimizer, saved: dict, path: str,
                  hint: str, key=trainer_key):
    """(DCP load targets for this rank's chunks of every table tensor, keyed by `key`; a
    function that copies them into the shards and optimizer slots once loaded, a
    collective for ROW_HASH tables). PlannerError naming the table when the checkpoint
    lacks a tensor or holds it in another shape."""
    state: dict = {}
    buffers: dict[str, dict] = {}
    for name, module in tables.modules.items():
        for slot, template in _table_tensors(tables, sparse, name).items():
            entry = saved.get(key(name, slot))
            size = _global_size(module, template)
            if entry is None or tuple(entry.size) != size:
                found = "nothing" if entry is None else f"{list(entry.size)}"
                raise PlannerError(f"table {name}: checkpoint {path} holds {found} for its "
                                   f"{slot}, the model needs {list(size)}: it was saved from "
                                   f"another model or optimizer; {hint}")
            buffer = _load_buffer(module, template)
            buffers.setdefault(name, {})[slot] = buffer
            if buffer is not None:
                with sharded_tensor_quiet():
                    state[key(name, slot)] = _entry(module, buffer, loading=True)
        if "step" in sparse.state[name]:
            state[key(name, "step")] = sparse.state[name]["step"]

    def finish() -> None:
        with torch.no_grad():
            for name, module in tables.modules.items():
                _place_loaded(tables, sparse, name, module, buffers[name])
    return state, finish


def load_sharded(trainer: HybridTrainer, path: str) -> int:
    """Load `path` into `trainer` (any world size and placements of the same model) on
    every rank; returns the step it was saved at. Nothing is loaded before every file's
    digest and the metadata were checked (`open_checkpoint`)."""
    marker, vetted, hint = open_checkpoint(path)
    saved = vetted.state_dict_metadata
    state, finish = table_targets(trainer.tables, trainer.sparse_optimizer, saved, path, hint)
    names = _dense_names(trainer)
    dense_slots: dict = {}
    for p, n in names.items():
        state[f"dense/{n}"] = p.detach()
        prefix = f"dense_optim/{n}/"
        slots = {k[len(prefix):]: torch.zeros(tuple(m.size), dtype=m.properties.dtype)
                 for k, m in saved.items() if k.startswith(prefix)}
        state.update({prefix + k: v for k, v in slots.items()})
        if slots:
            dense_slots[p] = slots
    state["meta/step"] = torch.zeros((), dtype=torch.int64)
    with torch.no_grad(), sharded_tensor_quiet():
        load_state(state, path, vetted, hint)
    finish()
    for p, slots in dense_slots.items():
        trainer.dense_optimizer.state[p] = slots
    step = int(state["meta/step"])
    trainer.steps = step
    return step


def _place_loaded(tables: ShardedTables, sparse: SparseRowOptimizer, name: str, module,
                  chunks: dict):
    """Copy the loaded chunks into the shard and its optimizer slots (ROW_HASH: from the
    canonical ranges to the ring owners first)."""
    targets = _table_tensors(tables, sparse, name)
    keys = list(targets)
    if isinstance(module, ShardedEmbedding) and module.placement.sharding is TableSharding.ROW_HASH:
        bounds = _canonical_range(module)
        if chunks["weight"] is not None:
            ids = torch.arange(bounds[0], bounds[1], dtype=torch.int64)
            values = [chunks[k] for k in keys]
        else:
            ids = torch.empty(0, dtype=torch.int64)
            values = [targets[k].new_empty((0,) + tuple(targets[k].shape[1:])) for k in keys]
        dest = torch.tensor(module.placement.ranks)[module.ring.owner(ids, module.table.name)]
        got_ids, got = _exchange_rows(ids, values, dest)
        mine = module.local_ids if module.local_ids is not None else torch.empty(0, dtype=torch.int64)
        if not torch.equal(got_ids, mine):
            raise RuntimeError(f"table {name}: the rows loaded for rank {module.rank} are not "
                               "the rows its hash ring gives it")
        for key, value in zip(keys, got):
            targets[key].copy_(value)
        return
    for key in keys:
        if chunks[key] is not None:
            targets[key].copy_(chunks[key])
