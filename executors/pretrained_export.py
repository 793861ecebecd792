"""`export_pretrained(pm, directory)`: a Hugging Face safetensors folder from any plan,
written by all ranks, the model never gathered on one rank.

    pm.export_pretrained("out/")       # every rank; then AutoModel*.from_pretrained("out/")

The scheme: every full tensor gets ONE owner rank, and each rank writes its own files of
the tensors it owns; tensors stream one at a time, so a rank's peak is one full tensor.

  1. Every rank lists what its stage modules hold (names, shapes, dtypes: metadata only)
     and the ranks exchange the lists. From them every rank computes the same plan:
     which tensors are written (a Hugging Face tied weight such as GPT-2's
     `lm_head.weight` is not: `from_pretrained` re-ties it, as `save_pretrained` leaves it
     out), each tensor's owner (among the ranks holding it, the one with the fewest bytes
     so far: the writing is spread over all ranks), and each owner's files (its tensors
     in its own processing order, cut at `max_shard_bytes`), numbered across ranks as
     `model-0000k-of-0000n.safetensors` (`model.safetensors` when there is one).
  2. Each owner opens its files and writes their headers at once (every offset follows
     from the shapes), then the ranks of each pipeline stage walk their parameters in
     the same order: a DTensor is assembled by `full_tensor()` — DTensor's redistribute
     is what handles every placement (uneven and strided FSDP2 shards, 2-D meshes); it
     costs each holder the all-gather FSDP runs every step — mapped back to the
     checkpoint's order (`executors.shard_slices.to_checkpoint_layout`, the same per-
     parameter transform loading uses), appended by its owner and dropped.
  3. Rank 0 writes `model.safetensors.index.json` and, for a Hugging Face model,
     `config.json`, once every rank has finished its files.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from collections import deque
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from executors.checkpoint import _agree, _gather, _rank_world
from executors.pretrained import INDEX, SINGLE, HFNames, local_targets
from executors.fused import layout_transforms
from executors.runtime import ParallelModel
from executors.shard_slices import checkpoint_shape, to_checkpoint_layout

DEFAULT_SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size, "5GB"
HEADER_ALIGN_BYTES = 8  # safetensors pads its JSON header so the data starts aligned
# torch dtype -> safetensors dtype tag (safetensors' format spec)
DTYPE_TAGS = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
              torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
              torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
              torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor of the export: its name, full shape and the dtype it is written in."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def _written(held: list[list[Entry]], names: HFNames) -> dict[str, Entry]:
    """Every tensor to write, in the order the ranks list them (first holder's order)."""
    everything: dict[str, Entry] = {}
    for entries in held:
        for e in entries:
            everything.setdefault(e.name, e)
    return {n: e for n, e in everything.items()
            if not (n in names.tied and names.tied[n] in everything)}


def plan_files(held: list[list[Entry]], names: HFNames,
               max_shard_bytes: int) -> list[tuple[int, list[Entry]]]:
    """(owner rank, its entries in its processing order) per file, in file order."""
    written = _written(held, names)
    holders: dict[str, list[int]] = {}
    for rank, entries in enumerate(held):
        for e in entries:
            holders.setdefault(e.name, []).append(rank)
    load = [0] * len(held)
    owner: dict[str, int] = {}
    for name, entry in written.items():
        owner[name] = min(holders[name], key=lambda r: (load[r], r))
        load[owner[name]] += entry.nbytes
    files: list[tuple[int, list[Entry]]] = []
    for rank, entries in enumerate(held):
        current: list[Entry] = []
        size, seen = 0, set()
        for e in entries:
            if owner.get(e.name) != rank or e.name in seen:  # a copy a later stage holds
                continue
            seen.add(e.name)
            if current and size + e.nbytes > max_shard_bytes:
                files.append((rank, current))
                current, size = [], 0
            current.append(e)
            size += e.nbytes
        if current:
            files.append((rank, current))
    return files


def file_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE]
    return [f"model-{k + 1:05d}-of-{count:05d}.safetensors" for k in range(count)]


