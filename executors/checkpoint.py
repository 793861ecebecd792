"""Checkpoints of a `ParallelModel` with torch.distributed.checkpoint (DCP).

    save_checkpoint(pm, "ckpt", step=100)          # every rank: ckpt/step-00000100/
    step = load_checkpoint(pm, latest_checkpoint("ckpt"))   # any plan, any world size

What is saved, one flat DCP state dict per rank (every rank writes its own shards):
  model/<fqn>              each parameter as this rank holds it: a DTensor (TP / FSDP
                           shard, replicate) or a plain tensor; names are the original
                           model's (`executors.state`), so any plan of the same model can
                           load them
  optim/<fqn>/<key>        the optimizer state of the parameters this rank updates
                           (AdamW's step, exp_avg, exp_avg_sq) in the parameter's
                           global shape; a ZeRO-1 rank writes the pieces of its flat
                           shard (`executors.optimizer.checkpoint_state`), and under
                           mixed precision its fp32 master weights as model/<fqn>
  rng/cpu/rank<r>          each rank's CPU (and CUDA) generator state
  scaler/<key>             fp16-mixed: the loss scale and its growth count
                           (`executors.loss_scaling`)
  meta/step                the optimizer steps taken: the data position (global batch k
                           is the k-th of the run, `executors.data`)

A fused projection split per part (`executors.fused`) holds its rows rank-major; it and
its per-element optimizer states are saved whole in the model's order (gathered over
their mesh: every rank passes the same tensor and DCP writes it once) and reordered into
this rank's shard on load, so the checkpoint is in the model's layout for every plan.

Loading builds the same dict from the model being resumed — its parameters and
zero-initialised optimizer states in ITS layout — and DCP copies each saved chunk into
whatever shard of the new layout covers it: resharding on load, so a checkpoint from
4 ranks with TP x FSDP resumes on 2 ranks with ZeRO-1, or under a pipeline.

Atomic saves: the ranks write into `.tmp-step-N/`, hash the files they wrote, and rank 0
writes `COMPLETE.json` (schema, step, world size, each file's size and SHA-256, the
marker's own digest; `executors.checkpoint_files`) and renames the folder to `step-N/`.
A save interrupted at any point leaves no `step-N/` (or leaves the previous one), and
`latest_checkpoint` only returns folders with the marker; a save that fails (a full
disk) says so in one line and removes its temporary folder. Loading checks the marker,
every file's size and digest and reads `.metadata` without running its pickle BEFORE
anything is loaded, so a damaged, partial or foreign checkpoint is a one-line
`PlannerError` naming the file, never a half-loaded model. The ranks agree on every such
error (`_agree`), so they fail together instead of leaving a peer in a collective.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
import re
import shutil
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from executors.checkpoint_files import (LEGACY_SCHEMA, MARKER, METADATA, VettedReader,
                                        check_sizes, disk_error_message, file_digest,
                                        os_error_in, probe_write, read_marker, read_metadata,
                                        render_marker, verify_files, write_file)
from executors.fused import FusedSplit, full_in_model_order, fused_parameters, load_model_order
from executors.runtime import ParallelModel
from executors.optimizer_state import checkpoint_state, load_targets
from ir.errors import PlannerError

STEP_DIR = re.compile(r"^step-(\d+)$")
RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")  # DCP's data file of rank r (FileSystemWriter)
PROBE_BYTES = 1 << 20  # a failed write that lost its errno is retried with 1 MiB to learn why
EXAMPLE_NAMES = 3  # parameter names quoted when a checkpoint and a model disagree


def step_dir(directory: str, step: int) -> str:
    return os.path.join(directory, f"step-{step:08d}")


# ------------------------------------------------------------------ the state dict


def _named_parameters(pm: ParallelModel) -> dict[str, torch.nn.Parameter]:
    """The parameters saved as they are held (sharded tables are saved by
    `executors.embedding_checkpoint`, under the same model/ names)."""
    tables = pm.tables.parameter_ids() if pm.tables is not None else set()
    out: dict[str, torch.nn.Parameter] = {}
    for _, module in pm.stage_modules:
        for name, param in module.named_parameters():
            if id(param) not in tables:
                out.setdefault(name, param)
    return out


def _tables_quiet(pm: ParallelModel):
    """Sharded tables are saved as ShardedTensor chunks: silence its deprecation there."""
    if pm.tables is None:
        return contextlib.nullcontext()
    from executors.embedding_checkpoint import sharded_tensor_quiet
    return sharded_tensor_quiet()


def _rng_state() -> dict[str, torch.Tensor]:
    rank = dist.get_rank()
    out = {f"rng/cpu/rank{rank}": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out[f"rng/cuda/rank{rank}"] = torch.cuda.get_rng_state()
    return out


def _fused(pm: ParallelModel) -> dict[str, tuple[FusedSplit, int]]:
    return fused_parameters(module for _, module in pm.stage_modules)


def _as_saved(tensor: torch.Tensor, like: torch.Tensor,
              fused: tuple[FusedSplit, int] | None) -> torch.Tensor:
    """What is saved for `tensor` (a parameter `like`, or a state of its shape)."""
    if fused is not None and tuple(tensor.shape) == tuple(like.shape):
        return full_in_model_order(tensor, *fused)
    return tensor.detach()


def state_dict_for_save(pm: ParallelModel, step: int) -> dict[str, torch.Tensor]:
    params = _named_parameters(pm)
    names = {id(p): n for n, p in params.items()}
    fused = _fused(pm)
    state: dict[str, torch.Tensor] = {f"model/{n}": _as_saved(p, p, fused.get(n))
                                      for n, p in params.items()}
    # ZeRO-1: the fp32 master as model/; fused parameters' states in the model's order
    state.update(checkpoint_state(pm.optimizer, names, fused))
    if pm.tables is not None:  # the global tables under model/<t>.weight, optim/<t>.weight/
        from executors.embedding_checkpoint import model_key, table_state
        state.update(table_state(pm.tables, pm.sparse_optimizer, model_key))
    state.update(_rng_state())
    if pm.loss_scaler is not None:
        state.update({f"scaler/{k}": v for k, v in pm.loss_scaler.state_dict().items()})
    state["meta/step"] = torch.tensor(step, dtype=torch.int64)
    return state


# ------------------------------------------------------------------ ranks agree


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(obj) -> list:
    """Every rank's `obj`, in rank order (a collective; [obj] without a process group)."""
    rank, world = _rank_world()
    if world == 1:
        return [obj]
    out: list = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _agree(error: str | None) -> None:
    """Raise the first rank's error on every rank (a collective), so no rank is left
    waiting in the next collective for a peer that failed."""
    errors = [e for e in _gather(error) if e]
    if errors:
        raise PlannerError(errors[0])


