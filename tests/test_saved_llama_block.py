"""A llama block's saved activations, counted by hand (issue 17): what the IR measures on
meta is what autograd keeps on CPU, where `nn.RMSNorm` runs torch's composite
(`rms_norm_composite`: the fp32 upcast input, its rsqrt and the fp32 normalised input are
saved, 8h + 4 bytes a token). CUDA runs `aten::_fused_rms_norm` instead, whose backward
keeps only its input and the fp32 rstd (derivatives.yaml: 2h + 4 bytes a token in bf16),
so on an H100 each RMSNorm keeps 6h bytes a token less than this count: 1.66 GB of
llama3.2-1b's 33 norms at 4 x 1024 tokens, not yet priced (no CUDA device to show it)."""

from __future__ import annotations

import torch

from ir.saved_tensors import storage_bytes, storage_key
from planner.models import load_layer_graph
from planner.zoo import llama

B, T, H, HEADS, KV_HEADS, FFN, VOCAB = 2, 32, 64, 4, 2, 128, 256  # head_dim 16 != T
SPEC = (f"llama:layers=2,hidden={H},heads={HEADS},kv_heads={KV_HEADS},ffn={FFN},"
        f"vocab={VOCAB},seq={T}")


def _hand_count() -> int:
    head_dim = H // HEADS
    per_norm = 4 * H + 4 + 4 * H  # fp32 input, fp32 rsqrt, fp32 normalised input
    attention = (2 * H  # the normalised input q, k and v read
                 + 2 * H + 2 * H  # q and repeated k, copied for the score bmm
                 + 2 * HEADS * T  # softmax output
                 + 2 * H  # repeated v, copied for att @ v
                 + 2 * H)  # o's input
    mlp = 2 * H + 4 * 2 * FFN  # normalised input; gate, silu, up, product outputs
    per_token = 2 * per_norm + attention + mlp
    rotary = 4 * T * head_dim * 2  # cos and sin in bf16, for q and for k
    mask = T * T  # bool causal mask
    return B * T * per_token + rotary + mask


def test_llama_block_saved_bytes_hand_count():
    graph = load_layer_graph(SPEC, micro_batch=B, seq_len=T, dtype=torch.bfloat16)
    block = next(l for l in graph.layers if l.name == "blocks.0")
    assert block.saved_activation_bytes == _hand_count()
    assert block.saved_attention_bytes == B * HEADS * T * T * 2


def test_a_cpu_block_saves_the_hand_count():
    """Real bf16 tensors on CPU, autograd's saved tensors (each storage once, parameters
    excluded): the same bytes as the meta measurement."""
    config = llama.Config(layers=1, hidden=H, heads=HEADS, kv_heads=KV_HEADS, ffn=FFN,
                          vocab=VOCAB, seq=T)
    block = llama.Block(config).to(torch.bfloat16)
    params = {storage_key(p) for p in block.parameters()}
    seen: dict = {}

    def pack(t):
        if storage_key(t) not in params:
            seen[storage_key(t)] = storage_bytes(t)
        return t

    x = torch.randn(B, T, H, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = block(x)  # keeps the saved tensors alive: no storage address is reused
    assert y.shape == x.shape and sum(seen.values()) == _hand_count()
