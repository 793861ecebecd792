"""bench/bench_kernel_model.py's schedule: the rows are timed in two mirrored passes
around the spec, each row's timing the mean of its two passes, so a drift of the
machine's speed between the spec and the rows does not read as model error."""

from __future__ import annotations

import pytest

bench = pytest.importorskip("bench.bench_kernel_model")


def fake_entry(name: str, forward_s: float, backward_s: float) -> dict:
    return {"name": name, "structural_hash": name, "forward_seconds": forward_s,
            "backward_seconds": backward_s, "node_span_seconds": 0.0,
            "node_span_spread": 0.0}


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
        return ("spec at", now[0]), None

    monkeypatch.setattr(bench, "profile_graph", profile_graph)
    monkeypatch.setattr(bench, "profile_device", profile_device)
    monkeypatch.setattr(bench, "gemm_shapes", lambda graphs: [])
    graphs = {("a", 1): ("A", None), ("b", 1): ("B", None), ("c", 1): ("C", None)}
    spec, profiled, schedule = bench.interleaved_profile(graphs, 1, 1, log=lambda *a, **k: None)
    assert events == ["A", "B", "C", "spec", "C", "B", "A"]
    assert spec == ("spec at", 4)
    for key in graphs:
        (entry,) = profiled[key]
        assert entry["forward_seconds"] == 4.0  # (1 + 7) / 2, (2 + 6) / 2, (3 + 5) / 2
        assert entry["backward_seconds"] == 8.0
    assert profiled[("a", 1)][0]["passes_s"] == {"fwd": (1.0, 7.0), "bwd": (2.0, 14.0)}
    assert [p["phase"] for p in schedule] == [
        "pass 1 a mb 1", "pass 1 b mb 1", "pass 1 c mb 1", "spec",
        "pass 2 c mb 1", "pass 2 b mb 1", "pass 2 a mb 1"]


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
    """The rows are timed on the clock given (the thread clock by default in `main`), each
    forward less one read of it (a read in the window is the clock's cost, not the
    layer's); the backward's span takes its own cost out already."""
    reads = iter(range(10**6))

    def ticking() -> float:  # each read 0.25 s after the one before
        return next(reads) * 0.25

    def profile_graph(graph, measurer, device, *, warmup, repeats, clock):
        assert clock is ticking
        return [fake_entry("layer", 2.0, 3.0)]

    monkeypatch.setattr(bench, "profile_graph", profile_graph)
    monkeypatch.setattr(bench, "profile_device", lambda *a, **k: ("spec", None))
    monkeypatch.setattr(bench, "gemm_shapes", lambda graphs: [])
    _, profiled, _ = bench.interleaved_profile({("a", 1): ("A", None)}, 1, 1,
                                               log=lambda *a, **k: None, clock=ticking)
    (entry,) = profiled[("a", 1)]
    assert entry["forward_seconds"] == 1.75
    assert entry["backward_seconds"] == 3.0
