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
