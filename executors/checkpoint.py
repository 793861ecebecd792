"""Checkpoints of a `ParallelModel` with torch.distributed.checkpoint (DCP).

    save_checkpoint(pm, "ckpt", step=100)          # every rank: ckpt/step-00000100/
    step = load_checkpoint(pm, latest_checkpoint("ckpt"))   # any plan, any world size

What is saved, one flat DCP state dict per rank (every rank writes its own shards):
  model/<fqn>              each parameter as this rank holds it: a DTensor (TP / FSDP
                           shard, replicate) or a plain tensor; names are the original
                           model's (`executors.state`), so any plan of the same model can
                           load them
  optim/<fqn>/<key>        the optimizer state of the parameters this rank updates
                           (AdamW's step, exp_avg, exp_avg_sq; ZeRO-1 owners only)
  rng/cpu/rank<r>          each rank's CPU (and CUDA) generator state
  meta/step                the optimizer steps taken: the data position (global batch k
                           is the k-th of the run, `executors.data`)

Loading builds the same dict from the model being resumed — its parameters and
zero-initialised optimizer states in ITS layout — and DCP copies each saved chunk into
whatever shard of the new layout covers it: resharding on load, so a checkpoint from
4 ranks with TP x FSDP resumes on 2 ranks with ZeRO-1, or under a pipeline.

Atomic saves: the ranks write into `.tmp-step-N/`; after every rank has finished, rank 0
writes `COMPLETE.json` (schema, step, world size, the size of every file) and renames
the folder to `step-N/`. A save interrupted at any point leaves no `step-N/` (or leaves
the previous one), and `latest_checkpoint` only returns folders with the marker. Loading
re-checks the marker and the file sizes, so a truncated or partial checkpoint is a
one-line `PlannerError`, never a half-loaded model.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from executors.runtime import ParallelModel
from ir.errors import PlannerError

CHECKPOINT_SCHEMA = "planner.checkpoint/v1"
MARKER = "COMPLETE.json"
STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(directory: str, step: int) -> str:
    return os.path.join(directory, f"step-{step:08d}")


# ------------------------------------------------------------------ the state dict


def _named_parameters(pm: ParallelModel) -> dict[str, torch.nn.Parameter]:
    out: dict[str, torch.nn.Parameter] = {}
    for _, module in pm.stage_modules:
        for name, param in module.named_parameters():
            out.setdefault(name, param)
    return out


def _inner_optimizer(pm: ParallelModel):
    """The torch optimizer (ZeRO-1's `ShardedOptimizer` wraps one, or None)."""
    opt = pm.optimizer
    return opt.inner if hasattr(opt, "inner") else opt


def _optimizer_params(pm: ParallelModel) -> list[torch.nn.Parameter]:
    inner = _inner_optimizer(pm)
    if inner is None:
        return []
    return [p for group in inner.param_groups for p in group["params"]]


def _rng_state() -> dict[str, torch.Tensor]:
    rank = dist.get_rank()
    out = {f"rng/cpu/rank{rank}": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out[f"rng/cuda/rank{rank}"] = torch.cuda.get_rng_state()
    return out


def state_dict_for_save(pm: ParallelModel, step: int) -> dict[str, torch.Tensor]:
    params = _named_parameters(pm)
    names = {id(p): n for n, p in params.items()}
    state: dict[str, torch.Tensor] = {f"model/{n}": p.detach() for n, p in params.items()}
    inner = _inner_optimizer(pm)
    for p in _optimizer_params(pm):
        for key, value in (inner.state.get(p) or {}).items():
            if not isinstance(value, torch.Tensor):
                value = torch.tensor(value)
            state[f"optim/{names[id(p)]}/{key}"] = value
    state.update(_rng_state())
    state["meta/step"] = torch.tensor(step, dtype=torch.int64)
    return state


# ------------------------------------------------------------------ save


def save_checkpoint(pm: ParallelModel, directory: str, step: int | None = None,
                    keep: int | None = None) -> str:
    """Save on every rank (a collective); returns the checkpoint folder `step-N/`.

    step defaults to the optimizer steps taken (`pm.steps`). keep: how many complete
    checkpoints to leave in `directory` (older ones are removed), None for all."""
    step = pm.steps if step is None else step
    final = step_dir(directory, step)
    tmp = os.path.join(directory, f".tmp-step-{step:08d}")
    rank = dist.get_rank()
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a save interrupted earlier
        os.makedirs(tmp)
    dist.barrier()
    dcp.save(state_dict_for_save(pm, step), checkpoint_id=tmp)
    dist.barrier()  # every rank's files are closed
    if rank == 0:
        files = {name: os.path.getsize(os.path.join(tmp, name)) for name in sorted(os.listdir(tmp))}
        marker = {"schema": CHECKPOINT_SCHEMA, "step": step,
                  "world_size": dist.get_world_size(), "plan": str(pm.plan), "files": files}
        with open(os.path.join(tmp, MARKER), "w") as fh:
            json.dump(marker, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        if os.path.exists(final):  # the same step saved again (a resumed run): swap
            old = os.path.join(directory, f".old-step-{step:08d}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(directory)
        if keep is not None:
            for old_step in complete_steps(directory)[:-keep]:
                shutil.rmtree(step_dir(directory, old_step), ignore_errors=True)
    dist.barrier()
    return final


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


def check_checkpoint(path: str) -> dict:
    """The marker of a complete, intact checkpoint folder; PlannerError otherwise."""
    if not os.path.isdir(path):
        raise PlannerError(f"checkpoint {path} does not exist; pass a folder written by "
                           "save_checkpoint (e.g. ckpt/step-00000100)")
    marker_path = os.path.join(path, MARKER)
    parent = os.path.dirname(os.path.abspath(path))
    earlier = latest_checkpoint(parent)
    hint = (f"resume from {earlier}" if earlier and os.path.abspath(earlier) != os.path.abspath(path)
            else "resume from an earlier checkpoint or start over")
    if not os.path.isfile(marker_path):
        raise PlannerError(f"checkpoint {path} is partial (no {MARKER}: its save was "
                           f"interrupted); {hint}")
    try:
        with open(marker_path) as fh:
            marker = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlannerError(f"checkpoint {path} is corrupted ({MARKER} is not valid JSON: "
                           f"{exc}); {hint}") from None
    if not isinstance(marker, dict) or marker.get("schema") != CHECKPOINT_SCHEMA:
        found = marker.get("schema") if isinstance(marker, dict) else None
        raise PlannerError(f"checkpoint {path} has schema {found!r}, not {CHECKPOINT_SCHEMA!r}; "
                           "save it again with this version")
    files = marker.get("files")
    if not isinstance(files, dict) or not isinstance(marker.get("step"), int):
        raise PlannerError(f"checkpoint {path} is corrupted ({MARKER} lacks 'files' or "
                           f"'step'); {hint}")
    for name, size in files.items():
        file_path = os.path.join(path, name)
        if not os.path.isfile(file_path):
            raise PlannerError(f"checkpoint {path} is corrupted (file {name} is missing); {hint}")
        actual = os.path.getsize(file_path)
        if actual != size:
            raise PlannerError(f"checkpoint {path} is corrupted (file {name} has {actual} bytes, "
                               f"the save wrote {size}); {hint}")
    return marker


# ------------------------------------------------------------------ load


def load_checkpoint(pm: ParallelModel, path: str) -> int:
    """Load `path` into `pm` (any plan and world size of the same model) on every rank;
    returns the step it was saved at and sets `pm.steps` to it."""
    marker = check_checkpoint(path)
    try:
        metadata = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    except Exception as exc:  # a damaged .metadata (pickle) file
        raise PlannerError(f"checkpoint {path} is corrupted (cannot read its metadata: "
                           f"{type(exc).__name__}); resume from an earlier checkpoint") from None
    params = _named_parameters(pm)
    names = {id(p): n for n, p in params.items()}
    state: dict[str, torch.Tensor] = {}
    for name, param in params.items():
        key = f"model/{name}"
        _check_entry(path, metadata, key, tuple(param.shape))
        state[key] = param.detach()
    inner = _inner_optimizer(pm)
    optim: dict[int, dict[str, torch.Tensor]] = {}
    for p in _optimizer_params(pm):
        prefix = f"optim/{names[id(p)]}/"
        entries = {k[len(prefix):]: m for k, m in metadata.items() if k.startswith(prefix)}
        slots = {}
        for key, meta in entries.items():
            if not isinstance(meta, TensorStorageMetadata):
                continue
            size = tuple(meta.size)
            if size == tuple(p.shape):  # a per-element state: this rank's layout of p
                slots[key] = torch.zeros_like(p.detach(), dtype=meta.properties.dtype)
            else:  # a scalar such as AdamW's step
                slots[key] = torch.zeros(size, dtype=meta.properties.dtype)
            state[prefix + key] = slots[key]
        if slots:
            optim[id(p)] = slots
    rng_keys = [k for k in _rng_state() if k in metadata]
    for key in rng_keys:
        state[key] = torch.zeros(tuple(metadata[key].size), dtype=metadata[key].properties.dtype)
    state["meta/step"] = torch.zeros((), dtype=torch.int64)
    try:
        dcp.load(state, checkpoint_id=path)
    except Exception as exc:
        raise PlannerError(f"checkpoint {path} could not be loaded ({type(exc).__name__}: "
                           f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}); "
                           "it may be corrupted: resume from an earlier checkpoint") from None
    if inner is not None:
        by_id = {id(p): p for p in _optimizer_params(pm)}
        for pid, slots in optim.items():
            inner.state[by_id[pid]] = slots
    for key in rng_keys:
        if key.startswith("rng/cpu/"):
            torch.set_rng_state(state[key])
        elif key.startswith("rng/cuda/"):
            torch.cuda.set_rng_state(state[key])
    step = int(state["meta/step"])
    if step != marker["step"]:
        raise PlannerError(f"checkpoint {path} is corrupted (its data says step {step}, its "
                           f"marker {marker['step']}); resume from an earlier checkpoint")
    pm.steps = step
    return step


def _check_entry(path: str, metadata: dict, key: str, shape: tuple[int, ...]) -> None:
    meta = metadata.get(key)
    name = key.split("/", 1)[1]
    if meta is None:
        raise PlannerError(f"checkpoint {path} has no parameter {name!r}: it was saved from "
                           "another model; resume with the model it was saved from")
    if not isinstance(meta, TensorStorageMetadata) or tuple(meta.size) != shape:
        saved = list(meta.size) if isinstance(meta, TensorStorageMetadata) else "not a tensor"
        raise PlannerError(f"checkpoint {path}: parameter {name!r} is {saved} in the checkpoint "
                           f"but {list(shape)} in the model: resume with the model it was "
                           "saved from")
