"""Fixtures shared across test files: a real probe that several files read, run once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cpu_host_op_probe():
    """One real `host_probes.host_op_seconds_by_pass("cpu")` for every test that only reads
    it (structure and units): at 11 rounds of 50 runs it takes ~6-20 s on this 2-core
    machine, and test_cost_host and test_forward_host each ran it."""
    from cost_models.host_probes import host_op_seconds_by_pass

    return host_op_seconds_by_pass("cpu")


@pytest.fixture
def few_host_op_rounds(monkeypatch):
    """`host_op_seconds_by_pass` at 3 rounds of 5 runs, and its `F.embedding_bag` excess
    probe at 3 rounds of 20 calls (9 of 200: most of the probe's time), for tests that
    check what it does with its parts (stand-in figures, the order of its timed calls),
    not a measured value."""
    from cost_models import host_probes, item_probes

    monkeypatch.setattr(host_probes, "HOST_OP_ROUNDS", 3)
    monkeypatch.setattr(host_probes, "HOST_OP_RUNS_PER_ROUND", 5)
    monkeypatch.setattr(item_probes, "EMBEDDING_BAG_PYTHON_ROUNDS", 3)
    monkeypatch.setattr(item_probes, "EMBEDDING_BAG_PYTHON_CALLS", 20)
