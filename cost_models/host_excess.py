"""What one ATen op costs the host with autograd's recording off, as a backward formula
dispatches it, and the per-call fixed excess some ops carry beyond that; one thread.

Autograd's engine runs a backward formula with grad mode off, so each op it dispatches
pays the dispatcher's walk, an output's allocation and TensorIterator's set-up, and a
view far less (metadata only, no kernel). `plain_dispatch_seconds` times both at tiny
sizes (a few dozen elements: nanoseconds of arithmetic), and the ops that cost more per
call whatever their size. On this CPU (torch 2.13, one thread, thread clock, 2 x 8 fp32
inputs, 2026-11-24) over add's 1.0-1.7 us: exact GELU +5.1 us and its backward +10.5,
a fused RMS norm +6.6, layer norm +1.7 and its backward +2.5, a row mean +2.3, addmm
+0.8 (it first copies the bias into the output), a bias-gradient sum +0.7; relu,
tanh-GELU, silu, tanh, rsqrt, pow, mul, mm, bmm, clone and softmax within +-0.5 of add.
A sweep of every op the zoo and tests/data/hf models run (bench/bench_host_excess_sweep.py,
2026-11-25, load ~5) added the composites and gathers it screened above 0.6 us, measured
here over two probe runs: repeat +5.8-6.8, BCE-with-logits +4.9-5.5, a training batch
norm +3.2-4.2 and its backward +3.1-3.3, slice's backward +1.7-2.0, index_put +1.5-1.7,
embedding's dense backward +1.3-1.6, index +0.9-1.1, the (log-)softmax backwards
+0.6-0.7, stack +0.6-0.8, cat +0.4-0.7, masked_fill and nll_loss +0.5, and from the MoE
and HF models histc +2.4, sort +2.2, select's backward +2.0, a dtype cast +1.2-1.4, topk,
scatter, scatter_add, new_zeros and new_ones +0.6-0.7; the bench names what it left out
and why (`NOT_LISTED`: within 0.5 us of add at tiny sizes, views, or priced per call by
`item_probes`), besides compute kernels, random draws and in-place ops. The sweep skips
ops without a kernel; of those, the allocations the zoo's layers record
(`ALLOCATION_EXCESS_OPS`) dispatch as ops and are measured too (new_empty_strided +1.25).
Tanh-GELU is keyed apart from exact GELU (`KernelRecord.excess_key`, from the
recorded `approximate` argument) and measured as its own entry, so a layer with it is
not charged erf's excess. That excess is neither dispatch nor bandwidth (the kernel tables price bytes): it is
measured as tiny-size time minus add's (add streams and has no fixed cost: the
reference), the ops alternating within each round, and `cost_models.compute` charges it
once per call of that op, backward and forward (`KernelCalibration.host_excess_s`); the
probes take it out of the chains they time (`host_probes.host_op_seconds_by_pass`), so
no call pays it twice. Also here: what an fx call node that dispatches nothing costs in
generated code (`python_node_seconds`: ~0.065 us here, thread clock, 2026-11-24).

    >>> sorted(HOST_EXCESS_OPS)[:2]
    ['aten::_fused_rms_norm', 'aten::addmm']
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# The reference: a streaming op with no fixed cost beyond dispatch. Excess is timed
# through `torch.ops.aten` (the same Python call path for every op, so it cancels); the
# plain figures through torch's C-bound `torch.add` and `Tensor.view`, the least Python
# in front of the dispatcher (a backward formula calls from C++: none).
REFERENCE_OP = "aten::add"
PLAIN_OP, PLAIN_VIEW = "torch.add", "Tensor.view"
# Ops whose excess is measured (module docstring: the ones above ~0.5 us on this CPU that
# zoo and HF layers dispatch, found by bench/bench_host_excess_sweep.py, which fails when
# one is missing). Dropout is left out: CPUs run it as bernoulli_, div_ and mul
# (priced per element by `random_element_s`), not the native_dropout its record names.
TANH_GELU, TANH_GELU_BACKWARD = ("aten::gelu(approximate=tanh)",
                                 "aten::gelu_backward(approximate=tanh)")  # `excess_key`s
CORE_EXCESS_OPS = ("aten::gelu", "aten::gelu_backward", TANH_GELU, TANH_GELU_BACKWARD,
                   "aten::native_layer_norm",
                   "aten::native_layer_norm_backward", "aten::_fused_rms_norm", "aten::mean",
                   "aten::sum", "aten::addmm")
# The allocations layers record (`ir.kernel_records.ALLOCATION_OPS`: the sweep skips them
# as ops without a kernel): batch norm's empty reserve (cnn-small), AccumulateGrad's
# layout clone of a gradient that is not dense (dlrm-small's top MLP inputs at micro-
# batch > 1). Over add: new_empty_strided +1.25 us, empty +0.2-0.4 (thread clock, min of
# 9 rounds of 500, load 5, 2026-11-26).
ALLOCATION_EXCESS_OPS = ("aten::new_empty_strided", "aten::empty")
# found by bench/bench_host_excess_sweep.py (module docstring)
SWEPT_EXCESS_OPS = ("aten::binary_cross_entropy_with_logits", "aten::repeat",
                    "aten::native_batch_norm", "aten::native_batch_norm_backward",
                    "aten::slice_backward", "aten::embedding_dense_backward",
                    "aten::index_put", "aten::index", "aten::_softmax_backward_data",
                    "aten::_log_softmax_backward_data", "aten::stack", "aten::cat",
                    "aten::masked_fill", "aten::nll_loss_forward", "aten::histc", "aten::sort",
                    "aten::select_backward", "aten::_to_copy", "aten::topk",
                    "aten::scatter_add", "aten::scatter", "aten::new_zeros", "aten::new_ones",
                    *ALLOCATION_EXCESS_OPS)
HOST_EXCESS_OPS = CORE_EXCESS_OPS + SWEPT_EXCESS_OPS
# Each group is timed in rounds of its own (with the reference): in one round over all
# of them exact GELU read 8.8 us over add where its own group's rounds read 5-6.4 (profile-
# device under pytest, thread clock, 2026-11-25), enough to zero the forward per-op
# figure the probe chain's excess is taken from (`host_probes.host_op_seconds_by_pass`).
EXCESS_GROUPS = (CORE_EXCESS_OPS, SWEPT_EXCESS_OPS)
# Tiny inputs: EXCESS_ROWS x EXCESS_WIDTH fp32, the size of the host probe chain's
# activations (`clusters.OP_OVERHEAD_WIDTH`, 2 rows): what is timed is the host.
EXCESS_ROWS, EXCESS_WIDTH = 2, 8
# A round times EXCESS_CALLS calls of each op (milliseconds: far above the thread clock's
# resolution); the figure is the median over EXCESS_ROUNDS rounds of (op - reference).
EXCESS_CALLS = 500
EXCESS_ROUNDS = 9
EXCESS_WARMUP_CALLS = 20
# Record dtypes (`KernelRecord.dtype`, torch's names) of tensors that can carry a gradient.
FLOATING_DTYPE_PREFIXES = ("float", "bfloat")


def _tiny_calls(device: str) -> dict:
    """One zero-argument call per op of HOST_EXCESS_OPS, the reference, the plain pair and
    two streaming ops (relu, mul: no excess, for checking the probe), on tiny inputs, in
    the overload a layer dispatches (a bias gradient's `sum.dim_IntList`, a norm's
    `mean.dim`)."""
    import torch

    aten = torch.ops.aten
    x, y, grad = (torch.randn(EXCESS_ROWS, EXCESS_WIDTH, device=device) for _ in range(3))
    weight, bias = torch.randn(EXCESS_WIDTH, device=device), torch.randn(EXCESS_WIDTH, device=device)
    square = torch.randn(EXCESS_WIDTH, EXCESS_WIDTH, device=device)
    mean = x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
    shape = [EXCESS_WIDTH]
    target = torch.rand(EXCESS_ROWS, EXCESS_WIDTH, device=device)  # probabilities
    rows = torch.arange(EXCESS_ROWS, device=device)  # row ids (an index, class labels)
    labels = rows % EXCESS_WIDTH
    mask = x > 0
    pairs = torch.tensor([[0, 1], [1, 0]], device=device)  # per row, two column ids
    grad_row = grad[0]  # the gradient of one selected row
    running_mean = torch.zeros(EXCESS_WIDTH, device=device)
    running_var = torch.ones(EXCESS_WIDTH, device=device)
    batch_mean = x.mean(0)  # a training batch norm's saved statistics, per channel
    batch_invstd = torch.rsqrt(x.var(0, unbiased=False) + 1e-5)
    calls = {
        REFERENCE_OP: lambda: aten.add.Tensor(x, y),
        PLAIN_OP: lambda: torch.add(x, y),
        PLAIN_VIEW: lambda: x.view(EXCESS_ROWS * EXCESS_WIDTH),
        "aten::gelu": lambda: aten.gelu(x),
        "aten::gelu_backward": lambda: aten.gelu_backward(grad, x),
        TANH_GELU: lambda: aten.gelu(x, approximate="tanh"),
        TANH_GELU_BACKWARD: lambda: aten.gelu_backward(grad, x, approximate="tanh"),
        "aten::native_layer_norm": lambda: aten.native_layer_norm(x, shape, weight, bias, 1e-5),
        "aten::native_layer_norm_backward": lambda: aten.native_layer_norm_backward(
            grad, x, shape, mean, rstd, weight, bias, [True, True, True]),
        "aten::_fused_rms_norm": lambda: aten._fused_rms_norm(x, shape, weight, 1e-5),
        "aten::mean": lambda: aten.mean.dim(x, [-1], True),
        "aten::sum": lambda: aten.sum.dim_IntList(grad, [0]),
        "aten::addmm": lambda: aten.addmm(bias, x, square),
        "aten::binary_cross_entropy_with_logits": lambda: aten.binary_cross_entropy_with_logits(
            x, target, None, None, 1),  # mean: dlrm's loss
        "aten::index": lambda: aten.index.Tensor(x, [rows]),  # x[ids]: a gather of rows
        "aten::stack": lambda: aten.stack([x, y]),
        "aten::cat": lambda: aten.cat([x, y], -1),
        "aten::_softmax_backward_data": lambda: aten._softmax_backward_data(grad, x, -1,
                                                                            x.dtype),
        "aten::_log_softmax_backward_data": lambda: aten._log_softmax_backward_data(
            grad, x, -1, x.dtype),
        "aten::nll_loss_forward": lambda: aten.nll_loss_forward(x, labels, None, 1, -100),
        "aten::embedding_dense_backward": lambda: aten.embedding_dense_backward(
            grad, rows, EXCESS_WIDTH, -1, False),
        "aten::masked_fill": lambda: aten.masked_fill.Scalar(x, mask, -1.0),
        "aten::native_batch_norm": lambda: aten.native_batch_norm(
            x, weight, bias, running_mean, running_var, True, 0.1, 1e-5),
        "aten::native_batch_norm_backward": lambda: aten.native_batch_norm_backward(
            grad, x, weight, running_mean, running_var, batch_mean, batch_invstd, True, 1e-5,
            [True, True, True]),
        "aten::repeat": lambda: aten.repeat(x, [2, 1]),
        "aten::index_put": lambda: aten.index_put(x, [rows], y),
        "aten::slice_backward": lambda: aten.slice_backward(grad, [EXCESS_ROWS, 2 * EXCESS_WIDTH],
                                                            1, 0, EXCESS_WIDTH, 1),
        "aten::histc": lambda: aten.histc(x, EXCESS_WIDTH, -1.0, 1.0),  # MoE expert counts
        "aten::sort": lambda: aten.sort(x, -1),
        "aten::topk": lambda: aten.topk(x, 2),  # MoE routing: the top 2 experts
        "aten::select_backward": lambda: aten.select_backward(grad_row, [EXCESS_ROWS,
                                                                        EXCESS_WIDTH], 0, 0),
        "aten::_to_copy": lambda: aten._to_copy(x, dtype=torch.float64),
        "aten::scatter_add": lambda: aten.scatter_add(x, 1, pairs, y),
        "aten::scatter": lambda: aten.scatter.src(x, 1, pairs, y),
        "aten::new_zeros": lambda: aten.new_zeros(x, [EXCESS_ROWS, EXCESS_WIDTH]),
        "aten::new_ones": lambda: aten.new_ones(x, [EXCESS_ROWS, EXCESS_WIDTH]),
        "aten::new_empty_strided": lambda: aten.new_empty_strided(
            x, [EXCESS_ROWS, EXCESS_WIDTH], [EXCESS_WIDTH, 1]),  # a gradient's layout clone
        "aten::empty": lambda: aten.empty.memory_format([0]),  # batch norm's reserve
        "aten::relu": lambda: aten.relu(x),
        "aten::mul": lambda: aten.mul.Tensor(x, y),
    }
    assert {REFERENCE_OP, PLAIN_OP, PLAIN_VIEW, *HOST_EXCESS_OPS} <= set(calls)
    return calls


@dataclass(frozen=True, slots=True)
class PlainDispatch:
    """Host seconds per call with autograd's recording off: a streaming op (`op_s`), a
    view (`view_s`), and per op of HOST_EXCESS_OPS what it costs beyond the reference
    (`excess_s`, never below 0)."""

    op_s: float
    view_s: float
    excess_s: dict


def plain_dispatch_seconds(device: str = "cpu", ops=HOST_EXCESS_OPS) -> PlainDispatch:
    """The reference op's and the view's per-call seconds (medians over rounds) and each
    listed op's excess (median over rounds of its per-call time minus the reference's in
    the same round), every round timing every op of one group (EXCESS_GROUPS) and the
    reference in turn on the probe clock, so a slow spell of a shared machine hits them
    alike. Inputs need no grad: nothing records.
    `ops`: which ops' excess to measure (any `_tiny_calls` holds)."""
    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    clock = probe_clock(device)
    rounds = {}
    with _one_thread():
        tiny = _tiny_calls(device)
        others = tuple(op for op in ops if op not in HOST_EXCESS_OPS)  # relu, mul: checks
        groups = [tuple(op for op in group if op in ops) for group in EXCESS_GROUPS]
        groups[0] += others
        for i, group in enumerate(groups):
            if i > 0 and not group:
                continue
            plain = (PLAIN_OP, PLAIN_VIEW) if i == 0 else ()  # measured once, with the first
            calls = {op: tiny[op] for op in (REFERENCE_OP, *plain, *group)}
            for call in calls.values():
                for _ in range(EXCESS_WARMUP_CALLS):
                    call()
            rounds.update({op: [] for op in (*plain, *group)})
            for _ in range(EXCESS_ROUNDS):
                per_call = {}
                for op, call in calls.items():
                    start = clock()
                    for _ in range(EXCESS_CALLS):
                        call()
                    per_call[op] = (clock() - start) / EXCESS_CALLS
                for op in (*plain, *group):
                    rounds[op].append(per_call[op] - (per_call[REFERENCE_OP] if op in ops
                                                      else 0.0))
    return PlainDispatch(statistics.median(rounds[PLAIN_OP]),
                         statistics.median(rounds[PLAIN_VIEW]),
                         {op: max(0.0, statistics.median(rounds[op])) for op in ops})