class StreamingFile:
    """A safetensors file written one tensor at a time: the header (all offsets, from the
    shapes) first, then each tensor's bytes in the header's order. Opened on the first
    write, closed after the last."""

    def __init__(self, path: str, entries: list[Entry]):
        header: dict = {}
        offset = 0
        for e in entries:
            header[e.name] = {"dtype": DTYPE_TAGS[e.dtype], "shape": list(e.shape),
                              "data_offsets": [offset, offset + e.nbytes]}
            offset += e.nbytes
        header["__metadata__"] = {"format": "pt"}
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % HEADER_ALIGN_BYTES)
        self.header = struct.pack("<Q", len(blob)) + blob  # u64 little-endian header size
        self.path, self.pending = path, deque(e.name for e in entries)
        self.fh = None

    def expects(self, name: str) -> bool:
        return bool(self.pending) and self.pending[0] == name

    def write(self, name: str, tensor: torch.Tensor) -> None:
        assert self.expects(name), f"{self.path}: {name} out of order"
        if self.fh is None:
            self.fh = open(self.path, "wb")
            self.fh.write(self.header)
        data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        self.fh.write(data.numpy().data)
        self.pending.popleft()
        if not self.pending:
            self.fh.close()


def _written_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """`dtype` for floating-point tensors; integer and bool buffers keep theirs."""
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


@torch.no_grad()
def export_pretrained(pm: ParallelModel, directory: str,
                      max_shard_bytes: int = DEFAULT_SHARD_BYTES,
                      dtype: torch.dtype | None = None) -> str:
    """Write `pm`'s weights to `directory` as a Hugging Face folder (a collective; module
    docstring). dtype: write floating-point tensors in this dtype (default: their own);
    max_shard_bytes: start a new file before one would exceed it. Returns `directory`."""
    rank, world = _rank_world()
    module = pm.stage_modules[0][1]
    names = HFNames.of(module)
    targets = local_targets(pm)
    transforms = layout_transforms(m for _, m in pm.stage_modules)
    held = _gather([Entry(n, checkpoint_shape(t, transforms.get(n)), _written_dtype(t, dtype))
                    for n, t, _ in targets])
    files = plan_files(held, names, max_shard_bytes)
    file_of = {e.name: name for (_, entries), name in zip(files, file_names(len(files)))
               for e in entries}
    error = None
    if rank == 0:
        try:
            os.makedirs(directory, exist_ok=True)
            for stale in glob.glob(os.path.join(directory, "model*.safetensors*")):
                os.remove(stale)  # another export's shards would mix with these
        except OSError as exc:
            error = f"cannot write to {directory} ({exc.strerror}); choose another directory"
    _agree(error)
    mine = {name: StreamingFile(os.path.join(directory, name), entries)
            for (owner, entries), name in zip(files, file_names(len(files))) if owner == rank}
    for name, tensor, _ in targets:
        if name not in file_of:
            continue  # a tied weight stored under its source's name
        # every holder of a DTensor joins its all-gather; only the owner keeps the result
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()
        out = mine.get(file_of[name])
        if out is not None and out.expects(name):  # not a second stage copy's turn
            full = to_checkpoint_layout(full, transforms.get(name))
            try:
                out.write(name, full.to(_written_dtype(tensor, dtype)))
            except OSError as exc:
                error = error or (f"cannot write {out.path} ({exc.strerror}); free space "
                                  "or choose another directory")
        del full
    unfinished = [f.path for f in mine.values() if f.pending]
    if unfinished and error is None:
        error = f"export to {directory} left {unfinished[0]} incomplete; export again"
    _agree(error)
    if rank == 0:
        total = sum(e.nbytes for _, entries in files for e in entries)
        if len(files) > 1:
            with open(os.path.join(directory, INDEX), "w") as fh:
                json.dump({"metadata": {"total_size": total},
                           "weight_map": dict(sorted(file_of.items()))}, fh, indent=2)
        config = getattr(module, "config", None)
        if hasattr(config, "save_pretrained"):
            config.save_pretrained(directory)
    _agree(None)  # the folder is complete on every rank's return
    return directory
