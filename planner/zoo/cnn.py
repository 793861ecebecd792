"""CNN: a small ResNet-like image classifier (He et al. 2016, basic blocks).

    stem (3x3 conv, BN, ReLU) -> blocks["0" .. "n-1"] -> pool (global average) -> head

Each block is conv3x3-BN-ReLU-conv3x3-BN plus the identity, then ReLU. All blocks keep
`channels` channels and the full image_size resolution (no downsampling stages), so they
are identical and a planner measures one; that keeps the family small while still having
convolutions, batch norm and residuals. Pipeline stages: `stem`, `pool` and `head` may be
set to None and blocks deleted; forward then takes / returns the activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.zoo import _common


@dataclass(frozen=True)
class Config:
    channels: int = 16  # feature maps in the stem and every block
    blocks: int = 2  # residual blocks
    image_size: int = 16  # square input images, image_size x image_size pixels
    num_classes: int = 10  # classifier outputs
    in_channels: int = 3  # RGB

    def __post_init__(self):
        _common.check_positive("cnn", self, "channels", "blocks", "image_size", "num_classes",
                               "in_channels")


def conv3x3(in_channels: int, out_channels: int) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False)  # BN follows


class Stem(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.conv = conv3x3(c.in_channels, c.channels)
        self.bn = nn.BatchNorm2d(c.channels)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(images)))  # (B, C_in, H, W) -> (B, C, H, W)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(c.channels, c.channels), nn.BatchNorm2d(c.channels)
        self.conv2, self.bn2 = conv3x3(c.channels, c.channels), nn.BatchNorm2d(c.channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))  # (B, C, H, W)
        return F.relu(x + self.bn2(self.conv2(y)))


class Pool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))  # (B, C, H, W) -> (B, C): global average pooling


class CNN(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.stem = Stem(c)
        self.blocks = nn.ModuleDict({str(i): Block(c) for i in range(c.blocks)})
        self.pool = Pool()
        self.head = nn.Linear(c.channels, c.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stem(images) if self.stem is not None else images  # (B, C, H, W)
        for block in self.blocks.values():
            x = block(x)
        x = self.pool(x) if self.pool is not None else x  # (B, C)
        return self.head(x) if self.head is not None else x  # (B, classes)


def build(config: Config) -> CNN:
    return CNN(config)  # PyTorch's default conv/BN/Linear init, deterministic under manual_seed


def example_inputs(config: Config, micro_batch: int, seq_len: int | None = None, device="cpu",
                   generator: torch.Generator | None = None):
    """({"images": (B, C_in, H, W)}, class labels (B,)); seq_len is ignored."""
    shape = (micro_batch, config.in_channels, config.image_size, config.image_size)
    images = _common.randn(shape, device, generator)
    return {"images": images}, _common.randint(config.num_classes, (micro_batch,), device, generator)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target)


def seq_len(config: Config) -> None:
    return None
