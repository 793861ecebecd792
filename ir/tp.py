"""Find a layer's tensor-parallel candidates (Megatron-LM's split, Shoeybi et al. 2019).

Inside a block, the linears that open a parallel region (attention q/k/v, MLP up/gate)
are column-parallel and the ones that close it (attention out, MLP down) are
row-parallel; a large embedding is vocab-parallel and a vocabulary-sized output
projection outside the blocks is the (loss-parallel) head.

Where they come from, in order:
  1. the model's own plan: Hugging Face configs carry `base_model_tp_plan`
     ({"layers.*.self_attn.q_proj": "colwise", ...}); only its plain "colwise" and
     "rowwise" entries on nn.Linear are taken, and a parent module (an attention, an MLP)
     with any other entry (packed / gathered / MoE experts) is left whole;
  2. else the names the common families use (GPT-2/Megatron, Llama, BERT, T5, OPT, BART):
     a parent module holding a projection that no name explains (a fused q|k|v, a Conv1D,
     MLA's low-rank q_a_proj) is left whole, since splitting only its output projection
     would leave its input unsplit.
Under multi-query attention (one key/value head: Gemma-2B) the key and value projections
are not split: each rank keeps them whole and the TP degree need only divide the query
heads. Either way, an attention module that takes a per-head bias from outside (T5's
position_bias, ALiBi) or holds a head-sized table (T5's relative_attention_bias) is left
whole: that bias has a row per global head. A block counts as tensor-parallel only if it keeps both column- and row-parallel modules.

A TP degree must divide each split feature dimension, the vocab and the query and
key/value head counts of each split attention module ("heads", "kv_heads"; a second
attention module with other counts adds "<its path>.heads").

Fused projections are split per part (`TPCandidate.fused`) where their model's forward
unpacks them in a known order: GPT-2's Conv1D c_attn and Phi-3's qkv_proj are [q | k | v]
(q = heads·head_dim, k = v = kv_heads·head_dim), Phi-3's gate_up_proj is [gate | up]
(chunk(2)); Phi-3's own plan calls them "colwise_gather_output" / "rowwise_split_input"
and is read so. The executor reorders their rows so that rank r's contiguous shard is
[q_r | k_r | v_r] (`executors.fused`). With ONE key/value head (multi-query) the k and
v parts are shared: every rank holds them whole beside its query heads (`fused_shared`),
and the TP degree need only divide the query heads.

Falcon's query_key_value packs heads as its attention's flags say
(modeling_falcon.FalconAttention._split_heads; `falcon_packing`):
  multi_query, not new_decoder_architecture   [q | k | v], one key/value head: fused
                                               parts, k and v shared;
  new_decoder_architecture                     per key/value group [q_g.. | k_g | v_g]:
                                               a contiguous split keeps whole groups
                                               (tp divides kv_heads); one group is the
                                               [q | k | v] above;
  neither                                      per head [q_h k_h v_h]: a contiguous
                                               split keeps whole heads.
Its `dense` beside that query_key_value closes the attention (row-parallel). Other fused
names (InternLM's grouped wqkv) leave their parent whole. GPT-NeoX's query_key_value is a
plain colwise candidate (its own plan): per-head [q_h k_h v_h] groups, as Falcon's last
case.
"""

from __future__ import annotations

import fnmatch
import inspect

from torch import nn

from ir.layer import TPCandidate, TPStyle

_COLWISE = {"q", "k", "v", "q_proj", "k_proj", "v_proj", "query", "key", "value", "wq", "wk",
            "wv", "gate_proj", "up_proj", "w1", "w3", "fc1", "c_fc", "wi", "wi_0", "wi_1",
            "fc_in", "dense_h_to_4h", "gate", "up", "w_gate", "w_up"}
# Projections that pack several column-parallel outputs into one weight (see above).
FUSED_PROJECTIONS = frozenset({"qkv", "c_attn", "wqkv", "query_key_value", "qkv_proj",
                               "gate_up_proj", "in_proj"})
