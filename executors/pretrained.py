"""`load_pretrained(pm, path)`: pretrained weights into any applied plan, each rank reading
only the slices it holds.

    report = pm.load_pretrained("llama-hf/")     # every rank; before the first step
    report = pm.load_pretrained("ckpt/step-00000100")   # this project's DCP checkpoints

A Hugging Face folder (`model.safetensors`, or `model.safetensors.index.json` and the
files it names; what `save_pretrained` and `export_pretrained` write): every rank maps
each parameter (and persistent buffer) of its stage modules to a checkpoint tensor, then
reads, for each rectangle its local shard holds (`executors.shard_slices.shard_pieces`,
where the per-parameter layout transform of fused-projection TP plugs in), exactly that
slice through safetensors' lazy `get_slice(name)[a:b, c:d]` (an mmap: only those bytes
are touched), and copies it into the local tensor. No rank builds a full tensor it does
not hold, nor opens a file none of its tensors is in.

Names: a parameter is looked up under its own name, then — for the executor's untied
copies (`executors.tied`) of Hugging Face's tied weights — under the other names of its
weight (`all_tied_weights_keys`: `save_pretrained` stores GPT-2's `lm_head.weight` as
`transformer.wte.weight`, safetensors' `save_model` the other way round), each with and
without the model's `base_model_prefix` (the hub's `gpt2` checkpoint is a bare
`GPT2Model`: `h.0.attn.c_attn.weight`). Before anything is read, every rank checks its
names and shapes and the ranks pool the names they used: a missing, mis-shaped or unused
(extra) tensor is one `PlannerError` on every rank naming the tensor and the file. Dtypes convert on copy (a bf16 checkpoint fills fp32 weights).

A DCP folder written by `executors.checkpoint.save_checkpoint` (or the folder holding
its `step-N/` folders: the latest) loads its weights only, verified as `load_checkpoint`
verifies them (digests, vetted metadata), resharded by DCP into this plan's layout; the
optimizer state, RNG and step stay as they are (use `load_checkpoint` to resume a run).

Load before the first optimizer step: an optimizer that keeps its own copy of the
weights (a master copy) would not see the new values.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from executors.checkpoint import (STEP_DIR, _agree, _check_model, _fused, _gather, _marker_and_sizes,
                                  _named_parameters, _rank_world, latest_checkpoint,
                                  model_targets)
from executors.checkpoint_files import MARKER, METADATA, VettedReader, read_metadata, verify_files
from executors.fused import layout_transforms
from executors.runtime import ParallelModel
from executors.shard_slices import checkpoint_shape, local_tensor, shard_pieces
from ir.errors import PlannerError

try:
    from safetensors import safe_open
except ImportError:  # optional (`pip install planner[pretrained]`): only reading needs it
    safe_open = None

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
EXAMPLE_NAMES = 3  # tensor names quoted when a checkpoint holds tensors the model lacks


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What this rank loaded."""

    format: str  # "safetensors" or "dcp"
    tensors: int  # local tensors filled
    bytes_read: int  # safetensors: bytes read from the files; dcp: bytes of the local shards
    files_opened: int  # safetensors files this rank opened (dcp: 0)


@torch.no_grad()
def load_pretrained(pm: ParallelModel, path: str) -> LoadReport:
    """Fill `pm`'s parameters from the checkpoint folder `path` (a collective)."""
    if os.path.isfile(os.path.join(path, INDEX)) or os.path.isfile(os.path.join(path, SINGLE)):
        return _load_safetensors(pm, path)
    if STEP_DIR.match(os.path.basename(os.path.normpath(path))) or os.path.isfile(
            os.path.join(path, MARKER)):
        return _load_dcp(pm, path)  # a partial step-N folder gets load_checkpoint's message
    latest = latest_checkpoint(path) if os.path.isdir(path) else None
    if latest is not None:
        return _load_dcp(pm, latest)
    raise PlannerError(f"{path} holds no checkpoint (no {SINGLE}, {INDEX} or {MARKER}); pass "
                       "a folder written by save_pretrained / export_pretrained or by "
                       "save_checkpoint")


# ------------------------------------------------------------------ what this rank holds


