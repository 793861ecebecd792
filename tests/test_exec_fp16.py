"""fp16-mixed training with dynamic loss scaling equals one process with torch's GradScaler.

The reference is written without the executor: an fp32 master model, an fp16 copy that
runs forward and backward each step (what FSDP2's MixedPrecisionPolicy does), its fp16
gradients cast to fp32 onto the master, and `torch.amp.GradScaler` unscaling, skipping
and adapting. Step 2 overflows on purpose:
  - under tp2 x dp2 (ZeRO-3), one rank's first micro-batch gets an inf activation
    gradient, which the reductions then spread;
  - under pp2 x dp2, one rank's already-reduced local gradient gets an inf that no other
    rank ever sees: only the executor's agreement makes the other stages skip too.
Every rank must skip step 2, the scale must follow the reference's exactly, the losses
and parameters must match within fp16's precision, and a checkpoint restores the scale.
The pp2 x dp2 run also clips by global norm (`max_grad_norm`, ZeRO-1's 16-bit gradients
still scaled in the step): the reference unscales, then clips, as GradScaler documents,
and each stepped step's norm must match; the skipped step reports inf, unclipped.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from executors import apply, full_state_dict
from executors.checkpoint import load_checkpoint, save_checkpoint, step_dir
from executors.loss_scaling import LossScaler
from ir.strategy import Precision
from ir.trace import model_output_tensor
from ir.plan import uniform_plan
from test_exec_plans import GLOBAL_BATCH, GPT, batches_of, build_model, graph_of
from dist_utils import spawn

pytestmark = [pytest.mark.multiprocess]

STEPS = 4
OVERFLOW_STEP = 2  # 1-based
INIT_SCALE = 2.0 ** 10
GROWTH_INTERVAL = 2  # small, so the test also sees the scale grow
LR = 1e-3
# fp16 keeps 11 significant bits (~5e-4 relative); the parallel run sums its gradients
# in another order, so losses and parameters agree to a few ulps of fp16, not to fp32's.
LOSS_RTOL = 2e-3
PARAM_RTOL = 1e-2


def _batches():
    return [b for b in batches_of(GPT)] + [batches_of(GPT)[0]]  # STEPS = 4 global batches


def reference(max_norm: float | None = None) -> dict:
    """One process: fp32 master weights, fp16 compute, torch.amp.GradScaler; with
    `max_norm`, clip_grad_norm_ after the unscale."""
    master, loss_fn = build_model(GPT)
    opt = torch.optim.SGD(master.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    losses, scales, norms = [], [], []
    for step, (inputs, target) in enumerate(_batches(), start=1):
        half = copy.deepcopy(master).half()
        loss = loss_fn(model_output_tensor(half(**inputs)).float(), target)
        scaler.scale(loss).backward()
        for p, h in zip(master.parameters(), half.parameters()):
            p.grad = h.grad.float()
        if step == OVERFLOW_STEP:
            next(master.parameters()).grad.view(-1)[0] = float("inf")
        if max_norm is not None:
            scaler.unscale_(opt)
            norms.append(float(torch.nn.utils.clip_grad_norm_(master.parameters(), max_norm)))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        scales.append(scaler.get_scale())
    return {"losses": losses, "scales": scales, "norms": norms,
            "state": {n: p.detach().clone() for n, p in master.named_parameters()}}


def _overflow_activation_grad(module, step_of):
    """On the first call of the overflow step: make the output's gradient inf."""
    fired = []

    def hook(_module, _inputs, output):
        if step_of() == OVERFLOW_STEP - 1 and not fired:
            fired.append(True)
            output.register_hook(lambda g: torch.full_like(g, float("inf")))
    module.register_forward_hook(hook)