# The fused ones whose forward unpacks [q | k | v] as consecutive blocks (GPT-2 and
# OpenAI-GPT split(split_size); Phi-3 slices at heads·head_dim) and [gate | up] halves
# (Phi-3 chunk(2)).
_FUSED_QKV = frozenset({"c_attn", "qkv_proj"})
_FUSED_GATE_UP = frozenset({"gate_up_proj"})
# Falcon's fused projection and the attention flags that say how it packs heads.
_FALCON_QKV = "query_key_value"
_FALCON_FLAGS = ("multi_query", "new_decoder_architecture")
# The output projection beside a Falcon query_key_value (BERT's rule reads "dense" by its
# parent instead, see `_style_by_name`).
_FALCON_OUT = "dense"
_ROWWISE = {"o", "o_proj", "out_proj", "c_proj", "wo", "w2", "fc2", "down_proj", "fc_out",
            "dense_4h_to_h", "down", "proj", "w_down", "out"}
# Key / value projections, kept whole under multi-query attention (one KV head).
_KV_NAMES = {"k_proj", "v_proj", "key", "value", "k", "v", "wk", "wv"}
# Attributes holding an attention module's query / key-value head counts (the module
# instance's own, else its config's); the executor sets the local counts on the instance.
HEAD_ATTRS = ("num_heads", "n_head", "n_heads", "num_attention_heads", "nhead", "n_heads_q")
KV_HEAD_ATTRS = ("num_key_value_heads", "n_kv_heads", "kv_heads", "num_kv_heads", "n_kv_head")
# forward() parameters that bring an additive attention bias computed outside the module
# with one row per GLOBAL head (T5's position_bias, ALiBi): its heads cannot be split.
_HEAD_BIAS_ARGS = frozenset({"bias", "position_bias", "alibi", "attn_bias",
                             "relative_position_bias"})
# Hugging Face plan styles that are a plain DTensor Colwise/Rowwise split of an nn.Linear.
_HF_STYLES = {"colwise": TPStyle.COLWISE, "rowwise": TPStyle.ROWWISE}
# Hugging Face plan styles around fused projections (Phi-3): the fused colwise output is
# gathered there; split per part instead (`fused_parts`), the rowwise input arrives split.
_HF_FUSED_STYLES = {"colwise_gather_output": TPStyle.COLWISE,
                    "rowwise_split_input": TPStyle.ROWWISE}
# Hugging Face plan styles that keep a module whole (replicated) and need nothing split.
_HF_WHOLE = {"replicated_with_grad_allreduce", "replicate", "sequence_parallel"}


def _linear_dims(module: nn.Module) -> tuple[int, int] | None:
    """(in_features, out_features) of an nn.Linear or a Conv1D (weight stored (in, out))."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if is_conv1d(module):
        n_in, n_out = module.weight.shape
        return n_in, n_out
    return None


def is_conv1d(module: nn.Module) -> bool:
    """Hugging Face's Conv1D (GPT-2, OpenAI-GPT): a Linear whose weight is (in, out)."""
    return type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None


def _is_projection(module: nn.Module) -> bool:
    """A weight-matrix module: an nn.Linear or a transposed one (HF GPT-2's Conv1D)."""
    return isinstance(module, nn.Linear) or is_conv1d(module)


