"""Counting the ATen ops a layer dispatches, the distinct ones among them, the elements
random ops draw, autograd nodes and fx nodes that dispatch nothing.

Each op costs a framework dispatch on the host, which is what small layers spend their
time on; the compute model prices `Layer.ops_fwd` / `ops_bwd` with the cluster's
per-op overhead, the forward's distinct ops (`Layer.distinct_ops_fwd`) with
`KernelCalibration.in_sequence_op_host_s`, those the layer before did not run
(`Layer.cold_distinct_ops_fwd`) with `KernelCalibration.cold_op_host_s`, and random
draws with
`ClusterSpec.random_element_s`.
"""

from __future__ import annotations

from typing import Callable

from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

from ir.kernel_recorder import KernelRecorder
from ir.kernel_records import KernelKind
from ir.saved_tensors import tensor_leaves
from ir.stand_in import is_step_input

# ATen ops that draw random numbers (dropout masks): a CPU thread spends ~10x longer per
# element on them than a memory-bound op moving the same bytes, so the compute model
# prices their elements apart (`ClusterSpec.random_element_s`).
RANDOM_OPS = frozenset({"bernoulli", "bernoulli_", "native_dropout", "rand", "rand_like",
                        "uniform_", "normal_", "randn", "randn_like"})


class OpCounter(TorchDispatchMode):
    """Counts ATen ops dispatched (views and copies included): each costs a framework
    dispatch on the host, which is what small layers spend their time on. Also counts
    the elements random-number ops draw, and how many of them fall where tensor
    parallelism shards the activations (`tp_sharded_now`, set by the layer run). With a
    `recorder`, every op is also recorded as a kernel (`ir.kernel_recorder`)."""

    def __init__(self, recorder: KernelRecorder | None = None):
        super().__init__()
        self.recorder = recorder
        self.count = 0
        self.random_elements = 0
        self.random_tp_sharded_elements = 0
        self.tp_sharded_now = False
        # The distinct ATen overloads dispatched (`aten.add.Tensor`, `aten.view.default`):
        # each has its own code and data, which a run of them cycles through the caches.
        self.overloads: set = set()
        self.on_op: Callable[[], None] | None = None  # told of each op (`ir.dtensor_ops`)

    @property
    def distinct_ops(self) -> int:
        """Distinct ATen op overloads dispatched: a layer's forward runs each one's
        dispatch path, kernel and Python binding in turn, evicting the others' from the
        caches (`cost_models.sequence_probes.in_sequence_chains`)."""
        return len(self.overloads)

    @property
    def overload_names(self) -> frozenset[str]:
        """The distinct overloads' names (`aten.add.Tensor`): what a layer's forward runs
        that the layer before it may not have (`cold_distinct_ops`)."""
        return frozenset(str(op) for op in self.overloads)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.overloads.add(func)
        if self.on_op is not None:
            self.on_op()
        out = func(*args, **(kwargs or {}))
        if self.recorder is not None:
            self.recorder.record(func, args, kwargs, out)
        if func.overloadpacket.__name__ in RANDOM_OPS:
            drawn = next((t.numel() for t in tensor_leaves(out)), 0)
            self.random_elements += drawn
            if self.tp_sharded_now:
                self.random_tp_sharded_elements += drawn
        return out


# A run of distinct ops keeps this many ops' code and data in cache: the in-sequence probe's
# knee (`cost_models.sequence_probes.in_sequence_cost`: six fits, 16-17 distinct ops on this
# CPU, 2026-11-25). A layer that ran fewer leaves the ops of the layers before it warm.
COLD_WINDOW_DISTINCT_OPS = 16


def recent_window_layers(previous: list[frozenset[str]]) -> int:
    """How many of the layers before a layer (`previous`, their forward ops, nearest
    first) leave their ops warm when it starts: the layer before always, earlier ones while
    fewer than COLD_WINDOW_DISTINCT_OPS distinct ops ran since (a norm between a block and
    a head leaves the block's matmul warm: llama-tiny's head ran 2 us of cold code at 2
    cold ops counted so, where the layer before alone counts 6:
    bench/bench_small_layers.py, 2026-11-25). `recent_forward_ops` counts against them,
    `cost_models.layer_profile.StepNeighbours` runs them before a timed forward."""
    if not previous:
        return 0
    ran, layers = previous[0], 1
    for earlier in previous[1:]:
        if len(ran) >= COLD_WINDOW_DISTINCT_OPS:
            break
        ran, layers = ran | earlier, layers + 1
    return layers


def recent_forward_ops(previous: list[frozenset[str]]) -> frozenset[str] | None:
    """The forward ops warm when a layer starts: those of the `recent_window_layers`
    layers before it (`previous`, nearest first). None: no layer before
    (`cold_distinct_ops`' first layer)."""
    if not previous:
        return None
    return frozenset().union(*previous[:recent_window_layers(previous)])


