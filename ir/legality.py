"""What the executor can run, decided from the layer IR: the one legality contract.

The search (`planner.search_space`, `planner.search`) offers only what these functions
allow, and the executor (`executors.validate.check_plan`) rejects by the same functions
(plus checks against the live module, for plans written by hand). Facts that need the
module (its forward signature, which modules are norms) are read once at trace time
(`ir.measure`) and stored on the `Layer`:

    Layer.chain_input            its only input is one tensor from the layer before it
    Layer.sequence_parallel_ok   SP can run it (`sequence_parallel_problem` says why not)

    sequence_parallel_applies(layer, strategy)   does SP change how the layer runs
    layout_change_problem(graph, j, tp_a, tp_b)  can layer j follow TP tp_a with tp_b
    input_readers(graph)                         layers that may read the model's inputs
    input_layout_problem(graph, j, first, ...)   do they read them in their stage's split
    linked_runs(graph)                           runs of layers that share one TP degree
    pipeline_problem(graph)                      can the model be cut into stages at all
    layer_module_problem(graph)                  is every layer one module holding its
                                                 weights (else no plan can run)
"""

from __future__ import annotations

import inspect

from torch import nn

from ir.layer import Layer, LayerGraph, TPCandidate, TPStyle
from ir.strategy import LayerStrategy

_BLOCK_STYLES = (TPStyle.COLWISE, TPStyle.ROWWISE)


def is_tp_block(candidates: tuple[TPCandidate, ...]) -> bool:
    """A layer with column- or row-parallel linears (not an embedding or a head)."""
    return any(c.style in _BLOCK_STYLES for c in candidates)


def _inside(path: str, prefix: str) -> bool:
    return prefix == "" or path == prefix or path.startswith(prefix + ".")


def sequence_parallel_problem(name: str, module: nn.Module,
                              candidates: tuple[TPCandidate, ...]) -> str | None:
    """Why sequence parallelism (Korthikanti et al. 2022) cannot run this layer, or None.
    SP runs every module that is not a TP candidate on a sequence chunk, so those must be
    norms; and it gathers the sequence at the input of the module holding the
    column-parallel linears, which must not be the layer itself."""
    if not is_tp_block(candidates):
        return (f"layer {name}: sequence parallelism needs column- and row-parallel linears; "
                "an embedding, head or norm runs on the full sequence")
    paths = [c.module for c in candidates]
    split_parents = {c.module.rsplit(".", 1)[0] for c in candidates
                     if c.style is TPStyle.COLWISE and "." in c.module}
    for path, sub in module.named_modules():
        if not any(True for _ in sub.parameters(recurse=False)):
            continue
        if any(_inside(path, p) for p in paths):
            continue
        # a Linear left whole inside a split attention (multi-query key/value) takes the
        # gathered input like its split siblings
        shared = isinstance(sub, nn.Linear) and any(path.startswith(p + ".")
                                                    for p in split_parents)
        if "norm" not in type(sub).__name__.lower() and not shared:
            return (f"layer {name}: sequence parallel runs every non-TP module on a sequence "
                    f"chunk, but {path} ({type(sub).__name__}) is not a normalization; turn "
                    "sequence_parallel off for this layer")
    colwise = [c.module for c in candidates if c.style is TPStyle.COLWISE]
    if any("." not in p for p in colwise):
        return (f"layer {name}: sequence parallel gathers the input of the module holding the "
                "column-parallel linears, which here is the layer itself; turn "
                "sequence_parallel off for this layer")
    return None


def sequence_parallel_applies(layer: Layer, strategy: LayerStrategy) -> bool:
    """Whether `strategy` runs `layer` sequence-parallel. On a layer SP cannot run (an
    embedding, a head, a final norm) the flag changes nothing, and the search never sets it."""
    return strategy.sequence_parallel and strategy.tp > 1 and layer.sequence_parallel_ok


def takes_one_positional_input(module: nn.Module) -> bool:
    """forward(x): the executor re-splits a layer's batch at its one input."""
    params = list(inspect.signature(module.forward).parameters.values())
    return len(params) == 1 and params[0].kind in (params[0].POSITIONAL_ONLY,
                                                   params[0].POSITIONAL_OR_KEYWORD)


