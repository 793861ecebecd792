"""A GPT layer graph built from published formulas instead of a trace: a reference input.

Each block carries exactly Korthikanti et al. 2022's activation bytes (16-bit, dropout
on) and Narayanan et al. 2021's FLOPs, so tests can check the cost models against the
papers without the tracer, and the search can be exercised on any size instantly.

    >>> g = gpt_layer_graph(layers=2, hidden=64, heads=4, vocab=128, seq=32)
    >>> [l.kind for l in g.layers]
    ['Embedding', 'GPTBlock', 'GPTBlock', 'Head']
"""

from __future__ import annotations

import hashlib

from ir.layer import Layer, LayerGraph, LayerMeasurement, TPCandidate, TPStyle

# Korthikanti et al. 2022, eq. 1: a block saves s*b*h*(34 + 5*a*s/h) bytes in 16-bit with
# 1-byte dropout masks (CUDA). The IR records masks as measured on meta/CPU, in the
# activation dtype (2 bytes), so a synthetic block stores them that way too: the
# attention mask a*s^2*b and two sbh masks (after attention and after the MLP).
KORTHIKANTI_SBH_COEFF = 34
KORTHIKANTI_ATTENTION_COEFF = 5  # 5*a*s^2*b: scores, softmax output, dropout mask
# Of the 34: 24 lie between a column- and the next row-parallel Linear (sharded by TP),
# 10 are layer-norm inputs, dropout masks and residual inputs (replicated); sec. 4.2.1.
KORTHIKANTI_TP_SHARDED_SBH_COEFF = 24
# A block's modules with parameters (a weight and a bias each): 12h^2 + 13h in all.
BLOCK_MODULES = ("ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc1", "mlp.fc2")
# Selective checkpointing (`ir.checkpoint_policy`) keeps the linears' matmul outputs, in
# b*s*h tensors: q, k, v and the 4h-wide first MLP output between a column- and a
# row-parallel Linear (7), the two row-parallel outputs (2). Its backward rebuilds the
# rest of Korthikanti's saved set: all of it but those 7 and the block input (8 in all);
# full checkpointing rebuilds all of it but the input (1).
SELECTIVE_SHARDED_TENSORS, SELECTIVE_ROWWISE_TENSORS = 7, 2
SELECTIVE_NOT_REBUILT_TENSORS, FULL_NOT_REBUILT_TENSORS = 8, 1
INPUT_ID_BYTES = 8  # int64 token ids
TWO_BYTES = 2  # bf16 activations


def korthikanti_block_bytes(s: int, b: int, h: int, a: int) -> int:
    """s*b*h*(34 + 5*a*s/h): one block's saved activations, no parallelism."""
    return s * b * h * KORTHIKANTI_SBH_COEFF + KORTHIKANTI_ATTENTION_COEFF * a * s * s * b