# Internal dispatch probe: what an op and a view cost dispatched from C++, as a backward
# formula dispatches them (no Python binding in front: `torch.add` / `Tensor.view` from
# Python read 0.96 / 0.77 us here, from C++ 0.65 / 0.33, thread clock, 2026-11-25): the
# slope over list length of `torch._foreach_add` (a CPU tensor list takes the slow path,
# one `at::add` per pair through the dispatcher) and of `Tensor.unbind` (one `select` view
# per row), INTERNAL_SHORT vs INTERNAL_LONG items of EXCESS_ROWS x EXCESS_WIDTH, grad mode
# off; the median over EXCESS_ROUNDS rounds of EXCESS_CALLS calls each (the call's own
# Python cancels in the slope). In the same rounds, what a view costs called from Python
# as a layer's generated forward calls it (an fx node `x.view(...)`: its line, the Python
# binding, the dispatch): the slope of a GraphModule of chained view nodes, as long
# (0.63-0.64 us a node against 0.34 from C++, load 3-4; 0.63 / 0.49 inside profile-device
# at load 5-7, 2026-11-25).
INTERNAL_SHORT, INTERNAL_LONG = 2, 34


@dataclass(frozen=True, slots=True)
class InternalDispatch:
    """Host seconds per op (`op_s`) and per view (`view_s`) dispatched from C++ with grad
    mode off, as autograd's engine runs a backward formula's; and per view called from
    Python, one fx node each, grad mode off (`python_view_s`: a layer's `x.view`,
    `transpose`, `getitem` slice; 0 where not measured)."""

    op_s: float
    view_s: float
    python_view_s: float = 0.0