def layout_change_problem(graph: LayerGraph, j: int, tp_before: int, tp_after: int) -> str | None:
    """Why layer j (TP degree tp_after) cannot follow layer j-1 (tp_before), or None.

    In a stage of D devices a layer of TP degree t runs D/t data-parallel replicas, so a
    TP change re-splits the batch (`executors.layout.relayout`). The executor does that on
    the layer's one input; a layer that also takes masks, position embeddings or model
    inputs would see those in the old split, so its degree must equal its neighbour's."""
    if tp_before == tp_after:
        return None
    name, prev = graph.layers[j].name, graph.layers[j - 1].name
    if max(tp_before, tp_after) % min(tp_before, tp_after):
        return (f"layer {name}: TP degree {tp_after} after {tp_before} (layer {prev}); "
                "neighbouring TP degrees must divide one another")
    if not graph.layers[j].chain_input:
        return (f"layer {name}: its data-parallel degree would change (tp {tp_before} -> "
                f"{tp_after}), which re-splits the batch of its input; that needs a layer taking "
                f"one tensor produced only by {prev}; give both layers the same tp")
    return None


def input_readers(graph: LayerGraph) -> list[int]:
    """Layers after the first that are not chain inputs: besides their neighbour's output
    they may read the model's inputs (decoder ids, masks), which reach every stage split
    as the stage's first layer is (`executors.runtime`)."""
    return [j for j in range(1, len(graph.layers)) if not graph.layers[j].chain_input]


def input_layout_problem(graph: LayerGraph, j: int, first: int, tp_first: int,
                         tp_j: int) -> str | None:
    """Why layer j (TP degree tp_j), in the stage that starts at layer `first` (tp_first),
    would read the model's inputs in another batch split than its own, or None."""
    if tp_first == tp_j or graph.layers[j].chain_input:
        return None
    return (f"layer {graph.layers[j].name}: it may read the model's inputs, which reach its "
            f"stage split as layer {graph.layers[first].name} (tp {tp_first}) is; give it "
            f"tp {tp_first} too")


def linked_runs(graph: LayerGraph) -> list[tuple[int, int]]:
    """Maximal runs [a, b] of >= 2 layers where each layer after the first is not a chain
    input: every layer of a run must have the same TP degree (`layout_change_problem`)."""
    runs, start = [], 0
    for j in range(1, len(graph.layers) + 1):
        if j == len(graph.layers) or graph.layers[j].chain_input:
            if j - 1 > start:
                runs.append((start, j - 1))
            start = j
    return runs


def pipeline_problem(graph: LayerGraph) -> str | None:
    """Why the model cannot be cut into pipeline stages at all, or None. A stage replaces
    the layer modules outside it (`executors.pipeline`), so every layer must be a module
    (merged layers: `merged_layer_problem`, refused at any pp before this is asked)."""
    if not graph.cut_points:
        return f"{graph.model} has no place where a pipeline can cut (one tensor crossing)"
    for layer in graph.layers:
        if not layer.name:
            return "a pipeline cannot cut root-level glue layers"
    return None


def layer_module_problem(graph: LayerGraph) -> str | None:
    """Why no plan can run the model, or None: the executor applies each layer's strategy
    to one module holding every weight the layer owns. The search refuses the model
    (`planner.search_space.outer_candidates`), and `executors.validate.check_plan` a plan."""
    return merged_layer_problem(graph) or weight_outside_layers_problem(graph)


def weight_outside_layers_problem(graph: LayerGraph) -> str | None:
    """A weight a layer owns (it reads it first) under no name inside its module, or None:
    e.g. a parent holding the block stack reads it in its own forward (DeBERTa-v2's
    `encoder.rel_embeddings.weight`, handed to every block), so no strategy shards it or
    averages its gradient. Asked after `merged_layer_problem` (`layer_module_problem`):
    each layer's name is one module's."""
    for layer in graph.layers:
        paths = (layer.name + ".",) if layer.name else ("",)
        outside = [p for p in layer.param_names if not p.startswith(paths)]
        if outside:
            return (f"layer {layer.name} reads parameter {outside[0]} from outside its "
                    "module, so no strategy can shard it or average its gradient; register "
                    "the weight inside that layer's module")
    return None


def merged_layer_problem(graph: LayerGraph) -> str | None:
    """Why no plan can run the model, or None: the executor applies each layer's strategy
    to one module (`executors.apply`), and `ir.layers` merges modules called on both sides
    of another layer into one layer of several modules."""
    for layer in graph.layers:
        if "+" in layer.name:
            return (f"layer {layer.name}: modules called at several places are merged into one "
                    "layer, and the executor applies a strategy to one module per layer")
    return None