def gpt_layer_graph(layers: int, hidden: int, heads: int, vocab: int, seq: int,
                    micro_batch: int = 1, name: str = "synthetic-gpt") -> LayerGraph:
    """Embedding, `layers` Megatron GPT blocks and an untied head, measured in bf16."""
    s, b, h, a, v = seq, micro_batch, hidden, heads, vocab
    act = s * b * h * TWO_BYTES  # one b x s x h bf16 tensor
    attention = KORTHIKANTI_ATTENTION_COEFF * a * s * s * b
    block_params = 12 * h * h + 13 * h  # Narayanan et al. 2021: 12h^2 + 13h per block
    cands = (TPCandidate("attn.qkv", TPStyle.COLWISE, 3 * h * h + 3 * h),
             TPCandidate("attn.proj", TPStyle.ROWWISE, h * h + h),
             TPCandidate("mlp.fc1", TPStyle.COLWISE, 4 * h * h + 4 * h),
             TPCandidate("mlp.fc2", TPStyle.ROWWISE, 4 * h * h + h))
    tp_params = 12 * h * h + 7 * h  # all weights + column-parallel biases (3h + 4h)
    block_hash = hashlib.sha1(f"gptblock-{h}-{a}-{s}".encode()).hexdigest()[:12]
    attention_mask = a * s * s * b  # elements
    residual_masks = 2 * s * b * h  # elements
    extra_mask_bytes = (TWO_BYTES - 1) * (attention_mask + residual_masks)
    saved = korthikanti_block_bytes(s, b, h, a) + extra_mask_bytes
    out = [Layer(
        name="embed", kind="Embedding", index=0, params=v * h + s * h,
        param_bytes=(v * h + s * h) * TWO_BYTES, tp_params=v * h,
        measured=LayerMeasurement(saved_activation_bytes=s * b * INPUT_ID_BYTES),
        input_bytes=s * b * INPUT_ID_BYTES, output_bytes=act,
        structural_hash="embed", tp_candidates=(TPCandidate("wte", TPStyle.VOCAB, v * h),),
        tp_divisors=(("vocab", v),), param_names=("embed.wte.weight", "embed.wpe.weight"))]
    for i in range(layers):
        out.append(Layer(
            name=f"blocks.{i}", kind="GPTBlock", index=i + 1, params=block_params,
            param_bytes=block_params * TWO_BYTES, tp_params=tp_params,
            measured=LayerMeasurement(
                flops_fwd=24 * b * s * h * h + 4 * b * s * s * h,  # Narayanan et al. 2021
                flops_bwd=2 * (24 * b * s * h * h + 4 * b * s * s * h),
                saved_activation_bytes=saved,
                saved_tp_sharded_bytes=(KORTHIKANTI_TP_SHARDED_SBH_COEFF * s * b * h + attention
                                        + (TWO_BYTES - 1) * attention_mask),
                saved_attention_bytes=attention + (TWO_BYTES - 1) * attention_mask,
                saved_dropout_mask_bytes=TWO_BYTES * (attention_mask + residual_masks),
                selective_kept_bytes=(SELECTIVE_SHARDED_TENSORS + SELECTIVE_ROWWISE_TENSORS) * act,
                selective_kept_tp_sharded_bytes=SELECTIVE_SHARDED_TENSORS * act,
                selective_kept_rowwise_bytes=SELECTIVE_ROWWISE_TENSORS * act,
                selective_backward_bytes=saved - SELECTIVE_NOT_REBUILT_TENSORS * act,
                full_backward_bytes=saved - FULL_NOT_REBUILT_TENSORS * act),
            input_bytes=act, output_bytes=act,
            structural_hash=block_hash, tp_candidates=cands,
            tp_divisors=(("heads", a), ("hidden", h)), sequence_parallel_ok=True,
            param_names=tuple(f"blocks.{i}.{module}.{kind}" for module in BLOCK_MODULES
                              for kind in ("weight", "bias"))))
    logits = s * b * v * TWO_BYTES
    out.append(Layer(
        name="head", kind="Head", index=layers + 1, params=v * h + 2 * h,
        param_bytes=(v * h + 2 * h) * TWO_BYTES, tp_params=v * h,
        measured=LayerMeasurement(flops_fwd=2 * b * s * h * v, flops_bwd=4 * b * s * h * v,
                                  saved_activation_bytes=2 * act + logits),
        input_bytes=act,
        output_bytes=logits,
        structural_hash="head", tp_candidates=(TPCandidate("lm_head", TPStyle.HEAD, v * h),),
        tp_divisors=(("vocab", v),),
        param_names=("head.norm.weight", "head.norm.bias", "head.lm_head.weight")))
    n = len(out)
    edges = tuple((i, i + 1, out[i].output_bytes) for i in range(n - 1))
    num_params = sum(l.params for l in out)
    fingerprint = hashlib.sha1(f"{name}-{layers}-{h}-{a}-{v}-{s}-{b}".encode()).hexdigest()
    return LayerGraph(model=name, trace_method="synthetic", dtype="bfloat16",
                      micro_batch=b, seq_len=s, layers=tuple(out), edges=edges,
                      num_params=num_params, fingerprint=fingerprint,
                      cut_points=tuple(range(n - 1)), unique_layers_measured=3)
