"""Find a layer's tensor-parallel candidates (Megatron-LM's split, Shoeybi et al. 2019).

Inside a block, the linears that open a parallel region (attention q/k/v, MLP up/gate)
are column-parallel and the ones that close it (attention out, MLP down) are
row-parallel; a large embedding is vocab-parallel and a vocabulary-sized output
projection outside the blocks is the (loss-parallel) head. Modules are recognised by the
names the common model families use (GPT-2/Megatron, Llama, BERT, T5, OPT/GPT-J/NeoX),
and a block counts as tensor-parallel only if it has both column- and row-parallel
modules — otherwise splitting it would need an extra collective we do not model.

A TP degree must divide the head counts, every split feature dimension and the vocab.

Fused projections (one Linear producing q, k and v, or gate and up) are left out: a
plain column split would hand each rank a slice of q, k and v together, mixing heads, and
splitting them right needs a weight re-layout the executors do not do. HF GPT-2's Conv1D
(weight stored in x out) is left out for the same reason. Such blocks run replicated.
"""

from __future__ import annotations

from torch import nn

from ir.layer import TPCandidate, TPStyle

_COLWISE = {"q", "k", "v", "q_proj", "k_proj", "v_proj", "query", "key", "value", "wq", "wk",
            "wv", "gate_proj", "up_proj", "w1", "w3", "fc1", "c_fc", "wi", "wi_0", "wi_1",
            "fc_in", "dense_h_to_4h", "gate", "up", "w_gate", "w_up"}
# Projections that pack several column-parallel outputs into one weight (see above).
FUSED_PROJECTIONS = frozenset({"qkv", "c_attn", "wqkv", "query_key_value", "qkv_proj",
                               "gate_up_proj", "in_proj"})
_ROWWISE = {"o", "o_proj", "out_proj", "c_proj", "wo", "w2", "fc2", "down_proj", "fc_out",
            "dense_4h_to_h", "down", "proj", "w_down", "out"}
_HEAD_NAMES = {"num_heads", "n_head", "n_heads", "num_attention_heads", "nhead", "n_heads_q"}
_KV_HEAD_NAMES = {"num_key_value_heads", "n_kv_heads", "kv_heads", "num_kv_heads",
                  "n_kv_head", "num_key_value_groups_heads"}


def _linear_dims(module: nn.Module) -> tuple[int, int] | None:
    """(in_features, out_features) of an nn.Linear (other projections are not split)."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    return None


def _style_by_name(path: str) -> TPStyle | None:
    parts = path.lower().split(".")
    leaf = parts[-1]
    parent = parts[-2] if len(parts) > 1 else ""
    if leaf == "dense":  # BERT: attention.output.dense / intermediate.dense / output.dense
        if parent == "intermediate":
            return TPStyle.COLWISE
        if parent == "output":
            return TPStyle.ROWWISE
        return None
    if leaf in FUSED_PROJECTIONS:
        return None
    if leaf in _COLWISE:
        return TPStyle.COLWISE
    if leaf in _ROWWISE:
        return TPStyle.ROWWISE
    return None


def _params(module: nn.Module, style: TPStyle) -> int:
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    n = weight.numel() if weight is not None else 0
    if style is TPStyle.COLWISE and bias is not None:
        n += bias.numel()  # a column-parallel bias splits with the output features
    return n


def _head_counts(module: nn.Module) -> list[tuple[str, int]]:
    found: dict[str, int] = {}
    for sub in module.modules():
        sources = [vars(sub)]
        config = getattr(sub, "config", None)
        if config is not None and not isinstance(config, nn.Module):
            sources.append(getattr(config, "__dict__", {}))
        for source in sources:
            for key, value in source.items():
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    if key in _HEAD_NAMES:
                        found.setdefault("heads", value)
                    elif key in _KV_HEAD_NAMES:
                        found.setdefault("kv_heads", value)
    return sorted(found.items())


def tp_analysis(layer_module: nn.Module, *, in_block: bool, vocab_rows: int | None,
                ) -> tuple[tuple[TPCandidate, ...], tuple[tuple[str, int], ...]]:
    """The TP candidates of one layer and the numbers a TP degree must divide."""
    candidates: list[TPCandidate] = []
    divisors: dict[str, int] = {}
    if in_block and isinstance(layer_module, (nn.Embedding, nn.EmbeddingBag)):
        in_block = False  # a stack of embedding tables (DLRM): each table is vocab-parallel
    if in_block:
        for path, sub in layer_module.named_modules():
            dims = _linear_dims(sub)
            if dims is None:
                continue
            style = _style_by_name(path)
            if style is None:
                continue
            candidates.append(TPCandidate(path, style, _params(sub, style)))
            n_in, n_out = dims
            divisors[f"{path}.out" if style is TPStyle.COLWISE else f"{path}.in"] = (
                n_out if style is TPStyle.COLWISE else n_in)
        styles = {c.style for c in candidates}
        if styles != {TPStyle.COLWISE, TPStyle.ROWWISE}:
            return (), ()
        divisors.update(_head_counts(layer_module))
    else:
        for path, sub in layer_module.named_modules():
            if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and sub.num_embeddings == vocab_rows:
                candidates.append(TPCandidate(path, TPStyle.VOCAB, sub.weight.numel()))
                divisors[f"{path}.vocab"] = sub.num_embeddings
            dims = _linear_dims(sub)
            if dims is not None and vocab_rows and dims[1] == vocab_rows:
                candidates.append(TPCandidate(path, TPStyle.HEAD, _params(sub, TPStyle.COLWISE)))
                divisors[f"{path}.vocab"] = dims[1]
    return tuple(candidates), tuple(sorted(divisors.items()))


def largest_vocab(root: nn.Module) -> int | None:
    """Rows of the largest embedding: the vocabulary (positions and token types are smaller)."""
    rows = [m.num_embeddings for m in root.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag))]
    return max(rows) if rows else None
