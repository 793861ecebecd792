"""Which name a layer's parameter goes by when one Parameter has several.

A Parameter may be registered under several names (T5 and BART: `shared.weight`,
`encoder.embed_tokens.weight`, `decoder.embed_tokens.weight`, `lm_head.weight` are one
tensor). The layer IR gives it to the first layer using it (`ir.measure`); that layer's
`param_names` name it under the layer's own module path, the path by which its strategy
(TP, FSDP) reaches it, and `executors.tied` treats names outside every layer as aliases.
"""

from __future__ import annotations

from torch import nn


def names_in_layers(root: nn.Module, layer_names: list[str],
                    owned: list[list[str]]) -> list[tuple[str, ...]]:
    """Per layer, its owned parameters named under its own module path where the tensor
    has such a name (T5's `shared.weight` is layer encoder.embed_tokens's
    `encoder.embed_tokens.weight`): the name its strategy shards it by."""
    names_of: dict[int, list[str]] = {}
    for fqn, p in root.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(fqn)
    canon = dict(root.named_parameters())
    out = []
    for lname, names in zip(layer_names, owned):
        paths = tuple(part + "." for part in lname.split("+")) if lname else ("",)
        inside = [[n for n in names_of[id(canon[name])] if n.startswith(paths)] for name in names]
        out.append(tuple(name if name in ins or not ins else ins[0]
                         for name, ins in zip(names, inside)))
    return out
