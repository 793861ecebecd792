"""`executors.host_collectives`' decisions, one process: when FSDP2's reduce-scatter input
takes a gradient's storage instead of a copy, and which units skip the backward gather.
(The rings' values and peaks on 4 ranks are in tests/test_exec_meta.py.)"""

from __future__ import annotations

import torch
from torch import nn

from executors.host_collectives import RingReduceScatter, _alias_copy_in, weightless_backward


def _ring_input(numel: int, dtype=torch.float32) -> torch.Tensor:
    return RingReduceScatter().allocate((numel,), dtype=dtype, device=torch.device("cpu"))


def test_one_even_gradient_lends_its_storage():
    grad = torch.randn(8, 6)
    want = grad.clone()
    scratch = _ring_input(grad.numel())
    assert _alias_copy_in([grad], scratch, 4)
    assert scratch.data_ptr() == grad.data_ptr()
    # FSDP2's layout (chunk_cat: rank i's rows in row i of (n, numel / n)) is the gradient's
    torch.testing.assert_close(scratch.view(4, -1), want.view(4, -1), rtol=0, atol=0)


def test_other_layouts_are_copied_as_fsdp2_does():
    even = torch.randn(8, 6)
    assert not _alias_copy_in([even, torch.randn(4, 6)], _ring_input(72), 4)  # two tensors
    assert not _alias_copy_in([torch.randn(10, 6)], _ring_input(72), 4)  # padded to 12 rows
    assert not _alias_copy_in([even], torch.empty(48), 4)  # not a ring's buffer
    assert not _alias_copy_in([even], _ring_input(48, torch.float64), 4)  # other dtype
    assert not _alias_copy_in([torch.randn(6, 8).t()], _ring_input(48), 4)  # not contiguous


def test_rows_of_a_larger_gradient_lend_their_memory():
    """A vocabulary-parallel embedding's local gradient: rows of a larger buffer."""
    full = torch.randn(16, 6)
    rows = full[8:]
    want = rows.clone()
    scratch = _ring_input(rows.numel())
    assert _alias_copy_in([rows], scratch, 4)
    assert scratch.data_ptr() == rows.data_ptr()
    torch.testing.assert_close(scratch.view(8, 6), want, rtol=0, atol=0)


def test_only_embeddings_skip_the_backward_gather():
    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos, self.drop = nn.Embedding(8, 4), nn.Embedding(4, 4), nn.Dropout()

    assert weightless_backward(Embed())
    assert weightless_backward(nn.Embedding(8, 4))
    assert not weightless_backward(nn.Sequential(nn.Embedding(8, 4), nn.LayerNorm(4)))
    assert not weightless_backward(nn.Linear(4, 4))
    assert not weightless_backward(nn.Dropout())  # no parameters: nothing to decide
