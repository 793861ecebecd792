"""The optimizer step's per-tensor sizes on a TP rank (`step_tensor_params`) name each
tensor as the executor steps it, tied copies included, even where sizes coincide."""

from __future__ import annotations

import pytest
import torch
from torch import nn

VOCAB, DIM = 64, 32  # the head's table and the tied projection: 2048 elements each


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class _Head(nn.Module):
    """An output prior table of its own (a bare Parameter: TP leaves it whole), registered
    before the vocabulary projection tied to the embedding (TP splits it by vocabulary)."""

    def __init__(self) -> None:
        super().__init__()
        self.prior = nn.Parameter(torch.zeros(VOCAB, DIM))
        self.out = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        return self.out(x) + x @ self.prior.t()


class _TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([_Block(), _Block()])
        self.head = _Head()
        self.head.out.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_a_tied_copy_is_not_priced_as_its_same_size_neighbour():
    """The head steps `prior` (whole at tp=2, 2048) then its copy of the tied `out`
    (1024 at tp=2). Tied copies used to be placed by size, at the first 2048-element
    tensor: the sizes came out swapped, (1024, 2048), and single-tensor AdamW's
    temporaries priced 2 x 2048 + 1024 elements (20480 B) where a real step of the
    rank's two tensors in that order holds 16384 B."""
    from cost_models.memory_walk import LayerMemory
    from cost_models.model_states import ModelStates
    from cost_models.step_temporaries import optimizer_step_temp_bytes, step_tensor_params
    from ir.measure import build_layer_graph
    from tests.step_memory import measured_step_temp_bytes
    from ir.strategy import LayerStrategy

    with torch.device("meta"):
        model = _TiedLM()
    ids = torch.zeros(2, 8, dtype=torch.long, device="meta")
    head = build_layer_graph(model, {"ids": ids}).layer("head")
    assert head.tied_param_names == ("head.out.weight",) and head.tp_violation(2) is None
    local = step_tensor_params(head, LayerStrategy(tp=2), 1e12)
    assert local == (VOCAB * DIM, VOCAB * DIM / 2)  # parameters() order: prior, out

    params = [nn.Parameter(torch.randn(int(n))) for n in local]  # the rank's tensors
    opt = torch.optim.AdamW(params, foreach=False)
    measured = measured_step_temp_bytes(opt, params)
    priced = optimizer_step_temp_bytes(
        [LayerMemory(states=ModelStates(0, 0, 0), activations=None, gather_unit_bytes=0,
                     unsharded_grad_bytes=0, step_tensor_params=local,
                     fp32_moment_bytes=4.0 * sum(local))], "adamw", "single")
    assert priced == 2 * VOCAB * DIM * 4
    assert measured == pytest.approx(priced, abs=64)