def view_graph_module(views: int):
    """A GraphModule of `views` chained call_method nodes on a 2-D tensor input, each a
    view (`view(-1)`, then back to `view(rows, -1)`, alternating), as generated code calls
    a layer's Python-level views; returns the last."""
    import torch
    from torch import fx

    graph = fx.Graph()
    x = graph.placeholder("x")
    last = x
    for i in range(views):
        shape = (-1,) if i % 2 == 0 else (EXCESS_ROWS, -1)
        last = graph.call_method("view", (last, *shape))
    graph.output(last)
    return fx.GraphModule(torch.nn.Module(), graph)


def _internal_calls(device: str) -> dict:
    """{(kind, items): zero-argument call}: kind "op" a foreach add over `items` pairs,
    "view" an unbind of `items` rows, "python_view" a `view_graph_module` of `items` view
    nodes, at INTERNAL_SHORT and INTERNAL_LONG items."""
    import torch

    rows = torch.randn(INTERNAL_LONG, EXCESS_ROWS, EXCESS_WIDTH, device=device)
    lefts, rights = (list(torch.randn(INTERNAL_LONG, EXCESS_ROWS, EXCESS_WIDTH,
                                      device=device).unbind(0)) for _ in range(2))
    x = torch.randn(EXCESS_ROWS, EXCESS_WIDTH, device=device)
    chains = {n: view_graph_module(n) for n in (INTERNAL_SHORT, INTERNAL_LONG)}
    return {(kind, n): call for n in (INTERNAL_SHORT, INTERNAL_LONG) for kind, call in (
        ("op", lambda n=n: torch._foreach_add(lefts[:n], rights[:n])),
        ("view", lambda n=n: rows[:n].unbind(0)),
        ("python_view", lambda n=n: chains[n](x)))}


