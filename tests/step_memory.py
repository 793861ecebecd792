"""What a real optimizer step holds beyond what it updates, read by the live-tensor
tracker: the measurement the step-temporaries tests price against."""

from __future__ import annotations

import torch

from ir.memory_tracker import LiveTensorTracker


def measured_step_temp_bytes(opt: torch.optim.Optimizer, params: list) -> int:
    """Peak bytes `opt`'s second step holds over its parameters, gradients (ones) and
    states: the first step makes the moments, so the second allocates only temporaries."""
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()  # the moments are made
    states = [t for st in opt.state.values() for t in st.values()]
    with LiveTensorTracker() as mem:
        mem.track([*params, *(p.grad for p in params), *states])
        held = mem.live_bytes
        opt.step()
    return mem.peak_bytes - held
