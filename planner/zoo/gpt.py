"""GPT: a Megatron / GPT-2 style decoder-only transformer.

    embed (token + learned position) -> blocks["0" .. "l-1"] (pre-LN) -> norm -> head

Parameters with ffn = 4h, bias on and a tied head (Narayanan et al. 2021, sec. 5.1):
    P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h))  +  2h for the final LayerNorm
(per block 12h² + 13h: q/k/v/proj 4h² + 4h, MLP 8h² + 5h, two LayerNorms 4h).

Pipeline stages: `embed`, `norm` and `head` may be set to None and blocks deleted from
`blocks`; forward then takes the hidden state (B, T, h) in place of `input_ids` and/or
returns the hidden state in place of the logits. Attention reshapes infer the head count
(`view(B, T, -1, head_dim)`), so a tensor-parallel shard holding heads/tp heads runs the
same code. Attention is written out (no fused kernel) so a tracer sees every matmul.

    >>> model = build(Config())
    >>> inputs, labels = example_inputs(Config(), micro_batch=2)
    >>> loss_fn(model(**inputs), labels).backward()
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
    layers: int = 2  # transformer blocks (l)
    hidden: int = 64  # model width (h)
    heads: int = 4  # attention heads; must divide hidden; 4 allows tensor parallel 2 and 4
    vocab: int = 128  # V; Megatron pads GPT-2's 50257 tokens to 51200 for even TP shards
    seq: int = 32  # s: rows of the learned position table = longest sequence
    ffn: int = 0  # MLP inner width; 0 means 4 * hidden (GPT-2, GPT-3, Megatron)
    dropout: float = 0.1  # embedding, attention-probability and residual dropout (GPT-2)
    tie_embeddings: bool = True  # head reuses the token embedding (GPT-2, Megatron)
    bias: bool = True  # biases in Linear and LayerNorm; Megatron's count assumes them

    def __post_init__(self):
        _common.check_positive("gpt", self, "layers", "hidden", "heads", "vocab", "seq")
        _common.check_divisible("gpt", self, "hidden", "heads")
        if self.ffn < 0 or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"gpt: need ffn >= 0 and 0 <= dropout < 1, got ffn={self.ffn}, "
                             f"dropout={self.dropout}")

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden


class Embedding(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.hidden)
        self.pos = nn.Embedding(c.seq, c.hidden)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
        return self.drop(self.tok(input_ids) + self.pos(positions))  # (B, T, h)


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.n_heads = c.heads  # read by the tensor-parallel analysis (heads % tp == 0)
        self.head_dim = c.hidden // c.heads
        self.q = nn.Linear(c.hidden, c.hidden, bias=c.bias)
        self.k = nn.Linear(c.hidden, c.hidden, bias=c.bias)
        self.v = nn.Linear(c.hidden, c.hidden, bias=c.bias)
        self.proj = nn.Linear(c.hidden, c.hidden, bias=c.bias)
        self.attn_drop = nn.Dropout(c.dropout)
        self.resid_drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T = x.shape[0], x.shape[1]
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, T, T)
        att = att.masked_fill(_common.causal_mask(T, x.device), float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)  # (B, nh, T, hd) -> (B, T, nh*hd)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.fc1 = nn.Linear(c.hidden, c.ffn_size, bias=c.bias)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(c.ffn_size, c.hidden, bias=c.bias)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))  # (B, T, ffn) -> (B, T, h)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.hidden, bias=c.bias)
        self.attn = Attention(c)
        self.ln2 = nn.LayerNorm(c.hidden, bias=c.bias)
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.embed = Embedding(c)
        self.blocks = nn.ModuleDict({str(i): Block(c) for i in range(c.layers)})
        self.norm = nn.LayerNorm(c.hidden, bias=c.bias)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)
        if c.tie_embeddings:
            self.head.weight = self.embed.tok.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) if self.embed is not None else input_ids  # (B, T, h)
        for block in self.blocks.values():
            h = block(h)
        h = self.norm(h) if self.norm is not None else h
        return self.head(h) if self.head is not None else h  # (B, T, V)


def init_weights(model: GPT) -> None:
    """GPT-2 init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2·layers)), zero biases."""
    residual_std = 0.02 / math.sqrt(2 * model.config.layers)
    for name, module in model.named_modules():
        if module is model.head and model.config.tie_embeddings:
            continue  # the shared matrix is initialised once, as the token embedding
        if isinstance(module, nn.Linear):
            is_residual = name.endswith(("attn.proj", "mlp.fc2"))
            nn.init.normal_(module.weight, 0.0, residual_std if is_residual else 0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, 0.02)
        elif isinstance(module, nn.LayerNorm):
            module.reset_parameters()


def build(config: Config) -> GPT:
    model = GPT(config)
    init_weights(model)
    return model


def example_inputs(config: Config, micro_batch: int, seq_len: int | None = None, device="cpu",
                   generator: torch.Generator | None = None):
    """({"input_ids": (B, T)}, next-token labels (B, T))."""
    T = _common.resolve_seq("gpt", config.seq, seq_len, learned_positions=True)
    tokens = _common.randint(config.vocab, (micro_batch, T + 1), device, generator)  # (B, T+1)
    return {"input_ids": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return _common.lm_loss(output, target)


def seq_len(config: Config) -> int:
    return config.seq


def megatron_parameter_count(config: Config) -> int:
    """Narayanan et al. 2021's P plus the final LayerNorm (exact for ffn=4h, bias, tied)."""
    l, h, V, s = config.layers, config.hidden, config.vocab, config.seq
    return 12 * l * h * h + 13 * l * h + (V + s) * h + 2 * h