def internal_dispatch_seconds(device: str = "cpu") -> InternalDispatch:
    """Per-item slopes of a C++ loop of adds and of views and of a Python chain of view
    nodes (the probe above), each floored at 0; one thread, the probe clock. CPU only: a
    GPU's foreach add is one fused kernel, not a loop."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    clock = probe_clock(device)
    with _one_thread(), torch.no_grad():
        calls = _internal_calls(device)
        for call in calls.values():
            for _ in range(EXCESS_WARMUP_CALLS):
                call()
        slopes = {kind: [] for kind, _ in calls}
        for _ in range(EXCESS_ROUNDS):
            per_call = {}
            for key, call in calls.items():
                start = clock()
                for _ in range(EXCESS_CALLS):
                    call()
                per_call[key] = (clock() - start) / EXCESS_CALLS
            for kind, rounds in slopes.items():
                rounds.append((per_call[kind, INTERNAL_LONG] - per_call[kind, INTERNAL_SHORT])
                              / (INTERNAL_LONG - INTERNAL_SHORT))
    return InternalDispatch(*(max(0.0, statistics.median(slopes[kind])) if kind in slopes
                              else 0.0 for kind in ("op", "view", "python_view")))


def records_excess_seconds(records, excess_s) -> float:
    """Host excess of some kernel records: per record, its calls x `excess_s(op)` (a
    function of the record's `excess_key`, e.g. `KernelCalibration.host_excess_s` or a probe's dict's
    `get`)."""
    return sum(r.count * excess_s(r.excess_key) for r in records)


def backward_nodes(forward_records, parameter_tensors: int) -> int:
    """Autograd nodes a backward runs, as the host model counts them: one per forward call
    on floating tensors (an integer or bool op, index arithmetic, cannot carry a gradient,
    so records none; a float op on tensors that need no gradient is still counted) plus
    one per parameter tensor (its gradient's accumulation)."""
    return sum(r.count for r in forward_records
               if r.dtype.startswith(FLOATING_DTYPE_PREFIXES)) + parameter_tensors


# Python-node probe: generated GraphModules (`torch.fx`, as `planner profile` times a
# layer) of NODE_PATTERNS_SHORT and NODE_PATTERNS_LONG repeats of one pattern of fx call
# nodes that dispatch no ATen op (a layer's `x.shape`, `shape[-1]`, size arithmetic and
# `x.size(-1)`); the per-node figure is the median over NODE_ROUNDS rounds of (long -
# short) / their node difference (the module call and the return cancel), each round
# timing NODE_CALLS calls of each (milliseconds).
NODE_PATTERNS_SHORT, NODE_PATTERNS_LONG = 4, 36
NODE_CALLS = 300
NODE_ROUNDS = 9


def no_dispatch_graph_module(patterns: int):
    """A GraphModule of `patterns` repeats of four call nodes that dispatch nothing on a
    tensor input: getattr(x, "shape"), getitem(shape, -1), mul(that, 2), x.size(-1); it
    returns the last product (an int). Its node count: `4 * patterns`."""
    import operator

    import torch
    from torch import fx

    graph = fx.Graph()
    x = graph.placeholder("x")
    last = None
    for _ in range(patterns):
        shape = graph.call_function(getattr, (x, "shape"))
        width = graph.call_function(operator.getitem, (shape, -1))
        last = graph.call_function(operator.mul, (width, 2))
        graph.call_method("size", (x, -1))
    graph.output(last)
    return fx.GraphModule(torch.nn.Module(), graph)


NODES_PER_PATTERN = 4  # `no_dispatch_graph_module`'s call nodes per repeat


def python_node_seconds(device: str = "cpu") -> float:
    """Host seconds per fx call node that dispatches no ATen op, in generated code (module
    docstring of the probe above); one thread, the probe clock."""
    import torch

    from cost_models.clusters import _one_thread
    from cost_models.host_probes import probe_clock

    clock = probe_clock(device)
    with _one_thread():
        x = torch.randn(EXCESS_ROWS, EXCESS_WIDTH, device=device)
        short, long = (no_dispatch_graph_module(n) for n in (NODE_PATTERNS_SHORT,
                                                            NODE_PATTERNS_LONG))
        for module in (short, long):
            for _ in range(EXCESS_WARMUP_CALLS):
                module(x)
        rounds = []
        for _ in range(NODE_ROUNDS):
            times = []
            for module in (short, long):
                start = clock()
                for _ in range(NODE_CALLS):
                    module(x)
                times.append((clock() - start) / NODE_CALLS)
            nodes = NODES_PER_PATTERN * (NODE_PATTERNS_LONG - NODE_PATTERNS_SHORT)
            rounds.append((times[1] - times[0]) / nodes)
    return max(0.0, statistics.median(rounds))
