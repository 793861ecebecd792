"""The files of a checkpoint folder: the completion marker with a SHA-256 digest per file,
its verification, DCP's `.metadata` read without running its pickle, and disk errors.

    marker = read_marker(path, hint)           # schema, step, files: {name: {bytes, sha256}}
    problem = verify_files(path, marker, names, hint)   # None, or a one-line message
    metadata = read_metadata(path, marker, hint)        # a vetted DCP `Metadata`
    dcp.load(state, storage_reader=VettedReader(path, metadata))

What the digests protect against: bit rot, torn or partial writes, a file overwritten in
place, files swapped between checkpoints — any change not made through `save_checkpoint`.
What they do not: someone who can write the folder can also rewrite `COMPLETE.json` with
digests of their own files. Against that, `.metadata` (DCP's pickle) is read by
`MetadataUnpickler`, which builds only the classes DCP's metadata needs and refuses any
other global before it is called; the `.distcp` files are read by DCP with
`torch.load(weights_only=True)`. Tensor VALUES in a checkpoint stay trusted data.

Order on load: the marker (its own digest), then every file's size and digest, then the
restricted read of the very bytes that were hashed, and only then DCP — which is handed
the vetted metadata (`VettedReader`) and never unpickles `.metadata` itself.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import re
import shutil

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata

from ir.errors import PlannerError

CHECKPOINT_SCHEMA = "planner.checkpoint/v2"  # v2: a SHA-256 per file and for the marker
LEGACY_SCHEMA = "planner.checkpoint/v1"  # sizes only: loaded with a warning (see read_marker)
MARKER = "COMPLETE.json"
METADATA = ".metadata"  # DCP's global metadata file (torch/distributed/checkpoint/filesystem.py)
HASH_CHUNK_BYTES = 8 << 20  # 8 MiB reads: hashing runs at disk/page-cache speed, memory flat
MARKER_MAX_BYTES = 64 << 20  # a marker lists file names and digests; more is not a marker
DIGEST = re.compile(r"^[0-9a-f]{64}$")

# The globals a DCP `.metadata` of this project holds (torch 2.x FileSystemWriter; seen in
# checkpoints of DDP, ZeRO-1/2, FSDP2 + TP DTensors and pipeline plans). Deliberately absent:
# BytesStorageMetadata — it makes DCP torch.load(weights_only=False) the item's bytes, and
# this project saves tensors only.
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
ALLOWED_GLOBALS = {
    (_DCP_METADATA, "Metadata"), (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "ChunkStorageMetadata"), (_DCP_METADATA, "TensorProperties"),
    (_DCP_METADATA, "StorageMeta"), (_DCP_METADATA, "MetadataIndex"),
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # maps "torch.strided" to the layout object
    ("pathlib", "PosixPath"), ("pathlib._local", "PosixPath"),  # StorageMeta.checkpoint_id
}


# ------------------------------------------------------------------ digests


def file_digest(path: str) -> tuple[int, str]:
    """(bytes, SHA-256 hex) of a file, streamed in HASH_CHUNK_BYTES reads."""
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK_BYTES):
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


def _render(body: dict) -> bytes:
    """The one byte form of a marker: sorted keys, two-space indent, a final newline."""
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()


def render_marker(step: int, world_size: int, plan: str,
                  files: dict[str, tuple[int, str]]) -> bytes:
    """COMPLETE.json's bytes: the step, the files' sizes and digests, and a digest of the
    rest of the marker itself (a flipped byte in the marker is named as such)."""
    body = {"schema": CHECKPOINT_SCHEMA, "step": step, "world_size": world_size, "plan": plan,
            "files": {name: {"bytes": size, "sha256": digest}
                      for name, (size, digest) in sorted(files.items())}}
    body["marker_sha256"] = hashlib.sha256(_render(body)).hexdigest()
    return _render(body)


def write_file(path: str, data: bytes) -> None:
    """Write and fsync `path`, keeping the mode of the file it replaces."""
    mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else None
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    if mode is not None:
        os.chmod(path, mode)


# ------------------------------------------------------------------ the marker


def read_marker(path: str, hint: str) -> dict:
    """The marker of `path` as {"schema", "step", "world_size", "plan", "files": {name:
    {"bytes", "sha256"}}}; PlannerError naming COMPLETE.json if it is damaged.

    A v1 marker (sizes only, written before digests existed) is accepted with "sha256":
    None per file: the planner's own earlier saves stay resumable, their sizes are still
    checked and their metadata still read by the restricted unpickler; a damaged byte in
    them goes unseen, as it did when they were written. A digest would not stop an
    attacker either (they rewrite the marker), so v1 loses only the bit-rot check."""
    marker_path = os.path.join(path, MARKER)
    where = f"checkpoint {path}: {MARKER}"
    try:
        if os.path.getsize(marker_path) > MARKER_MAX_BYTES:
            raise PlannerError(f"{where} is over {MARKER_MAX_BYTES >> 20} MiB, not a marker "
                               f"written by save_checkpoint; {hint}")
        with open(marker_path, "rb") as fh:
            raw = fh.read()
        marker = json.loads(raw)
    except (OSError, ValueError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else f"not valid JSON: {exc}"
        raise PlannerError(f"checkpoint {path} is corrupted ({MARKER} is {reason}); "
                           f"{hint}") from None
    if not isinstance(marker, dict) or marker.get("schema") not in (CHECKPOINT_SCHEMA,
                                                                     LEGACY_SCHEMA):
        found = marker.get("schema") if isinstance(marker, dict) else type(marker).__name__
        raise PlannerError(f"{where} has schema {found!r}, not {CHECKPOINT_SCHEMA!r}; it was "
                           "not written by this planner's save_checkpoint: save it again "
                           "with this version")
    files, step = marker.get("files"), marker.get("step")
    if not isinstance(files, dict) or type(step) is not int or step < 0:
        raise PlannerError(f"checkpoint {path} is corrupted ({MARKER} lacks 'files' or "
                           f"'step'); {hint}")
    if marker["schema"] == LEGACY_SCHEMA:
        if not all(type(size) is int and size >= 0 for size in files.values()):
            raise PlannerError(f"checkpoint {path} is corrupted ({MARKER} has a file size "
                               f"that is not a count of bytes); {hint}")
        marker["files"] = {name: {"bytes": size, "sha256": None} for name, size in files.items()}
        return marker
    body = {k: v for k, v in marker.items() if k != "marker_sha256"}
    own = hashlib.sha256(_render(body)).hexdigest()
    if marker.get("marker_sha256") != own or raw != _render(marker):
        raise PlannerError(f"checkpoint {path} is corrupted ({MARKER} does not match its own "
                           f"digest: its bytes changed after the save); {hint}")
    for name, entry in files.items():
        if not (isinstance(entry, dict) and type(entry.get("bytes")) is int
                and isinstance(entry.get("sha256"), str) and DIGEST.match(entry["sha256"])):
            raise PlannerError(f"checkpoint {path} is corrupted ({MARKER}: the entry of "
                               f"{name!r} is not {{bytes, sha256}}); {hint}")
    return marker


def check_sizes(path: str, marker: dict, hint: str) -> None:
    """Every file the marker lists exists, is a plain file (in the folder) and has its size."""
    for name, entry in marker["files"].items():
        file_path = os.path.join(path, name)
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise PlannerError(f"checkpoint {path} is corrupted ({MARKER} lists {name!r}, "
                               f"not a file name in the folder); {hint}")
        if not os.path.isfile(file_path):
            raise PlannerError(f"checkpoint {path} is corrupted (file {name} is missing); {hint}")
        actual = os.path.getsize(file_path)
        if actual != entry["bytes"]:
            raise PlannerError(f"checkpoint {path} is corrupted (file {name} has {actual} bytes, "
                               f"the save wrote {entry['bytes']}); {hint}")


def verify_files(path: str, marker: dict, names, hint: str) -> str | None:
    """The first of `names` whose SHA-256 differs from the marker's, as a one-line message
    naming the file, the size and both digests and what to do; None when all match."""
    for name in names:
        expected = marker["files"][name]["sha256"]
        if expected is None:  # a v1 marker: nothing to compare with
            continue
        try:
            size, found = file_digest(os.path.join(path, name))
        except OSError as exc:
            return f"checkpoint {path}: cannot read file {name} ({exc.strerror}); {hint}"
        if found != expected:
            return (f"checkpoint {path} is corrupted (file {name}: {size} bytes as saved, "
                    f"but SHA-256 {found[:16]}... where the save recorded {expected[:16]}...); "
                    f"{hint}")
    return None


# ------------------------------------------------------------------ DCP's .metadata


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata; any global outside ALLOWED_GLOBALS or torch's dtypes is
    refused before it is looked up, so nothing else is ever called."""

    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # torch.float32 etc.: values, not callables
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("a persistent id")