# ------------------------------------------------------------------ save


def save_checkpoint(pm: ParallelModel, directory: str, step: int | None = None,
                    keep: int | None = None) -> str:
    """Save on every rank (a collective); returns the checkpoint folder `step-N/`.

    step defaults to the optimizer steps taken (`pm.steps`). keep: how many complete
    checkpoints to leave in `directory` (older ones are removed), None for all. A save
    that fails (e.g. a full disk) raises one PlannerError on every rank naming the folder
    and the free space, removes its temporary folder and leaves earlier checkpoints."""
    step = pm.steps if step is None else step
    with _tables_quiet(pm):
        return save_state(state_dict_for_save(pm, step), directory, step, str(pm.plan), keep)


def save_state(state: dict, directory: str, step: int, plan: str,
               keep: int | None = None) -> str:
    """The atomic, digested save of any flat DCP state dict (a collective): `step-N/`
    with COMPLETE.json naming `plan`. save_checkpoint and the sharded-table checkpoints
    (`executors.embedding_checkpoint`) both save through it."""
    final = step_dir(directory, step)
    tmp = os.path.join(directory, f".tmp-step-{step:08d}")
    rank, world = _rank_world()
    local_bytes = sum(_local(t).numel() * _local(t).element_size() for t in state.values())
    error = None
    if rank == 0:
        try:
            os.makedirs(directory, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # a save interrupted earlier
            os.makedirs(tmp)
        except OSError as exc:
            error = disk_error_message(exc, tmp, None, exc.strerror or str(exc))
    gathered = _gather((error, local_bytes))
    _agree(next((e for e, _ in gathered if e), None))
    needed_bytes = sum(b for _, b in gathered)
    failure = None
    try:
        dcp.save(state, checkpoint_id=tmp)
    except (CheckpointException, Exception) as exc:  # DCP raises the former on every rank
        failure = exc
    _finish_failed_save(failure, tmp, needed_bytes)
    digests = {}
    try:  # each rank hashes the files it wrote, while they are in its page cache
        for name in sorted(os.listdir(tmp)):
            if _hasher(name, world) == rank:
                digests[name] = file_digest(os.path.join(tmp, name))
    except OSError as exc:
        error = f"cannot read back {tmp} ({exc.strerror}); save again"
    gathered = _gather((error, digests))
    _agree(next((e for e, _ in gathered if e), None))
    error = None
    if rank == 0:
        files = {name: d for _, part in gathered for name, d in part.items()}
        try:
            write_file(os.path.join(tmp, MARKER),
                       render_marker(step, world, plan, files))
            _swap_in(tmp, final, directory, step)
            if keep is not None:
                for old_step in complete_steps(directory)[:-keep]:
                    shutil.rmtree(step_dir(directory, old_step), ignore_errors=True)
        except OSError as exc:
            error = disk_error_message(exc, tmp, needed_bytes, exc.strerror or str(exc))
            shutil.rmtree(tmp, ignore_errors=True)
    _agree(error)
    return final


def _local(tensor: torch.Tensor) -> torch.Tensor:
    if hasattr(tensor, "local_shards"):  # a ShardedTensor (sharded tables): its chunks
        shards = [s.tensor.reshape(-1) for s in tensor.local_shards()]
        return torch.cat(shards) if shards else torch.empty(0)
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _hasher(name: str, world: int) -> int:
    """The rank that hashes file `name`: DCP's `__<r>_<i>.distcp` by rank r, the rest by 0."""
    match = RANK_FILE.match(name)
    return int(match.group(1)) if match and int(match.group(1)) < world else 0


def _finish_failed_save(failure: BaseException | None, tmp: str, needed_bytes: int) -> None:
    """When any rank's dcp.save failed: rank 0 finds why (an errno any rank saw, else a
    probe write), removes `tmp`, and every rank raises the same one-line PlannerError."""
    rank, _ = _rank_world()
    os_error = os_error_in(failure) if failure is not None else None
    report = None
    if failure is not None:
        text = str(failure).strip().splitlines()
        report = (os_error.errno if os_error else None,
                  os_error.strerror if os_error else None, text[-1][:200] if text else "")
    reports = [r for r in _gather(report) if r]
    if not reports:
        return
    error = None
    if rank == 0:
        errno_seen = next(((no, msg) for no, msg, _ in reports if no), None)
        cause = OSError(*errno_seen) if errno_seen else probe_write(tmp, PROBE_BYTES)
        shutil.rmtree(tmp, ignore_errors=True)
        error = disk_error_message(cause, tmp, needed_bytes, reports[0][2])
    _agree(error)


def _swap_in(tmp: str, final: str, directory: str, step: int) -> None:
    """Rename `tmp` to `final`; the same step saved again (a resumed run) replaces the old
    folder and keeps its mode and its files' modes."""
    if os.path.exists(final):
        os.chmod(tmp, os.stat(final).st_mode & 0o7777)
        for name in os.listdir(tmp):
            old = os.path.join(final, name)
            if os.path.isfile(old):
                os.chmod(os.path.join(tmp, name), os.stat(old).st_mode & 0o7777)
        old = os.path.join(directory, f".old-step-{step:08d}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(directory)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------ find and check


def complete_steps(directory: str) -> list[int]:
    """Steps of the complete checkpoints in `directory`, ascending."""
    if not os.path.isdir(directory):
        return []
    steps = []
    for name in os.listdir(directory):
        match = STEP_DIR.match(name)
        if match and os.path.isfile(os.path.join(directory, name, MARKER)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_checkpoint(directory: str) -> str | None:
    """The newest complete checkpoint folder in `directory`, or None."""
    steps = complete_steps(directory)
    return step_dir(directory, steps[-1]) if steps else None


def _hint(path: str) -> str:
    """What to do about a bad checkpoint `path`: the newest other complete one beside it."""
    parent = os.path.dirname(os.path.normpath(path)) or "."
    others = [step_dir(parent, s) for s in complete_steps(parent)
              if os.path.abspath(step_dir(parent, s)) != os.path.abspath(path)]
    if others:
        return f"delete {path} and resume from {others[-1]}"
    return f"delete {path} and start over (no other complete checkpoint beside it)"


def _marker_and_sizes(path: str) -> tuple[dict, str]:
    if not os.path.isdir(path):
        raise PlannerError(f"checkpoint {path} does not exist; pass a folder written by "
                           "save_checkpoint (e.g. ckpt/step-00000100)")
    hint = _hint(path)
    if not os.path.isfile(os.path.join(path, MARKER)):
        raise PlannerError(f"checkpoint {path} is partial (no {MARKER}: its save was "
                           f"interrupted); {hint}")
    marker = read_marker(path, hint)
    check_sizes(path, marker, hint)
    return marker, hint


def check_checkpoint(path: str) -> dict:
    """The marker of a complete, intact checkpoint folder (every file's size and SHA-256
    checked, `.metadata` read restrictedly); PlannerError naming the damaged file."""
    marker, hint = _marker_and_sizes(path)
    problem = verify_files(path, marker, sorted(marker["files"]), hint)
    if problem:
        raise PlannerError(problem)
    read_metadata(path, marker, hint)
    return marker


# ------------------------------------------------------------------ load


def open_checkpoint(path: str):
    """(marker, vetted DCP metadata, hint) of `path` on every rank (a collective): every
    file's size and digest checked (the hashing shared by the ranks), `.metadata` read
    restrictedly; PlannerError naming the damaged file otherwise, on every rank."""
    rank, world = _rank_world()
    marker, hint = _marker_and_sizes(path)
    data_files = sorted(n for n in marker["files"] if n != METADATA)
    _agree(verify_files(path, marker, data_files[rank::world], hint))  # hashing shared
    vetted = read_metadata(path, marker, hint)  # the bytes hashed are the bytes read
    if marker["schema"] == LEGACY_SCHEMA and rank == 0:
        warnings.warn(f"checkpoint {path} predates file digests ({LEGACY_SCHEMA}): its sizes "
                      "are checked, its contents cannot be; the next save records digests",
                      stacklevel=3)
    return marker, vetted, hint


def load_state(state: dict, path: str, vetted, hint: str) -> None:
    """dcp.load into `state` from the vetted metadata; one PlannerError if DCP fails."""
    try:
        dcp.load(state, storage_reader=VettedReader(path, vetted))
    except (CheckpointException, Exception) as exc:  # DCP raises the former on every rank
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        raise PlannerError(f"checkpoint {path} could not be loaded ({type(exc).__name__}: "
                           f"{lines[-1][:200] if lines else ''}); {hint}") from None


def load_checkpoint(pm: ParallelModel, path: str) -> int:
    """Load `path` into `pm` (any plan and world size of the same model) on every rank;
    returns the step it was saved at and sets `pm.steps` to it. Nothing is loaded until
    every file's size and digest and the metadata have been checked."""
    marker, vetted, hint = open_checkpoint(path)
    metadata = vetted.state_dict_metadata
    params = _named_parameters(pm)
    tables = {f"{n}.weight": (m.table.rows, m.table.dim)
              for n, m in (pm.tables.modules.items() if pm.tables is not None else ())}
    fused = _fused(pm)
    state, shapes, install_model = model_targets(params, fused)
    _check_model(path, metadata, {**shapes, **tables})
    names = {id(p): n for n, p in params.items()}
    optim, install_optim = load_targets(pm.optimizer, names, metadata, fused)
    state.update(optim)
    install_tables = None
    if pm.tables is not None:  # each rank's shards, resharded from any saved layout
        from executors.embedding_checkpoint import model_key, table_targets
        chunks, install_tables = table_targets(pm.tables, pm.sparse_optimizer, metadata, path,
                                               hint, model_key)
        state.update(chunks)
    rng_keys = [k for k in _rng_state() if k in metadata]
    for key in rng_keys:
        state[key] = torch.zeros(tuple(metadata[key].size), dtype=metadata[key].properties.dtype)
    scaler_keys = [k for k in metadata if k.startswith("scaler/")]
    if pm.loss_scaler is not None:
        for key in scaler_keys:
            state[key] = torch.zeros(tuple(metadata[key].size), dtype=metadata[key].properties.dtype)
    state["meta/step"] = torch.zeros((), dtype=torch.int64)
    with _tables_quiet(pm):
        load_state(state, path, vetted, hint)
    if install_tables is not None:
        install_tables()
    install_model()
    install_optim()
    for key in rng_keys:
        if key.startswith("rng/cpu/"):
            torch.set_rng_state(state[key])
        elif key.startswith("rng/cuda/"):
            torch.cuda.set_rng_state(state[key])
    if pm.loss_scaler is not None and scaler_keys:  # else (from fp32/bf16) start afresh
        pm.loss_scaler.load_state_dict({k[len("scaler/"):]: state[k] for k in scaler_keys})
    step = int(state["meta/step"])
    if step != marker["step"]:
        raise PlannerError(f"checkpoint {path} is corrupted (its data says step {step}, its "
                           f"marker {marker['step']}); {hint}")
    pm.steps = step
    return step


def model_targets(params: dict[str, torch.Tensor], fused: dict[str, tuple[FusedSplit, int]]
                  ) -> tuple[dict[str, torch.Tensor], dict[str, tuple[int, ...]], Callable[[], None]]:
    """(the `model/<name>` tensors `dcp.load` fills, the model's shape of each, and the
    step that installs them once loaded). A checkpoint holds the model's order: a fused
    parameter (stored rank-major, `executors.fused`) loads into a whole buffer in the
    model's order and shape, which the install step reorders into its shard."""
    whole: list[tuple[torch.Tensor, torch.Tensor, tuple[FusedSplit, int]]] = []

    def target(tensor: torch.Tensor, name: str) -> torch.Tensor:
        if name not in fused:
            return tensor
        split, dim = fused[name]  # saved in the model's order and shape
        buffer = torch.zeros(split.model_shape(tensor.shape, dim), dtype=tensor.dtype)
        whole.append((tensor, buffer, fused[name]))
        return buffer

    def install() -> None:
        for tensor, buffer, (split, dim) in whole:
            load_model_order(tensor, buffer, split, dim)

    state = {f"model/{n}": target(p.detach(), n) for n, p in params.items()}
    return state, {n: tuple(state[f"model/{n}"].shape) for n in params}, install


def _check_model(path: str, metadata: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """The checkpoint holds exactly the model's parameters with the model's shapes (a
    collective: a pipeline rank holds only its stage's, so the ranks pool their names)."""
    problem = None
    for name, shape in shapes.items():
        meta = metadata.get(f"model/{name}")
        if meta is None:
            problem = (f"checkpoint {path} has no parameter {name!r}: it was saved from "
                       "another model; resume with the model it was saved from")
        elif tuple(meta.size) != shape:
            problem = (f"checkpoint {path}: parameter {name!r} is {list(meta.size)} in the "
                       f"checkpoint but {list(shape)} in the model: it was saved from another "
                       "model; resume with the model it was saved from")
        if problem:
            break
    gathered = _gather((problem, sorted(shapes)))
    _agree(next((p for p, _ in gathered if p), None))
    known = {n for _, names in gathered for n in names}
    extra = sorted(k[len("model/"):] for k in metadata
                   if k.startswith("model/") and k[len("model/"):] not in known)
    if extra:
        raise PlannerError(f"checkpoint {path} holds {len(extra)} parameters this model lacks "
                           f"(e.g. {', '.join(map(repr, extra[:EXAMPLE_NAMES]))}): it was saved "
                           "from another model; resume with the model it was saved from")
