"""bench/bench_kernel_model.py's schedule: the rows are timed in two mirrored passes
around the spec, each row's timing the mean of its two passes, so a drift of the
machine's speed between the spec and the rows does not read as model error."""

from __future__ import annotations

import types

import pytest

import bench.bench_kernel_model as bench


def fake_entry(name: str, forward_s: float, backward_s: float) -> dict:
    return {"name": name, "structural_hash": name, "forward_seconds": forward_s,
            "backward_seconds": backward_s, "node_span_seconds": 0.0,
            "node_span_spread": 0.0}


def fake_spec(name: str, forward_op_s: float):
    """What the schedule reads of a spec: its name and host headline (backward 1 us)."""
    return types.SimpleNamespace(name=name, op_overhead_s=forward_op_s,
                                 backward_op_overhead_s=1e-6)


def test_rows_timed_in_mirrored_passes_around_the_spec(monkeypatch):
    """Pass 1 times the graphs in order, then the spec is measured, then pass 2 times them
    reversed; a clock that slows by 1 s per call (a linear drift) gives every graph's two
    passes the same mean, the spec's own reading (t = 3 for three graphs)."""
    events, now = [], [0.0]

    def profile_graph(graph, measurer, device, *, warmup, repeats, clock):
        now[0] += 1
        events.append(graph)
        return [fake_entry("layer", now[0], 2 * now[0])]

    def profile_device(device, quick=False, extra_gemm_shapes=()):
        now[0] += 1
        events.append("spec")
        return fake_spec(f"spec at {now[0]:.0f}", 2e-6), "tables"

    def spec_from_calibration(device, cal, name):
        assert cal == "tables" and name == "spec at 4"  # the kernel tables kept
        events.append("host again")
        return fake_spec("host again", 3e-6)  # a slower reading: the first is kept

    monkeypatch.setattr(bench, "profile_graph", profile_graph)
    monkeypatch.setattr(bench, "profile_device", profile_device)
    monkeypatch.setattr(bench, "spec_from_calibration", spec_from_calibration)
    monkeypatch.setattr(bench, "gemm_shapes", lambda graphs: [])
    graphs = {("a", 1): ("A", None), ("b", 1): ("B", None), ("c", 1): ("C", None)}
    spec, profiled, schedule = bench.interleaved_profile(graphs, 1, 1, log=lambda *a, **k: None)
    assert events == ["A", "B", "C", "spec", "C", "B", "A", "host again"]
    assert spec.name == "spec at 4"
    for key in graphs:
        (entry,) = profiled[key]
        assert entry["forward_seconds"] == 4.0  # (1 + 7) / 2, (2 + 6) / 2, (3 + 5) / 2
        assert entry["backward_seconds"] == 8.0
    assert profiled[("a", 1)][0]["passes_s"] == {"fwd": (1.0, 7.0), "bwd": (2.0, 14.0)}
    assert [p["phase"] for p in schedule] == [
        "pass 1 a mb 1", "pass 1 b mb 1", "pass 1 c mb 1", "spec",
        "pass 2 c mb 1", "pass 2 b mb 1", "pass 2 a mb 1", "spec host again"]
    assert schedule[-1]["host_op_s"] == [pytest.approx(3e-6), pytest.approx(4e-6)]


def test_faster_host_reading_kept(monkeypatch):
    """A slow spell over the spec's host probes (all its figures 2-3x) loses to the
    reading after pass 2, which replaces the host figures whole."""
    monkeypatch.setattr(bench, "profile_graph", lambda *a, **k: [fake_entry("l", 1.0, 1.0)])
    monkeypatch.setattr(bench, "profile_device",
                        lambda *a, **k: (fake_spec("slow", 6e-6), "tables"))
    monkeypatch.setattr(bench, "spec_from_calibration",
                        lambda device, cal, name: fake_spec("fast", 2.5e-6))
    monkeypatch.setattr(bench, "gemm_shapes", lambda graphs: [])
    spec, _, _ = bench.interleaved_profile({("a", 1): ("A", None)}, 1, 1,
                                           log=lambda *a, **k: None)
    assert spec.name == "fast"


def test_pass_spread_counts_each_pass_alone():
    """A row within 15% on its mean can be over on one pass alone: the spread says so."""
    rows = [{"model": "m", "predicted_s": 1.0, "measured_passes_s": (0.8, 1.1)},
            {"model": "m", "predicted_s": 1.0, "measured_passes_s": (1.0, 1.0)}]
    spread = bench.pass_spread(rows)
    assert spread["max"] == pytest.approx(0.3 / 0.95)
    assert spread["median"] == pytest.approx(0.3 / 0.95)  # the upper of two
    assert spread["over_target_pass1"] == 1  # 1.0 / 0.8 - 1 = +25%
    assert spread["over_target_pass2"] == 0  # 1.0 / 1.1 - 1 = -9%


def test_rows_on_the_given_clock_less_its_read(monkeypatch):
    """The rows are timed on the clock given (`main`'s --clock: wall or thread), each
    forward less one read of it (a read in the window is the clock's cost, not the
    layer's); the backward's span takes its own cost out already."""
    reads = iter(range(10**6))

    def ticking() -> float:  # each read 0.25 s after the one before
        return next(reads) * 0.25

    def profile_graph(graph, measurer, device, *, warmup, repeats, clock):
        assert clock is ticking
        return [fake_entry("layer", 2.0, 3.0)]

    monkeypatch.setattr(bench, "profile_graph", profile_graph)
    monkeypatch.setattr(bench, "profile_device", lambda *a, **k: (fake_spec("s", 1e-6), None))
    monkeypatch.setattr(bench, "spec_from_calibration", lambda *a: fake_spec("s2", 2e-6))
    monkeypatch.setattr(bench, "gemm_shapes", lambda graphs: [])
    _, profiled, _ = bench.interleaved_profile({("a", 1): ("A", None)}, 1, 1,
                                               log=lambda *a, **k: None, clock=ticking)
    (entry,) = profiled[("a", 1)]
    assert entry["forward_seconds"] == 1.75
    assert entry["backward_seconds"] == 3.0
