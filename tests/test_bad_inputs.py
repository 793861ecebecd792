"""Every bad input of issues 6 and 16, through the command line: one line on stderr that
names the file, key or flag and says how to fix it, exit status 2, no traceback, no file
of the case's folder touched (content and mode), under 10 s.

The cases are tables (tests/bad_input_cases.py: plan files, special files, cluster specs,
profiles; tests/bad_input_flags.py: flags, model specs, output paths; ISSUE_6 below).
Each case runs `planner.cli.main` in this process (tests/cli_run.py), or in a forked
child where it might block (a FIFO) or must drop root (an unreadable file).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from tests.bad_input_cases import (FILE_TYPES, PLAN_FILES, PROFILES, SPECS, Bad, Base, edited,
                                   plan, put)
from tests.bad_input_flags import FLAGS, MODELS, OUTPUTS
from tests.cli_run import check_contract, run_cli, run_forked, snapshot
from tests.layer_graphs import commands_trace_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTINEL = "sentinel: must not be overwritten\n"
FP = r"[0-9a-f]{16}"
GOOD_PLAN = ["plan", "gpt-tiny", "--cluster", "local", "--gpus-per-node", "2", "--global-batch",
             "8", "--uniform", "--dp", "2", "--pp", "1", "--micro-batch", "4"]
VALIDATE = " --nproc 2 --json --calibrate --out {d}/out.json"


def _checkpoints(d: str) -> None:
    """ckpt/step-3: a complete marker but a truncated data file; ckpt/step-6: no marker;
    bad/step-9: a marker that is not JSON."""
    step3 = os.path.join(d, "ckpt", "step-00000003")
    os.makedirs(step3)
    with open(os.path.join(step3, "__0_0.distcp"), "wb") as fh:
        fh.write(b"x" * 10)
    with open(os.path.join(step3, ".metadata"), "wb") as fh:
        fh.write(b"y" * 20)
    with open(os.path.join(step3, "COMPLETE.json"), "w") as fh:
        json.dump({"schema": "planner.checkpoint/v1", "step": 3, "world_size": 1,
                   "files": {"__0_0.distcp": 4096, ".metadata": 20}}, fh)
    step6 = os.path.join(d, "ckpt", "step-00000006")
    os.makedirs(step6)
    with open(os.path.join(step6, "__0_0.distcp"), "wb") as fh:
        fh.write(b"x" * 10)
    bad = os.path.join(d, "bad", "step-00000009")
    os.makedirs(bad)
    with open(os.path.join(bad, "COMPLETE.json"), "w") as fh:
        fh.write('{"schema": "planner.checkpoint/v1", "st')


def _tp3(p: dict) -> None:
    for layer in p["layers"]:
        layer.update(tp=3, dp=1)
        for key in ("tp_groups", "dp_groups"):
            layer.pop(key)
    for stage in p["stages"]:
        stage["devices"] = 3
        stage.pop("ranks")
    p.pop("pipeline_groups")
    p.update(world_size=3, micro_batch=8)


ISSUE_6 = [
    Bad("malformed-plan-json", "validate {d}/plan.json" + VALIDATE,
        r"planner: error: plan file '{d}/plan\.json' is not valid JSON \(malformed JSON at line 1, "
        r"column 44: Expecting ',' delimiter\); re-create it with `planner plan`",
        {"plan.json": lambda b: '{"schema": "planner.plan/v1", "model": [1,2}\n'}),
    Bad("truncated-plan-json", "validate {d}/plan.json" + VALIDATE,
        r"plan file '{d}/plan\.json' is not valid JSON \(truncated JSON at line \d+, column \d+: .*\); "
        r"re-create it with `planner plan`",
        {"plan.json": lambda b: json.dumps(b.plan, indent=2)[:300]}),
    Bad("unknown-schema-version", "validate {d}/plan.json" + VALIDATE,
        r"planner: error: {d}/plan\.json: schema: unknown schema version 'planner\.plan/v9'; "
        r"this planner reads 'planner\.plan/v1' \(re-plan with this version\)",
        plan(put("schema", "planner.plan/v9"))),
    Bad("unknown-optimizer-impl", "validate {d}/plan.json" + VALIDATE,
        r"planner: error: {d}/plan\.json: optimizer_impl: 'fast' is not one of fused, foreach, "
        r"single: use one of them \(or delete the key for the device's default\)",
        plan(put("optimizer_impl", "fast"))),
    Bad("plan-for-another-model", "validate {d}/plan.json" + VALIDATE,
        rf"planner: error: plan {{d}}/plan\.json was made for another model \(fingerprint "
        rf"0123456789abcdef\); gpt-tiny traces to fingerprint {FP} now: re-plan with `planner "
        r"plan gpt-tiny --cluster local --gpus-per-node 2 --global-batch 8 --out FILE`",
        plan(put("model.fingerprint", "0123456789abcdef"))),
    Bad("world-size-mismatch", "validate {d}/plan.json --nproc 4 --json --calibrate --out {d}/out.json",
        r"planner: error: plan {d}/plan\.json needs 2 processes but --nproc is 4: pass --nproc "
        r"2, or re-plan with `planner plan gpt-tiny --cluster local --gpus-per-node 4`",
        plan(lambda p: None)),
    Bad("tp-not-dividing-heads", "estimate gpt:layers=2,hidden=96,heads=6,vocab=128,seq=32 --cluster "
        "local --gpus-per-node 4 --tp 4 --global-batch 8",
        r"planner: error: layer blocks\.0: tp=4 does not divide heads=6: use a TP degree in \[1, 2\]"),
    Bad("tp-not-dividing-kv-heads", "estimate llama-tiny --cluster local --gpus-per-node 8 --tp 8 "
        "--global-batch 8",
        r"planner: error: layer blocks\.0: tp=8 does not divide kv_heads=4: use a TP degree in "
        r"\[1, 2, 4\]"),
    Bad("tp-not-dividing-hidden", "estimate gpt:layers=2,hidden=66,heads=6,vocab=128,seq=32,ffn=128 "
        "--cluster local --gpus-per-node 4 --tp 4 --global-batch 8",
        r"planner: error: layer blocks\.0: tp=4 does not divide attn\.k\.out=66: use a TP degree "
        r"in \[1, 2\]"),
    Bad("tp-not-dividing-vocab", "estimate gpt:layers=2,hidden=64,heads=4,vocab=130,seq=32 --cluster "
        "local --gpus-per-node 4 --tp 4 --global-batch 8",
        r"planner: error: layer embed: tp=4 does not divide tok\.vocab=130: use a TP degree in "
        r"\[1, 2\]"),
    Bad("tp-not-dividing-in-plan-file", "validate {d}/plan.json --nproc 3 --json --calibrate --out "
        "{d}/out.json",
        r"planner: error: layer embed: tp=3 does not divide tok\.vocab=128: use a TP degree in "
        r"\[1, 2, 4, 8, 16, 32, 64\]", plan(_tp3)),
    Bad("unknown-model-preset", "plan gpt-5 --cluster local --global-batch 8 --out {d}/out.json",
        r"planner: error: unknown model 'gpt-5': unknown preset 'gpt-5'; known presets: "
        r"gpt3-125m, .*, gpt-tiny, .*"),
    Bad("unknown-cluster-preset", "plan gpt-tiny --cluster a100-81g --global-batch 8 --out "
        "{d}/out.json",
        r"planner: error: unknown cluster 'a100-81g': use a preset \(a100-40g, a100-80g, "
        r"h100-80g, h200, local\) or a spec JSON file \(planner profile-cluster --out spec\.json\)"),
    Bad("untraceable-model", "inspect tests.factories:data_dependent",
        r"planner: error: cannot trace DataDependent: torch\.fx failed \(TraceError: .*\) and "
        r"torch\.export failed in DataDependent\.forward \(.*\); make forward\(\) free of "
        r"data-dependent Python control flow \(no \.item\(\)/if on tensor values\) or pass a "
        r"traceable wrapper"),
    Bad("partial-checkpoint", "--ckpt-dir {d}/ckpt --resume {d}/ckpt/step-00000006",
        r"train_resumable: error: checkpoint {d}/ckpt/step-00000006 is partial \(no "
        r"COMPLETE\.json: its save was interrupted\); delete {d}/ckpt/step-00000006 and "
        r"resume from {d}/ckpt/step-00000003", setup=_checkpoints, how="resumable"),
    Bad("corrupted-checkpoint", "--ckpt-dir {d}/ckpt --resume {d}/ckpt/step-00000003",
        r"train_resumable: error: checkpoint {d}/ckpt/step-00000003 is corrupted \(file "
        r"__0_0\.distcp has 10 bytes, the save wrote 4096\); delete {d}/ckpt/step-00000003 "
        r"and start over \(no other complete checkpoint beside it\)", setup=_checkpoints,
        how="resumable"),
    Bad("corrupted-checkpoint-marker", "--ckpt-dir {d}/bad --resume {d}/bad/step-00000009",
        r"train_resumable: error: checkpoint {d}/bad/step-00000009 is corrupted \(COMPLETE\.json "
        r"is not valid JSON: .*\); delete {d}/bad/step-00000009 and start over \(no other "
        r"complete checkpoint beside it\)", setup=_checkpoints, how="resumable"),
]

TABLE = ISSUE_6 + PLAN_FILES + FILE_TYPES + SPECS + PROFILES + FLAGS + MODELS + OUTPUTS


@pytest.fixture(scope="module", autouse=True)
def trace_once():
    """Each zoo model the cases' commands trace, traced once (`commands_trace_once`): the
    cases check what a command says about its input, not the trace."""
    with commands_trace_once():
        yield


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Base:
    """A good plan (gpt-tiny, DDP on 2 local processes), spec, profile and HF config."""
    from cost_models.clusters import get_cluster

    path = tmp_path_factory.mktemp("good") / "plan.json"
    result = run_cli([*GOOD_PLAN, "--out", str(path)])
    assert result.code == 0, result.stderr
    profile = {"schema": "planner.profile/v1", "model": "gpt-tiny", "device": "cpu",
               "device_name": "cpu", "dtype": "float32", "micro_batch": 1,
               "layers": [{"name": "embed", "structural_hash": "abc", "forward_seconds": 1e-4,
                           "backward_seconds": 2e-4, "micro_batch": 1,
                           "saved_activation_bytes": 1024}]}
    with open(os.path.join(ROOT, "tests", "data", "hf", "gpt2", "config.json")) as fh:
        hf = json.load(fh)
    return Base(json.loads(path.read_text()), get_cluster("a100-80g").to_dict(), profile, hf)


def _write(folder: str, name: str, content) -> None:
    if not isinstance(content, (str, bytes)):
        content = json.dumps(content, indent=2)
    if isinstance(content, str):
        content = content.encode()
    with open(os.path.join(folder, name), "wb") as fh:
        fh.write(content)


def _resumable(argv: list[str]) -> int:
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import train_resumable

    return train_resumable.main(argv)


def _planner(argv: list[str]) -> int:
    from planner.cli import main

    return main(argv)


def run_case(case: Bad, folder: str):
    argv = [a.replace("{d}", folder) for a in case.command.split()]
    if case.how == "inproc":
        return run_cli(argv)
    if case.how == "resumable":
        return run_forked(_resumable, argv, timeout_s=30)
    uid = 65534 if case.how == "nobody" and os.geteuid() == 0 else None  # root reads anything
    return run_forked(_planner, argv, timeout_s=case.limit_s + 5, uid=uid)


@pytest.fixture
def folder(request, tmp_path):
    """The case's folder; a case that drops to `nobody` gets one that user can enter."""
    case = request.node.callspec.params["case"]
    if case.how != "nobody":
        yield str(tmp_path)
        return
    path = tempfile.mkdtemp(prefix="planner-bad-")
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_the_table_is_large_and_names_are_unique():
    assert len(TABLE) >= 100
    assert len({c.name for c in TABLE}) == len(TABLE)


