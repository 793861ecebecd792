"""MLP: a stack of Linear + ReLU blocks and a linear classifier -- the simplest planner input.

    blocks["0"]: in_features -> width, blocks["1" .. "l-1"]: width -> width, head: width -> classes

Every block but the first has the same shape, so a planner measures it once. Pipeline
stages: blocks may be deleted and `head` set to None; forward then takes / returns the
(B, width) activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.zoo import _common


@dataclass(frozen=True)
class Config:
    layers: int = 4  # Linear + ReLU blocks (the head is one more Linear)
    width: int = 64  # hidden width of every block
    in_features: int = 32  # input vector length
    out_features: int = 10  # classes

    def __post_init__(self):
        _common.check_positive("mlp", self, "layers", "width", "in_features", "out_features")


class Block(nn.Module):
    def __init__(self, in_features: int, width: int):
        super().__init__()
        self.fc = nn.Linear(in_features, width)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))  # (B, in) -> (B, width)


class MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.blocks = nn.ModuleDict(
            {str(i): Block(c.in_features if i == 0 else c.width, c.width) for i in range(c.layers)})
        self.head = nn.Linear(c.width, c.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return self.head(x) if self.head is not None else x  # (B, classes)


def build(config: Config) -> MLP:
    return MLP(config)  # PyTorch's default Linear init, deterministic under manual_seed


def example_inputs(config: Config, micro_batch: int, seq_len: int | None = None, device="cpu",
                   generator: torch.Generator | None = None):
    """({"x": (B, in_features)}, class labels (B,)); seq_len is ignored."""
    x = _common.randn((micro_batch, config.in_features), device, generator)
    return {"x": x}, _common.randint(config.out_features, (micro_batch,), device, generator)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target)


def seq_len(config: Config) -> None:
    return None