def local_targets(pm: ParallelModel) -> list[tuple[str, torch.Tensor, nn.Module]]:
    """(name, tensor, stage module) of every parameter and persistent buffer of this rank's
    stage modules; a tensor listed once (a rank holding several stages has a copy each)."""
    out, seen = [], set()
    for _, module in pm.stage_modules:
        named = list(module.named_parameters()) + persistent_buffers(module)
        for name, tensor in named:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                out.append((name, tensor, module))
    return out


def persistent_buffers(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Buffers that belong in a state dict (RoPE tables and masks are recomputed)."""
    out = []
    for path, sub in module.named_modules():
        for attr, buf in sub._buffers.items():
            if buf is not None and attr not in sub._non_persistent_buffers_set:
                out.append((f"{path}.{attr}" if path else attr, buf))
    return out


@dataclass(frozen=True, slots=True)
class HFNames:
    """A Hugging Face model's naming conventions (empty for any other module)."""

    tied: dict  # tied parameter name -> the name it is stored under (GPT-2's lm_head.weight)
    prefix: str  # base_model_prefix ("transformer", "model"), or ""
    ignore: tuple[str, ...]  # regexes of checkpoint tensors the model ignores on load

    @classmethod
    def of(cls, module: nn.Module) -> "HFNames":
        tied = getattr(module, "all_tied_weights_keys", None)
        ignore = getattr(module, "_keys_to_ignore_on_load_unexpected", None) or ()
        return cls(dict(tied) if isinstance(tied, dict) else {},
                   getattr(module, "base_model_prefix", "") or "", tuple(ignore))

    def same_weight(self, name: str) -> list[str]:
        """`name`, then every other name of its tied weight: a file may keep any one of
        them (save_pretrained the source, safetensors' save_model the first target)."""
        source = self.tied.get(name, name)
        return list(dict.fromkeys([name, source] + sorted(
            t for t, s in self.tied.items() if s == source)))

    def candidates(self, name: str) -> list[str]:
        """Checkpoint names `name` may be stored under, in order of preference."""
        out = []
        for base in self.same_weight(name):
            out.append(base)
            if self.prefix and base.startswith(self.prefix + "."):
                out.append(base[len(self.prefix) + 1:])  # a bare base-model checkpoint
            elif self.prefix:
                out.append(f"{self.prefix}.{base}")  # a full checkpoint into the base model
        return list(dict.fromkeys(out))

    def ignored(self, name: str) -> bool:
        return any(re.search(pattern, name) for pattern in self.ignore)


# ------------------------------------------------------------------ safetensors


class SafetensorsFolder:
    """The tensor names of a Hugging Face folder and the file holding each; files are
    opened (their header read, their data mmapped) on first use only."""

    def __init__(self, path: str):
        self.path = path
        self.handles: dict[str, object] = {}
        index = os.path.join(path, INDEX)
        if os.path.isfile(index):
            try:
                with open(index) as fh:
                    weight_map = json.load(fh)["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise PlannerError(f"{index} is not a safetensors index ({exc}); re-save the "
                                   "model with save_pretrained") from None
            self.file_of = {str(k): str(v) for k, v in weight_map.items()}
        else:
            self.file_of = {name: SINGLE for name in self.open(SINGLE).keys()}

    def open(self, file: str):
        if file not in self.handles:
            full = os.path.join(self.path, file)
            if not os.path.isfile(full):
                raise PlannerError(f"{os.path.join(self.path, INDEX)} names {file}, which "
                                   f"is missing from {self.path}; copy the whole folder")
            try:
                handle = safe_open(full, framework="pt", device="cpu")
            except Exception as exc:  # safetensors' own error types
                raise PlannerError(f"{full} is not a safetensors file ({exc}); re-save the "
                                   "model with save_pretrained") from None
            self.handles[file] = handle
        return self.handles[file]

    def slice(self, name: str):
        return self.open(self.file_of[name]).get_slice(name)

    def where(self, name: str) -> str:
        return os.path.join(self.path, self.file_of[name])


def _plan_reads(pm: ParallelModel, folder: SafetensorsFolder, names: HFNames):
    """(model name, tensor, checkpoint name) per local target, or the first problem."""
    reads = []
    transforms = layout_transforms(m for _, m in pm.stage_modules)
    for name, tensor, _ in local_targets(pm):
        stored = next((c for c in names.candidates(name) if c in folder.file_of), None)
        if stored is None:
            return reads, (f"checkpoint {folder.path} has no tensor {name!r} for the model's "
                           f"{'parameter' if isinstance(tensor, nn.Parameter) else 'buffer'} "
                           f"{name!r} (looked for {', '.join(names.candidates(name))}): it "
                           "is another model's; load a checkpoint of this model's config")
        shape = list(folder.slice(stored).get_shape())
        expected = list(checkpoint_shape(tensor, transforms.get(name)))
        if shape != expected:
            return reads, (f"checkpoint {folder.where(stored)}: tensor {stored!r} is {shape} "
                           f"but the model's {name!r} is {expected}: it is another "
                           "model's; load a checkpoint of this model's config")
        if local_tensor(tensor).is_meta:
            return reads, (f"the model's {name!r} is still on the meta device: materialize "
                           "the parameters (empty) before loading into them")
        reads.append((name, tensor, stored))
    return reads, None


def _load_safetensors(pm: ParallelModel, path: str) -> LoadReport:
    if safe_open is None:
        raise PlannerError(f"loading {path} needs the safetensors package: "
                           "pip install safetensors")
    names = HFNames.of(pm.stage_modules[0][1])
    reads, problem = [], None
    try:
        folder = SafetensorsFolder(path)
        reads, problem = _plan_reads(pm, folder, names)
    except PlannerError as exc:
        problem = str(exc)
    gathered = _gather((problem, sorted({stored for _, _, stored in reads})))
    _agree(next((p for p, _ in gathered if p), None))
    used = {n for _, part in gathered for n in part}
    extra = sorted(n for n in folder.file_of if n not in used and not names.ignored(n))
    if extra:
        raise PlannerError(
            f"checkpoint {path} holds {len(extra)} tensors this model lacks (e.g. "
            f"{', '.join(f'{n!r} in {folder.file_of[n]}' for n in extra[:EXAMPLE_NAMES])}): "
            "it is another model's; load a checkpoint of this model's config")
    transforms = layout_transforms(m for _, m in pm.stage_modules)
    bytes_read, error = 0, None
    try:
        for name, tensor, stored in reads:
            target = local_tensor(tensor)
            source = folder.slice(stored)
            for piece in shard_pieces(tensor, transforms.get(name)):
                data = source[piece.full]
                target[piece.local].copy_(data)
                bytes_read += data.numel() * data.element_size()
    except Exception as exc:  # a truncated or unreadable file, on this rank only
        error = (f"checkpoint {path} could not be read ({type(exc).__name__}: "
                 f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); copy the folder again")
    _agree(error)  # no rank trains on half-loaded weights while another failed
    return LoadReport("safetensors", len(reads), bytes_read, len(folder.handles))


# ------------------------------------------------------------------ DCP


def _load_dcp(pm: ParallelModel, path: str) -> LoadReport:
    """The weights of a `save_checkpoint` folder, checked as `load_checkpoint` checks them."""
    rank, world = _rank_world()
    marker, hint = _marker_and_sizes(path)
    data_files = sorted(n for n in marker["files"] if n != METADATA)
    _agree(verify_files(path, marker, data_files[rank::world], hint))  # hashing shared
    vetted = read_metadata(path, marker, hint)
    params = _named_parameters(pm)
    # the checkpoint holds the model's order; fused parameters are stored rank-major
    state, shapes, install = model_targets(params, _fused(pm))
    _check_model(path, vetted.state_dict_metadata, shapes)
    try:
        dcp.load(state, storage_reader=VettedReader(path, vetted))
    except Exception as exc:  # DCP raises CheckpointException on every rank
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        raise PlannerError(f"checkpoint {path} could not be loaded ({type(exc).__name__}: "
                           f"{lines[-1][:200] if lines else ''}); {hint}") from None
    install()
    local_bytes = sum(local_tensor(p).numel() * local_tensor(p).element_size()
                      for p in params.values())
    return LoadReport("dcp", len(params), local_bytes, 0)
