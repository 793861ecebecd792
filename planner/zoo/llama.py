"""Llama: a Llama-3 style decoder (RMSNorm, SwiGLU, grouped-query attention, RoPE).

    embed -> blocks["0" .. "l-1"] (pre-RMSNorm) -> norm -> head (untied by default)

Per block: q and o are h×h, k and v are h×(kv_heads·head_dim), the SwiGLU MLP is
3·h·ffn, two RMSNorm weights; no biases anywhere (Touvron et al. 2023; Meta's Llama 3
model cards). Rotary angles are computed in forward from the positions 0..T-1 (no buffer,
so a meta-built model needs no buffer re-initialisation and any T works).

Pipeline stages: `embed`, `norm` and `head` may be set to None and blocks deleted;
forward then takes / returns the hidden state (B, T, h). Reshapes infer the local head
count, so a tensor-parallel shard with heads/tp query heads and kv_heads/tp key/value
heads runs the same code. Attention is written out so a tracer sees every matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.zoo import _common


@dataclass(frozen=True)
class Config:
    layers: int = 2  # transformer blocks
    hidden: int = 64  # model width (h)
    heads: int = 8  # query heads; head_dim = hidden / heads must be even (RoPE pairs)
    kv_heads: int = 4  # key/value heads (GQA); divides heads; 4 allows tensor parallel 4
    ffn: int = 160  # SwiGLU inner width (Llama 3 8B: 14336 = 3.5 · 4096)
    vocab: int = 128  # Llama 3 uses 128256
    seq: int = 32  # training context length; RoPE itself has no limit
    rope_theta: float = 500000.0  # RoPE base; Llama 3 raised it from 10000
    norm_eps: float = 1e-5  # RMSNorm epsilon (Llama 3)
    tie_embeddings: bool = False  # Llama 3 8B/70B/405B have a separate output matrix

    def __post_init__(self):
        _common.check_positive("llama", self, "layers", "hidden", "heads", "kv_heads", "ffn",
                               "vocab", "seq")
        _common.check_divisible("llama", self, "hidden", "heads")
        _common.check_divisible("llama", self, "heads", "kv_heads")
        if (self.hidden // self.heads) % 2:
            raise ValueError(f"llama: head_dim = hidden/heads = {self.hidden // self.heads} "
                             "must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def rotary_cos_sin(length, head_dim: int, theta: float, device):
    """cos and sin of the rotary angles pos · theta^(-2i/head_dim), each (T, head_dim)."""
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponents)  # (hd/2,)
    positions = torch.arange(length, device=device, dtype=torch.float32)  # (T,)
    angles = torch.outer(positions, inv_freq)  # (T, hd/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hd): both halves rotate alike
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (x1, x2) half-pairs of x (B, T, n, hd) by the angles (T, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (B, T, n, hd)
    cos = cos[None, :, None, :].to(x.dtype)  # (1, T, 1, hd)
    sin = sin[None, :, None, :].to(x.dtype)  # (1, T, 1, hd)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.n_heads, self.n_kv_heads = c.heads, c.kv_heads  # read by the TP analysis
        self.head_dim, self.rope_theta = c.head_dim, c.rope_theta
        self.n_rep = c.heads // c.kv_heads  # query heads per key/value head
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T = x.shape[0], x.shape[1]
        q = self.q(x).view(B, T, -1, self.head_dim)  # (B, T, nh, hd)
        k = self.k(x).view(B, T, -1, self.head_dim)  # (B, T, nkv, hd)
        v = self.v(x).view(B, T, -1, self.head_dim)  # (B, T, nkv, hd)
        cos, sin = rotary_cos_sin(T, self.head_dim, self.rope_theta, x.device)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k = k.repeat_interleave(self.n_rep, dim=2)  # (B, T, nh, hd): kv head j serves q heads j*rep..
        v = v.repeat_interleave(self.n_rep, dim=2)  # (B, T, nh, hd)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh, T, hd)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, T, T)
        att = F.softmax(att.masked_fill(_common.causal_mask(T, x.device), float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)  # (B, nh, T, hd) -> (B, T, nh*hd)
        return self.o(y)


class FeedForward(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.gate = nn.Linear(c.hidden, c.ffn, bias=False)
        self.up = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))  # (B, T, ffn) -> (B, T, h)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.attn_norm = nn.RMSNorm(c.hidden, eps=c.norm_eps)
        self.attn = Attention(c)
        self.mlp_norm = nn.RMSNorm(c.hidden, eps=c.norm_eps)
        self.mlp = FeedForward(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleDict({str(i): Block(c) for i in range(c.layers)})
        self.norm = nn.RMSNorm(c.hidden, eps=c.norm_eps)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)
        if c.tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) if self.embed is not None else input_ids  # (B, T, h)
        for block in self.blocks.values():
            h = block(h)
        h = self.norm(h) if self.norm is not None else h
        return self.head(h) if self.head is not None else h  # (B, T, V)


def init_weights(model: Llama) -> None:
    """N(0, 0.02) for every matrix, unit RMSNorm weights; a tied matrix is set once."""
    for module in model.modules():
        if module is model.head and model.config.tie_embeddings:
            continue
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        elif isinstance(module, nn.RMSNorm):
            module.reset_parameters()


def build(config: Config) -> Llama:
    model = Llama(config)
    init_weights(model)
    return model


def example_inputs(config: Config, micro_batch: int, seq_len: int | None = None, device="cpu",
                   generator: torch.Generator | None = None):
    """({"input_ids": (B, T)}, next-token labels (B, T)); any T works with RoPE."""
    T = _common.resolve_seq("llama", config.seq, seq_len, learned_positions=False)
    tokens = _common.randint(config.vocab, (micro_batch, T + 1), device, generator)  # (B, T+1)
    return {"input_ids": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return _common.lm_loss(output, target)


def seq_len(config: Config) -> int:
    return config.seq
