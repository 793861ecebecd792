"""The one definition of what a `Precision` means when a layer runs: FSDP2's
MixedPrecisionPolicy for it. The executor gives it to every data-parallel unit
(`executors.data_parallel`); `planner validate`'s mixed-precision reference
(`planner.trial.reference`) runs one process under the same policy.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from ir.strategy import Precision


def mp_policy(precision: Precision) -> MixedPrecisionPolicy:
    """fp32: no casts; mixed: parameters gathered and computed in the compute dtype (a
    unit's floating inputs cast to it), gradients reduced in fp32."""
    if precision is Precision.FP32:
        return MixedPrecisionPolicy()
    dtype = getattr(torch, precision.compute_dtype)
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
