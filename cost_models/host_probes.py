"""Timing what the framework adds on the host, inside a process group `profile-cluster`
spawned (CPU processes: wall-clock figures hold the ranks' sharing of the cores, the DP
unit's CPU time does not), and per pass on one process (`host_op_seconds_by_pass`).

  op_overhead_s / backward_op_overhead_s   seconds per ATen op in forward (Python) and
                            backward (autograd's C++ engine), timed apart on one thread,
                            in parts for the device kit (`HostOpCost`);

  dtensor_op_overhead_s     extra seconds per op on replicated DTensors (rank 0 alone);
  (a data-parallel unit's: `cost_models.dp_unit_probe`; a tensor-parallel module's:
  `cost_models.tp_probes`; the optimizer step's: `cost_models.step_probes`.)
Each is timed against the same work without the feature, the two alternating, so a
slow spell of a shared machine hits both. `cost_models.host_overhead_fit` takes out what
the comm model already prices.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass


# Per-pass op probe: a chain of HOST_OP_CHAIN_BLOCKS tiny blocks (`clusters._overhead_block`,
# 2 x 8 activations: a few hundred FLOPs per op, nanoseconds of kernel, so what is timed is
# dispatch). A run is one forward then one backward, each timed; a round sums
# HOST_OP_RUNS_PER_ROUND runs (tens of milliseconds of work, far above the clock's
# resolution); the figure is the median round of HOST_OP_ROUNDS, the spread (max - min) /
# median over rounds says how steady the machine was.
HOST_OP_CHAIN_BLOCKS = 8
# The distinct ATen ops the function chain runs in order (t, addmm, native_layer_norm,
# gelu, sum; `ir.op_count.OpCounter`, pinned by tests/test_forward_host.py): its per-op
# figures hold what its ops pay among these (`sequence_probes`), which
# `host_dispatch.forward_host_seconds` nets out of a layer's in-sequence term.
HOST_OP_CHAIN_DISTINCT_OPS = 5
HOST_OP_RUNS_PER_ROUND = 50
HOST_OP_ROUNDS = 11
HOST_OP_ROUNDS_GPU = 5  # each ~5x longer there (H100 block probe 33.2 us an op, here 6.1)
HOST_OP_WARMUP_RUNS = 5


def probe_clock(device: str):
    """The clock a probe reads: on CPU this thread's CPU time. The probes run on one thread
    without I/O, so on an idle host it equals the wall clock; on a shared one it leaves out
    the time other processes held the core. At load 10 on 2 cores here (2026-11-24) the
    wall clock put this module's forward probe at 11.5-12.0 us per op (spread 124-335%),
    the thread clock at 3.8-3.9 (4-20%), while a layer's sub-millisecond calls mostly ran
    unpreempted. GPUs: the wall clock (the host waits on the device)."""
    return time.thread_time if device == "cpu" else time.perf_counter


@dataclass(frozen=True, slots=True)
class HostOpCost:
    """Host seconds per dispatched op in each pass (the median round), and their range.
    The forward also in three parts: per view op (`view_op_s`: metadata only, no kernel),
    per other op called as a function (`function_op_s`) and per leaf-module call on top
    of its ops (`module_call_s`). The backward also in four: per view and per other
    op as a formula dispatches them, from C++ with grad mode off
    (`host_excess.internal_dispatch_seconds`), per ATen op's fixed excess (`excess_s`), and per autograd node the engine runs
    (`backward_node_s`: the chain's backward less those, over its nodes)."""
    forward_s: float
    backward_s: float
    forward_range_s: tuple[float, float]  # (least, most) per op over the rounds
    backward_range_s: tuple[float, float]
    forward_ops: int
    backward_ops: int
    function_op_s: float = 0.0
    module_call_s: float = 0.0
    view_op_s: float = 0.0
    backward_view_op_s: float = 0.0
    backward_nonview_op_s: float = 0.0
    backward_node_s: float = 0.0
    excess_s: tuple[tuple[str, float], ...] = ()  # (op, seconds): `cost_models.host_excess`
    python_node_s: float = 0.0  # per fx node dispatching nothing (with `excess_s` out
    # of `function_op_s`): `host_excess.python_node_seconds`
    # The function chain again with grad mode off: per other op with nothing recorded,
    # per view as a C++ caller dispatches it (F.linear's t, matmul's views, autograd's
    # detach of a saved output: 40 of llama-tiny block's 64 forward views; the Python
    # `views` chain read 1.2 us a view here, a C++ loop 0.35: `host_excess
    # .internal_dispatch_seconds`), and per autograd node the grad-mode forward records
    # (`forward_node_s`: the two functions runs' difference over the chain's grad_fns).
    function_nograd_op_s: float = 0.0
    view_nograd_op_s: float = 0.0
    forward_node_s: float = 0.0
    # ... and per view called from Python, one fx node each, grad mode off (the same
    # probe's `python_view_s`; a layer's Python-level views, `Layer.python_view_nodes_fwd`)
    python_view_nograd_op_s: float = 0.0
    # the grad-off runs and the C++-called figures were timed: the per-op figures
    # record nothing and the nodes are priced apart. A flag, not a figure's sign: any of
    # them is a slope or a difference that may read 0 on a loaded host.
    parts_measured: bool = False

    def spread(self, backward: bool = False) -> float:
        """(most - least) / median over the rounds: how steady the machine was."""
        (low, high), mid = (self.backward_range_s, self.backward_s) if backward else (
            self.forward_range_s, self.forward_s)
        return (high - low) / mid if mid > 0 else 0.0

    def calibration_fields(self) -> dict:
        """The `KernelCalibration` fields these figures fill (the parts, not the totals)."""
        from ir.kernel_calibration import HostOpExcess

        recorded_apart = self.parts_measured
        return dict(forward_host_op_s=(self.function_nograd_op_s if recorded_apart
                                       else self.function_op_s),
                    module_call_host_s=self.module_call_s,
                    view_host_op_s=self.view_nograd_op_s if recorded_apart else self.view_op_s,
                    python_view_host_op_s=self.python_view_nograd_op_s,
                    forward_node_host_s=self.forward_node_s,
                    backward_view_host_op_s=self.backward_view_op_s,
                    backward_nonview_host_op_s=self.backward_nonview_op_s,
                    backward_node_host_s=self.backward_node_s,
                    python_node_host_s=self.python_node_s,
                    host_op_excess=tuple(HostOpExcess(op, s) for op, s in self.excess_s))


def host_op_seconds_by_pass(device: str = "cpu", gpu: bool | None = None) -> HostOpCost:
    """Seconds per ATen op of a tiny chain's forward (grad enabled, as training runs it)
    and, apart, of its backward (`loss.backward()`: autograd's engine dispatches every
    backward op from C++). Ops are counted per pass with `ir.op_count.count_ops`, the
    counter that gives `Layer.ops_fwd` / `ops_bwd`, so the two figures price those counts.

    The forward's price per op depends on how the ops are called: a model's layer calls
    some as functions and some inside modules (each `nn.Module.__call__` costs the host
    more than one op, a view far less: it makes no kernel). So the same chain's forward is
    also timed three more ways: its leaf modules called one after another (as a layer's
    generated forward calls them), the same ops as `torch.nn.functional` calls on the same
    tensors, and a chain of views. Per view op = the last over its ops; per other op as a
    function = (the second - its views x that) / its other ops (less its ops' fixed
    excess, `host_excess`, over them: a layer pays its own ops'), per fx call node that
    dispatches nothing `host_excess.python_node_seconds`; per module call = (first -
    second) / leaf calls. Ops are told apart as `ir.kernel_recorder` tells a layer's.
    The function chain runs again with grad mode off: its per-op figure then
    records nothing, its views (F.linear's t) taken out at a C++ caller's price
    (`host_excess.internal_dispatch_seconds`, the kit's per-view figure too: the Python
    chain's 1.2 us a view, 3x that, over-priced view-heavy forwards, dlrm's bottom MLP
    and llama-tiny's blocks, and under-priced the other ops), and per forward autograd
    node = (functions with grad - without) / the grad_fns the chain records
    (`ir.op_count.autograd_nodes` without accumulations, the count
    `host_dispatch.forward_host_seconds` takes of a layer): an op on int tensors, or on
    tensors needing no gradient, records none. A view an fx node of the layer calls from
    Python (`x.view`, `transpose`, a slice) pays the binding and its line on top: the same
    C++ probe's `python_view_s` (grad off; its node priced apart as above).
    One thread; the runs alternate within each round (a slow spell hits all of them), the
    module and function chains in turns (the first after a backward pays the caches').

    Backward, in parts: the engine runs one node per forward op that
    recorded one plus one per parameter tensor (its gradient's accumulation), and each
    node's formula dispatches ops from C++ with grad mode off. Per view and per other op:
    `host_excess.internal_dispatch_seconds` (a C++ loop's: the plain probe's Python
    binding, ~0.3-0.4 us a call here, put on each view and op, left mlp-small's block
    backward, 9 views to 5 nodes, +16..+29% over against the chain's 16 to 12); per
    node = (the chain's backward - its views x per view - its other ops x per op - its
    ops' excess) / its nodes (`ir.op_count.autograd_nodes`, the count
    `host_dispatch.backward_host_seconds` takes of a layer). The chain's backward is
    timed after its forward and the forward of a copy with its own parameters (the layer
    after), in one call after the copy's nodes, by an `autograd_engine.NodeSpan`, every
    gradient set to None first, as a step's first micro-batch runs a layer's after the
    layer after's (and `layer_profile.time_layer` a profiled one's); the figure is the
    median run, as the profile's. Timed after the forward variants instead, its code
    partly evicted, it read ~18 us more (0.2 us a node, 2026-11-25); after the chain
    itself as the neighbour, the two graphs shared each parameter's accumulation node
    and the span ran their gradients' sums (48 adds) too: 2.7-3.2 us a node against
    1.9-2.2, mlp-small's first block +55..+80% over against +19..+38% (4 paired rounds,
    bench/bench_backward_probe.py, load 4-6, 2026-11-25).
    Both backward figures leave out the span's own cost (`node_span_s`); a step pays the
    engine's start (`autograd_call_s`) once per micro-batch and stage."""
    import torch
    from torch import nn

    from cost_models.autograd_engine import NodeSpan
    from cost_models.clusters import OP_OVERHEAD_WIDTH, _one_thread, _overhead_block
    from cost_models.host_excess import (CORE_EXCESS_OPS, HOST_EXCESS_OPS,
                                         internal_dispatch_seconds, plain_dispatch_seconds,
                                         python_node_seconds, records_excess_seconds)
    from cost_models.item_probes import bag_python_excess
    from ir.kernel_recorder import KernelRecorder
    from ir.op_count import OpCounter, autograd_nodes, count_ops

    gpu = device != "cpu" if gpu is None else gpu  # a test takes the GPU branch on CPU
    span_s = node_span_s(device)
    # views and ops as C++ callers dispatch them (forward views mostly, a formula's all)
    internal = internal_dispatch_seconds(device)
    with _one_thread():
        chain, leaves, calls = host_probe_chain(device)
        # the layer after, with parameters of its own as in a step (docstring)
        after = nn.Sequential(*[_overhead_block() for _ in range(HOST_OP_CHAIN_BLOCKS)]).to(device)
        x = torch.randn(2, OP_OVERHEAD_WIDTH, device=device)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        holder = {}
        clock = probe_clock(device)

        def clear():  # a step's first micro-batch: no gradient to accumulate into
            chain.zero_grad(set_to_none=True)
            after.zero_grad(set_to_none=True)

        def forward():
            holder["loss"] = chain(x).sum()

        def backward():
            holder.pop("loss").backward()

        def neighbour():  # the layer after's forward: its nodes run first (`StepNeighbours`)
            return after(x).sum()

        def through_modules():
            y = x
            for module in leaves:
                y = module(y)
            return y.sum()

        as_functions = functools.partial(run_as_functions, calls, x)

        def views():
            y = x.detach().requires_grad_()  # requiring grad, as a layer's input does
            for _ in range(len(calls)):
                y = y.view(-1).view(x.shape)
            return y

        for _ in range(HOST_OP_WARMUP_RUNS):
            clear()
            forward()
            backward()
            through_modules()
            as_functions()
            views()
        clear()
        forward_ops = count_ops(forward)
        backward_ops = count_ops(backward)
        function_ops = count_ops(as_functions)
        view_ops = count_ops(views)
        forward_nodes = autograd_nodes([as_functions()], lambda t: False)  # grad_fns only
        recorder = KernelRecorder(set())
        with OpCounter(recorder):
            as_functions()
        function_records = recorder.records()
        function_views = sum(r.count for r in function_records if r.host_view)
        clear()
        forward()  # its backward is the one recorded next
        nodes = autograd_nodes([holder["loss"]], lambda t: True)  # its leaves: parameters
        recorder = KernelRecorder(set())
        with OpCounter(recorder):
            backward()  # each gradient stolen, as in the rounds (`layer_profile.time_layer`)
        backward_records = recorder.records()
        forward_rounds, backward_rounds, function_rounds, module_rounds = [], [], [], []
        view_rounds, nograd_rounds, node_rounds = [], [], []

        def view_rounds_s(views_s: float) -> float:  # per view of the Python views chain
            return views_s / HOST_OP_RUNS_PER_ROUND / max(view_ops, 1)

        for _ in range(HOST_OP_ROUNDS_GPU if gpu else HOST_OP_ROUNDS):
            forward_s = modules_s = functions_s = views_s = 0.0
            backward_runs = []
            nograd_functions_s = 0.0
            for run in range(HOST_OP_RUNS_PER_ROUND):
                clear()
                span = NodeSpan(device, clock, sync)  # made first: its node runs after
                start = clock()
                forward()
                sync()
                forward_s += clock() - start
                # the chain's nodes after the layer after's in one call, as a step and
                # `layer_profile.time_layer` run them, timed by the span
                roots = [neighbour(), holder.pop("loss"), span.root]
                span.arm(roots[1:2])
                torch.autograd.backward(roots, [torch.ones_like(t) for t in roots])
                backward_runs.append(span.seconds())
                for timed in (through_modules, as_functions)[::1 if run % 2 else -1]:
                    start = clock()
                    timed()
                    sync()
                    if timed is through_modules:
                        modules_s += clock() - start
                    else:
                        functions_s += clock() - start
                start = clock()
                views()
                views_s += clock() - start
                with torch.no_grad():  # entered outside the clock
                    start = clock()
                    as_functions()
                    sync()
                    nograd_functions_s += clock() - start
            runs = HOST_OP_RUNS_PER_ROUND
            # the chain's views are F.linear's t: a C++ caller's
            nograd_rest_s = nograd_functions_s / runs - function_views * internal.view_s
            nograd_rounds.append(max(0.0, nograd_rest_s) / max(function_ops - function_views, 1))
            node_rounds.append(max(0.0, functions_s - nograd_functions_s) / runs
                               / max(forward_nodes, 1))
            forward_rounds.append(forward_s / runs / max(forward_ops, 1))
            # the round's median run, as the profile takes a layer's (a mean also took
            # the runs a slow spell hit: ~5% more here, 2026-11-25)
            backward_rounds.append(max(0.0, statistics.median(backward_runs) - span_s)
                                   / max(backward_ops, 1))
            view_rounds.append(view_rounds_s(views_s))
            others_s = functions_s / runs - function_views * view_rounds[-1]
            function_rounds.append(max(0.0, others_s) / max(function_ops - function_views, 1))
            module_rounds.append(max(0.0, modules_s - functions_s) / runs / len(leaves))

    backward_s = statistics.median(backward_rounds) * backward_ops  # the chain's, engine out
    function_op_s = statistics.median(function_rounds)
    # GPUs: the core ops' excess (the swept ones', 0.5-2 us on this CPU, small by a launch)
    plain = plain_dispatch_seconds(device, CORE_EXCESS_OPS if gpu else HOST_EXCESS_OPS)
    # the chain's exact GELU, layer norm and addmm excess out of its per-op figure
    # (`host_dispatch.forward_host_seconds` charges each layer's own)
    chain_excess_s = records_excess_seconds(
        function_records, lambda op: plain.excess_s.get(op, 0.0)) / max(
        function_ops - function_views, 1)
    function_op_s = max(0.0, function_op_s - chain_excess_s)
    nograd_op_s = max(0.0, statistics.median(nograd_rounds) - chain_excess_s)
    # a formula's op from C++: on a GPU the grad-off chain's (`_foreach_add` is one fused
    # kernel there, no per-op loop; the Python binding, ~0.3 us, is small by its launch)
    op_s = nograd_op_s if gpu else internal.op_s
    views = sum(r.count for r in backward_records if r.host_view)
    # host_dispatch.backward_host_seconds' formula solved for the per-node figure
    rest_s = (backward_s - views * internal.view_s - (backward_ops - views) * op_s
              - records_excess_seconds(backward_records, lambda op: plain.excess_s.get(op, 0.0)))
    parts = dict(backward_view_op_s=internal.view_s, backward_nonview_op_s=op_s,
                 backward_node_s=max(0.0, rest_s) / nodes,
                 # F.embedding_bag's arange and clone price as function ops, its view as one
                 excess_s=tuple(sorted({**plain.excess_s, **bag_python_excess(
                     device, 2 * nograd_op_s + internal.view_s)}.items())),
                 python_node_s=python_node_seconds(device), function_nograd_op_s=nograd_op_s,
                 view_nograd_op_s=internal.view_s,
                 python_view_nograd_op_s=internal.python_view_s,
                 forward_node_s=statistics.median(node_rounds))
    return HostOpCost(statistics.median(forward_rounds), statistics.median(backward_rounds),
                      (min(forward_rounds), max(forward_rounds)),
                      (min(backward_rounds), max(backward_rounds)), forward_ops, backward_ops,
                      function_op_s, statistics.median(module_rounds),
                      statistics.median(view_rounds), **parts, parts_measured=True)


def host_probe_chain(device: str = "cpu"):
    """(chain, its leaves, each leaf bound as a function) of the per-op probe: the chain
    whose distinct ops HOST_OP_CHAIN_DISTINCT_OPS counts."""
    from torch import nn

    from cost_models.clusters import _overhead_block

    chain = nn.Sequential(*[_overhead_block() for _ in range(HOST_OP_CHAIN_BLOCKS)]).to(device)
    leaves = [m for m in chain.modules() if not list(m.children())]
    return chain, leaves, [_as_function(m) for m in leaves]


def run_as_functions(calls, x):
    """The chain's calls in turn on `x`, then a sum: the probe's function pass."""
    y = x
    for call in calls:
        y = call(y)
    return y.sum()


def _as_function(module):
    """`module`'s forward as one `torch.nn.functional` call on its own tensors (the leaf
    kinds of `clusters._overhead_block`), bound once: no module call, no attribute look-up."""
    import torch.nn.functional as F
    from torch import nn

    if isinstance(module, nn.Linear):
        weight, bias = module.weight, module.bias
        return lambda y: F.linear(y, weight, bias)
    if isinstance(module, nn.LayerNorm):
        shape, weight, bias, eps = module.normalized_shape, module.weight, module.bias, module.eps
        return lambda y: F.layer_norm(y, shape, weight, bias, eps)
    if isinstance(module, nn.GELU):
        approximate = module.approximate
        return lambda y: F.gelu(y, approximate=approximate)
    raise TypeError(f"host probe: no functional form for {type(module).__name__}")


def dtensor_op_overhead_s(device, mesh) -> float:
    """Extra seconds per op on replicated DTensors over plain tensors: the same tiny
    block, once plain and once with DTensor parameters and input (no communication).
    The compute model charges it on the ops the TP executor runs on DTensors outside its
    TP modules (SP's norms: `tp_host.dtensor_op_seconds`, counted by `ir.dtensor_ops`)."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    from cost_models.autograd_engine import NodeSpan
    from cost_models.clusters import OP_OVERHEAD_WIDTH, _one_thread, _overhead_block, \
        seconds_per_op

    def replicated(t):  # from_local: no broadcast, so rank 0 can run alone
        return DTensor.from_local(t, mesh, [Replicate()], run_check=False)

    with _one_thread():
        x = torch.randn(2, OP_OVERHEAD_WIDTH, device=device)
        plain = seconds_per_op(_overhead_block().to(device), x)
        block = _overhead_block().to(device)
        for module in block.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                setattr(module, name, torch.nn.Parameter(replicated(param.detach())))
        on_dtensors = seconds_per_op(block, replicated(x))
    return max(on_dtensors - plain, 0.0)


@functools.lru_cache(maxsize=None)
def autograd_call_s(device: str = "cpu") -> float:
    """Host seconds one `torch.autograd.backward` call costs beyond its nodes (the engine's
    start), once per process and device: the intercept of
    `autograd_engine.measure_engine_start` (a least-squares line through graphs of 1 to 8
    ops). A training step pays it once per micro-batch and stage. About 9 us on this
    host's CPU (2026-11-24)."""
    from cost_models.autograd_engine import measure_engine_start

    return measure_engine_start(device).seconds


@functools.lru_cache(maxsize=None)
def node_span_s(device: str = "cpu") -> float:
    """Host seconds an `autograd_engine.NodeSpan` reads beyond the nodes it spans (its two
    stamps; no input's hand-over, as in a step), once per process and device: what the
    backward figures timed by one (`host_op_seconds_by_pass`, `layer_profile.time_layer`)
    leave out."""
    from cost_models.autograd_engine import measure_engine_start

    return measure_engine_start(device, nodes_only=True).seconds
