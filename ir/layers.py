"""Group the nodes of a traced graph into layers by module hierarchy.

A *layer* is a module the planner schedules as a unit:
  - every element of a *block stack* (a ModuleList/ModuleDict/Sequential of >= 2 children
    of one class, e.g. `blocks.17`, `model.layers.17`, `encoder.block.3`);
  - every other child module on the path down to the stacks (embeddings, final norm,
    head), as a layer of its own, if it has parameters.
Nodes outside every layer module (root-level glue: reshapes, masks, the loss) join the
layer of their first user, or, with no user inside a layer, the latest layer feeding them.
Layers are ordered by a topological sort of the layer DAG (first appearance breaks ties);
layers in a cycle (a module called at two places) are merged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import networkx as nx
import torch.fx as fx
from torch import nn

from ir.errors import PlannerError

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential)


def _is_block_stack(module: nn.Module) -> bool:
    if not isinstance(module, _CONTAINERS):
        return False
    children = list(module.children())
    return len(children) >= 2 and len({type(c) for c in children}) == 1


def _contains_stack(module: nn.Module) -> bool:
    return any(_is_block_stack(m) for m in module.modules())


def layer_module_paths(root: nn.Module) -> list[str]:
    """Paths of the modules that become layers, in definition order (see module docstring)."""
    paths: list[str] = []

    def visit(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = prefix + name
            if _is_block_stack(child):
                for sub_name, block in child.named_children():
                    if _contains_stack(block):
                        visit(block, f"{path}.{sub_name}.")
                    else:
                        paths.append(f"{path}.{sub_name}")
            elif _contains_stack(child):
                visit(child, path + ".")
            else:
                paths.append(path)

    if _is_block_stack(root) or _contains_stack(root):
        visit(root, "")
    elif any(True for _ in root.children()):
        visit(root, "")
    if not paths:
        paths.append("")  # a model with no children is one layer
    return paths


def node_module_path(node: fx.Node, prefix: str) -> str | None:
    """The innermost module path a node ran in, relative to the traced model."""
    if node.op == "call_module":
        path = str(node.target)
    else:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            return None
        key, value = next(reversed(stack.items()))
        path = value[0] if isinstance(value, tuple) else key
    if prefix:
        if path == prefix.rstrip("."):
            return ""
        if not path.startswith(prefix):
            return None
        path = path[len(prefix):]
    return path


def _owner(path: str | None, layer_paths: list[str]) -> str | None:
    if path is None:
        return None
    best = None
    for lp in layer_paths:
        if lp == "" or path == lp or path.startswith(lp + "."):
            if best is None or len(lp) > len(best):
                best = lp
    return best


@dataclass(frozen=True)
class LayerNodes:
    """One layer: its name (module path), module class and its graph nodes in order."""

    name: str
    kind: str
    nodes: tuple[fx.Node, ...]


def group_nodes(gm: fx.GraphModule, root: nn.Module, module_prefix: str = "") -> list[LayerNodes]:
    """Partition the graph's compute nodes into ordered layers."""
    candidates = layer_module_paths(root)
    # Parameter-free modules (dropout, rotary tables, pooling) are glue, not layers: they
    # are often called at several places and would tie distant layers into one.
    layer_paths = [p for p in candidates
                   if any(True for _ in (root.get_submodule(p) if p else root).parameters())]
    layer_paths = layer_paths or candidates
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    owner: dict[fx.Node, str] = {}
    for n in nodes:
        o = _owner(node_module_path(n, module_prefix), layer_paths)
        if o == "" and len(layer_paths) > 1:
            o = None  # a root-level node, when the root is not itself the only layer
        if o is not None:
            owner[n] = o
    fixed = set(owner)  # nodes of a layer's own module; the rest is glue
    # Layers rank by where their own modules first run; glue follows that order.
    rank: dict[str, int] = {}
    for n in nodes:
        if n in owner:
            rank.setdefault(owner[n], len(rank))
    by_rank = lambda m: rank[owner[m]]  # noqa: E731

    def adopt_from_users() -> None:  # walk backwards so chains of glue resolve
        for n in reversed(nodes):
            users = [u for u in n.users if u in owner]
            if n not in owner and users:
                owner[n] = owner[min(users, key=by_rank)]

    # Glue joins its earliest user's layer; glue nobody in a layer uses (the loss) joins
    # the latest layer feeding it; glue fed by graph inputs alone then follows its users;
    # what is left (asserts, shape checks) joins the nearest layer in graph order.
    adopt_from_users()
    for n in nodes:
        feeders = [a for a in n.all_input_nodes if a in owner]
        if n not in owner and feeders:
            owner[n] = owner[max(feeders, key=by_rank)]
    adopt_from_users()
    last = None
    for n in nodes:
        if n in owner:
            last = owner[n]
        elif last is not None:
            owner[n] = last
    for n in reversed(nodes):
        if n in owner:
            last = owner[n]
        else:
            owner[n] = last if last is not None else (layer_paths[0] if layer_paths else "")
    _glue_to_earliest_user(nodes, owner, fixed,
                           lambda m: rank.get(owner[m], len(rank)))  # noqa: E731
    return _order_layers(nodes, owner, root)


def _glue_to_earliest_user(nodes: list[fx.Node], owner: dict[fx.Node, str], fixed: set,
                           by_rank) -> None:
    """Move each glue node to its earliest user's layer, until none moves. One backward
    walk can place glue before its users are placed (GPT-OSS: one arange feeds the
    sliding-window mask of layer 0 and the full mask of layer 1; it joined layer 1, so
    layer 1 fed layer 0 and the cycle merged both)."""
    for _ in range(len(nodes)):
        moved = False
        for n in reversed(nodes):
            users = [u for u in n.users if u in owner]
            if n in fixed or not users:
                continue
            earliest = min(users, key=by_rank)
            if by_rank(earliest) < by_rank(n):
                owner[n], moved = owner[earliest], True
        if not moved:
            return


def _position(gm: fx.GraphModule):
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    return index.__getitem__


def _order_layers(nodes: list[fx.Node], owner: dict[fx.Node, str], root: nn.Module):
    first_seen: dict[str, int] = {}
    members: dict[str, list[fx.Node]] = {}
    for i, n in enumerate(nodes):
        name = owner[n]
        first_seen.setdefault(name, i)
        members.setdefault(name, []).append(n)
    g = nx.DiGraph()
    g.add_nodes_from(first_seen)
    for n in nodes:
        for a in n.all_input_nodes:
            if a in owner and owner[a] != owner[n]:
                g.add_edge(owner[a], owner[n])
    # Merge cycles (a module used at two places on both sides of another layer).
    condensed = nx.condensation(g)
    groups = {c: sorted(condensed.nodes[c]["members"], key=first_seen.__getitem__)
              for c in condensed.nodes}
    ordered = list(nx.lexicographical_topological_sort(
        condensed, key=lambda c: first_seen[groups[c][0]]))
    result = []
    position = {n: i for i, n in enumerate(nodes)}
    for c in ordered:
        names = groups[c]
        layer_nodes = sorted((n for name in names for n in members[name]), key=position.__getitem__)
        kinds = Counter(_kind(root, name) for name in names)
        result.append(LayerNodes("+".join(names), "+".join(kinds), tuple(layer_nodes)))
    if not result:
        raise PlannerError("the traced graph has no operations; is forward() empty?")
    return result


def _kind(root: nn.Module, path: str) -> str:
    if path == "":
        return type(root).__name__
    try:
        return type(root.get_submodule(path)).__name__
    except AttributeError:
        return "Module"