def _parent(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


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


def falcon_packing(attention: nn.Module) -> str | None:
    """How a Falcon attention packs query_key_value (module docstring): "blocks"
    ([q | k | v], one key/value head), "groups" (per key/value group) or "heads" (per
    head); None for a module without Falcon's flags."""
    flags = vars(attention)
    if not all(isinstance(flags.get(f), bool) for f in _FALCON_FLAGS):
        return None
    kv_heads = head_counts(attention).get("kv_heads")
    if flags["new_decoder_architecture"]:
        return "blocks" if kv_heads == 1 else "groups"
    return "blocks" if flags["multi_query"] else "heads"


def _qkv_blocks(parent: nn.Module, n_out: int) -> tuple[int, ...] | None:
    """(q, k, v) features of a [q | k | v] packing of `n_out` features, or None."""
    counts = head_counts(parent)
    heads = counts.get("heads")
    kv_heads = counts.get("kv_heads", heads)
    if not heads or n_out % (heads + 2 * kv_heads):
        return None  # not attention
    head_dim = n_out // (heads + 2 * kv_heads)
    if vars(parent).get("head_dim", head_dim) != head_dim:
        return None  # another packing than [q | k | v]
    return heads * head_dim, kv_heads * head_dim, kv_heads * head_dim


def fused_shared(parts: tuple[int, ...], attention: nn.Module) -> tuple[bool, ...]:
    """Per part of a fused [q | k | v]: held whole by every rank (multi-query attention's
    one key/value head beside split queries). () for a packing with nothing shared."""
    counts = head_counts(attention)
    if len(parts) == 3 and counts.get("kv_heads") == 1 and counts.get("heads", 1) > 1:
        return (False, True, True)
    return ()


def packed_by_heads(layer_module: nn.Module, path: str) -> bool:
    """A fused query_key_value whose contiguous split keeps whole heads or key/value
    groups (Falcon's "heads" and "groups" packings): a plain column-parallel module."""
    if path.rsplit(".", 1)[-1] != _FALCON_QKV or not _parent(path):
        return False
    return falcon_packing(layer_module.get_submodule(_parent(path))) in ("heads", "groups")


def fused_parts(layer_module: nn.Module, path: str) -> tuple[int, ...] | None:
    """The output features of each projection the fused module at `path` packs, in the
    model's order ((q, k, v) or (gate, up)), or None when it is not one this module
    splits per part (see the module docstring)."""
    leaf, parent_path = path.rsplit(".", 1)[-1], _parent(path)
    sub = layer_module.get_submodule(path)
    dims = _linear_dims(sub)
    if dims is None or not parent_path:
        return None
    parent = layer_module.get_submodule(parent_path)
    n_out = dims[1]
    if leaf in _FUSED_QKV or (leaf == _FALCON_QKV and falcon_packing(parent) == "blocks"):
        return _qkv_blocks(parent, n_out)
    if leaf in _FUSED_GATE_UP and n_out % 2 == 0:
        # its down projection takes one half: the [gate | up] halves of Phi-3's MLP
        downs = [d for _, d in parent.named_children() if d is not sub and _linear_dims(d)
                 and _linear_dims(d)[0] == n_out // 2]
        return (n_out // 2, n_out // 2) if downs else None
    return None


def model_tp_plan(layer_module: nn.Module) -> dict[str, str] | None:
    """The Hugging Face `base_model_tp_plan` of the model this layer belongs to, if any
    (found on the config its attention / MLP modules hold)."""
    for sub in layer_module.modules():
        config = getattr(sub, "config", None)
        plan = getattr(config, "base_model_tp_plan", None) if config is not None else None
        if isinstance(plan, dict) and plan:
            return plan
    return None


def _takes_head_bias(module: nn.Module) -> bool:
    """forward() takes a per-head bias, unless the module's config turns that bias off
    (Falcon's `alibi` argument is None when `config.alibi` is False: rotary instead)."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    config = getattr(module, "config", None)
    return any(getattr(config, arg, None) is not False for arg in _HEAD_BIAS_ARGS & set(params))


def _whole_parents(layer_module: nn.Module, parents: set[str]) -> set[str]:
    """Parents that must stay whole although their projections are explained: they hold
    a parameter module that is neither a projection nor a norm (T5's relative-position
    table, sized by the global head count), own a parameter themselves (GPT-OSS's
    per-head attention `sinks`: TP would leave it whole beside split heads), or take a
    per-head bias from outside; parent "" (the layer module is the attention) alike.
    Sharding `sinks` by head, as HF's TP plan does, is not done: such an attention
    stays whole."""
    whole = set()
    for parent in parents:
        module = layer_module.get_submodule(parent) if parent else layer_module
        # parent "": the layer module is the attention itself, the same rule
        if _takes_head_bias(module) or any(True for _ in module.parameters(recurse=False)):
            whole.add(parent)
        for _, child in module.named_children():
            owns = any(True for _ in child.parameters(recurse=False))
            if owns and not _is_projection(child) and "norm" not in type(child).__name__.lower():
                whole.add(parent)
    return whole


def _multi_query_parents(layer_module: nn.Module, styles: dict[str, TPStyle]) -> set[str]:
    """Attention modules with ONE key/value head (multi-query, Gemma-2B): their key and
    value projections stay whole on every rank (`KEY_VALUE_NAMES`), the query heads split."""
    out = set()
    for parent in {_parent(p) for p, s in styles.items() if s is TPStyle.COLWISE}:
        counts = head_counts(layer_module.get_submodule(parent)) if parent else {}
        if counts.get("kv_heads") == 1 and counts.get("heads", 1) > 1:
            out.add(parent)
    return out


def _unsplit_projections(layer_module: nn.Module, styles: dict[str, TPStyle],
                         shared_kv: set[str]) -> set[str]:
    """Split parents that would still hold a projection left whole (one the model's plan
    does not list): only multi-query key/value may stay whole inside a split attention."""
    out = set()
    for parent in {_parent(p) for p in styles if _parent(p)}:
        for name, child in layer_module.get_submodule(parent).named_children():
            path = f"{parent}.{name}"
            kv = parent in shared_kv and name in _KV_NAMES
            if _is_projection(child) and path not in styles and not kv:
                out.add(parent)
    return out


def _styles_from_plan(layer_module: nn.Module, plan: dict[str, str]) -> dict[str, TPStyle]:
    """path -> style from a model plan; keys are relative to the base model, e.g.
    "layers.*.self_attn.q_proj": the part after the layer index is the path in a layer."""
    styles: dict[str, TPStyle] = {}
    whole: set[str] = set()  # parents with an entry we cannot run as a plain split
    names = [p for p, _ in layer_module.named_modules() if p]
    for key, value in plan.items():
        if ".*." not in key:
            continue
        pattern = key.split(".*.", 1)[1]
        for path in fnmatch.filter(names, pattern):
            sub = layer_module.get_submodule(path)
            style = _HF_STYLES.get(value)
            fused = _HF_FUSED_STYLES.get(value)
            if style is not None and isinstance(sub, nn.Linear):
                styles[path] = style
            elif fused is TPStyle.COLWISE and fused_parts(layer_module, path):
                styles[path] = fused
            elif fused is TPStyle.ROWWISE and isinstance(sub, nn.Linear):
                styles[path] = fused
            elif value not in _HF_WHOLE:
                whole.update({_parent(path), path})
    return {p: s for p, s in styles.items()
            if _parent(p) not in whole and not any(p.startswith(w + ".") for w in whole if w)}


def _styles_by_name(layer_module: nn.Module) -> dict[str, TPStyle]:
    styles: dict[str, TPStyle] = {}
    unexplained: set[str] = set()  # parents holding a projection no name explains
    for path, sub in layer_module.named_modules():
        if not path or not _is_projection(sub):
            continue
        style = (TPStyle.COLWISE if fused_parts(layer_module, path)
                 or packed_by_heads(layer_module, path) else _style_by_name(path))
        if style is None and _closes_falcon_attention(layer_module, path):
            style = TPStyle.ROWWISE
        if style is None:
            unexplained.add(_parent(path))
        else:
            styles[path] = style
    return {p: s for p, s in styles.items() if _parent(p) not in unexplained}


def _closes_falcon_attention(layer_module: nn.Module, path: str) -> bool:
    """Falcon's attention `dense`: the output projection beside its query_key_value."""
    parent = _parent(path)
    if path.rsplit(".", 1)[-1] != _FALCON_OUT or not parent:
        return False
    attention = layer_module.get_submodule(parent)
    return falcon_packing(attention) is not None and hasattr(attention, _FALCON_QKV)


def _params(module: nn.Module, style: TPStyle) -> int:
    weight = getattr(module, "weight", None)
    bias = getattr(module, "bias", None)
    n = weight.numel() if weight is not None else 0
    if style is TPStyle.COLWISE and bias is not None:
        n += bias.numel()  # a column-parallel bias splits with the output features
    return n


def head_counts(attention: nn.Module) -> dict[str, int]:
    """{"heads": n, "kv_heads": m} of an attention module (instance attributes first,
    then its config's); {} for a module that is not one."""
    found: dict[str, int] = {}
    sources = [vars(attention)]
    config = getattr(attention, "config", None)
    if config is not None and "attention" in type(attention).__name__.lower():
        sources.append({k: getattr(config, k, None) for k in HEAD_ATTRS + KV_HEAD_ATTRS})
    for source in sources:
        for kind, keys in (("heads", HEAD_ATTRS), ("kv_heads", KV_HEAD_ATTRS)):
            for key in keys:
                value = source.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    found.setdefault(kind, value)
    return found


def tp_analysis(layer_module: nn.Module, *, in_block: bool, vocab_rows: int | None,
                ) -> tuple[tuple[TPCandidate, ...], tuple[tuple[str, int], ...]]:
    """The TP candidates of one layer and the numbers a TP degree must divide."""
    candidates: list[TPCandidate] = []
    divisors: dict[str, int] = {}
    if in_block and isinstance(layer_module, (nn.Embedding, nn.EmbeddingBag)):
        in_block = False  # a stack of embedding tables (DLRM): each table is vocab-parallel
    if in_block:
        plan = model_tp_plan(layer_module)
        styles = (_styles_from_plan(layer_module, plan) if plan is not None
                  else _styles_by_name(layer_module))
        whole = _whole_parents(layer_module, {_parent(p) for p in styles})
        styles = {p: s for p, s in styles.items() if _parent(p) not in whole}
        shared_kv = _multi_query_parents(layer_module, styles)
        styles = {p: s for p, s in styles.items()
                  if not (_parent(p) in shared_kv and p.rsplit(".", 1)[-1] in _KV_NAMES)}
        whole = _unsplit_projections(layer_module, styles, shared_kv)
        styles = {p: s for p, s in styles.items() if _parent(p) not in whole}
        if set(styles.values()) != {TPStyle.COLWISE, TPStyle.ROWWISE}:
            return (), ()
        for path, sub in layer_module.named_modules():
            style = styles.get(path)
            if style is None:
                continue
            parts = (fused_parts(layer_module, path) or ()) if style is TPStyle.COLWISE else ()
            shared = fused_shared(parts, layer_module.get_submodule(_parent(path))) \
                if parts else ()
            candidates.append(TPCandidate(path, style, _params(sub, style), parts, shared))
            n_in, n_out = _linear_dims(sub)
            if not shared:  # with a shared part only the split parts must divide
                divisors[f"{path}.out" if style is TPStyle.COLWISE else f"{path}.in"] = (
                    n_out if style is TPStyle.COLWISE else n_in)
            for k, part in enumerate(parts):  # each packed projection splits on its own
                if not (shared and shared[k]):  # a shared part stays whole
                    divisors[f"{path}.part{k}"] = part
        for parent in sorted({_parent(c.module) for c in candidates}):
            for kind, value in head_counts(layer_module.get_submodule(parent)).items():
                if kind == "kv_heads" and parent in shared_kv:
                    continue  # one key/value head, whole on every rank
                if divisors.setdefault(kind, value) != value:  # a second, different count
                    divisors[f"{parent}.{kind}"] = value
    else:
        for path, sub in layer_module.named_modules():
            # DTensor's RowwiseParallel splits nn.Embedding; an EmbeddingBag (a
            # recommendation model's table) is not offered until its sharding runs
            if isinstance(sub, nn.Embedding) and sub.num_embeddings == vocab_rows:
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
