"""`planner validate`'s gradient check (issue 17): the first step's gradient norms, per
layer, against one process under the plan's own precision policy.

The spawned test validates the same gpt-tiny ZeRO-1 plan, fp32 and bf16, twice each:
built as is, and built by a factory (`tests.factories:gpt_tiny_wrong_grad`) whose blocks.1
gets 0.99 times its gradients when run on more than one process. The losses of the
wrong bf16 plan pass the old 2% bound; only the gradient check fails it. The right bf16
plan clips (`--clip-grad-norm`, at `reference.MAX_GRAD_NORM`, below its first-step
norm): ZeRO-1's 16-bit gradients reach the step unclipped, their coefficient in the
step's `grad_multiplier`, and the ranks' norms must still match the clipped reference
(read without the multiplier, they failed).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.distributed as dist

from ir.plan import uniform_plan
from ir.strategy import Precision
from planner.cli import main
from planner.trial.grad_check import (BF16_GRAD_NORM_RTOL, FP32_GRAD_NORM_RTOL,
                                      check_grad_norms, grad_norm_rtol)
from planner.trial.reference import BF16_LOSS_RTOL

WRONG = "tests.factories:gpt_tiny_wrong_grad"


def test_the_reference_and_the_executor_read_one_policy():
    import executors.data_parallel
    import ir.precision_policy

    assert executors.data_parallel.mp_policy is ir.precision_policy.mp_policy
    policy = ir.precision_policy.mp_policy(Precision.BF16_MIXED)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)


def test_the_mixed_reference_computes_in_bf16_with_fp32_gradients():
    """One step of gpt-tiny under the bf16 policy: its loss is a bf16 number (the fp32
    reference's is not), it names every parameter's gradient once (the tied head's under
    the embedding), and those gradients are near the fp32 reference's, not equal."""
    from planner.models import load_layer_graph, load_model
    from planner.trial.mixed_reference import MixedPrecision
    from planner.trial.reference import global_batches, reference_run

    graph = load_layer_graph("gpt-tiny", micro_batch=1, dtype=torch.bfloat16)
    plan = uniform_plan(len(graph.layers), global_batch=4, precision=Precision.BF16_MIXED)
    mixed = MixedPrecision.of(plan, graph)
    for other in (Precision.FP32, Precision.FP16_MIXED):
        assert MixedPrecision.of(uniform_plan(len(graph.layers), precision=other), graph) is None
    batches = global_batches("gpt-tiny", 4, None, 1)
    bf16 = reference_run("gpt-tiny", None, "adamw", batches, 1, mixed=mixed)
    fp32 = reference_run("gpt-tiny", None, "adamw", batches, 1)
    assert not dist.is_initialized()  # its one-rank group is gone
    as_bf16 = [float(torch.tensor(x).bfloat16()) for x in (bf16.losses[0], fp32.losses[0])]
    assert as_bf16[0] == bf16.losses[0] and as_bf16[1] != fp32.losses[0]
    names = {n for n, _ in load_model("gpt-tiny").module.named_parameters()}
    assert set(bf16.grad_norms) == set(fp32.grad_norms) == names
    layers = [layer.name for layer in graph.layers]
    close = check_grad_norms(bf16.grad_norms, fp32.grad_norms, layers, rtol=0.01)
    assert close.matches and 0 < close.worst_relative_error, close


def test_gradient_norms_are_compared_per_layer_over_the_reference_names():
    want = {"a.w": 3.0, "a.b": 4.0, "b.w": 1.0}  # layer a's norm is 5
    layers = ["a", "b", "c"]  # c: no parameter in the reference, not compared
    same = check_grad_norms({**want, "c.w": 7.0}, want, layers, 1e-4)  # c.w: a tied copy
    assert same.matches and same.worst_relative_error == 0
    rtol = BF16_GRAD_NORM_RTOL
    near = check_grad_norms({**want, "a.b": math.sqrt((5 * (1 + rtol / 2)) ** 2 - 9)},
                            want, layers, rtol)
    assert near.matches
    off = check_grad_norms({**want, "a.b": math.sqrt((5 * 1.01) ** 2 - 9)}, want, layers, rtol)
    assert not off.matches and off.worst_layer == "a"
    assert off.worst_relative_error == pytest.approx(0.01)
    missing = check_grad_norms({"a.w": 3.0, "a.b": 4.0}, want, layers, 1e-4)
    assert not missing.matches and missing.worst_layer == "b"
    assert missing.worst_relative_error == math.inf
    assert not check_grad_norms({}, {}, layers, 1e-4).matches  # nothing compared: no verdict
    assert grad_norm_rtol(Precision.FP16_MIXED) is None  # its loss scaler skips steps


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", ["bf16-mixed", "fp32"])
@pytest.mark.parametrize("model,right", [("gpt-tiny", True), (WRONG, False)])
def test_a_gradient_one_percent_off_fails_validate_and_passed_the_loss_bound(
        model, right, precision, tmp_path, capsys):
    path = str(tmp_path / "plan.json")
    clip = ["--clip-grad-norm"] if right and precision == "bf16-mixed" else []
    assert main(["plan", model, "--cluster", "local", "--gpus-per-node", "2", "--global-batch",
                 "8", "--uniform", "--dp", "2", "--zero", "1", "--precision", precision,
                 *clip, "--out", path]) == 0
    capsys.readouterr()
    assert main(["validate", path, "--nproc", "2", "--steps", "1", "--json",
                 "--model", model]) == 0
    out = json.loads(capsys.readouterr().out)
    bf16 = precision == "bf16-mixed"
    rtol = BF16_GRAD_NORM_RTOL if bf16 else FP32_GRAD_NORM_RTOL
    assert out["grad_norm_rtol"] == rtol
    assert out["grad_norms_match_reference"] is right, out
    # no loss bound sees it: bf16's 2% passes the wrong plan's losses, and so does fp32's
    # 1e-5 (its 3 checked losses read <= 2e-7 off)
    assert out["loss_matches_reference"] is True
    if bf16:
        assert out["loss_rtol"] == BF16_LOSS_RTOL
    if right:
        assert out["grad_norm_worst_relative_error"] <= rtol
    else:  # blocks.1's norm is 0.99x: 1e-2 off, the other layers' within the bound
        assert out["grad_norm_worst_layer"] == "blocks.1"
        assert out["grad_norm_worst_relative_error"] == pytest.approx(0.01, abs=3e-3)
