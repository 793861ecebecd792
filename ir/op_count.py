"""Counting the ATen ops a layer dispatches, the elements random ops draw, and the
Python numbers torch's binding wraps into Tensor arguments.

Each op costs a framework dispatch on the host, which is what small layers spend their
time on; the compute model prices `Layer.ops_fwd` / `ops_bwd` with the cluster's
per-op overhead, random draws with `ClusterSpec.random_element_s`, and wrapped numbers
(`x * 0.5`) with `KernelCalibration.wrapped_number_host_s` and its cast variant.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

from ir.kernel_recorder import KernelRecorder
from ir.saved_tensors import tensor_leaves

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
        # Python numbers handed for Tensor arguments, and those needing a cast
        # (`wrapped_numbers`): each costs the host beyond its op's dispatch.
        self.wrapped_numbers = 0
        self.cast_wrapped_numbers = 0
        self.on_op: Callable[[], None] | None = None  # told of each op (`ir.dtensor_ops`)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        if self.on_op is not None:
            self.on_op()
        wrapped, cast = wrapped_numbers(func, args, kwargs or {})
        self.wrapped_numbers += wrapped
        self.cast_wrapped_numbers += cast
        out = func(*args, **(kwargs or {}))
        if self.recorder is not None:
            self.recorder.record(func, args, kwargs, out)
        if func.overloadpacket.__name__ in RANDOM_OPS:
            drawn = next((t.numel() for t in tensor_leaves(out)), 0)
            self.random_elements += drawn
            if self.tp_sharded_now:
                self.random_tp_sharded_elements += drawn
        return out


# The dtype torch's Python binding gives a number it wraps into a 0-dim Tensor argument
# (`x * 0.5`): float -> double, int -> long, bool -> bool (bool first: it is an int).
WRAPPED_NUMBER_DTYPES = ((bool, torch.bool), (int, torch.int64), (float, torch.float64))


def wrapped_numbers(func, args, kwargs) -> tuple[int, int]:
    """(numbers, cast): how many Python numbers the op `func` was handed for Tensor-typed
    arguments of its schema (the binding wrapped each into a 0-dim tensor: `x * 0.5`
    dispatches `mul.Tensor(x, 0.5)`; a C++ caller's `mul.Scalar` shows a Scalar type and
    is not counted), and how many of them have a dtype (WRAPPED_NUMBER_DTYPES) other than
    the op's first tensor's, which TensorIterator casts: 0.5 times a float32 tensor."""
    first = next((t.dtype for t in tensor_leaves((args, kwargs))), None)
    numbers = cast = 0
    for i, argument in enumerate(func._schema.arguments):
        if not isinstance(argument.type, torch.TensorType):
            continue
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        dtype = next((d for kind, d in WRAPPED_NUMBER_DTYPES if isinstance(value, kind)), None)
        if dtype is not None:
            numbers += 1
            cast += first is not None and dtype != first
    return numbers, cast


def count_ops(fn: Callable[[], object]) -> int:
    """ATen ops `fn()` dispatches (the same count the layer IR records)."""
    counter = OpCounter()
    with counter:
        fn()
    return counter.count



def autograd_nodes(roots, counts_leaf: Callable[[object], bool]) -> int:
    """Autograd nodes a backward from `roots` (tensors) runs: every node reachable from
    their `grad_fn`s through `next_functions`, a leaf's gradient accumulation
    (`AccumulateGrad`) only where `counts_leaf(its tensor)` (a layer's parameters: its
    input stand-ins are leaves only in the measurement)."""
    seen, stack = set(), [t.grad_fn for t in roots]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
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


def python_calls(nodes: list[fx.Node], started: dict[fx.Node, int], total_ops: int) -> int:
    """Python-level torch calls among `nodes`: each call node that dispatched >= 1 ATen op
    (`_node_ops`; a leaf module's node counts its forward's one functional call, as
    `nn.Linear` calls `F.linear`). A call's first op pays Python's argument parsing; the
    rest of its ops (the layer's `ops_fwd` less these) are dispatched inside a C++
    composite (`F.linear`'s t, views and addmm) and cost the host far less per op
    (`cost_models.call_probes`). A leaf module whose forward makes several torch calls
    is counted as one (its other calls priced as inner ops)."""
    return sum(1 for n, ops in _node_ops(nodes, started, total_ops)
               if n.op in (*PYTHON_NODE_OPS, "call_module") and ops > 0)


# Tensor methods that, with nothing to do (same dtype, device and layout), return the
# tensor itself and dispatch no ATen op, after parsing their arguments in Python's binding
# as a dispatching call does (`x.to(torch.float32)` on float32: ~0.85 us, 2026-11-24).
SELF_RETURNING_METHODS = frozenset({"to", "type", "type_as", "contiguous", "float", "double",
                                    "half", "bfloat16", "long", "int", "bool", "cpu",
                                    "cuda"})


def noop_calls(nodes: list[fx.Node], started: dict[fx.Node, int], total_ops: int) -> int:
    """Of `python_nodes`' nodes, the torch calls that dispatched nothing: a
    `SELF_RETURNING_METHODS` method call (fx records Tensor methods as call_method; an
    exported graph has dropped such calls)."""
    return sum(1 for n, ops in _node_ops(nodes, started, total_ops)
               if n.op == "call_method" and ops == 0 and n.target in SELF_RETURNING_METHODS)
