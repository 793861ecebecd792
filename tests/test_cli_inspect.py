"""`planner inspect` and `planner profile` end to end, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cost_models.layer_profile import load_profile
from ir.errors import PlannerError
from planner.cli import main
from tests.cli_run import run_cli, run_cli_strict


def planner(*args: str) -> subprocess.CompletedProcess:
    """`python -m planner.cli ARGS` in a fresh interpreter: the entry point, and a stderr
    that holds whatever a first import or a first trace prints (~2-3 s of CPU each)."""
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_inspect_json_contract(capsys):
    assert main(["inspect", "gpt-tiny", "--micro-batch", "2", "--seq-len", "16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "gpt-tiny" and doc["trace_method"] in ("fx", "export")
    assert isinstance(doc["num_params"], int) and doc["seq_len"] == 16 and doc["micro_batch"] == 2
    keys = {"name", "kind", "params", "param_bytes", "flops_fwd", "flops_bwd",
            "saved_activation_bytes", "output_bytes"}
    for layer in doc["layers"]:
        assert keys <= set(layer)
        assert all(isinstance(layer[k], int) for k in keys - {"name", "kind"})
    assert sum(l["params"] for l in doc["layers"]) == doc["num_params"]


def test_inspect_table_groups_repeated_blocks(capsys):
    assert main(["inspect", "gpt:layers=6,hidden=64,heads=4,vocab=128,seq=16"]) == 0
    out = capsys.readouterr().out
    assert "blocks.0 .. blocks.5" in out and "x6" in out
    assert "parameters" in out and "cut points" in out


def test_unknown_preset_is_one_line_and_exit_2():
    result = run_cli_strict(["inspect", "gpt-huge"])
    assert result.code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown model 'gpt-huge'" in lines[0] and "gpt3-175b" in lines[0]
    assert "Traceback" not in result.stderr


def test_untraceable_factory_is_one_line_without_traceback_unless_debug():
    spec = "tests.factories:data_dependent"
    result = planner("inspect", spec)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "DataDependent" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    with pytest.raises(PlannerError, match="DataDependent"):  # uncaught: the traceback
        run_cli(["--debug", "inspect", spec])


def test_missing_hf_config_names_the_file():
    result = run_cli_strict(["inspect", "hf:does/not/exist.json"])
    assert result.code == 2 and "does/not/exist.json" in result.stderr


def test_factory_models_inspect(capsys):
    assert main(["inspect", "tests.factories:two_layer_mlp", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["num_params"] == 4 * 8 + 8 + 8 * 2 + 2


def test_profile_measures_real_seconds_and_bytes(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(["profile", "gpt-tiny", "--repeats", "2", "--warmup", "1", "--out", str(out)]) == 0
    doc = load_profile(str(out))
    assert doc["device"] == "cpu" and doc["dtype"] == "float32"
    assert len(doc["layers"]) == 4  # embedding, block (x4, measured once), norm, head
    for layer in doc["layers"]:
        assert layer["forward_seconds"] > 0 and layer["backward_seconds"] >= 0
    # Real CPU tensors save exactly what the meta measurement predicts.
    inspect = json.loads(_inspect_json(capsys, "gpt-tiny", "fp32"))
    by_hash = {l["structural_hash"]: l for l in inspect["layers"]}
    for layer in doc["layers"]:
        assert layer["saved_activation_bytes"] == by_hash[layer["structural_hash"]]["saved_activation_bytes"]


def _inspect_json(capsys, spec, dtype):
    capsys.readouterr()
    assert main(["inspect", spec, "--dtype", dtype, "--json"]) == 0
    return capsys.readouterr().out


def test_bad_profile_file_is_rejected(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    with pytest.raises(PlannerError, match="not valid JSON"):
        load_profile(str(bad))
