"""What to do with each layer: tiny frozen strategy types (like DTensor placements).

`str()` is short for tables (`tp2·z3·ckpt`), `repr()` is exact.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class DPMode(str, enum.Enum):
    """How a layer's data-parallel replicas hold model states (ZeRO stages)."""

    REPLICATE = "replicate"  # plain DDP: everything replicated, gradients all-reduced
    ZERO1 = "zero1"  # optimizer states sharded
    ZERO2 = "zero2"  # + gradients sharded (reduce-scatter)
    ZERO3 = "zero3"  # + parameters sharded (all-gather in forward and backward)

    @property
    def stage(self) -> int:
        return {"replicate": 0, "zero1": 1, "zero2": 2, "zero3": 3}[self.value]

    @classmethod
    def from_stage(cls, stage: int) -> "DPMode":
        try:
            return [cls.REPLICATE, cls.ZERO1, cls.ZERO2, cls.ZERO3][stage]
        except (IndexError, TypeError):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}") from None

    def __str__(self) -> str:
        return self.value


class Checkpoint(str, enum.Enum):
    """Activation checkpointing of one layer."""

    NONE = "none"
    SELECTIVE = "selective"  # keep matmul/collective outputs (ir.checkpoint_policy)
    FULL = "full"  # keep the layer input, recompute the whole layer in backward

    def __str__(self) -> str:
        return self.value


class Schedule(str, enum.Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"

    def __str__(self) -> str:
        return self.value


class Precision(str, enum.Enum):
    FP32 = "fp32"
    BF16_MIXED = "bf16-mixed"  # bf16 compute, fp32 master weights and reductions
    FP16_MIXED = "fp16-mixed"

    @property
    def compute_bytes(self) -> int:
        return 4 if self is Precision.FP32 else 2

    @property
    def loss_bytes(self) -> int:
        """Bytes per element of the logits the loss runs on, as the executor runs it:
        fp16-mixed upcasts them to fp32 (`executors.runtime.Runtime._weighted_loss`: its
        scaled gradient would overflow fp16); bf16-mixed keeps bf16 (no autocast)."""
        return 4 if self is Precision.FP16_MIXED else self.compute_bytes

    @property
    def compute_dtype(self) -> str:
        return {"fp32": "float32", "bf16-mixed": "bfloat16", "fp16-mixed": "float16"}[self.value]

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class LayerStrategy:
    """How one layer runs: TP degree, DP degree and mode, sequence parallel, checkpointing."""

    tp: int = 1
    dp: int = 1
    dp_mode: DPMode = DPMode.REPLICATE
    sequence_parallel: bool = False
    checkpoint: Checkpoint = Checkpoint.NONE
    # ZeRO-Offload (Ren et al. 2021): FSDP2's CPUOffloadPolicy keeps the layer's sharded
    # parameters, gradients and optimizer states in host memory and steps it on the CPU.
    offload: bool = False

    def __post_init__(self) -> None:
        if self.tp < 1 or self.dp < 1:
            raise ValueError(f"tp and dp must be >= 1, got tp={self.tp} dp={self.dp}")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tp > 1")
        if self.offload and self.dp_mode is not DPMode.ZERO3:
            raise ValueError(f"offload needs dp_mode zero3 (FSDP2's CPUOffloadPolicy applies "
                             f"to fully_shard), got {self.dp_mode}")

    @property
    def devices(self) -> int:
        return self.tp * self.dp

    def __str__(self) -> str:
        parts = [f"tp{self.tp}"]
        if self.sequence_parallel:
            parts[-1] += "+sp"
        parts.append(f"dp{self.dp}")
        if self.dp_mode is not DPMode.REPLICATE:
            parts.append(f"z{self.dp_mode.stage}" + ("·off" if self.offload else ""))
        if self.checkpoint is not Checkpoint.NONE:
            parts.append("ckpt" if self.checkpoint is Checkpoint.FULL else "sel")
        return "·".join(parts)


@dataclass(frozen=True, slots=True)
class Stage:
    """A pipeline stage: a contiguous layer range [first_layer, last_layer] on `devices` devices."""

    first_layer: int
    last_layer: int  # inclusive
    devices: int

    def __post_init__(self) -> None:
        if self.first_layer > self.last_layer or self.first_layer < 0:
            raise ValueError(f"bad stage layer range [{self.first_layer}, {self.last_layer}]")
        if self.devices < 1:
            raise ValueError(f"a stage needs >= 1 device, got {self.devices}")

    @property
    def num_layers(self) -> int:
        return self.last_layer - self.first_layer + 1

    def __str__(self) -> str:
        return f"L{self.first_layer}-{self.last_layer}@{self.devices}"


def runs_as_dp_unit(holds_params: bool, strategy: LayerStrategy, precision: Precision) -> bool:
    """Whether a layer becomes an FSDP2 unit (`executors.data_parallel`), which the cost
    models price: it holds parameters and runs data parallel, or in mixed precision (its
    unit casts the parameters to the compute dtype)."""
    return holds_params and (strategy.dp > 1 or precision is not Precision.FP32)
