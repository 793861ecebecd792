"""Dynamic loss scaling for fp16-mixed training, agreed by every rank.

fp16 has 5 exponent bits: gradients below ~6e-8 flush to zero. The loss is multiplied
by `scale` before backward and the gradients divided by it before the optimizer step
(Micikevicius et al. 2018, "Mixed Precision Training", section 3.2). A step whose
gradients hold an inf or nan is skipped and the scale halved; after `growth_interval`
clean steps it doubles: the rule and defaults of `torch.amp.GradScaler`.

Under a plan the gradients are spread over ranks (FSDP shards, TP shards, pipeline
stages), so one rank may overflow where another does not. Each rank checks its own
gradients, and ONE all-reduce (MAX over the default group, the whole world) tells every
rank whether any overflowed: all skip that step together, and every rank's scale stays
the same number.

    scaler = LossScaler()
    loss = scaler.scale(loss); loss.backward()
    if scaler.unscale_and_check(params, device):   # else skipped
        optimizer.step()   # a ShardedOptimizer: step(grad_multiplier=1 / scaler.scale_value)
    scaler.update(); optimizer.zero_grad()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

# torch.amp.GradScaler's defaults (torch/amp/grad_scaler.py): start at 2^16, halve on an
# overflow, double after 2000 clean steps.
INIT_SCALE = 2.0 ** 16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000


@dataclass
class LossScaler:
    """The scale and the count of clean steps since it last changed."""

    scale_value: float = INIT_SCALE
    growth_factor: float = GROWTH_FACTOR
    backoff_factor: float = BACKOFF_FACTOR
    growth_interval: int = GROWTH_INTERVAL
    growth_tracker: int = 0
    skipped_steps: int = 0
    last_step_skipped: bool = field(default=False, init=False)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    def unscale_and_check(self, params: Iterable[torch.nn.Parameter], device: torch.device,
                          multiplied: frozenset[int] = frozenset()) -> bool:
        """Divide every local gradient but the `multiplied` ones by the scale; True when
        no rank's gradients hold an inf or nan (then the optimizer may step)."""
        inverse = 1.0 / self.scale_value
        overflow = torch.zeros((), device=device)
        for p in params:
            if p.grad is None:
                continue
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            if id(p) not in multiplied:
                grad.mul_(inverse)
            # a `multiplied` gradient (`executors.optimizer.multiplied_params`: ZeRO-1's
            # 16-bit ones, beside their fp32 master shard) stays scaled: the optimizer
            # unscales its fp32 copy (`ShardedOptimizer.step(grad_multiplier=)`), since
            # unscaling in fp16 would flush the small values the scale protects
            overflow = torch.maximum(overflow, (~torch.isfinite(grad)).any().to(overflow.dtype))
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(overflow, op=dist.ReduceOp.MAX)
        self.last_step_skipped = bool(overflow.item())
        return not self.last_step_skipped

    def update(self) -> None:
        """After the step: back off on an overflow, grow after enough clean steps."""
        if self.last_step_skipped:
            self.scale_value *= self.backoff_factor
            self.growth_tracker = 0
            self.skipped_steps += 1
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.scale_value *= self.growth_factor
            self.growth_tracker = 0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps (tensors, for DCP)."""
        return {"scale": torch.tensor(self.scale_value, dtype=torch.float64),
                "growth_tracker": torch.tensor(self.growth_tracker, dtype=torch.int64),
                "skipped_steps": torch.tensor(self.skipped_steps, dtype=torch.int64)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.scale_value = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
        self.skipped_steps = int(state["skipped_steps"])
