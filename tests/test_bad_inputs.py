"""Every bad input of issue 6, through the command line: one line on stderr that names the
problem and the fix, exit status 2, and no output file touched.

One table (name, command, the exact message as a regular expression over the whole
line). `{d}` in a command or message is the test's folder; `out.json` there is a
sentinel file that commands with `--out` point at, and it must survive unchanged. The
checkpoint entries run examples/train_resumable.py (the checkpoint-loading program; the
`planner` command has no checkpoint verb) in one process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANNER = [sys.executable, "-m", "planner.cli"]
RESUMABLE = [sys.executable, os.path.join(ROOT, "examples", "train_resumable.py")]
SENTINEL = "sentinel: must not be overwritten\n"
FP = r"[0-9a-f]{16}"


@dataclass(frozen=True)
class Bad:
    name: str
    argv: tuple[str, ...]
    message: str  # regex of the whole stderr line, after {d} is filled in (escaped)
    program: tuple[str, ...] = tuple(PLANNER)

    def __str__(self) -> str:
        return self.name


VALIDATE = ("--nproc", "2", "--json", "--calibrate", "--out", "{d}/out.json")
TABLE = [
    Bad("malformed-plan-json", ("validate", "{d}/malformed.json", *VALIDATE),
        r"planner: error: plan file '{d}/malformed.json' is malformed JSON \(line 1, column 44: "
        r"Expecting ',' delimiter\); re-create it with `planner plan`"),
    Bad("truncated-plan-json", ("validate", "{d}/truncated.json", *VALIDATE),
        r"planner: error: plan file '{d}/truncated.json' is truncated JSON \(line \d+, column \d+: "
        r".*\); re-create it with `planner plan`"),
    Bad("unknown-schema-version", ("validate", "{d}/schema.json", *VALIDATE),
        r"planner: error: {d}/schema.json: schema: unknown schema version 'planner.plan/v9'; "
        r"this planner reads 'planner.plan/v1' \(re-plan with this version\)"),
    Bad("plan-for-another-model", ("validate", "{d}/other_model.json", *VALIDATE),
        rf"planner: error: plan {{d}}/other_model.json was made for another model \(fingerprint "
        rf"0123456789abcdef\); gpt-tiny traces to fingerprint {FP} now: re-plan with `planner "
        r"plan gpt-tiny --cluster local --gpus-per-node 2 --global-batch 8 --out FILE`"),
    Bad("world-size-mismatch", ("validate", "{d}/good.json", "--nproc", "4", "--json",
                                "--calibrate", "--out", "{d}/out.json"),
        r"planner: error: plan {d}/good.json needs 2 processes but --nproc is 4: pass --nproc "
        r"2, or re-plan with `planner plan gpt-tiny --cluster local --gpus-per-node 4`"),
    Bad("tp-not-dividing-heads", ("estimate", "gpt:layers=2,hidden=96,heads=6,vocab=128,seq=32",
                                  "--cluster", "local", "--gpus-per-node", "4", "--tp", "4",
                                  "--global-batch", "8"),
        r"planner: error: layer blocks.0: tp=4 does not divide heads=6: use a TP degree in \[1, 2\]"),
    Bad("tp-not-dividing-kv-heads", ("estimate", "llama-tiny", "--cluster", "local",
                                     "--gpus-per-node", "8", "--tp", "8", "--global-batch", "8"),
        r"planner: error: layer blocks.0: tp=8 does not divide kv_heads=4: use a TP degree in "
        r"\[1, 2, 4\]"),
    Bad("tp-not-dividing-hidden", ("estimate", "gpt:layers=2,hidden=66,heads=6,vocab=128,seq=32,ffn=128",
                                   "--cluster", "local", "--gpus-per-node", "4", "--tp", "4",
                                   "--global-batch", "8"),
        r"planner: error: layer blocks.0: tp=4 does not divide attn.k.out=66: use a TP degree "
        r"in \[1, 2\]"),
    Bad("tp-not-dividing-vocab", ("estimate", "gpt:layers=2,hidden=64,heads=4,vocab=130,seq=32",
                                  "--cluster", "local", "--gpus-per-node", "4", "--tp", "4",
                                  "--global-batch", "8"),
        r"planner: error: layer embed: tp=4 does not divide tok.vocab=130: use a TP degree in "
        r"\[1, 2\]"),
    Bad("tp-not-dividing-in-plan-file", ("validate", "{d}/tp3.json", "--nproc", "3", "--json",
                                         "--calibrate", "--out", "{d}/out.json"),
        r"planner: error: layer embed: tp=3 does not divide tok.vocab=128: use a TP degree in "
        r"\[1, 2, 4, 8, 16, 32, 64\]"),
    Bad("impossible-memory-budget", ("plan", "gpt-tiny", "--cluster", "local", "--gpus-per-node",
                                     "2", "--global-batch", "8", "--memory-budget", "0.2",
                                     "--out", "{d}/out.json"),
        r"planner: error: no plan fits 204.80 MiB per device; the most frugal plan needs "
        r"[0-9.]+ MiB; "
        r"try: more devices \(--nodes 2\), a smaller --global-batch or --seq-len"),
    Bad("unknown-model-preset", ("plan", "gpt-5", "--cluster", "local", "--global-batch", "8",
                                 "--out", "{d}/out.json"),
        r"planner: error: unknown model 'gpt-5': unknown preset 'gpt-5'; known presets: "
        r"gpt3-125m, .*, gpt-tiny, .*"),
    Bad("unknown-cluster-preset", ("plan", "gpt-tiny", "--cluster", "a100-81g",
                                   "--global-batch", "8", "--out", "{d}/out.json"),
        r"planner: error: unknown cluster 'a100-81g': use a preset \(a100-40g, a100-80g, "
        r"h100-80g, h200, local\) or a spec JSON file \(planner profile-cluster --out spec.json\)"),
    Bad("untraceable-model", ("inspect", "tests.factories:data_dependent"),
        r"planner: error: cannot trace DataDependent: torch.fx failed \(TraceError: .*\) and "
        r"torch.export failed in DataDependent.forward \(.*\); make forward\(\) free of "
        r"data-dependent Python control flow \(no .item\(\)/if on tensor values\) or pass a "
        r"traceable wrapper"),
    Bad("partial-checkpoint", ("--ckpt-dir", "{d}/ckpt", "--resume", "{d}/ckpt/step-00000006"),
        r"train_resumable: error: checkpoint {d}/ckpt/step-00000006 is partial \(no "
        r"COMPLETE.json: its save was interrupted\); delete {d}/ckpt/step-00000006 and "
        r"resume from {d}/ckpt/step-00000003",
        program=tuple(RESUMABLE)),
    Bad("corrupted-checkpoint", ("--ckpt-dir", "{d}/ckpt", "--resume", "{d}/ckpt/step-00000003"),
        r"train_resumable: error: checkpoint {d}/ckpt/step-00000003 is corrupted \(file "
        r"__0_0.distcp has 10 bytes, the save wrote 4096\); delete {d}/ckpt/step-00000003 "
        r"and start over \(no other complete checkpoint beside it\)", program=tuple(RESUMABLE)),
    Bad("corrupted-checkpoint-marker", ("--ckpt-dir", "{d}/bad", "--resume", "{d}/bad/step-00000009"),
        r"train_resumable: error: checkpoint {d}/bad/step-00000009 is corrupted \(COMPLETE.json "
        r"is not valid JSON: .*\); delete {d}/bad/step-00000009 and start over \(no other "
        r"complete checkpoint beside it\)",
        program=tuple(RESUMABLE)),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Plan files (good and broken), fake checkpoints and the sentinel."""
    d = tmp_path_factory.mktemp("bad")
    from planner.cli import main

    good = d / "good.json"
    # Pinned (DDP, one stage, one micro-batch): the broken variants edit this shape.
    assert main(["plan", "gpt-tiny", "--cluster", "local", "--gpus-per-node", "2",
                 "--global-batch", "8", "--uniform", "--dp", "2", "--pp", "1", "--micro-batch",
                 "4", "--out", str(good)]) == 0
    text = good.read_text()
    data = json.loads(text)
    (d / "malformed.json").write_text('{"schema": "planner.plan/v1", "model": [1,2}\n')
    (d / "truncated.json").write_text(text[:300])

    def variant(name: str, change) -> None:
        copy = json.loads(text)
        change(copy)
        (d / name).write_text(json.dumps(copy, indent=2))

    variant("schema.json", lambda p: p.update(schema="planner.plan/v9"))
    variant("other_model.json", lambda p: p["model"].update(fingerprint="0123456789abcdef"))

    def tp3(p):
        for layer in p["layers"]:
            layer.update(tp=3, dp=1)
        for stage in p["stages"]:
            stage["devices"] = 3
        p.update(world_size=3, micro_batch=8)

    variant("tp3.json", tp3)
    assert data["world_size"] == 2
    # ckpt/step-3: complete marker but a truncated data file; ckpt/step-6: no marker
    step3 = d / "ckpt" / "step-00000003"
    step3.mkdir(parents=True)
    (step3 / "__0_0.distcp").write_bytes(b"x" * 10)
    (step3 / ".metadata").write_bytes(b"y" * 20)
    (step3 / "COMPLETE.json").write_text(json.dumps(
        {"schema": "planner.checkpoint/v1", "step": 3, "world_size": 1,
         "files": {"__0_0.distcp": 4096, ".metadata": 20}}))
    (d / "ckpt" / "step-00000006").mkdir()
    (d / "ckpt" / "step-00000006" / "__0_0.distcp").write_bytes(b"x" * 10)
    bad = d / "bad" / "step-00000009"
    bad.mkdir(parents=True)
    (bad / "COMPLETE.json").write_text('{"schema": "planner.checkpoint/v1", "st')
    (d / "out.json").write_text(SENTINEL)
    return d


def snapshot(d) -> dict[str, bytes]:
    out = {}
    for base, _, files in os.walk(d):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as fh:
                out[path] = fh.read()
    return out


@pytest.mark.parametrize("case", TABLE, ids=str)
def test_bad_input_gives_one_line_exit_2_and_overwrites_nothing(case: Bad, folder):
    d = str(folder)
    before = snapshot(d)
    argv = [a.replace("{d}", d) for a in case.argv]
    proc = subprocess.run([*case.program, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1, proc.stderr[-2000:]
    pattern = case.message.replace("{d}", re.escape(d))
    assert re.fullmatch(pattern, lines[0]), f"\n got: {lines[0]}\nwant: {pattern}"
    assert snapshot(d) == before  # nothing written, nothing overwritten
    assert (folder / "out.json").read_text() == SENTINEL
