"""`from planner import auto_parallel`: one process and spawned gloo ranks."""

from __future__ import annotations

import pytest
import torch

from ir.errors import PlannerError
from planner.models import load_model
from tests.dist_utils import spawn

STEPS = 3
SPEC = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=16,dropout=0"
GLOBAL_BATCH = 8


def _batches(loaded, count: int):
    gen = torch.Generator().manual_seed(123)
    fam_inputs = []
    for _ in range(count):
        ids = torch.randint(0, 64, (GLOBAL_BATCH, 16), generator=gen)
        fam_inputs.append(({"input_ids": ids}, torch.roll(ids, -1, dims=1)))
    return fam_inputs


def _reference(steps: int) -> list[float]:
    loaded = load_model(SPEC, micro_batch=GLOBAL_BATCH, device="cpu", seed=0)
    model = loaded.module
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for inputs, target in _batches(loaded, steps):
        opt.zero_grad()
        loss = loaded.loss_fn(model(**inputs), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _run(rank: int, world: int, payload) -> dict:
    from planner import auto_parallel

    loaded = load_model(SPEC, micro_batch=2, device="cpu", seed=0)
    batches = _batches(loaded, STEPS)
    example = ({"input_ids": batches[0][0]["input_ids"][:2]}, batches[0][1][:2])
    pm = auto_parallel(loaded.module, example, loss_fn=loaded.loss_fn,
                       optimizer=torch.optim.AdamW, optimizer_kwargs={"lr": 1e-2},
                       cluster="local", global_batch=GLOBAL_BATCH, **payload)
    losses = [pm.train_step(batch) for batch in batches]
    return {"losses": losses, "plan": str(pm.plan), "world": pm.plan.world_size}


def test_auto_parallel_single_process_matches_plain_training():
    import torch.distributed as dist

    try:
        result = _run(0, 1, {})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert result["world"] == 1
    assert result["losses"] == pytest.approx(_reference(STEPS), rel=1e-5)


def test_auto_parallel_on_two_ranks_plans_once_and_matches():
    results = spawn(_run, 2, {}, timeout_s=300)
    assert results[0]["plan"] == results[1]["plan"]  # rank 0 planned, rank 1 received it
    reference = _reference(STEPS)
    for r in results:
        assert r["world"] == 2
        assert r["losses"] == pytest.approx(reference, rel=1e-5)


def test_auto_parallel_bad_batch_is_a_clear_error():
    from planner.api import _split_batch

    with pytest.raises(PlannerError, match=r"a batch is \(inputs, target\)"):
        _split_batch(torch.zeros(2), ("x",))
