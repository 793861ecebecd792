"""Checkpoints that cannot lie: every byte is checked before anything loads, DCP's pickled
`.metadata` never runs code, and a failed save says why and leaves the previous one.

One 2-rank gloo run (DDP + ZeRO-1) saves step 1 and step 2 of a small GPT, then, on
copies of that folder, tries to resume from: each file of step 2 with one byte flipped
(the `.distcp` files, `.metadata`, COMPLETE.json); a `.metadata` crafted to create a
sentinel file when unpickled, under a marker whose digests were recomputed for it (an
attacker who can write the folder can rewrite the marker); the checkpoint under a model
with fewer layers. Then it saves step 3 onto a "full disk" (every file write fails with
ENOSPC after FULL_AFTER_BYTES) and resumes step 2, which must give the same loss as the
first time. The rest runs in one process on the files that run left behind.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import pickle
import shutil
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import filesystem as dcp_filesystem

from executors import apply
from executors.checkpoint import (check_checkpoint, latest_checkpoint, load_checkpoint,
                                  save_checkpoint, step_dir)
from executors.checkpoint_files import (LEGACY_SCHEMA, MARKER, METADATA, file_digest,
                                        read_marker, render_marker, unpickle_metadata)
from ir.errors import PlannerError
from ir.plan import uniform_plan
from ir.strategy import Precision
from planner.models import load_layer_graph, load_model

from dist_utils import spawn

pytestmark = [pytest.mark.multiprocess]

GPT = "gpt:layers=3,hidden=32,heads=2,vocab=64,seq=16,dropout=0"
OTHER_GPT = "gpt:layers=2,hidden=32,heads=2,vocab=64,seq=16,dropout=0"  # a layer fewer
SEQ, GLOBAL_BATCH, SEED = 16, 4, 7
OPT = {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-4}
FULL_AFTER_BYTES = 4096  # the "disk" fills after 4 KiB per file: mid-tensor, as in real life
FLIP_AT = 0.5  # where in a file the flipped byte sits (fraction of its size)


@functools.lru_cache(maxsize=None)
def plan_and_graph(spec: str):
    g = load_layer_graph(spec, micro_batch=2, seq_len=SEQ, dtype=torch.float32)
    return uniform_plan(len(g.layers), global_batch=GLOBAL_BATCH, precision=Precision.FP32,
                        dp=2, zero=1, micro_batch=2), g


def build(spec: str):
    plan, g = plan_and_graph(spec)
    loaded = load_model(spec, micro_batch=1, seq_len=SEQ, device="cpu", seed=SEED)
    return apply(loaded.module, plan, g, loss_fn=loaded.loss_fn, optimizer_kwargs=OPT,
                 example_inputs=loaded.inputs)


def batch(step: int):
    loaded = load_model(GPT, micro_batch=GLOBAL_BATCH, seq_len=SEQ, device="cpu",
                        seed=100 + step)
    return loaded.inputs, loaded.target


class Sentinel:
    """Unpickling this creates a file: what a malicious `.metadata` would do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def flip_byte(path: str) -> None:
    with open(path, "r+b") as fh:
        at = int(os.path.getsize(path) * FLIP_AT)
        fh.seek(at)
        value = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([value ^ 0xFF]))


def rewrite_metadata(folder: str, change) -> None:
    """`change` the folder's DCP metadata, then rewrite the marker with digests of the new
    file (what an attacker with write access can do). The metadata is this test's own
    checkpoint, so loading it with pickle is trusted here."""
    with open(os.path.join(folder, METADATA), "rb") as fh:
        metadata = pickle.load(fh)
    change(metadata)
    with open(os.path.join(folder, METADATA), "wb") as fh:
        pickle.dump(metadata, fh)
    with open(os.path.join(folder, MARKER)) as fh:
        marker = json.load(fh)
    files = {n: file_digest(os.path.join(folder, n)) for n in marker["files"]}
    with open(os.path.join(folder, MARKER), "wb") as fh:
        fh.write(render_marker(marker["step"], marker["world_size"], marker["plan"], files))


