"""Model factories for `package.module:factory` specs used by the tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TwoLayerMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum().item() > 0:  # data-dependent control flow defeats both tracers
            return y * 2
        return y


def _batch(micro_batch, device):
    x = torch.zeros(micro_batch, 4, device=device)
    return {"x": x}


def two_layer_mlp(micro_batch=1, seq_len=None, device="meta"):
    with torch.device(device):
        model = TwoLayerMLP()
    target = torch.zeros(micro_batch, dtype=torch.long, device=device)
    return model, _batch(micro_batch, device), target, F.cross_entropy


def data_dependent(micro_batch=1, seq_len=None, device="meta"):
    with torch.device(device):
        model = DataDependent()
    return model, _batch(micro_batch, device), None, None


class BasicBlock(nn.Module):
    """He et al. 2016's basic block, downsampling by `stride` (conv + BN on the shortcut)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                                      nn.BatchNorm2d(out_channels))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))  # (B, C_out, H / stride, W / stride)
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


NECK_MOMENTUM = 0.3  # not torch's 0.1: the running statistics follow the module's own


class ResNetBN(nn.Module):
    """A small ResNet whose BatchNorms vary: one is a layer by itself (stem_bn), one is 1-D
    with its own momentum (neck_bn). (momentum=None cannot be measured on the meta device:
    torch's BatchNorm reads num_batches_tracked as a Python float.)"""

    def __init__(self, channels: int = 8, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(channels)
        self.block = BasicBlock(channels, 2 * channels, stride=2)
        self.neck_bn = nn.BatchNorm1d(2 * channels, momentum=NECK_MOMENTUM)
        self.head = nn.Linear(2 * channels, num_classes)

    def forward(self, images):
        x = F.relu(self.stem_bn(self.stem(images)))  # (B, C, H, W)
        x = self.block(x).mean(dim=(2, 3))  # (B, 2C): global average pooling
        return self.head(self.neck_bn(x))  # (B, classes)


RESNET_IMAGE_SIZE = 8  # pixels per side: small enough for 2 CPU cores, large enough to downsample


def resnet_bn(micro_batch=1, seq_len=None, device="meta", seed=0):
    with torch.device(device):
        model = ResNetBN()
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(micro_batch, 3, RESNET_IMAGE_SIZE, RESNET_IMAGE_SIZE,
                         generator=generator).to(device) * 2 + 1  # mean 1, std 2: BN matters
    target = torch.randint(0, 10, (micro_batch,), generator=generator).to(device)
    return model, {"images": images}, target, F.cross_entropy


WRONG_GRAD_SCALE = 0.99  # blocks.1's parameter gradients in a distributed run: 1% short


class _ScaleBackward(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by `factor`."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.clone()  # not a view: FSDP2 warns an output view may lose its hooks

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _in_a_world() -> bool:
    import torch.distributed as dist

    return dist.is_initialized() and dist.get_world_size() > 1


def gpt_tiny_wrong_grad(micro_batch=1, seq_len=None, device="meta"):
    """gpt-tiny whose blocks.1 gets 0.99 times its parameters' gradients when run on more
    than one process (its output's gradient scaled by 0.99, its input's by 1 / 0.99: the
    other layers' gradients stay right): a plan that drops a 1%-sized gradient term, which
    the one-process references do not drop."""
    from planner.models import load_model

    loaded = load_model("gpt-tiny", micro_batch, seq_len, device)
    block = loaded.module.get_submodule("blocks.1")
    block.register_forward_pre_hook(lambda _m, args: (
        (_ScaleBackward.apply(args[0], 1 / WRONG_GRAD_SCALE),) + args[1:]
        if _in_a_world() else args))
    block.register_forward_hook(lambda _m, _args, out: (
        _ScaleBackward.apply(out, WRONG_GRAD_SCALE) if _in_a_world() else out))
    return loaded.module, loaded.inputs, loaded.target, loaded.loss_fn