def unpickle_metadata(data: bytes, where: str) -> dcp_metadata.Metadata:
    """DCP `Metadata` from `.metadata` bytes, by MetadataUnpickler; `where` names the file."""
    try:
        metadata = MetadataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise PlannerError(f"{where} refers to {exc}, which DCP checkpoint metadata never "
                           "holds; refused without running it: the checkpoint was not "
                           "written by save_checkpoint or was tampered with, delete it") from None
    except Exception as exc:  # truncated or garbled pickle data
        raise PlannerError(f"{where} is not readable DCP metadata ({type(exc).__name__}); "
                           "delete the checkpoint") from None
    if not isinstance(metadata, dcp_metadata.Metadata):
        raise PlannerError(f"{where} holds a {type(metadata).__name__}, not DCP Metadata; "
                           "delete the checkpoint")
    return metadata


def _check_structure(metadata: dcp_metadata.Metadata, files: dict) -> str | None:
    """What in `metadata` DCP would misuse, or None: entries that are not tensors, tensor
    storage outside the checkpoint's own listed files or past their ends, transforms."""
    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict):
        return "its state_dict_metadata is not a dict"
    for key, meta in entries.items():
        if not (isinstance(key, str) and isinstance(meta, dcp_metadata.TensorStorageMetadata)
                and isinstance(meta.properties, dcp_metadata.TensorProperties)
                and isinstance(meta.properties.dtype, torch.dtype)
                and isinstance(meta.size, torch.Size) and isinstance(meta.chunks, list)):
            return f"entry {key!r} is not a tensor"
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        return "its storage_data is not a dict"
    for index, info in storage.items():
        if not (isinstance(index, dcp_metadata.MetadataIndex)
                and isinstance(info, dcp_filesystem._StorageInfo)):
            return "its storage_data is not DCP's file index"
        if info.relative_path not in files or info.relative_path in (MARKER, METADATA):
            return f"{index.fqn!r} points at {info.relative_path!r}, not a data file of it"
        if not (type(info.offset) is int and type(info.length) is int and info.offset >= 0
                and info.length >= 0
                and info.offset + info.length <= files[info.relative_path]["bytes"]):
            return f"{index.fqn!r} points past the end of {info.relative_path}"
        if info.transform_descriptors:
            return f"{index.fqn!r} needs transforms {list(info.transform_descriptors)}"
    return None