def craft_metadata(folder: str, sentinel: str) -> None:
    """The real metadata carrying a Sentinel, under a re-digested marker."""

    def plant(metadata):
        metadata.planner_data = {"payload": Sentinel(sentinel)}

    rewrite_metadata(folder, plant)


@contextmanager
def full_disk():
    """DCP's file writes fail with ENOSPC after FULL_AFTER_BYTES bytes per file."""

    class Full:  # the real stream, but write() runs out of space
        def __init__(self, inner, path):
            self.inner, self.path, self.written = inner, str(path), 0

        def write(self, data):
            if self.written + len(data) > FULL_AFTER_BYTES:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
            self.written += len(data)
            return self.inner.write(data)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    original = dcp_filesystem.FileSystem.create_stream

    @contextmanager
    def create_stream(self, path, mode):
        with original(self, path, mode) as stream:
            yield Full(stream, path) if "w" in mode else stream

    dcp_filesystem.FileSystem.create_stream = create_stream
    try:
        yield
    finally:
        dcp_filesystem.FileSystem.create_stream = original


def attempt(fn):
    """The PlannerError message of fn(), or None when it succeeds."""
    try:
        fn()
    except PlannerError as exc:
        return str(exc)
    return None


def worker(rank: int, world: int, root: str) -> dict:
    out: dict = {}
    ckpt = os.path.join(root, "ckpt")
    pm = build(GPT)
    out["loss0"] = pm.train_step(*batch(0))
    save_checkpoint(pm, ckpt)
    out["loss1"] = pm.train_step(*batch(1))
    save_checkpoint(pm, ckpt)
    good = step_dir(ckpt, 2)
    names = sorted(os.listdir(good))
    out["names"] = names
    flips = {}
    for i, name in enumerate(names):  # one copy per damaged file; step 1 stays beside it
        copy = os.path.join(root, f"flip-{i}")
        if rank == 0:
            shutil.copytree(ckpt, copy)
            flip_byte(os.path.join(step_dir(copy, 2), name))
        dist.barrier()
        flips[name] = attempt(lambda: load_checkpoint(pm, latest_checkpoint(copy)))
    out["flips"] = flips
    crafted, sentinel = os.path.join(root, "crafted"), os.path.join(root, "SENTINEL")
    if rank == 0:
        shutil.copytree(ckpt, crafted)
        craft_metadata(step_dir(crafted, 2), sentinel)
    dist.barrier()
    out["crafted"] = attempt(lambda: load_checkpoint(pm, step_dir(crafted, 2)))
    out["sentinel_after_crafted"] = os.path.exists(sentinel)
    other = build(OTHER_GPT)
    out["other_model"] = attempt(lambda: load_checkpoint(other, good))
    out["loss2"] = pm.train_step(*batch(2))
    with full_disk():
        out["full"] = attempt(lambda: save_checkpoint(pm, ckpt))
    out["left_after_full"] = sorted(os.listdir(ckpt))
    out["resumed_at"] = load_checkpoint(pm, latest_checkpoint(ckpt))
    out["loss2_again"] = pm.train_step(*batch(2))
    if rank == 0:  # a user's modes on the folder and marker survive saving step 2 again
        os.chmod(good, 0o750)
        os.chmod(os.path.join(good, MARKER), 0o640)
    dist.barrier()
    pm.steps = 2
    save_checkpoint(pm, ckpt)
    out["modes"] = (os.stat(good).st_mode & 0o777,
                    os.stat(os.path.join(good, MARKER)).st_mode & 0o777)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("trust"))
    return root, spawn(worker, 2, root, timeout_s=180)


