"""Which of a layer's ops the TP executor runs on DTensors outside its TP modules, counted
while the layer is measured on meta.

`executors.tensor_parallel.layer_tp_plan` gives every module of a TP layer that owns
parameters directly but is no TP candidate (`replicated_param_modules`: the norms, Qwen3's
per-head q_norm, multi-query attention's whole key/value projection) a DTensor style:
  - under sequence parallelism every such module (`SequenceParallel`: its input comes in
    as a sequence-split DTensor, its ops run on DTensors, its output goes back local);
  - without it only those inside a module whose column-parallel projections are split
    (`in_split_parent`: they see this rank's heads; `SequenceParallel` on dim 0, or
    `SharedProjection` for a whole Linear).
All other ops of the layer run on plain tensors (the TP modules' DTensor work is priced
per module: `cost_models.tp_probes`). So the trace records, per such module, the ATen ops
dispatched inside it: in forward while an fx node of that module runs, in backward while
autograd runs the function of a node the module's forward made (node pre- and post-hooks;
the module's parameters' AccumulateGrad included: their gradients are DTensors too), plus
one add per extra gradient its nodes send into one slot (the engine sums them after the
node's function; the executor does that on DTensors). A sum of the module's input
gradient with one from outside (the residual) runs on plain tensors under the executor,
after `from_local`'s backward: not counted. `tests/test_sp_dtensor_ops` checks the counts
against the DTensor ops 2 gloo ranks dispatch.
`cost_models.tp_host.dtensor_op_seconds` prices the ones the strategy runs on DTensors
at `ClusterSpec.dtensor_op_overhead_s` each.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import torch
from torch import fx, nn

from ir.saved_tensors import storage_key, tensor_leaves


def replicated_param_modules(module: nn.Module, candidate_paths: Iterable[str]
                             ) -> list[tuple[str, nn.Module]]:
    """(path relative to `module`, submodule) of the modules that own parameters directly
    but lie in no TP candidate (candidate paths relative to `module`; "" is the module
    itself): what the TP executor gives a DTensor style of its own."""
    candidates = list(candidate_paths)
    out = []
    for path, sub in module.named_modules():
        if not any(True for _ in sub.parameters(recurse=False)):
            continue
        if any(path == c or path.startswith(c + ".") or c == "" for c in candidates):
            continue
        out.append((path, sub))
    return out


def in_split_parent(colwise_paths: Iterable[str], path: str) -> bool:
    """`path` sits inside a module whose column-parallel projections (`colwise_paths`,
    relative to the layer) are split, not the layer itself: it sees this rank's heads."""
    parents = {p.rsplit(".", 1)[0] for p in colwise_paths if "." in p}
    return any(path.startswith(p + ".") for p in parents)


def _inside(path: str | None, module_path: str) -> bool:
    return path is not None and (path == module_path or path.startswith(module_path + "."))


class DTensorRegions:
    """Per module path (full, as the fx nodes name them), the ops its forward and backward
    dispatch. `enter(path)` before each fx node of the forward tags the forward's ops;
    `finish_forward(...)` after it finds the autograd nodes each module made and hooks
    them; `count(backward)` charges each op to the module running (forward: its fx node;
    backward: its autograd node's own function, between the node's pre- and post-hook)."""

    def __init__(self, module_paths: Iterable[str]):
        self.paths = tuple(module_paths)
        self.now: str | None = None
        self.forward_ops = dict.fromkeys(self.paths, 0)
        self.backward_ops = dict.fromkeys(self.paths, 0)
        self._owner: dict[object, str] = {}  # autograd node -> module path
        self._backward_now: str | None = None  # module whose node autograd runs

    def enter(self, path: str | None) -> None:
        self.now = next((p for p in self.paths if _inside(path, p)), None)

    def finish_forward(self, nodes: list[fx.Node], paths: dict[fx.Node, str | None],
                       env: dict, param_keys: set, inputs: Iterable[fx.Node] = ()) -> None:
        """Give each autograd node the module whose fx node first carried it (a value an
        fx node passes on unchanged, `.to` its own dtype, keeps its maker), then walk back
        from each module's nodes to what it made inside (a leaf module's inner ops) and
        its parameters' AccumulateGrad, stopping at nodes made outside it (or carried
        by the layer's `inputs`)."""
        self.now = None
        first: dict[object, str | None] = {}
        for n in (*inputs, *nodes):
            owner = next((p for p in self.paths if _inside(paths.get(n), p)), None)
            for t in tensor_leaves(env.get(n)):
                if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                    first.setdefault(t.grad_fn, owner)
        for start, owner in first.items():
            if owner is None:
                continue
            stack = [start]
            while stack:
                node = stack.pop()
                if node is None or node in self._owner or first.get(node, owner) != owner:
                    continue
                variable = getattr(node, "variable", None)
                if variable is not None and storage_key(variable) not in param_keys:
                    continue  # a layer input's leaf: not the module's
                self._owner[node] = owner
                stack.extend(f for f, _ in node.next_functions)
        edges: dict[tuple[object, int], list[str]] = {}  # gradient slot -> consumers' modules
        for node, owner in self._owner.items():
            node.register_prehook(partial(self._running, owner))
            node.register_hook(partial(self._running, None))
            for target, slot in node.next_functions:
                if target is not None:
                    edges.setdefault((target, slot), []).append(owner)
        for owners in edges.values():  # k gradients into one slot: k - 1 adds
            for owner in owners[1:]:
                self.backward_ops[owner] += 1

    def _running(self, owner: str | None, *_hook_args) -> None:
        self._backward_now = owner

    def count(self, backward: bool) -> None:
        """One op dispatched now: charge it to the module running, if any."""
        now = self._backward_now if backward else self.now
        if now is not None:
            (self.backward_ops if backward else self.forward_ops)[now] += 1

    def counts(self, prefix: str) -> tuple[tuple[str, int, int], ...]:
        """((path relative to the layer, forward ops, backward ops), ...)."""
        cut = len(prefix) + 1 if prefix else 0
        return tuple((p[cut:], self.forward_ops[p], self.backward_ops[p]) for p in self.paths)
