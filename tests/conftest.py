"""Fixtures shared across test files: real probes that several files read, run once."""

from __future__ import annotations

import pytest


# The session's one real per-pass host probe at 5 rounds of 20 runs and its F.embedding_bag
# excess at 3 rounds of 20 calls (the kit: 11 x 50 and 9 x 200): its readers check
# structure, units and decade-wide ranges. 1.32 s of thread CPU against 2.53, min of 3
# interleaved, and per-op figures within ~10% of the kit's (load 1.2, 2026-11-26).
SESSION_HOST_OP_SETTINGS = {("host_probes", "HOST_OP_ROUNDS"): 5,
                            ("host_probes", "HOST_OP_RUNS_PER_ROUND"): 20,
                            ("item_probes", "EMBEDDING_BAG_PYTHON_ROUNDS"): 3,
                            ("item_probes", "EMBEDDING_BAG_PYTHON_CALLS"): 20}


@pytest.fixture(scope="session")
def cpu_host_op_probe():
    """One real `host_probes.host_op_seconds_by_pass("cpu")` (SESSION_HOST_OP_SETTINGS)
    for every test that only reads it (structure and units): at the kit's 11 rounds of 50
    runs it took ~6-20 s on this 2-core machine, and test_cost_host and test_forward_host
    each ran it."""
    from cost_models import host_probes, item_probes

    modules = {"host_probes": host_probes, "item_probes": item_probes}
    with pytest.MonkeyPatch.context() as patch:
        for (module, name), value in SESSION_HOST_OP_SETTINGS.items():
            patch.setattr(modules[module], name, value)
        return host_probes.host_op_seconds_by_pass("cpu")


# The session's one real checkpoint probe at the median of 3 rounds, not 7
# (`checkpoint_probes.ROUNDS`): the specs' readers check only that SAC's per-op figures
# lie in (0, 1 ms). 2.21 s of thread CPU against 4.71, min of 2 interleaved, every figure
# within ~15% of the kit's (selective forward 9.7 vs 10.0 us an op; load 0.9, 2026-11-26).
SESSION_CHECKPOINT_ROUNDS = 3


@pytest.fixture(scope="session")
def cpu_checkpoint_host_probe():
    """One real `checkpoint_probes.checkpoint_host_seconds("cpu")` (SESSION_CHECKPOINT_ROUNDS;
    ~5-15 s here at the kit's): both profile-cluster and profile-device write its fields."""
    from cost_models import checkpoint_probes

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint_probes, "ROUNDS", SESSION_CHECKPOINT_ROUNDS)
        return checkpoint_probes.checkpoint_host_seconds("cpu")


@pytest.fixture(scope="session")
def cpu_pipeline_action_probe():
    """One real `pipeline_probes.pipeline_action_host_s("cpu")` (~2-6 s here): profile-
    cluster, profile-device and test_step_host's plausibility check read it."""
    from cost_models.pipeline_probes import pipeline_action_host_s

    return pipeline_action_host_s("cpu")


@pytest.fixture(scope="session")
def shared_cpu_probes(cpu_host_op_probe, cpu_checkpoint_host_probe, cpu_pipeline_action_probe):
    """{probe function's name: a stand-in handing back the session's one real CPU run},
    for a test to set on the module that imported the probe (profile_cluster,
    device_spec): the command still writes the readings into its spec, and the probes
    themselves run once, not once per command."""
    readings = {"host_op_seconds_by_pass": cpu_host_op_probe,
                "checkpoint_host_seconds": cpu_checkpoint_host_probe,
                "pipeline_action_host_s": cpu_pipeline_action_probe}

    def served(name, reading):
        def probe(device, *args, **kwargs):
            assert device == "cpu" and not args and not kwargs, (name, device, args, kwargs)
            return reading
        return probe

    return {name: served(name, reading) for name, reading in readings.items()}


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