def test_a_flipped_byte_in_any_file_is_named_on_resume(run):
    root, out = run
    names = out[0]["names"]
    assert {METADATA, MARKER} <= set(names) and sum(n.endswith(".distcp") for n in names) == 2
    for r in out:
        for name in names:
            message = r["flips"][name]
            assert message is not None, f"a flipped byte in {name} was loaded"
            assert "\n" not in message and "is corrupted" in message, message
            assert name in message, message
            older = step_dir(os.path.join(root, f"flip-{names.index(name)}"), 1)
            assert message.endswith(f"and resume from {older}"), message
    distcp = next(n for n in names if n.endswith(".distcp"))
    assert "SHA-256" in out[0]["flips"][distcp] and "as saved" in out[0]["flips"][distcp]


def test_crafted_metadata_under_a_rewritten_marker_does_not_run(run):
    root, out = run
    for r in out:
        assert not r["sentinel_after_crafted"]
        assert r["crafted"] is not None and "\n" not in r["crafted"]
        assert f"{METADATA} refers to io.open" in r["crafted"] or \
            f"{METADATA} refers to builtins.open" in r["crafted"], r["crafted"]
        assert "refused without running it" in r["crafted"]
    assert not os.path.exists(os.path.join(root, "SENTINEL"))


def test_checkpoint_of_another_model_is_explained(run):
    _, out = run
    for r in out:
        message = r["other_model"]
        assert message is not None and "\n" not in message
        assert "parameters this model lacks (e.g. 'blocks.2." in message, message
        assert "saved from another model" in message


def test_full_disk_names_the_folder_and_free_space_and_keeps_the_previous(run):
    root, out = run
    for r in out:
        message = r["full"]
        assert message is not None and "\n" not in message
        tmp = os.path.join(root, "ckpt", ".tmp-step-00000003")
        assert message.startswith(f"No space left on device: {tmp}, "), message
        assert " free" in message and "the save needs about" in message, message
        assert r["left_after_full"] == ["step-00000001", "step-00000002"]
        assert r["resumed_at"] == 2
        assert r["loss2_again"] == r["loss2"]  # the previous checkpoint, bit for bit


def test_resaving_a_step_keeps_the_modes_of_what_it_replaces(run):
    _, out = run
    assert out[0]["modes"] == (0o750, 0o640)


# ------------------------------------------------------------------ one process, on files


def _copy(run, tmp_path) -> str:
    root, _ = run
    dst = str(tmp_path / "step-00000002")
    shutil.copytree(step_dir(os.path.join(root, "ckpt"), 2), dst)
    return dst


def test_intact_checkpoint_checks_and_its_metadata_reads_restrictedly(run, tmp_path):
    folder = _copy(run, tmp_path)
    marker = check_checkpoint(folder)
    assert marker["step"] == 2 and marker["world_size"] == 2
    for name, entry in marker["files"].items():
        assert file_digest(os.path.join(folder, name)) == (entry["bytes"], entry["sha256"])
    with open(os.path.join(folder, METADATA), "rb") as fh:
        metadata = unpickle_metadata(fh.read(), "x")
    keys = metadata.state_dict_metadata
    assert "meta/step" in keys and any(k.startswith("optim/") for k in keys)
    assert {k.split("/")[0] for k in keys} == {"model", "optim", "rng", "meta"}


def test_any_changed_byte_of_the_marker_is_named(run, tmp_path):
    """Every byte of COMPLETE.json, changed in its lowest bit (so it stays ASCII and the
    JSON often stays valid), is caught by the marker's own digest or its canonical form."""
    folder = _copy(run, tmp_path)
    marker_path = os.path.join(folder, MARKER)
    with open(marker_path, "rb") as fh:
        original = fh.read()
    for at in range(len(original)):
        changed = bytearray(original)
        changed[at] ^= 0x01
        with open(marker_path, "wb") as fh:
            fh.write(bytes(changed))
        with pytest.raises(PlannerError) as info:
            read_marker(folder, "hint")
        assert MARKER in str(info.value) and "\n" not in str(info.value), (at, info.value)
    marker = json.loads(original)
    digest = marker["files"][METADATA]["sha256"]
    marker["files"][METADATA]["sha256"] = ("0" if digest[0] != "0" else "1") + digest[1:]
    with open(marker_path, "w") as fh:
        json.dump(marker, fh, indent=2, sort_keys=True)
        fh.write("\n")
    with pytest.raises(PlannerError, match="COMPLETE.json does not match its own digest"):
        read_marker(folder, "hint")