def read_metadata(path: str, marker: dict, hint: str) -> dcp_metadata.Metadata:
    """Read `.metadata` once, check those bytes against the marker's digest, then unpickle
    them restrictedly and check their structure; PlannerError naming the file otherwise."""
    where = f"checkpoint {path}: {METADATA}"
    entry = marker["files"].get(METADATA)
    if entry is None:
        raise PlannerError(f"checkpoint {path} is corrupted ({MARKER} does not list "
                           f"{METADATA}); {hint}")
    try:
        with open(os.path.join(path, METADATA), "rb") as fh:
            data = fh.read(entry["bytes"] + 1)
    except OSError as exc:
        raise PlannerError(f"{where} cannot be read ({exc.strerror}); {hint}") from None
    found = hashlib.sha256(data).hexdigest()
    if len(data) != entry["bytes"] or entry["sha256"] not in (None, found):
        raise PlannerError(f"checkpoint {path} is corrupted (file {METADATA}: {len(data)} bytes "
                           f"and SHA-256 {found[:16]}... where the save recorded "
                           f"{entry['bytes']} bytes and {str(entry['sha256'])[:16]}...); {hint}")
    metadata = unpickle_metadata(data, where)
    problem = _check_structure(metadata, marker["files"])
    if problem:
        raise PlannerError(f"{where} is not metadata save_checkpoint writes ({problem}); "
                           "refused: delete the checkpoint")
    return metadata


class VettedReader(FileSystemReader):
    """DCP's file reader, handed metadata that `read_metadata` vetted: DCP never
    unpickles `.metadata` itself (nor any rank-local `__<rank>.metadata`)."""

    def __init__(self, path: str, metadata: dcp_metadata.Metadata) -> None:
        super().__init__(path)
        self._vetted = metadata

    def read_metadata(self, *args, **kwargs) -> dcp_metadata.Metadata:
        if kwargs.get("rank") is not None:
            raise PlannerError(f"checkpoint {self.path}: rank-local metadata is not read")
        self._vetted.storage_meta = dcp_metadata.StorageMeta(load_id=self.load_id)
        return self._vetted


# ------------------------------------------------------------------ disk errors


def human_bytes(count: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= scale:
            return f"{count / scale:.0f} {unit}" if count >= 10 * scale else \
                f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def free_bytes(path: str) -> int | None:
    """Free space where `path` (or its nearest existing parent) lives, or None."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def os_error_in(exc: BaseException) -> OSError | None:
    """The first OSError with an errno in an exception, its causes, or DCP's per-rank
    failures (torch's zip writer turns a failed write into a RuntimeError without errno
    on some ranks; another rank's write usually still carries ENOSPC)."""
    seen, todo = set(), [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno:
            return current
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):
            todo.extend(f[0] if isinstance(f, tuple) else f for f in failures.values())
        todo.extend([current.__cause__, current.__context__])
    return None


def probe_write(folder: str, probe_bytes: int) -> OSError | None:
    """Write `probe_bytes` into `folder` to learn why a write failed when the error lost
    its errno; the OSError, or None when the write succeeds."""
    probe = os.path.join(folder, ".write-probe")
    try:
        with open(probe, "wb") as fh:
            fh.write(b"\0" * probe_bytes)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        return exc
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass
    return None


def disk_error_message(error: OSError | None, folder: str, needed_bytes: int | None,
                       detail: str) -> str:
    """`No space left on device: ckpt/.tmp-step-6, 12 MB free (...)` — one line."""
    free = free_bytes(folder)
    space = f", {human_bytes(free)} free" if free is not None else ""
    need = f", the save needs about {human_bytes(needed_bytes)}" if needed_bytes else ""
    if error is not None and error.errno:
        reason = os.strerror(error.errno)
    else:
        reason = f"could not write the checkpoint ({detail})"
    fix = "free space or save elsewhere" if error is not None and error.errno in (
        errno.ENOSPC, errno.EDQUOT) else "fix the folder or save elsewhere"
    return f"{reason}: {folder}{space}{need}; {fix}"

