"""T5: an encoder-decoder transformer with relative position biases (Raffel et al. 2020).

    embed -> encoder_rel_bias -> encoder_blocks -> encoder_norm          (encoder output E)
    decoder_embed -> decoder_rel_bias -> decoder_blocks(·, E) -> decoder_norm -> head

Each decoder block reads the encoder output E (cross-attention), so the layer graph is a
DAG, not a chain. Norms are T5's RMS LayerNorm (scale only, no mean, no bias); linears
have no bias; attention logits are not scaled by 1/sqrt(d_kv) (T5 folds that into the
init of q).

Relative position bias (our choice): one bias table per stack, held by the top-level
modules `encoder_rel_bias` / `decoder_rel_bias`. Each computes the (1, heads, T, T) bias
once per forward from the sequence length, and every block of its stack adds it to its
self-attention logits -- as in T5, where the first block owns the table and passes the
bias on. The decoder's bias also carries the causal mask. Cross-attention has no bias.

`decoder_embed` is a second module whose weight *is* `embed`'s (T5's shared embedding),
so every layer runs once and modules appear in execution order; with tie_embeddings
(T5 v1.0) the head is tied too and its input is scaled by d_model^-0.5.

Pipeline pruning: blocks may be deleted, `embed`/`decoder_embed` set to None (the inputs
are then hidden states) and `head` set to None (returns the decoder hidden state). T5 is
exempt from stage-by-stage pipeline pruning: a stage boundary inside the decoder has to
carry both the encoder output and the decoder hidden state, which a one-tensor stage
interface cannot express, and the relative-bias modules must stay in every stage.
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
    layers: int = 2  # encoder blocks (t5-large: 24)
    decoder_layers: int = 2  # decoder blocks (t5-large: 24)
    d_model: int = 64  # model width (t5-large: 1024)
    d_kv: int = 16  # width of one head's q/k/v; heads * d_kv need not equal d_model
    heads: int = 4  # attention heads; 4 allows tensor parallel 2 and 4
    d_ff: int = 128  # ReLU feed-forward inner width (t5-large: 4096)
    vocab: int = 128  # SentencePiece vocabulary (T5: 32128, 32000 padded to a multiple of 128)
    seq: int = 32  # training length of encoder and decoder inputs (T5: 512)
    dropout: float = 0.1  # T5 pre-training dropout rate
    relative_buckets: int = 32  # rows of the relative position bias table (T5)
    relative_max_distance: int = 128  # distances beyond this share the last bucket (T5)
    norm_eps: float = 1e-6  # T5 LayerNorm epsilon
    tie_embeddings: bool = True  # T5 v1.0 ties the head to the shared embedding; v1.1 does not

    def __post_init__(self):
        _common.check_positive("t5", self, "layers", "decoder_layers", "d_model", "d_kv", "heads",
                               "d_ff", "vocab", "seq", "relative_buckets", "relative_max_distance")


def relative_buckets(relative: torch.Tensor, bidirectional: bool, num_buckets: int,
                     max_distance: int) -> torch.Tensor:
    """T5's bucketing of relative = key_pos - query_pos: exact when small, log-spaced beyond."""
    offset = 0
    if bidirectional:  # half the buckets for keys after the query, half for keys before
        num_buckets //= 2
        offset = (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:  # a causal decoder only sees keys at or before the query
        distance = (-relative).clamp(min=0)
    max_exact = num_buckets // 2
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    far = (max_exact + log_ratio * (num_buckets - max_exact)).long().clamp(max=num_buckets - 1)
    return offset + torch.where(distance < max_exact, distance, far)


class RelativeBias(nn.Module):
    """(1, heads, T, T) attention bias from a (buckets × heads) table; causal adds the mask."""

    def __init__(self, c: Config, causal: bool):
        super().__init__()
        self.causal = causal
        self.num_buckets, self.max_distance = c.relative_buckets, c.relative_max_distance
        self.table = nn.Embedding(c.relative_buckets, c.heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, T, d): only T and device used
        positions = torch.arange(x.shape[1], device=x.device)  # (T,)
        relative = positions[None, :] - positions[:, None]  # (Tq, Tk): key - query
        buckets = relative_buckets(relative, not self.causal, self.num_buckets, self.max_distance)
        bias = self.table(buckets).permute(2, 0, 1).unsqueeze(0)  # (Tq, Tk, nh) -> (1, nh, Tq, Tk)
        if self.causal:
            bias = bias.masked_fill(relative > 0, float("-inf"))  # hide future keys
        return bias


class Embed(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.tok(ids))  # (B, T, d)


class FinalNorm(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(x))


class Attention(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.n_heads, self.d_kv = c.heads, c.d_kv  # n_heads is read by the TP analysis
        self.q = nn.Linear(c.d_model, c.heads * c.d_kv, bias=False)
        self.k = nn.Linear(c.d_model, c.heads * c.d_kv, bias=False)
        self.v = nn.Linear(c.d_model, c.heads * c.d_kv, bias=False)
        self.o = nn.Linear(c.heads * c.d_kv, c.d_model, bias=False)
        self.attn_drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, bias: torch.Tensor | None):
        B, Tq, Tk = x.shape[0], x.shape[1], memory.shape[1]
        q = self.q(x).view(B, Tq, -1, self.d_kv).transpose(1, 2)  # (B, nh, Tq, dkv)
        k = self.k(memory).view(B, Tk, -1, self.d_kv).transpose(1, 2)  # (B, nh, Tk, dkv)
        v = self.v(memory).view(B, Tk, -1, self.d_kv).transpose(1, 2)  # (B, nh, Tk, dkv)
        att = q @ k.transpose(-2, -1)  # (B, nh, Tq, Tk), unscaled as in T5
        if bias is not None:
            att = att + bias  # (1, nh, Tq, Tk) broadcast over the batch
        att = self.attn_drop(F.softmax(att.float(), dim=-1).type_as(att))
        y = (att @ v).transpose(1, 2).reshape(B, Tq, -1)  # (B, nh, Tq, dkv) -> (B, Tq, nh*dkv)
        return self.o(y)


class FeedForward(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.wi = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.drop = nn.Dropout(c.dropout)
        self.wo = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.drop(F.relu(self.wi(x))))  # (B, T, d_ff) -> (B, T, d)


class EncoderBlock(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.attn_norm, self.attn = nn.RMSNorm(c.d_model, eps=c.norm_eps), Attention(c)
        self.ff_norm, self.ff = nn.RMSNorm(c.d_model, eps=c.norm_eps), FeedForward(c)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        n = self.attn_norm(x)
        x = x + self.drop(self.attn(n, n, bias))
        return x + self.drop(self.ff(self.ff_norm(x)))


class DecoderBlock(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.self_norm, self.self_attn = nn.RMSNorm(c.d_model, eps=c.norm_eps), Attention(c)
        self.cross_norm, self.cross_attn = nn.RMSNorm(c.d_model, eps=c.norm_eps), Attention(c)
        self.ff_norm, self.ff = nn.RMSNorm(c.d_model, eps=c.norm_eps), FeedForward(c)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, y: torch.Tensor, encoded: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        n = self.self_norm(y)
        y = y + self.drop(self.self_attn(n, n, bias))
        y = y + self.drop(self.cross_attn(self.cross_norm(y), encoded, None))
        return y + self.drop(self.ff(self.ff_norm(y)))


class T5(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.config = c
        self.embed = Embed(c)
        self.encoder_rel_bias = RelativeBias(c, causal=False)
        self.encoder_blocks = nn.ModuleDict({str(i): EncoderBlock(c) for i in range(c.layers)})
        self.encoder_norm = FinalNorm(c)
        self.decoder_embed = Embed(c)
        self.decoder_embed.tok.weight = self.embed.tok.weight  # T5's shared embedding
        self.decoder_rel_bias = RelativeBias(c, causal=True)
        self.decoder_blocks = nn.ModuleDict({str(i): DecoderBlock(c) for i in range(c.decoder_layers)})
        self.decoder_norm = FinalNorm(c)
        self.head = nn.Linear(c.d_model, c.vocab, bias=False)
        if c.tie_embeddings:
            self.head.weight = self.embed.tok.weight

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) if self.embed is not None else input_ids  # (B, S, d)
        encoder_bias = self.encoder_rel_bias(x)  # (1, nh, S, S)
        for block in self.encoder_blocks.values():
            x = block(x, encoder_bias)
        encoded = self.encoder_norm(x) if self.encoder_norm is not None else x  # (B, S, d)
        y = self.decoder_embed(decoder_input_ids) if self.decoder_embed is not None else decoder_input_ids
        decoder_bias = self.decoder_rel_bias(y)  # (1, nh, T, T), causal
        for block in self.decoder_blocks.values():
            y = block(y, encoded, decoder_bias)  # (B, T, d)
        y = self.decoder_norm(y) if self.decoder_norm is not None else y
        if self.head is None:
            return y
        if self.config.tie_embeddings:
            y = y * self.config.d_model ** -0.5  # T5 v1.0 rescales before the tied head
        return self.head(y)  # (B, T, V)


def init_weights(model: T5) -> None:
    """Mesh TensorFlow's T5 init: std 1 embeddings, fan-in scaled projections (q absorbs 1/sqrt(d_kv))."""
    c = model.config
    stds = {"q": (c.d_model * c.d_kv) ** -0.5, "k": c.d_model ** -0.5, "v": c.d_model ** -0.5,
            "o": (c.heads * c.d_kv) ** -0.5, "wi": c.d_model ** -0.5, "wo": c.d_ff ** -0.5,
            "table": c.d_model ** -0.5, "tok": 1.0, "head": 1.0}
    for name, module in model.named_modules():
        if name == "decoder_embed" or (name == "head" and c.tie_embeddings):
            continue  # shared with embed, initialised there
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, stds[name.rsplit(".", 1)[-1]])
        elif isinstance(module, nn.RMSNorm):
            module.reset_parameters()


def build(config: Config) -> T5:
    model = T5(config)
    init_weights(model)
    return model


def example_inputs(config: Config, micro_batch: int, seq_len: int | None = None, device="cpu",
                   generator: torch.Generator | None = None):
    """Encoder ids (B, S), decoder ids = labels shifted right behind start token 0, labels (B, S)."""
    T = _common.resolve_seq("t5", config.seq, seq_len, learned_positions=False)
    input_ids = _common.randint(config.vocab, (micro_batch, T), device, generator)
    labels = _common.randint(config.vocab, (micro_batch, T), device, generator)
    decoder_input_ids = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)  # (B, T)
    return {"input_ids": input_ids, "decoder_input_ids": decoder_input_ids}, labels


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return _common.lm_loss(output, target)


def seq_len(config: Config) -> int:
    return config.seq