def test_restricted_unpickler_refuses_any_other_global(tmp_path):
    sentinel = tmp_path / "SENTINEL"
    for payload in (Sentinel(str(sentinel)), {"ok": [1, 2]}, shutil.rmtree):
        data = pickle.dumps(payload)
        with pytest.raises(PlannerError) as info:
            unpickle_metadata(data, "ckpt/step-00000002: .metadata")
        assert "\n" not in str(info.value) and str(info.value).startswith(
            "ckpt/step-00000002: .metadata ")
    assert not sentinel.exists()
    with pytest.raises(PlannerError, match=r"refers to shutil\.rmtree, which DCP"):
        unpickle_metadata(pickle.dumps(shutil.rmtree), "m")
    with pytest.raises(PlannerError, match="holds a dict, not DCP Metadata"):
        unpickle_metadata(pickle.dumps({"ok": [1, 2]}), "m")


def test_crafted_metadata_under_the_original_marker_fails_its_digest(run, tmp_path):
    folder = _copy(run, tmp_path)
    sentinel = tmp_path / "SENTINEL"
    size = os.path.getsize(os.path.join(folder, METADATA))
    data = pickle.dumps(Sentinel(str(sentinel)))  # padded to the saved size: only the
    with open(os.path.join(folder, METADATA), "wb") as fh:  # digest can tell
        fh.write(data + b"\0" * (size - len(data)))
    with pytest.raises(PlannerError, match=rf"is corrupted \(file \{METADATA}: \d+ bytes as saved, "
                                           r"but SHA-256 [0-9a-f]{16}\.\.\. where the save "
                                           r"recorded [0-9a-f]{16}\.\.\.\); delete "):
        check_checkpoint(folder)
    assert not sentinel.exists()


def test_bytes_entries_and_foreign_file_paths_are_refused(run, tmp_path):
    """Metadata built only from admitted classes can still point DCP at a pickle it would
    load with weights_only=False (a bytes entry) or at a file outside the checkpoint."""
    folder = _copy(run, tmp_path)
    def escape(metadata):
        next(iter(metadata.storage_data.values())).relative_path = "../../../etc/passwd"

    rewrite_metadata(folder, escape)
    with pytest.raises(PlannerError, match=r"points at '\.\./\.\./\.\./etc/passwd', not a "
                                           "data file of it"):
        check_checkpoint(folder)
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    with pytest.raises(PlannerError, match="refers to torch.distributed.checkpoint.metadata."
                                           "BytesStorageMetadata"):
        unpickle_metadata(pickle.dumps(BytesStorageMetadata()), "m")


def test_a_v1_marker_without_digests_is_checked_by_size_and_still_read_restrictedly(run, tmp_path):
    folder = _copy(run, tmp_path)
    names = sorted(os.listdir(folder))
    legacy = {"schema": LEGACY_SCHEMA, "step": 2, "world_size": 2, "plan": "p",
              "files": {n: os.path.getsize(os.path.join(folder, n)) for n in names if n != MARKER}}
    with open(os.path.join(folder, MARKER), "w") as fh:
        json.dump(legacy, fh)
    assert check_checkpoint(folder)["step"] == 2
    sentinel = tmp_path / "SENTINEL"
    with open(os.path.join(folder, METADATA), "rb") as fh:
        metadata = pickle.load(fh)  # written by this test's run: trusted
    metadata.planner_data = {"payload": Sentinel(str(sentinel))}
    data = pickle.dumps(metadata)
    with open(os.path.join(folder, METADATA), "wb") as fh:
        fh.write(data)
    legacy["files"][METADATA] = len(data)
    with open(os.path.join(folder, MARKER), "w") as fh:
        json.dump(legacy, fh)
    with pytest.raises(PlannerError, match="refused without running it"):
        check_checkpoint(folder)
    assert not sentinel.exists()
