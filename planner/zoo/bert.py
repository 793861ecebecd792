"""BERT: a post-LN transformer encoder with a masked-language-model head (Devlin et al. 2019).

    embed (word + position + token type, LayerNorm, dropout) -> blocks["0" .. "l-1"] -> head

Each block is post-LN: x = LN(x + Attn(x)); x = LN(x + MLP(x)). The MLM head is
dense h×h + GELU + LayerNorm, then a decoder tied to the word embeddings plus a
vocabulary-sized bias. There is no pooler and no next-sentence head (as in Hugging Face's
BertForMaskedLM), so bert-large counts 335.2M parameters; the paper's "340M" includes
the pooler and rounds.

Pipeline stages: `embed` and `head` may be set to None and blocks deleted; forward then
takes the hidden state (B, T, h) as `input_ids` (token_type_ids is then unused) and/or
returns the hidden state. Every sequence is full length (no padding mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.zoo import _common

MASK_PROBABILITY = 0.15  # share of positions that carry an MLM label (Devlin et al. 2019)


@dataclass(frozen=True)
class Config:
    layers: int = 2  # encoder blocks (bert-large: 24)
    hidden: int = 64  # model width (bert-large: 1024)
    heads: int = 4  # attention heads; divides hidden; 4 allows tensor parallel 2 and 4
    ffn: int = 256  # MLP inner width, 4 · hidden in BERT
    vocab: int = 128  # WordPiece vocabulary (bert-large: 30522)
    seq: int = 32  # rows of the learned position table (BERT: 512)
    type_vocab: int = 2  # segment ids: sentence A / sentence B
    dropout: float = 0.1  # embedding, attention-probability and residual dropout
    norm_eps: float = 1e-12  # LayerNorm epsilon of the original BERT

    def __post_init__(self):
        _common.check_positive("bert", self, "layers", "hidden", "heads", "ffn", "vocab", "seq",
                               "type_vocab")
        _common.check_divisible("bert", self, "hidden", "heads")


class Embedding(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.word = nn.Embedding(c.vocab, c.hidden)
        self.pos = nn.Embedding(c.seq, c.hidden)
        self.token_type = nn.Embedding(c.type_vocab, c.hidden)
        self.norm = nn.LayerNorm(c.hidden, eps=c.norm_eps)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
        x = self.word(input_ids) + self.pos(positions) + self.token_type(token_type_ids)
        return self.drop(self.norm(x))  # (B, T, h)


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.n_heads = c.heads  # read by the tensor-parallel analysis
        self.head_dim = c.hidden // c.heads
        self.q = nn.Linear(c.hidden, c.hidden)
        self.k = nn.Linear(c.hidden, c.hidden)
        self.v = nn.Linear(c.hidden, c.hidden)
        self.o = nn.Linear(c.hidden, c.hidden)
        self.attn_drop = nn.Dropout(c.dropout)
        self.resid_drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T = x.shape[0], x.shape[1]
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, nh, T, T)
        att = self.attn_drop(F.softmax(att, dim=-1))  # bidirectional: no mask
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)  # (B, nh, T, hd) -> (B, T, nh*hd)
        return self.resid_drop(self.o(y))


class MLP(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.fc1 = nn.Linear(c.hidden, c.ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(c.ffn, c.hidden)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))  # (B, T, ffn) -> (B, T, h)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.attn = Attention(c)
        self.attn_norm = nn.LayerNorm(c.hidden, eps=c.norm_eps)
        self.mlp = MLP(c)
        self.mlp_norm = nn.LayerNorm(c.hidden, eps=c.norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm(x + self.attn(x))  # post-LN: normalise after the residual add
        return self.mlp_norm(x + self.mlp(x))


class MLMHead(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.dense = nn.Linear(c.hidden, c.hidden)
        self.act = nn.GELU()
        self.norm = nn.LayerNorm(c.hidden, eps=c.norm_eps)
        self.decoder = nn.Linear(c.hidden, c.vocab)  # weight tied to embed.word, own bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.act(self.dense(x))))  # (B, T, V)


class Bert(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.embed = Embedding(c)
        self.blocks = nn.ModuleDict({str(i): Block(c) for i in range(c.layers)})
        self.head = MLMHead(c)
        self.head.decoder.weight = self.embed.word.weight

    def forward(self, input_ids: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        # A later pipeline stage gets only the hidden state: token types are optional there
        # (and default to segment 0 on the first stage, as in BERT).
        if self.embed is not None and token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        h = self.embed(input_ids, token_type_ids) if self.embed is not None else input_ids
        for block in self.blocks.values():
            h = block(h)  # (B, T, h)
        return self.head(h) if self.head is not None else h  # (B, T, V)


def init_weights(model: Bert) -> None:
    """BERT init: N(0, 0.02) matrices, zero biases, unit LayerNorms; the tied matrix once."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            if model.head is None or module is not model.head.decoder:
                nn.init.normal_(module.weight, 0.0, 0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, 0.02)
        elif isinstance(module, nn.LayerNorm):
            module.reset_parameters()


def build(config: Config) -> Bert:
    model = Bert(config)
    init_weights(model)
    return model


def example_inputs(config: Config, micro_batch: int, seq_len: int | None = None, device="cpu",
                   generator: torch.Generator | None = None):
    """Sentence-pair inputs and MLM labels (B, T): a token at ~15% of positions, else -100."""
    B = micro_batch
    T = _common.resolve_seq("bert", config.seq, seq_len, learned_positions=True)
    input_ids = _common.randint(config.vocab, (B, T), device, generator)
    token_type_ids = (torch.arange(T, device=device) >= T // 2).long().expand(B, T)  # A then B
    targets = _common.randint(config.vocab, (B, T), device, generator)
    if torch.device(device).type == "meta":
        return {"input_ids": input_ids, "token_type_ids": token_type_ids}, targets
    chosen = _common.rand((B, T), device, generator) < MASK_PROBABILITY
    chosen[:, 0] = True  # at least one label per row, so the mean loss is defined
    labels = torch.where(chosen, targets, torch.full_like(targets, _common.IGNORE_INDEX))
    return {"input_ids": input_ids, "token_type_ids": token_type_ids.contiguous()}, labels


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return _common.lm_loss(output, target)


def seq_len(config: Config) -> int:
    return config.seq
