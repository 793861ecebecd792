"""Trace a model, measure every layer, and assemble the `LayerGraph`.

    >>> graph = build_layer_graph(model, {"input_ids": ids}, labels, loss_fn, name="gpt-tiny")

Each *unique* layer (by structural hash: same ops, same parameter and input shapes) is
measured once, forward and backward, on the meta device (`ir.graph_measurer`); this
module adds what the graph itself tells: which parameters each layer owns (first use;
tied copies apart), how many of them tensor parallelism divides (`ir.tp`), the bytes
crossing each layer boundary, where a pipeline may cut, the legality facts
(`ir.legality`) and the fingerprint plans are pinned to.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable

import torch
from torch import nn

from ir.checkpoint_measure import measure_checkpointing
from ir.dtensor_ops import replicated_param_modules
from ir.graph_measurer import GraphMeasurer
from ir.layer import Layer, LayerGraph, LayerMeasurement, TPStyle
from ir.layers import _is_block_stack
from ir.legality import sequence_parallel_problem, takes_one_positional_input
from ir.composite_ops import cold_ops_bwd, cold_ops_fwd
from ir.op_count import (recent_backward_ops, recent_code_bytes, recent_forward_ops,
                         step_between, step_evicts)
from ir.ownership import names_in_layers
from ir.plan import layer_digest
from ir.saved_tensors import tensor_leaves, value_nbytes
from ir.stand_in import canonical_param_names, is_data, is_float
from ir.tp import largest_vocab, tp_analysis
from ir.tp_recompute import TP_REDUCING_STYLES
from ir.trace import LossFn, Traced, trace


def build_layer_graph(model: nn.Module, inputs: dict[str, torch.Tensor],
                      target: torch.Tensor | None = None, loss_fn: LossFn | None = None, *,
                      name: str | None = None, dtype: torch.dtype = torch.float32,
                      force_trace: str | None = None, seq_len: int | None = -1,
                      progress: Callable[[int, int, str], None] | None = None) -> LayerGraph:
    """Trace `model` and measure it into a LayerGraph (all on the meta device).
    `seq_len` is recorded as given; -1 guesses it (dim 1 of the first integer input)."""
    traced = trace(model, inputs, target, loss_fn, force=force_trace, dtype=dtype)
    graph, _ = layer_graph_from_trace(traced, inputs, target, name=name or type(model).__name__,
                                      dtype=dtype, progress=progress, seq_len=seq_len)
    return graph


def layer_graph_from_trace(traced: Traced, inputs, target, *, name: str, dtype: torch.dtype,
                           progress: Callable[[int, int, str], None] | None = None,
                           seq_len: int | None = -1) -> tuple[LayerGraph, GraphMeasurer]:
    measurer = GraphMeasurer(traced, inputs, target, dtype)
    root = traced.root
    vocab = largest_vocab(root)
    canon_params = dict(root.named_parameters())
    param_order = {n: i for i, (n, _) in enumerate(root.named_parameters(remove_duplicate=False))}
    layer_names = [l.name for l in measurer.layers]
    param_names_by_layer = _owned_params(measurer, canon_params, layer_names)
    tied_by_layer, tied_owners = _tied_copies(root, layer_names, param_names_by_layer)
    local_names = names_in_layers(root, layer_names, param_names_by_layer)

    measured: dict[str, LayerMeasurement] = {}  # structural hash -> its one measurement
    layers: list[Layer] = []
    stacks = {name for name, m in root.named_modules() if name and _is_block_stack(m)}
    n_layers = len(measurer.layers)
    ran_before: list[frozenset[str]] = []  # the forward ops of the layers before, nearest first
    for i, layer_nodes in enumerate(measurer.layers):
        lname = layer_nodes.name
        module = None
        if "+" not in lname:
            module = root.get_submodule(lname) if lname else root
        in_block = "." in lname and lname.rsplit(".", 1)[0] in stacks
        candidates, divisors = ((), ())
        if module is not None:
            candidates, divisors = tp_analysis(module, in_block=in_block, vocab_rows=vocab)
        sp_ok = module is not None and sequence_parallel_problem(lname, module, candidates) is None
        shash = measurer.structural_hash(i)
        if progress:
            progress(i, n_layers, lname)
        if shash not in measured:
            col, row = measurer.tp_modules(i, candidates)
            own = (replicated_param_modules(module, [c.module for c in candidates])
                   if module is not None and candidates else [])
            replicated = [".".join(filter(None, (lname, path))) for path, _ in own]
            reducing = [".".join(filter(None, (lname, c.module))) for c in candidates
                        if c.style in TP_REDUCING_STYLES]
            measurement = measurer.measure_layer(i, col, row, replicated=replicated,
                                                 reducing=reducing)
            measured[shash] = dataclasses.replace(
                measurement, **measure_checkpointing(measurer, i, col, row))
        pnames = tuple(param_names_by_layer[i])
        tied = tied_by_layer[i]  # this layer's name -> the shared tensor
        tp_params, tied_tp = _tp_params(module, candidates, [canon_params[p] for p in pnames],
                                        list(tied.values()))
        in_bytes, out_bytes, gradless_in_bytes = _boundary_bytes(measurer, i)
        layers.append(Layer(
            name=lname, kind=layer_nodes.kind, index=i,
            params=sum(canon_params[p].numel() for p in pnames),
            param_bytes=sum(canon_params[p].numel() * _measured_itemsize(canon_params[p], dtype)
                            for p in pnames),
            tp_params=tp_params, input_bytes=in_bytes, output_bytes=out_bytes,
            gradless_input_bytes=gradless_in_bytes,
            gradless_tp_inputs=_gradless_tp_inputs(measurer, i, candidates),
            structural_hash=shash, measured=measured[shash], param_names=local_names[i],
            tp_candidates=candidates, tp_divisors=divisors,
            max_param_numel=max([canon_params[p].numel() for p in pnames]
                                + [t.numel() for t in tied.values()], default=0),
            **_param_steps(lname, param_order, pnames, local_names[i], canon_params, tied),
            tied_params=sum(t.numel() for t in {id(t): t for t in tied.values()}.values()),
            tied_tp_params=tied_tp, tied_param_names=tuple(tied),
            tied_owner_layers=tuple(tied_owners[i][n][0] for n in tied),
            tied_owner_params=tuple(tied_owners[i][n][1] for n in tied),
            tied_param_numels=tuple(t.numel() for t in tied.values()),
            chain_input=_chain_input(measurer, i, module, _batch_size(inputs)),
            sequence_parallel_ok=sp_ok,
            cold_distinct_ops_fwd=cold_ops_fwd(measured[shash],
                                               recent_forward_ops(ran_before))))
        ran_before.insert(0, measured[shash].forward_overloads)
    # backward: each layer after those whose backward ran just before it (the window)
    after_ops = [layer.measured.backward_overloads for layer in layers]
    windows = [recent_backward_ops(after_ops[i + 1:]) for i in range(len(layers))]
    layers = [dataclasses.replace(layer, **cold_ops_bwd(layer.measured, ran))
              for layer, ran in zip(layers, windows)]
    layers = [dataclasses.replace(layer, **step_between(layers, i),
                                  **recent_code_bytes(layers, i))
              for i, layer in enumerate(layers)]
    if layers:  # the first forward follows the step before's backward
        layers[0] = dataclasses.replace(layers[0], forward_after_backward=True)
    if not step_evicts([m.forward_overloads for m in measured.values()],
                       [m.backward_overloads for m in measured.values()]):
        layers = [dataclasses.replace(layer, step_warm=True) for layer in layers]
    edges, cuts, gradless_cuts = _edges_and_cuts(measurer)
    num_params = sum(p.numel() for p in root.parameters())
    seq_len = _seq_len(inputs) if seq_len == -1 else seq_len
    micro_batch = _batch_size(inputs)
    fingerprint = _fingerprint(layers, dtype, micro_batch, seq_len)
    graph = LayerGraph(model=name, trace_method=traced.method, dtype=str(dtype).replace("torch.", ""),
                       micro_batch=micro_batch, seq_len=seq_len, layers=tuple(layers),
                       edges=tuple(edges), num_params=num_params, fingerprint=fingerprint,
                       cut_points=tuple(cuts), gradless_cuts=tuple(gradless_cuts),
                       unique_layers_measured=len(measured))
    return graph, measurer


# ------------------------------------------------------------------------ parameters


def _owned_params(measurer: GraphMeasurer, canon_params: dict[str, nn.Parameter],
                  layer_names: list[str]) -> list[list[str]]:
    """Per layer, the canonical parameter names it owns: those it uses first. Parameters
    forward() never reads still take memory: they go to the layer whose module holds
    them (or the first layer)."""
    owned: set[str] = set()
    by_layer: list[list[str]] = []
    for i in range(len(measurer.layers)):
        names = [p for p in measurer.state_params_used(i) if p not in owned]
        owned.update(names)
        by_layer.append(names)
    for pname in canon_params:
        if pname not in owned:
            best = 0
            for i, lname in enumerate(layer_names):
                for part in lname.split("+"):
                    if part and pname.startswith(part + "."):
                        best = i
            by_layer[best].append(pname)
            owned.add(pname)
    return by_layer


def _tp_params(module: nn.Module | None, candidates, owned: list[torch.Tensor],
               tied: list[torch.Tensor]) -> tuple[int, int]:
    """(owned, tied-copy) parameters tensor parallelism divides: the weights of every
    candidate module, and the biases of column-parallel ones, less a fused module's shared
    rows (`TPCandidate.split_numel`: every rank holds those whole)."""
    owned_ids, tied_ids = {id(t) for t in owned}, {id(t) for t in tied}
    tp_params = tied_tp = 0
    for c in candidates:
        sub = module.get_submodule(c.module) if c.module else module
        w, b = getattr(sub, "weight", None), getattr(sub, "bias", None)
        for t in (w, b) if c.style is TPStyle.COLWISE else (w,):
            if t is not None and id(t) in owned_ids:
                tp_params += c.split_numel(t.numel())
            elif t is not None and id(t) in tied_ids:
                tied_tp += c.split_numel(t.numel())
    return tp_params, tied_tp


def _param_steps(lname: str, order: dict[str, int], pnames, local_names, canon_params,
                 tied: dict) -> dict[str, tuple]:
    """`param_numels` and `param_step_names`: a layer's parameters and tied copies in
    `order` (the model's named_parameters with duplicates: where `executors.tied.untie`
    leaves each copy), each named under the layer's path (`local_names`: its owned ones')."""
    named = sorted([(order[n], local, canon_params[n]) for n, local in zip(pnames, local_names)]
                   + [(order.get(n, len(order)), n, t) for n, t in tied.items()],
                   key=lambda it: it[0])
    steps = {}  # one entry per tensor, where it first comes
    for _, name, t in named:
        steps.setdefault(id(t), (name, t.numel()))
    prefix = lname + "." if lname and "+" not in lname else ""
    return dict(param_numels=tuple(n for _, n in steps.values()),
                param_step_names=tuple(name.removeprefix(prefix) for name, _ in steps.values()))


def _tied_copies(root: nn.Module, layer_names: list[str],
                 owned: list[list[str]]) -> tuple[list[dict[str, torch.Tensor]],
                                                  list[dict[str, tuple[int, str]]]]:
    """Per layer, {its parameter name: tensor} for tensors it holds a copy of but another
    layer owns, and {that name: (the owner's layer index, the tensor's canonical name)}.
    A layer holds every parameter registered under its module path (the longest layer
    name that prefixes the parameter's name; "" is the root), as
    `executors.tied` decides; `executors.tied.untie` then gives each holder its own copy,
    and the owner (`owned`, first use) counts the original."""
    owner = {p: i for i, names in enumerate(owned) for p in names}
    canon = canonical_param_names(root)
    out: list[dict[str, torch.Tensor]] = [{} for _ in layer_names]
    owners: list[dict[str, tuple[int, str]]] = [{} for _ in layer_names]
    holders: dict[int, dict[int, str]] = {}  # tensor id -> {holding layer: first name there}
    for fqn, p in root.named_parameters(remove_duplicate=False):
        best, best_len = None, -1
        for i, name in enumerate(layer_names):
            if (name == "" or fqn == name or fqn.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
        if best is not None:
            holders.setdefault(id(p), {}).setdefault(best, fqn)
    tensors = {id(p): p for p in root.parameters()}
    for pid, by_layer in holders.items():
        if len(by_layer) < 2:
            continue
        first_user = owner.get(canon[pid])
        for i, fqn in by_layer.items():
            if i != first_user:
                out[i][fqn] = tensors[pid]
                owners[i][fqn] = (min(by_layer) if first_user is None else first_user,
                                  canon[pid])
    return out, owners


def _measured_itemsize(t: torch.Tensor, dtype: torch.dtype) -> int:
    """Bytes per element of a parameter in the measurement dtype (integers keep theirs)."""
    return torch.empty((), dtype=dtype).element_size() if is_float(t.dtype) else t.element_size()


# ------------------------------------------------------------------------ boundaries


def _boundary_bytes(m: GraphMeasurer, i: int) -> tuple[int, int, int]:
    """(bytes entering, bytes leaving, bytes entering that get no gradient) layer i; the
    last layer, with nothing leaving, counts its last value."""
    info = m.infos[i]
    ins = [m.values.get(a, m.user_values.get(str(a.target))) for a in info.inputs]
    in_bytes = sum(value_nbytes(v) for v in ins)
    # per input, as in_bytes counts (two views of one data tensor: both gradless)
    gradless = sum(value_nbytes([t for t in tensor_leaves(v) if not t.requires_grad])
                   for v in ins)
    out_bytes = sum(value_nbytes(m.values[o]) for o in info.outputs if not (o.op == "placeholder"))
    if i == len(m.layers) - 1 and not info.outputs:
        out_bytes = value_nbytes(m.values[info.nodes.nodes[-1]])
    return in_bytes, out_bytes, gradless


def _gradless_tp_inputs(m: GraphMeasurer, i: int, candidates) -> tuple[str, ...]:
    """The candidates whose float inputs (values their nodes read from outside the
    module, parameters aside) all require no grad in the meta pass (`ir.stand_in.is_data`:
    the model's data): autograd makes no gradient for them, so the executor's backward
    never reduces one (DTensor's from_local and Megatron's f run only for a tensor that
    requires grad)."""
    info = m.infos[i]
    prefix = f"{info.nodes.name}." if info.nodes.name else ""
    inside = lambda path, mod: path is not None and (  # noqa: E731
        path == mod or path.startswith(mod + "."))
    gradless = []
    for c in candidates:
        module = prefix + c.module if c.module else info.nodes.name
        nodes = [n for n in info.nodes.nodes if inside(info.module_paths[n], module)]
        reads = [m.values.get(a, m.user_values.get(str(a.target))) for n in nodes
                 for a in n.all_input_nodes
                 if a.op != "get_attr" and not inside(info.module_paths.get(a), module)]
        floats = [t for v in reads for t in tensor_leaves(v) if is_float(t.dtype)
                  and not isinstance(t, nn.Parameter)]
        if floats and all(is_data(t) for t in floats):
            gradless.append(c.module)
    return tuple(gradless)


def _chain_input(m: GraphMeasurer, i: int, module: nn.Module | None,
                 micro_batch: int) -> bool:
    """Layer i's only outside input is one tensor owned by layer i-1, and its forward takes
    just that (`ir.legality.layout_change_problem`)."""
    if i == 0 or module is None or not takes_one_positional_input(module):
        return False
    # the loss target feeds the loss, which joined the last layer but runs outside it
    target = m.target_placeholder()
    outside = [a for a in m.infos[i].inputs if a is not target]
    return (len(outside) == 1 and m.owner.get(outside[0]) == i - 1
            and not _shaped_glue(m, i, target, micro_batch))


# Ops whose int-list argument is a shape: a trace bakes the batch into it
_SHAPE_OPS = frozenset({"view", "reshape", "expand", "_unsafe_view"})


def _shaped_glue(m: GraphMeasurer, i: int, target, micro_batch: int) -> bool:
    """Layer i's glue before its module (the parent's nodes that feed the module's input)
    passes a shape holding the traced batch, e.g. `h.view(output_shape)` (GPTBigCode):
    a view, reshape or expand (`_SHAPE_OPS`) whose int list holds `micro_batch`. The
    trace baked it at the traced batch; the glue runs on the value in the batch split of
    the layer before, before the executor's input re-split
    (`executors.layout.add_input_relayout`), so that split must be the one the parent's
    shapes were taken in. Other int lists (permute dims, reduction dims, pads) and the
    glue after the module (the loss's included) bake no batch the re-split would break."""
    info = m.infos[i]
    inside = {n for n in info.nodes.nodes if (path := info.module_paths.get(n)) is not None
              and (path == info.nodes.name or path.startswith(info.nodes.name + "."))}
    glue = set(info.nodes.nodes) - inside
    feeding, todo = set(), [a for n in inside for a in n.all_input_nodes if a in glue]
    while todo:  # the glue nodes the module's input is computed from
        n = todo.pop()
        if n not in feeding:
            feeding.add(n)
            todo += [a for a in n.all_input_nodes if a in glue]
    return any(_op_name(n) in _SHAPE_OPS and any(
        isinstance(a, (list, tuple)) and micro_batch in a
        and all(isinstance(x, int) for x in a) for a in list(n.args) + list(n.kwargs.values()))
        for n in feeding)


def _op_name(n) -> str:
    """A node's op without its namespace or overload: aten.view.default, torch.reshape
    and Tensor.expand give view, reshape, expand."""
    if n.op == "call_method":
        return n.target
    if n.op != "call_function":
        return ""
    name = str(n.target)
    return name.split(".")[1] if name.startswith("aten.") else getattr(n.target, "__name__", name)


def _edges_and_cuts(m: GraphMeasurer) -> tuple[list[tuple[int, int, int]], list[int],
                                                list[int]]:
    """(edges, cut points: at most one gradient-carrying value crosses, the gradless cut
    points among them: none does)."""
    n_layers = len(m.layers)
    edge_bytes: dict[tuple[int, int], int] = {}
    crossing = [0] * (n_layers + 1)  # difference array of grad-carrying values per cut
    for node, src in m.owner.items():
        consumers = {m.owner[u] for u in node.users if u in m.owner and m.owner[u] != src}
        if not consumers:
            continue
        nbytes = value_nbytes(m.values.get(node))
        for dst in consumers:
            edge_bytes[(src, dst)] = edge_bytes.get((src, dst), 0) + nbytes
        # a value that carries a gradient across the cut (made from parameters: the
        # meta pass's flag, `ir.stand_in.is_data`'s rule)
        if any(t.requires_grad for t in tensor_leaves(m.values.get(node))):
            crossing[src] += 1
            crossing[max(consumers)] -= 1
    cuts, gradless, running = [], [], 0
    for i in range(n_layers - 1):
        running += crossing[i]
        if running <= 1:
            cuts.append(i)
        if running == 0:
            gradless.append(i)
    edges = [(s, d, b) for (s, d), b in sorted(edge_bytes.items())]
    return edges, cuts, gradless


# ------------------------------------------------------------------------ shape and identity


def _seq_len(inputs: dict[str, torch.Tensor]) -> int | None:
    for t in inputs.values():
        if not is_float(t.dtype) and t.dim() >= 2:
            return int(t.shape[1])
    return None


def _batch_size(inputs: dict[str, torch.Tensor]) -> int:
    for t in inputs.values():
        if t.dim() >= 1:
            return int(t.shape[0])
    return 1


def _fingerprint(layers, dtype, micro_batch, seq_len) -> str:
    """The layer digests at the traced shape (IR dtype, micro-batch, sequence): not the
    model's display name, its example values or its loss (see `layer_digest`)."""
    h = hashlib.sha256()
    h.update(repr((str(dtype), micro_batch, seq_len)).encode())
    for l in layers:
        h.update(layer_digest(l).encode())
    return h.hexdigest()[:16]