def run_fp16(rank: int, world: int, payload) -> dict:
    name, plan, ckpt_dir = payload
    model, loss_fn = build_model(GPT)
    pm = apply(model, plan, graph_of(GPT), loss_fn=loss_fn, optimizer=torch.optim.SGD,
               optimizer_kwargs={"lr": LR, "momentum": 0.9}, max_grad_norm=CLIP.get(name))
    assert isinstance(pm.loss_scaler, LossScaler)  # fp16-mixed gets one by default
    pm.loss_scaler = LossScaler(scale_value=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    if name == "activation" and rank == 1:
        _overflow_activation_grad(pm.module.get_submodule("blocks.1"), lambda: pm.steps)
    if name == "local-grad" and rank == world - 1:  # a last-stage rank, after reductions
        sync = pm.tied.sync

        def sync_then_overflow():
            sync()
            if pm.steps == OVERFLOW_STEP - 1:
                grad = next(p.grad for p in pm.module.parameters() if p.grad is not None)
                (grad.to_local() if hasattr(grad, "to_local") else grad).view(-1)[0] = float("inf")
        pm.tied.sync = sync_then_overflow
    losses, scales, skipped, norms = [], [], [], []
    for inputs, target in _batches():
        losses.append(pm.train_step(inputs, target))
        norms.append(pm.last_grad_norm)
        scales.append(pm.loss_scaler.scale_value)
        skipped.append(pm.loss_scaler.last_step_skipped)
    state = full_state_dict(pm)
    # the scaler's state travels with the checkpoint
    save_checkpoint(pm, ckpt_dir)
    model, loss_fn = build_model(GPT)
    resumed = apply(model, plan, graph_of(GPT), loss_fn=loss_fn, optimizer=torch.optim.SGD,
                    optimizer_kwargs={"lr": LR, "momentum": 0.9})
    load_checkpoint(resumed, step_dir(ckpt_dir, pm.steps))
    restored = (resumed.loss_scaler.scale_value, resumed.loss_scaler.growth_tracker,
                resumed.loss_scaler.skipped_steps)
    return {"losses": losses, "scales": scales, "skipped": skipped, "restored": restored,
            "norms": norms,
            "saved": (pm.loss_scaler.scale_value, pm.loss_scaler.growth_tracker,
                      pm.loss_scaler.skipped_steps),
            "state": state if rank == 0 else None}


PLANS = {
    "activation": dict(tp=2, dp=2, zero=3, micro_batch=2),
    "local-grad": dict(pp=2, dp=2, zero=1, micro_batch=1),
}


CLIP = {"local-grad": 0.05}  # max_grad_norm: the reference's norms are ~1.5, every step clips
NORM_RTOL = 2e-3  # fp16 gradients summed in another order


@functools.lru_cache(maxsize=None)
def reference_run(max_norm: float | None = None) -> dict:
    return reference(max_norm)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(PLANS))
def test_fp16_overflow_is_skipped_on_every_rank_and_matches_grad_scaler(name, tmp_path):
    plan = uniform_plan(len(graph_of(GPT).layers), global_batch=GLOBAL_BATCH,
                        precision=Precision.FP16_MIXED, optimizer="sgd", **PLANS[name])
    results = spawn(run_fp16, 4, (name, plan, str(tmp_path)), timeout_s=240)
    ref = reference_run(CLIP.get(name))
    assert ref["scales"] == [INIT_SCALE, INIT_SCALE / 2, INIT_SCALE / 2, INIT_SCALE]
    for rank, got in enumerate(results):
        assert got["skipped"] == [s == OVERFLOW_STEP for s in range(1, STEPS + 1)], (rank, got)
        assert got["scales"] == ref["scales"], (rank, got["scales"])
        assert got["restored"] == got["saved"] == (INIT_SCALE, 0, 1), (rank, got)
    got = results[0]
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]),
                               rtol=LOSS_RTOL, atol=0.0)
    for pname, expected in ref["state"].items():
        error = (got["state"][pname].double() - expected.double()).norm()
        assert error <= PARAM_RTOL * expected.double().norm() + 1e-6, (pname, float(error))
    if name in CLIP:
        clipped = [n for s, n in enumerate(ref["norms"], start=1) if s != OVERFLOW_STEP]
        assert min(clipped) > 4 * CLIP[name], ref["norms"]
        for rank, got in enumerate(results):
            assert got["norms"][OVERFLOW_STEP - 1] == float("inf"), (rank, got["norms"])
            stepped = [n for s, n in enumerate(got["norms"], start=1) if s != OVERFLOW_STEP]
            assert stepped == pytest.approx(clipped, rel=NORM_RTOL), (rank, got["norms"])
    else:
        assert all(got["norms"] == [None] * STEPS for got in results)