def recent_backward_ops(after: list[frozenset[str]]) -> frozenset[str] | None:
    """The backward ops warm when a layer's backward starts: those of the layers whose
    backward ran just before it (`after`, their backward ops, the layer after first), as
    many as `recent_window_layers` keeps (the forward's rule: the layer after always,
    further ones while fewer than COLD_WINDOW_DISTINCT_OPS distinct ops ran since; dlrm's
    bottom_mlp after four tables' backwards of 2 ops each starts with top_mlp's mm and
    threshold_backward warm: priced with none cold it ran 4-12% under its price, where
    its 5 ops cold after tables.0 alone would price it 16-23% over: bench_kernel_model,
    2026-11-25, load 1). None: no
    layer after (`cold_distinct_ops_bwd`'s last layer)."""
    return recent_forward_ops(after)  # one window rule for both passes


def step_evicts(forward_ops: list[frozenset[str]], backward_ops: list[frozenset[str]]) -> bool:
    """Whether a step's distinct ops (every layer's forward and backward ops) are more than
    a cache holds (COLD_WINDOW_DISTINCT_OPS): then each layer's forward starts with its code
    and objects out of the caches; else the whole step stays warm (`Layer.step_warm`:
    mlp-small, 12 distinct ops, whose layers' forwards ran within 3 us of right after
    themselves: bench/bench_small_layers.py, 2026-11-25; its first layer and head still
    pay an entry, `cost_models.host_dispatch.warm_step_entry_seconds`)."""
    return len(frozenset().union(*forward_ops, *backward_ops)) > COLD_WINDOW_DISTINCT_OPS


def step_between(layers: list, index: int) -> dict:
    """`Layer.after_ops`, `after_bytes` (their kernels' bytes) and `same_code_before` of
    `layers[index]`, from what `planner profile` runs between its backward and its next
    forward (`cost_models.layer_profile.StepNeighbours`): the forward and backward ops of
    the layers of its backward window (`recent_backward_ops`' layers, the profile's
    `StepNeighbours.afters`; for the last layer, those of the layers before in its window,
    `recent_window_layers`, which it runs after
    the last layer's backward); and whether the layer just before runs the same forward
    ops (its code warm, only the layer's own objects cold); `Layer.backward_after_ops`:
    the forward and backward ops of the layers after in its backward window
    (`recent_backward_ops`' layers), what the profile runs between two of its backwards
    beside forwards; for the last layer, whose backward follows no other, all it runs
    there but its own forward (`StepNeighbours.after_backward` then `before_forward`): the
    layers before's (`after` above) forwards and backwards, then their forwards again
    (bench/bench_head_cold_ab.py, bench/bench_head_arrangement.py)."""
    after = []
    if index + 1 == len(layers):
        previous = [layers[j].measured.forward_overloads for j in range(index - 1, -1, -1)]
        after = layers[index - recent_window_layers(previous):index]
    same = index > 0 and (layers[index - 1].measured.forward_overloads
                          == layers[index].measured.forward_overloads)
    later = [layers[j].measured.backward_overloads for j in range(index + 1, len(layers))]
    window = layers[index + 1:index + 1 + recent_window_layers(later)] if later else after
    again = 0 if later else sum(layer.ops_fwd for layer in after)  # the last's befores
    # the profile runs the whole backward window's forwards and backwards there
    # (`StepNeighbours.afters` = `layer_profile.backward_window`), not the layer after's
    # alone (the last layer's window is `after`)
    return {"after_ops": sum(layer.ops_fwd + layer.ops_bwd for layer in window),
            "after_bytes": sum(kernel_bytes(layer) for layer in window),
            "same_code_before": same,
            "backward_after_ops": again + sum(layer.ops_fwd + layer.ops_bwd
                                              for layer in window)}


def recent_code_bytes(layers: list, index: int) -> dict:
    """`Layer.recent_ops_fwd` / `recent_ops_bwd` of `layers[index]`: for each distinct
    memory op of its pass that the work a step (and `planner profile`,
    `cost_models.layer_profile.StepNeighbours`) runs just before that pass ran too, the
    kernel bytes run since its last run there, as (op, weight bytes, activation bytes) at
    the traced micro-batch: the records after its last there (first-occurrence order,
    x count) and the pass's own before its first. The work before a forward: the layers
    before's forwards (`recent_window_layers`, as `recent_forward_ops`); before a
    backward: its own forward, then its backward window's forwards and backwards
    (`step_between`'s window; the last layer's: its forward alone). Its cold kernel code
    is read at these bytes (`cost_models.cold_kernel.recent_code_credit_seconds`)."""
    layer = layers[index]
    previous = [layers[j].measured.forward_overloads for j in range(index - 1, -1, -1)]
    befores = layers[index - recent_window_layers(previous):index]
    later = [layers[j].measured.backward_overloads for j in range(index + 1, len(layers))]
    window = layers[index + 1:index + 1 + recent_window_layers(later)]

    def records(ran, backward: bool) -> list:
        return [] if ran.kernels is None else list(
            ran.kernels.backward if backward else ran.kernels.forward)

    forward_work = [records(b, False) for b in befores]
    backward_work = ([records(layer, False)] + [records(w, False) for w in window]
                     + [records(w, True) for w in reversed(window)])
    return {"recent_ops_fwd": _bytes_since(records(layer, False), forward_work),
            "recent_ops_bwd": _bytes_since(records(layer, True), backward_work)}


