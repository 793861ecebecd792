"""Differentiable calls the host benches chain (bench_in_sequence.py, bench_small_backward.py):
28 distinct ATen paths from a 2 x 8 x 8 tensor to one of the same shape. Moved here from
`cost_models.sequence_probes` once no probe the planner runs used them."""

from __future__ import annotations


def chained_calls(device: str) -> list:
    """Differentiable calls from a 2 x 8 x 8 float32 tensor to one of the same shape, one
    Python call each (a chain of them records one autograd node, or a few, per call)."""
    import torch
    import torch.nn.functional as F

    y = torch.randn(2, 8, 8, device=device)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    v = torch.randn(8, device=device, requires_grad=True)
    mask = y > 0
    return [
        torch.tanh, torch.sigmoid, F.relu, F.gelu, F.silu, torch.exp, lambda x: x * 0.5,
        lambda x: x + 1, lambda x: x.pow(2), lambda x: F.softmax(x, -1),
        lambda x: F.layer_norm(x, (8,)), lambda x: F.linear(x, w, v),
        lambda x: torch.matmul(x, w), lambda x: x.transpose(1, 2),
        lambda x: x.clamp(min=-1.0), torch.erf, lambda x: torch.cumsum(x, -1), torch.neg,
        torch.sin, torch.cos, lambda x: F.log_softmax(x, -1), lambda x: x * y,
        lambda x: x + y, lambda x: torch.where(mask, x, y),
        lambda x: x.masked_fill(mask, 0.0), lambda x: x.reshape(2, 64).view(2, 8, 8),
        lambda x: x.sum(-1, keepdim=True).expand(2, 8, 8), lambda x: x - y,
    ]
