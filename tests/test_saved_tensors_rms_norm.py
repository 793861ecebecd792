"""`RMSNormCalls`: only a call CUDA would fuse has saves beyond the fused kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ir.saved_tensors import SavedTensorLog, storage_key


def _logged(x: torch.Tensor, weight: torch.Tensor) -> SavedTensorLog:
    log = SavedTensorLog({storage_key(weight)}, set())
    with torch.autograd.graph.saved_tensors_hooks(log.pack, log.unpack), log.norms:
        F.rms_norm(x, (x.shape[-1],), weight)
    return log


def test_a_call_cuda_fuses_has_excess_below_its_saves():
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    log = _logged(x, torch.ones(64, dtype=torch.bfloat16, requires_grad=True))
    assert 0 < log.rms_norm_excess < log.total


def test_a_call_cuda_decomposes_too_has_no_excess():
    # bf16 input, fp32 weight: torch.rms_norm does not dispatch to `_fused_rms_norm`
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    log = _logged(x, torch.ones(64, dtype=torch.float32, requires_grad=True))
    assert log.total > 0
    assert log.rms_norm_excess == 0 and log.rms_norm_sharded_excess == 0
