"""Test-only settings of named module constants that reach forked ranks: the fork server
(`ir.launch`) imported those modules before a test's monkeypatch ran, so each rank sets
them itself before its real target.

    start_ranks_with(monkeypatch, profile_cluster, {("cost_models.dp_unit_probe",
                                                     "DP_UNIT_STEPS"): 7})
"""

from __future__ import annotations

import importlib


def with_settings(rank: int, settings: dict, fn, *arguments):
    """`fn(rank, *arguments)` once each `settings` {(module, NAME): value} is set here."""
    for (module, name), value in settings.items():
        holder = importlib.import_module(module)
        if not hasattr(holder, name):  # a renamed constant must not pass unnoticed
            raise AttributeError(f"{module} has no {name} to set")
        setattr(holder, name, value)
    return fn(rank, *arguments)


def start_ranks_with(monkeypatch, module, settings: dict) -> None:
    """`module.start_ranks` (`ir.launch.start_ranks`, as `module` imported it) starts
    ranks that run `with_settings(settings)` around the target it is given."""
    real = module.start_ranks

    def start_ranks(fn, nprocs, arguments, folder):
        return real(with_settings, nprocs, (settings, fn, *arguments), folder)

    monkeypatch.setattr(module, "start_ranks", start_ranks)
