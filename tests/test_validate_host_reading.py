"""validate's re-reading of the host's per-op figure: read by the probe that made the
spec's figure (the block probe reads ~0.7x the per-pass forward on the same host), and
after the ranks, so that on a GPU the parent's CUDA context holds none of their memory
(review of issue 17, 2026-11-25)."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from planner.cli import main
from planner.trial import predict, run
from tests.cpu_specs import one_cpu_process


def test_a_profiled_cpu_spec_is_reread_by_the_per_pass_probe(monkeypatch):
    from cost_models import host_probes

    spec = dataclasses.replace(one_cpu_process(None), op_overhead_s=5e-6,
                               backward_op_overhead_s=2e-6)  # by pass: the per-pass probe
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(host_probes, "host_op_seconds_by_pass",
                        lambda device: types.SimpleNamespace(forward_s=7e-6))
    monkeypatch.setattr(predict, "host_op_rounds_s", lambda device: [1e-6])
    assert predict.host_op_reading(spec) == (5e-6, 7e-6)
    preset = dataclasses.replace(spec, backward_op_overhead_s=None)  # `local`: the block's
    assert predict.host_op_reading(preset) == (5e-6, 1e-6)


class _Stop(Exception):
    pass


def test_the_host_is_read_after_the_ranks(monkeypatch, tmp_path):
    path = tmp_path / "plan.json"
    assert main(["plan", "gpt-tiny", "--cluster", "local", "--global-batch", "2",
                 "--uniform", "--out", str(path)]) == 0
    calls = []

    def reading(spec):
        calls.append("reading")
        raise _Stop

    monkeypatch.setattr(run, "start_rank_server", lambda model: None)
    monkeypatch.setattr(run, "spawn_ranks", lambda payload, nproc: calls.append("ranks"))
    monkeypatch.setattr(run, "host_op_reading", reading)
    with pytest.raises(_Stop):
        run.validate_plan(str(path), 1)
    assert calls == ["ranks", "reading"]