@pytest.mark.parametrize("case", TABLE, ids=str)
def test_bad_input_gives_one_line_exit_2_and_overwrites_nothing(case: Bad, base: Base, folder):
    sentinel = Path(folder) / "out.json"
    sentinel.write_text(SENTINEL)
    os.chmod(sentinel, 0o644)
    for name, make in case.files.items():
        _write(folder, name, make(base))
    if case.setup:
        case.setup(folder)
    before = snapshot(folder)
    result = run_case(case, folder)
    limit = case.limit_s if case.how == "inproc" else case.limit_s + 5  # + the fork
    check_contract(result, case.want.replace("{d}", re.escape(folder)), before, snapshot(folder),
                   limit)
    assert sentinel.read_text() == SENTINEL
    assert stat.S_IMODE(os.stat(sentinel).st_mode) == 0o644


def test_show_escapes_control_characters_from_the_file(base: Base, tmp_path):
    def evil(p):
        p["model"]["name"] = "gpt\x1b[31m-tiny\x07"
    path = tmp_path / "plan.json"
    _write(str(tmp_path), "plan.json", edited("plan", evil)(base))
    result = run_cli(["show", str(path)])
    assert result.code == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "gpt\\x1b[31m-tiny\\x07" in result.stdout


def test_overwriting_a_plan_keeps_its_mode(tmp_path):
    old = tmp_path / "old.json"
    old.write_text("{}")
    os.chmod(old, 0o644)
    private = tmp_path / "private.json"
    private.write_text("{}")
    os.chmod(private, 0o600)
    for path in (old, private):
        assert run_cli([*GOOD_PLAN, "--out", str(path)]).code == 0
        assert json.loads(path.read_text())["schema"] == "planner.plan/v1"
    assert stat.S_IMODE(os.stat(old).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    new = tmp_path / "new.json"
    mask = os.umask(0o022)
    try:
        assert run_cli([*GOOD_PLAN, "--out", str(new)]).code == 0
    finally:
        os.umask(mask)
    assert stat.S_IMODE(os.stat(new).st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "old.json", "private.json"]


def test_a_billion_sample_batch_plans_within_the_time_limit():
    result = run_cli(["plan", "gpt-tiny", "--cluster", "a100-80g", "--global-batch",
                      "1000000000", "--time-limit", "5"])
    assert result.code in (0, 2), result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 1
    assert result.seconds < 10, f"took {result.seconds:.1f} s"


def test_a_full_disk_names_the_path_and_keeps_the_old_plan(tmp_path, monkeypatch):
    import errno

    import ir.output_file

    out = tmp_path / "out.json"
    out.write_text(SENTINEL)
    os.chmod(out, 0o644)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ir.output_file.os, "fsync", full)
    result = run_cli([*GOOD_PLAN, "--out", str(out)])
    line = check_contract(result, rf"cannot write plan {re.escape(str(out))}: No space left on "
                                  r"device, \d+ MB free; the previous file \(if any\) is unchanged",
                          {}, {})
    assert line.startswith("planner: error: ")
    assert out.read_text() == SENTINEL and stat.S_IMODE(os.stat(out).st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary file left


def test_brackets_and_escaped_quotes_inside_strings_do_not_count_as_nesting(base, tmp_path):
    def name(p):
        p["model"]["name"] = '\\"' + "[" * 200 + '\\"{' * 100 + "\\"
    _write(str(tmp_path), "plan.json", edited("plan", name)(base))
    result = run_cli(["show", str(tmp_path / "plan.json")])
    assert result.code == 0, result.stderr
