"""The first step's gradients of a plan against its reference: one process under the
plan's precision policy (bf16: `mixed_reference`; fp32: the fp32 reference).

A loss trajectory cannot see a wrong gradient of about 1% (`reference.BF16_LOSS_RTOL`:
on gpt-tiny, AdamW at lr 1e-3, halving one block's gradients moved no loss of 10 steps
by more than 4e-5 relative; AdamW normalises a gradient's scale and the loss barely
moves in 10 steps). The gradients themselves show it: before the first optimizer step
both sides hold the same weights and batch, so a layer's gradient norm differs only by
what the plan legitimately reorders, and a layer whose gradient is 1% off is 1e-2 off.

Every rank records, at its first step's `optimizer.step`, the L2 norm of each parameter's
WHOLE gradient (a DTensor's norm is reduced over its mesh), by the parameter's name in
the model (tied copies carry the summed gradient, as the reference's one tied parameter
does). The reference records the same after its first backward (`reference.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ir.strategy import Precision

# Per-layer gradient-norm bound between a bf16 plan and its same-policy reference (a
# layer's norm: over all its parameters; per parameter, a 64-element LayerNorm bias moved
# 1.1e-2 with the batch split, as much as the error to be seen). Measured on gpt-tiny
# (global batch 8, seq 32): in one process, the batch in 2, 4 or 8 chunks (what dp and
# micro-batches split) moved a block's norm <= 4.1e-4 and the final norm layer's (128
# parameters) <= 3.5e-3 (batches 0 and 1); `planner validate` of bf16 plans read worst
# layers 2.1e-4 (dp2, zero3x2), 2.7e-4 (zero1x2), 8.3e-4 (tp2+sp dp2), 9.5e-4 (pp2, 4
# micro-batches), 1.0e-3 (tp2 pp2 dp2), 1.3e-3 (tp2). One block's gradients 0.99x read
# 1.01e-2 (tests/test_validate_grads.py). The fp32 reference's were <= 2.9e-3 off.
BF16_GRAD_NORM_RTOL = 5e-3
# fp32 plans against the fp32 reference: the batch in 2, 4 or 8 chunks moved a layer's
# norm <= 7.8e-8 (gpt-tiny, as above); `planner validate` of fp32 plans (dp2, zero1x2,
# zero3x2, tp2, pp2 with 4 micro-batches, tp2+sp dp2) read worst layers 2.2e-8 to 1.3e-7.
# 1e-4 leaves a 1% error 100x above the bound and rounding 700x below it.
FP32_GRAD_NORM_RTOL = 1e-4
GRAD_NORM_ATOL = 1e-9  # a layer whose gradient is zero on both sides


def grad_norm_rtol(precision: Precision) -> float | None:
    """The per-layer bound of a plan of this precision; None for fp16 (its loss scaling
    skips steps, which no reference here reproduces: its losses alone are checked)."""
    return {Precision.FP32: FP32_GRAD_NORM_RTOL,
            Precision.BF16_MIXED: BF16_GRAD_NORM_RTOL}.get(precision)


def grad_norms(modules: list[nn.Module], skip: frozenset[int] = frozenset(),
               multiplied: frozenset[int] = frozenset(), multiplier: float = 1.0
               ) -> dict[str, float]:
    """{parameter name: fp32 L2 norm of its whole gradient} over `modules` (a rank's
    stage modules); parameters without a gradient, or whose id is in `skip`, are left out.
    Those whose id is in `multiplied` count `multiplier` times their norm: the gradients a
    `ShardedOptimizer` reads times its step's `grad_multiplier` (ZeRO-1's 16-bit ones,
    still unclipped and, under fp16, loss-scaled there), so that every norm is the one the
    optimizer steps with. Collective for DTensor gradients: every rank of a mesh calls it
    in the same order."""
    out: dict[str, float] = {}
    for module in modules:
        for name, param in module.named_parameters():
            if param.grad is None or id(param) in skip or param.grad.is_sparse:
                continue
            norm = torch.linalg.vector_norm(param.grad.float())
            if isinstance(norm, DTensor):
                norm = norm.full_tensor()
            out[name] = float(norm) * (abs(float(multiplier)) if id(param) in multiplied
                                       else 1.0)
    return out


@dataclass(frozen=True, slots=True)
class GradCheck:
    """The verdict: every layer's gradient norm within `rtol` of the reference's."""

    matches: bool
    rtol: float
    worst_layer: str  # the layer furthest off ("" when none compared)
    worst_relative_error: float  # inf when the plan lacks one of its gradients

    def to_json(self) -> dict:
        return {"grad_norms_match_reference": self.matches, "grad_norm_rtol": self.rtol,
                "grad_norm_worst_layer": self.worst_layer,
                # null where a gradient is missing or not finite (JSON has no Infinity)
                "grad_norm_worst_relative_error": (self.worst_relative_error
                                                   if math.isfinite(self.worst_relative_error)
                                                   else None)}


def layer_norms(norms: dict[str, float], names: list[str], layers: list[str]
                ) -> dict[str, float | None]:
    """{layer: L2 norm over the gradients of its parameters among `names`} (None when
    `norms` lacks one of them); layers without such a parameter are left out."""
    out: dict[str, float | None] = {}
    for layer in layers:
        mine = [n for n in names if not layer or n == layer or n.startswith(layer + ".")]
        if mine:
            out[layer] = (math.sqrt(sum(norms[n] ** 2 for n in mine))
                          if all(n in norms for n in mine) else None)
    return out


def check_grad_norms(got: dict[str, float], want: dict[str, float], layers: list[str],
                     rtol: float) -> GradCheck:
    """Per layer, over the reference's parameters (`want`'s names: a tied parameter counts
    in the layer the reference names it by); a parameter missing from `got` fails."""
    names = list(want)
    have, ref = layer_norms(got, names, layers), layer_norms(want, names, layers)
    worst, worst_error, ok = "", 0.0, bool(ref)
    for layer, w in ref.items():
        g = have[layer]
        close = g is not None and math.isfinite(g) and abs(g - w) <= rtol * w + GRAD_NORM_ATOL
        error = abs(g - w) / max(w, GRAD_NORM_ATOL) if g is not None and math.isfinite(g) \
            else math.inf
        ok = ok and close
        if not worst or error > worst_error:
            worst, worst_error = layer, error
    return GradCheck(ok, rtol, worst, worst_error)