def _bytes_since(own: list, work: list[list]) -> tuple[tuple[str, int, int], ...]:
    """(op, weight bytes, activation bytes) since each distinct memory op of `own` last ran
    in `work` (passes in run order, each its records): ops it never ran are left out."""
    out = []
    for first, r in enumerate(own):
        if r.kind is not KernelKind.MEMORY or any(o.op == r.op for o in own[:first]):
            continue
        weight = sum(o.weight_bytes * o.count for o in own[:first])
        activation = sum(o.activation_bytes * o.count for o in own[:first])
        for records in reversed(work):
            last = max((i for i, o in enumerate(records) if o.op == r.op), default=None)
            if last is not None:
                out.append((r.op, weight + sum(o.weight_bytes * o.count
                                               for o in records[last + 1:]),
                            activation + sum(o.activation_bytes * o.count
                                             for o in records[last + 1:])))
                break
            weight += sum(o.weight_bytes * o.count for o in records)
            activation += sum(o.activation_bytes * o.count for o in records)
    return tuple(out)


def kernel_bytes(layer) -> int:
    """Bytes a layer's kernels move in one forward and backward (its records'
    `total_bytes`; 0 for a layer without records): `Layer.after_bytes` sums a window's."""
    if layer.kernels is None:
        return 0
    return sum(r.total_bytes for r in layer.kernels.forward + layer.kernels.backward)


def cold_distinct_ops(measured, before: frozenset[str] | None) -> int:
    """Distinct forward ops of a layer (`measured.forward_overloads`) that the layers run
    before it did not run (`before`: `recent_forward_ops`); for the first layer (None), those
    its own backward did not run (`measured.backward_overloads`: a step's last backward,
    then the optimizer, precede it). Each runs with its code and data out of the caches
    (`cost_models.cold_entry_probes.cold_entry_cost`)."""
    ran = measured.backward_overloads if before is None else before
    return len(measured.forward_overloads - ran)


def cold_distinct_ops_bwd(measured, after: frozenset[str] | None) -> int:
    """Distinct backward ops of a layer (`measured.backward_overloads`) that the layers
    after it, whose backward runs just before, did not run (`after`: `recent_backward_ops`);
    for the last layer (None), those its own forward did not run (its backward follows
    it): `cold_distinct_ops` in backward order. Each runs with its code and data out of
    the caches (`cost_models.cold_backward_probes.cold_backward_cost`)."""
    ran = measured.forward_overloads if after is None else after
    return len(measured.backward_overloads - ran)


def count_ops(fn: Callable[[], object]) -> int:
    """ATen ops `fn()` dispatches (the same count the layer IR records)."""
    counter = OpCounter()
    with counter:
        fn()
    return counter.count


def autograd_nodes(roots, counts_leaf: Callable[[object], bool]) -> int:
    """Autograd nodes a backward from `roots` (tensors) runs: every node reachable from
    their `grad_fn`s through `next_functions`, a leaf's gradient accumulation
    (`AccumulateGrad`) only where `counts_leaf(its tensor)` (a layer's parameters), none
    past a layer's input (`ir.stand_in.StepInput`: the layer before's node in a step)."""
    seen, stack = set(), [t.grad_fn for t in roots]
    while stack:
        node = stack.pop()
        if node is None or node in seen or is_step_input(node):
            continue
        variable = getattr(node, "variable", None)  # AccumulateGrad's leaf
        if variable is not None and not counts_leaf(variable):
            continue
        seen.add(node)
        stack.extend(f for f, _ in node.next_functions)
    return len(seen)


# Counts of a layer's fx call nodes, run in order, from the op count when each started
# (`started`) and after the last (`total_ops`): `ir.graph_measurer` takes them per layer.
PYTHON_NODE_OPS = ("call_function", "call_method")


def _node_ops(nodes: list[fx.Node], started: dict[fx.Node, int], total_ops: int):
    """(node, ATen ops it dispatched) for `nodes` run in order, from the op count when
    each started (`started`) and after the last (`total_ops`)."""
    ends = [started[n] for n in nodes[1:]] + [total_ops]
    return [(n, end - started[n]) for n, end in zip(nodes, ends)]


def python_nodes(nodes: list[fx.Node], started: dict[fx.Node, int], total_ops: int) -> int:
    """Call nodes among `nodes` that dispatched no ATen op (`_node_ops`): lines of the
    generated forward that cost the host Python only. Module calls are counted apart
    (`ir.graph_measurer.GraphMeasurer.module_calls`), get_attr nodes are attribute reads."""
    return sum(1 for n, ops in _node_ops(nodes, started, total_ops)
               if n.op in PYTHON_NODE_OPS and ops == 0)
