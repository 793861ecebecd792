"""bench/bench_kernel_model_pool.py: each row's median error over several kept runs of
bench_kernel_model.py, and the runs kept in the repository stay readable."""

from __future__ import annotations

import glob
import gzip
import json
import os

import pytest

import bench.bench_kernel_model as bench
import bench.bench_kernel_model_pool as pool


def row(layer: str, error: float, phase: str = "fwd") -> dict:
    return {"model": "m", "layer": layer, "micro_batch": 1, "phase": phase, "error": error}


def test_a_row_reads_its_median_range_and_runs_over():
    """Three runs: a row over in one run only has a median within target; a row over in
    every run keeps its sign; each row's range and runs-over count are its own."""
    runs = {"a": [row("x", 0.30), row("y", -0.20)],
            "b": [row("x", 0.05), row("y", -0.40)],
            "c": [row("x", -0.02), row("y", -0.16)]}
    by_layer = {r["layer"]: r for r in pool.pooled_rows(runs)}
    assert by_layer["x"]["median_error"] == pytest.approx(0.05)
    assert (by_layer["x"]["min_error"], by_layer["x"]["max_error"]) == (-0.02, 0.30)
    assert by_layer["x"]["runs_over"] == 1
    assert by_layer["y"]["median_error"] == pytest.approx(-0.20)
    assert by_layer["y"]["runs_over"] == 3


def test_runs_with_other_rows_are_refused_by_name():
    runs = {"a.json": [row("x", 0.1)], "b.json": [row("x", 0.1, phase="bwd")]}
    with pytest.raises(SystemExit, match="b.json: its rows differ"):
        pool.pooled_rows(runs)


def test_a_recorded_run_keeps_only_the_raw_fields_named_by_its_spec_time(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setattr(bench, "RUNS_DIR", str(tmp_path))
    doc = {field: [field] for field in bench.RAW_FIELDS} | {"quick": True, "rows": [1]}
    path = bench.record_run(doc, "x86_64, torch 2.13.0+cpu, 1 thread, 2026-11-26 21:38 UTC")
    assert os.path.basename(path) == "quick-202611262138.json.gz"
    with gzip.open(path, "rt") as f:
        assert json.load(f) == {k: doc[k] for k in bench.RAW_FIELDS}  # no priced rows


def test_every_kept_run_loads_with_the_current_code():
    """The runs in bench/kernel_model_runs/ are what the pool prices by default: each
    must still read into a spec and its timings (graphs stand in: nothing is traced)."""
    paths = sorted(glob.glob(os.path.join(bench.RUNS_DIR, "*.json.gz")))
    assert len(paths) >= 10
    for path in paths:
        traced = _StandIns()
        saved = bench.load_result(path, traced=traced)
        assert len(saved.profiled) == 21 and not saved.quick  # 7 models x 3 micro-batches
        assert saved.spec.kernel_calibration is not None
        assert all(entries for entries in saved.profiled.values())


class _StandIns(dict):
    """A graph cache that answers every key without tracing."""

    def __contains__(self, key) -> bool:
        return True

    def __getitem__(self, key):
        return ("graph", "measurer")


class _Layer:
    def __init__(self, name: str, structural_hash: str):
        self.name, self.structural_hash = name, structural_hash


class _Graph:
    def __init__(self, *layers: _Layer):
        self.layers = list(layers)


def test_a_layer_without_its_saved_entry_or_an_entry_without_its_layer_is_refused():
    """A saved run whose entries no longer match the traced layers (their structural
    hashes moved) would drop those rows silently, run after run: refused in one line
    naming the layer and the leftover entry."""
    graphs = {("gpt-tiny", 4): (_Graph(_Layer("embed", "h0"), _Layer("blocks.0", "h1"),
                                       _Layer("blocks.1", "h1")), "measurer")}
    pool.check_saved_entries("run.json", graphs, {("gpt-tiny", 4): [
        {"structural_hash": "h0"}, {"structural_hash": "h1"}]})  # repeats share one
    with pytest.raises(SystemExit, match=r"^run.json: gpt-tiny mb 4: no saved entry for "
                                         r"layer blocks.0; saved entries of no layer: h9$"):
        pool.check_saved_entries("run.json", graphs, {("gpt-tiny", 4): [
            {"structural_hash": "h0"}, {"structural_hash": "h9"}]})


def test_a_run_lists_the_calibration_fields_its_spec_lacked(tmp_path):
    """A kept run's spec predates terms added since: those fields load as 0 (off). The
    pool lists them per run, read from the raw JSON against the current dataclass."""
    import dataclasses

    from ir.kernel_calibration import KernelCalibration

    fields = [f.name for f in dataclasses.fields(KernelCalibration)]
    path = tmp_path / "old.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"spec_full": {"kernel_calibration": {n: 0.0 for n in fields[1:]}}}, f)
    assert pool.absent_calibration_fields(str(path)) == [fields[0]]
    kept = sorted(glob.glob(os.path.join(bench.RUNS_DIR, "*.json.gz")))[0]
    assert set(pool.absent_calibration_fields(kept)) <= set(fields)


def test_recording_twice_keeps_both_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RUNS_DIR", str(tmp_path))
    doc = {field: [field] for field in bench.RAW_FIELDS} | {"quick": False}
    when = "x86_64, torch 2.13.0+cpu, 1 thread, 2026-11-26 21:38 UTC"
    paths = [bench.record_run(doc, when) for _ in range(3)]
    assert [os.path.basename(p) for p in paths] == [
        "202611262138.json.gz", "202611262138-2.json.gz", "202611262138-3.json.gz"]


def test_record_with_reprice_is_refused_by_argparse(monkeypatch, capsys):
    """--record keeps a timed run; --reprice times nothing: together, an error line."""
    monkeypatch.setattr("sys.argv", ["bench_kernel_model.py", "--reprice", "x.json",
                                     "--record"])
    with pytest.raises(SystemExit) as exit_:
        bench.main()
    assert exit_.value.code == 2
    assert "--record" in capsys.readouterr().err.strip().splitlines()[-1]
