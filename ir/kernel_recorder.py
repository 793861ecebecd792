"""Recording the kernels a layer runs: one `KernelRecord` per (op, shape, dtype).

`ir.op_count.OpCounter` (the dispatch mode that counts a layer's ATen ops) hands every op
to a `KernelRecorder`, which classifies it (`ir.kernel_records.KernelKind`), takes its
FLOPs from torch.utils.flop_counter's registered formulas and its bytes as each input
read once plus each output written once, and aggregates.

Fused kernels. On meta tensors (and on CPU) `F.scaled_dot_product_attention` runs as
its math decomposition (bmm, softmax, ...), but on a GPU it is one kernel: for bf16/fp16
without an explicit mask torch's dispatcher picks flash (or cuDNN) attention, with a mask
the memory-efficient kernel. `FusedKernels` therefore records each SDPA call of the
traced graph as ONE attention kernel forward and one backward (FLOPs 4*b*s^2*h and 2.5x
that: Dao 2023, FlashAttention-2) and drops the decomposition's ops from both records;
the cost model prices it at the target device's measured SDPA rate. Likewise dropout:
CPU and meta run bernoulli_, div_ and mul, CUDA one `native_dropout` (output and a bool
mask), recorded as that. Attention written out by hand (q @ k^T, softmax, ...) is
recorded as the kernels it is.

    >>> rec = KernelRecorder(weight_keys=set())
    >>> import torch
    >>> a = torch.empty(8, 4, device="meta"); b = torch.empty(4, 16, device="meta")
    >>> rec.record(torch.ops.aten.mm.default, (a, b), {}, torch.empty(8, 16, device="meta"))
    >>> [str(r) for r in rec.records()]
    ['1 x aten::mm[1x8x16x4]@float32']
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.fx as fx
from torch.utils.flop_counter import flop_registry

from ir.checkpoint_policy import op_name, saved_under_selective
from ir.kernel_records import (CONV_GRAD_BIAS, CONV_GRAD_INPUT, CONV_GRAD_WEIGHT, KernelKind,
                               KernelRecord)
from ir.saved_tensors import storage_key, tensor_leaves
from ir.scalar_operands import wraps_python_number
from ir.weight_outputs import is_weight_gradient, is_weight_output
from ir.tensor_iteration import (broadcast_strides, elementwise_strides, iteration_order,
                                 trailing_run, walks_out_of_order)
from ir.tensor_iteration import loops_per_call as tensor_loops_per_call

# ATen matmuls (cuBLAS GEMM kernels); `linear` and `matmul` decompose into these before
# they reach a dispatch mode.
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot"})
# ATen convolutions (cuDNN / oneDNN kernels; conv1d/2d/3d reach a dispatch mode as these).
CONV_OPS = frozenset({"convolution", "convolution_backward"})
# Fused SDPA kernels (forward and backward), as they dispatch on CUDA or CPU devices.
ATTENTION_OPS = frozenset(
    f"{base}{suffix}" for suffix in ("", "_backward") for base in (
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_flash_attention", "_efficient_attention"))
# Ops that launch no kernel and move no bytes beyond views (`OpOverload.is_view` covers
# the rest: view, expand, transpose, permute, t, slice, select, ...).
NO_KERNEL_OPS = frozenset({"_unsafe_view", "detach", "alias", "lift_fresh", "empty",
                           "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                           "_reshape_alias", "sym_size", "sym_stride", "sym_numel",
                           "_local_scalar_dense", "resize_", "set_"})
# Ops that read only their input's shape (they fill a new tensor): no input bytes.
SHAPE_ONLY_INPUT_OPS = frozenset({"ones_like", "zeros_like", "full_like", "rand_like",
                                  "randn_like", "new_zeros", "new_ones", "new_full"})
# FX call targets that are scaled-dot-product attention (fx traces call the functional,
# torch.export graphs the ATen op).
SDPA_TARGETS = (torch.nn.functional.scaled_dot_product_attention,
                torch.ops.aten.scaled_dot_product_attention.default)
SDPA_OP = "aten::scaled_dot_product_attention"
# The op a GPU runs for it, whose output the selective policy is asked about.
SDPA_GPU_OP = torch.ops.aten._scaled_dot_product_flash_attention.default
# Dropout as CUDA runs it (ATen `dropout` takes `native_dropout` on CUDA tensors; on CPU
# and meta it decomposes into bernoulli_, div_ and mul), with a bool mask.
DROPOUT_OP, DROPOUT_BACKWARD_OP = "aten::native_dropout", "aten::native_dropout_backward"
DROPOUT_GPU_OP = torch.ops.aten.native_dropout.default
DROPOUT_MASK_BYTES_PER_ELEMENT = 1
# Dao 2023 (FlashAttention-2) §4: the backward pass does 5 matmuls to the forward's 2,
# 2.5x the forward FLOPs.
ATTENTION_BACKWARD_FLOPS_RATIO = 2.5


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in tensor_leaves(value) if isinstance(t, torch.Tensor)]


def gemm_shape(name: str, args, out) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a matmul: `batch` products of (m x k) @ (k x n)."""
    if name in ("mm", "addmm"):
        a, b = (args[0], args[1]) if name == "mm" else (args[1], args[2])
        return 1, a.shape[0], b.shape[1], a.shape[1]
    if name in ("bmm", "baddbmm", "addbmm"):
        a, b = (args[0], args[1]) if name == "bmm" else (args[1], args[2])
        return (1 if name == "addbmm" else a.shape[0]), a.shape[-2], b.shape[-1], a.shape[-1]
    if name in ("mv", "addmv"):
        a = args[0] if name == "mv" else args[1]
        return 1, a.shape[0], 1, a.shape[1]
    if name == "dot":
        return 1, 1, 1, args[0].shape[0]
    raise ValueError(f"not a matmul: {name}")


def conv_shape(name: str, args, out) -> tuple[int, ...]:
    """(groups, batch, in_channels, out_channels, out_positions, kernel_area, grads) of a
    convolution or its backward (`ir.kernel_records`: channels per group; grads the
    backward's output_mask as CONV_GRAD_* bits, 0 forward).
    convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
    groups); convolution_backward(grad_out, input, weight, bias_sizes, stride, padding,
    dilation, transposed, output_padding, groups, output_mask)."""
    forward = name == "convolution"
    weight = args[1] if forward else args[2]
    out_like = _tensors(out)[0] if forward else args[0]
    groups = int(args[8] if forward else args[9])
    grads = 0
    if not forward:
        for bit, wanted in zip((CONV_GRAD_INPUT, CONV_GRAD_WEIGHT, CONV_GRAD_BIAS), args[10]):
            grads |= bit if wanted else 0
    # weight: (out_channels, in_channels / groups, *kernel); output: (batch, out, *positions)
    return (groups, int(out_like.shape[0]), int(weight.shape[1]), int(weight.shape[0]) // groups,
            int(math.prod(out_like.shape[2:])), int(math.prod(weight.shape[2:])), grads)


# An embedding bag's forward and backward (aten's CPU and CUDA kernels; the dense and sparse
# backward halves as they dispatch when called directly): recorded with the shape
# (indices, bags, dim), the items their cost counts (`cost_models.kernel_time`).
EMBEDDING_BAG_OPS = frozenset({"_embedding_bag", "_embedding_bag_forward_only",
                               "_embedding_bag_backward", "_embedding_bag_dense_backward",
                               "_embedding_bag_sparse_backward"})


def embedding_bag_shape(name: str, args, out) -> tuple[int, int, int]:
    """(indices, bags, dim) of an embedding bag op: forward `_embedding_bag(weight, indices,
    offsets, ...)` writes (bags, dim); the backwards take `(grad (bags, dim), indices, ...)`."""
    indices = args[1]
    bags_by_dim = _tensors(out)[0] if name.startswith("_embedding_bag_forward") or \
        name == "_embedding_bag" else args[0]
    return int(indices.numel()), int(bags_by_dim.shape[0]), int(bags_by_dim.shape[-1])


# Ops that write each input into a slice of a new output along `dim` (their own kernels,
# not TensorIterator over broadcast operands): (position of dim in args, default dim).
SLICE_WRITE_OPS = {"cat": (1, 0), "slice_backward": (2, None)}


# Reductions over dims given as `args[1]` (TensorIterator reduce kernels): their
# reduced dims run innermost (`reorder_dimensions` in aten/src/ATen/TensorIterator.cpp
# moves the dims where the output's stride is 0 to the front), so a sum over a middle dim
# walks the input strided, one loop per output element there.
REDUCTION_OPS = frozenset({"sum", "mean", "amax", "amin", "prod"})
# Row-wise kernels (one pass per row of their last dim(s): vectorised along the row,
# looping over rows): the dim or normalized shape that makes a row, by position in args.
ROW_OPS = {"_softmax": 1, "_log_softmax": 1, "_safe_softmax": 1,
           "_softmax_backward_data": 2, "_log_softmax_backward_data": 2,
           "native_layer_norm": 1, "native_layer_norm_backward": 2}


def _reduced_dims(args, shape: tuple[int, ...]) -> set[int]:
    """Dims a reduction op reduces (all of them without a dim argument)."""
    dims = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple, int)) \
        and not isinstance(args[1], bool) else None
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return set(range(len(shape)))
    return {d % len(shape) for d in ([dims] if isinstance(dims, int) else dims)}


def row_loops(name: str, args, inputs: list[torch.Tensor]) -> tuple[int, int]:
    """(elements per row, rows) of a row-wise op (ROW_OPS): a softmax's `dim` (rows are
    its other elements, for the last dim), a layer norm's normalized shape."""
    x = inputs[0]
    where = args[ROW_OPS[name]]
    if name.startswith("native_layer_norm"):
        row = math.prod(where)
    else:
        row = x.shape[where % max(1, x.dim())] if x.dim() else 1
    row = max(1, int(row))
    return row, max(1, x.numel() // row)


def _reduction_loops(args, x: torch.Tensor) -> tuple[int, int]:
    """(elements per innermost loop, loops) of a reduction of `x`: its reduced dims
    innermost (in stride order), the kept ones outside them, merged while the input's
    strides and the output's (0 over reduced dims, contiguous over kept ones) continue
    the dim inside (`trailing_run`)."""
    shape = tuple(int(d) for d in x.shape)
    reduced = _reduced_dims(args, shape)
    out_strides, stride = [0] * len(shape), 1
    for d in reversed(range(len(shape))):  # a contiguous output, 0 where reduced
        if d not in reduced:
            out_strides[d], stride = stride, stride * shape[d]
    by_stride = lambda dims: sorted(dims, key=lambda d: -x.stride(d))  # noqa: E731
    order = by_stride([d for d in range(len(shape)) if d not in reduced]) + \
        by_stride(list(reduced))  # outermost first
    run = trailing_run(tuple(shape[d] for d in order),
                        [tuple(x.stride(d) for d in order), tuple(out_strides[d] for d in order)])
    return run, max(1, math.prod(shape) // max(1, run))


def reduction_unvectorized(args, x: torch.Tensor) -> bool:
    """Whether ATen's CPU reduce runs a reduction of `x` element by element: neither an
    inner reduction (the innermost reduced dim contiguous) nor an outer one (the kept dim
    TensorIterator puts innermost, the output's last, contiguous in `x`): `is_inner_
    reduction` / `is_outer_reduction` in aten/src/ATen/native/cpu/Reduce.h. llama-tiny's
    repeat_kv backward sums a (16, 32, 4, 2, 8) gradient over n_rep twice: with d at
    stride 1 (vectorised, 42 us alone here) and at stride 32 (v's, 52 us)."""
    shape = tuple(int(d) for d in x.shape)
    reduced = _reduced_dims(args, shape)
    live = [d for d in range(len(shape)) if shape[d] != 1]
    kept = [d for d in live if d not in reduced]
    inner_reduced = min((d for d in live if d in reduced), key=x.stride, default=None)
    return not ((inner_reduced is not None and x.stride(inner_reduced) == 1)
                or (kept and x.stride(kept[-1]) == 1))


def inner_loops(name: str, args, inputs: list[torch.Tensor],
                outputs: list[torch.Tensor]) -> tuple[int, int]:
    """(elements per innermost loop, loops) of a memory-bound op; (0, 0) where not known.
    Elementwise ops iterate over the output's shape with every input broadcast to it, in
    TensorIterator's dim order (`tensor_iteration.iteration_order`: memory order); a
    reduction over its input's shape with the (keepdim) output broadcast to it; cat and
    slice_backward copy each input into a slice along `dim`, so a loop is that input's
    extent from `dim` inwards. A permuted, expanded or middle-dim-broadcast operand ends
    the loop early: the CPU pays per loop as well as per byte (`cost_models.kernel_time`).
    A reduction (REDUCTION_OPS) runs its reduced dims innermost (`_reduction_loops`); a
    row-wise op (ROW_OPS) one loop per row (`row_loops`)."""
    if name in ROW_OPS and inputs:
        return row_loops(name, args, inputs)
    if name in REDUCTION_OPS and inputs and inputs[0].dim():
        return _reduction_loops(args, inputs[0])
    if name in SLICE_WRITE_OPS:
        position, default = SLICE_WRITE_OPS[name]
        dim = args[position] if len(args) > position else default
        sources = [t for t in (inputs if name == "cat" else inputs[:1]) if t.numel() > 0]
        if dim is None or not sources:
            return 0, 0
        runs = [math.prod(t.shape[dim % max(1, t.dim()):]) for t in sources]
        return min(runs), sum(t.numel() // run for t, run in zip(sources, runs))
    operands = elementwise_strides(inputs, outputs)
    if operands is None:
        return 0, 0
    shape, strides = operands
    order = iteration_order(len(shape), strides)
    run = trailing_run(tuple(shape[d] for d in order),
                       [tuple(s[d] for d in order) for s in strides])
    return run, math.prod(shape) // run


def loops_per_call(name: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    """Inner loops per 2-D loop call of an elementwise op (`tensor_iteration
    .loops_per_call`: llama-tiny's repeat_kv clone, (16, 32, 4, 2, 8) from a stride-0
    n_rep dim, runs 2 loops of 8 per call); 0 where not known (not elementwise)."""
    operands = None if name in NOT_ELEMENTWISE_OPS else elementwise_strides(inputs, outputs)
    return 0 if operands is None else tensor_loops_per_call(*operands)


def transposing(name: str, args, inputs: list[torch.Tensor],
                outputs: list[torch.Tensor]) -> bool:
    """Whether an elementwise or slice-writing op (cat, slice_backward: each source
    against the output's strides) has an operand that walks memory out of the order the
    iteration runs (`tensor_iteration.walks_out_of_order`)."""
    if name in SLICE_WRITE_OPS:
        return bool(outputs) and any(
            t.dim() == outputs[0].dim() and walks_out_of_order(
                tuple(t.shape), [tuple(outputs[0].stride()), tuple(t.stride())])
            for t in (inputs if name == "cat" else inputs[:1]) if t.numel() > 1)
    if name in NOT_ELEMENTWISE_OPS:
        return False
    operands = elementwise_strides(inputs, outputs)
    return operands is not None and walks_out_of_order(*operands)


# Memory ops that are not one elementwise loop (their own kernels, `inner_loops`).
NOT_ELEMENTWISE_OPS = frozenset(ROW_OPS) | REDUCTION_OPS | frozenset(SLICE_WRITE_OPS) | \
    EMBEDDING_BAG_OPS


def scalar_over_broadcast(args, inputs: list[torch.Tensor],
                          outputs: list[torch.Tensor]) -> bool:
    """An elementwise op of a scalar (a Python number or a 0-dim tensor) and one tensor
    that is broadcast, stride 0, along the output's innermost dim: a mean's backward
    (`grad.expand(...) / n`). ATen's CPU loop runs it element by element: measured here
    (one thread, 2026-11-24) a (64, 1) column expanded to (64, 4096) times 2.0 took 79 us,
    the contiguous (64, 4096) 22 us, a tensor times the same expanded column as fast as
    a contiguous product."""
    if not outputs:
        return False
    tensors = [t for t in inputs if t.dim() > 0 and t.numel() > 1]
    scalar = any(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args) or \
        any(t.dim() == 0 for t in inputs)
    if not scalar or len(tensors) != 1:
        return False
    shape = tuple(outputs[0].shape)
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    strides = broadcast_strides(tensors[0], shape)
    return bool(dims) and strides is not None and strides[dims[-1]] == 0


# Ops whose `approximate` argument (positional index here) selects another kernel:
# GELU's "tanh" form is a polynomial, the default "none" calls erf (`aten/src/ATen/native/
# cpu/Activation.cpp`: GeluKernelImpl / GeluBackwardKernelImpl branch on it).
APPROXIMATE_ARG = {"gelu": 1, "gelu_backward": 2}


def approximation(name: str, args, kwargs) -> str:
    """A record's `variant`: the op's non-default `approximate` argument, else ""."""
    index = APPROXIMATE_ARG.get(name)
    if index is None:
        return ""
    value = (kwargs or {}).get("approximate", args[index] if len(args) > index else "none")
    return "" if value == "none" else str(value)


class KernelRecorder:
    """Aggregates the ops handed to `record` into `KernelRecord`s (one per op, shape,
    dtype). `weight_keys`: storages of the layer's parameters and buffers. Ops for which
    `skip_now()` is true are left out (a fused attention's decomposition)."""

    def __init__(self, weight_keys: set, weight_shapes: frozenset = frozenset()):
        self.weight_keys = weight_keys
        # shapes of those tensors, for the backward recorder: gradients shaped like them
        self.weight_shapes = weight_shapes
        self._counts: dict[tuple, list] = {}  # key -> [KernelRecord with count 0, count]
        self.skip_now = lambda: False

    def add(self, record: KernelRecord) -> None:
        key = (record.op, record.kind, record.dtype, record.shape, record.flops,
               record.weight_bytes, record.activation_bytes, record.causal,
               record.inner_loops, record.variant, record.unvectorized, record.inner_run,
               record.transposing, record.loops_per_call, record.binary, record.weight_output,
               record.scalar_operand)
        entry = self._counts.setdefault(key, [record, 0, 0])
        entry[1] += record.count
        entry[2] += record.strided_calls  # not in the key: a layout splits no record

    def record(self, func, args, kwargs, out) -> None:
        if self.skip_now():
            return
        name = func.overloadpacket.__name__
        op = op_name(func)
        inputs = [] if name in SHAPE_ONLY_INPUT_OPS else \
            list({id(t): t for t in _tensors((args, kwargs))}.values())
        outputs = _tensors(out)
        floating = [t for t in inputs + outputs if t.is_floating_point()] or inputs + outputs
        dtype = _dtype_name(floating[0].dtype) if floating else "none"
        if func.is_view or name in NO_KERNEL_OPS:
            self.add(KernelRecord(op, KernelKind.VIEW, dtype, (), 1))
            return
        read_weights = [t for t in inputs if storage_key(t) in self.weight_keys]
        weight = sum(t.nbytes for t in read_weights) + sum(
            t.nbytes for t in outputs if is_weight_gradient(name, t, self.weight_shapes))
        moved = sum(t.nbytes for t in inputs) + sum(t.nbytes for t in outputs) - weight
        counter = flop_registry.get(func.overloadpacket)
        flops = int(counter(*args, **(kwargs or {}), out_val=out)) if counter else 0
        if name in GEMM_OPS:
            kind, shape, causal = KernelKind.GEMM, gemm_shape(name, args, out), False
        elif name in CONV_OPS:
            kind, shape, causal = KernelKind.CONV, conv_shape(name, args, out), False
        elif name in ATTENTION_OPS:
            q, k = args[0], args[1]
            kind, causal = KernelKind.ATTENTION, bool((kwargs or {}).get("is_causal", False))
            shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3])
        elif name in EMBEDDING_BAG_OPS:
            kind, shape, causal = KernelKind.MEMORY, embedding_bag_shape(name, args, out), False
        else:
            kind, causal = KernelKind.MEMORY, False
            shape = tuple(outputs[0].shape) if outputs else ()
        memory = kind is KernelKind.MEMORY
        run, loops = inner_loops(name, args, inputs, outputs) if memory else (0, 0)
        self.add(KernelRecord(op, kind, dtype, tuple(int(d) for d in shape), 1, flops,
                              weight, moved, saved_under_selective(func), causal, loops,
                              approximation(name, args, kwargs),
                              memory and name not in NOT_ELEMENTWISE_OPS
                              and scalar_over_broadcast(args, inputs, outputs), run,
                              memory and transposing(name, args, inputs, outputs),
                              loops_per_call(name, inputs, outputs) if memory else 0,
                              memory and name not in NOT_ELEMENTWISE_OPS
                              and sum(t.numel() > 1 for t in inputs) >= 2,
                              int(memory and name in REDUCTION_OPS and bool(inputs)
                                  and inputs[0].dim() > 0
                                  and reduction_unvectorized(args, inputs[0])),
                              weight_output=bool(outputs) and is_weight_output(
                                  name, outputs[0], bool(read_weights), name in GEMM_OPS,
                                  self.weight_shapes),
                              scalar_operand=wraps_python_number(func, args)))

    def records(self) -> tuple[KernelRecord, ...]:
        out = []
        for record, count, strided_calls in self._counts.values():
            out.append(dataclasses.replace(record, count=count, strided_calls=strided_calls))
        return tuple(out)


class FusedKernels:
    """Turns each SDPA call and each dropout of a layer's forward into the one fused
    kernel a GPU runs, forward and backward, and hides their decompositions from both
    recorders (a dropout that dispatches nothing, p = 0 or eval mode, records nothing).

    Call `before_node(node, env, dropout)` before each FX node runs and `finish(env)` after
    the last: a node's autograd nodes are collected once its output exists.
    """

    def __init__(self, forward: KernelRecorder, backward: KernelRecorder):
        self.forward, self.backward = forward, backward
        self._running: fx.Node | None = None
        self._dropout = False
        self._skipped = 0  # ops the running node dispatched
        self._inputs: list[torch.Tensor] = []
        self.autograd_nodes: set = set()  # backward nodes of the fused calls
        forward.skip_now = self._skip_forward
        backward.skip_now = lambda: torch._C._current_autograd_node() in self.autograd_nodes

    @staticmethod
    def is_sdpa(node: fx.Node) -> bool:
        return node.op == "call_function" and node.target in SDPA_TARGETS

    def _skip_forward(self) -> bool:
        if self._running is None:
            return False
        self._skipped += 1
        return True

    def before_node(self, node: fx.Node, env: dict, dropout: bool = False) -> None:
        self._close(env)
        if self.is_sdpa(node) or dropout:
            self._running, self._dropout, self._skipped = node, dropout, 0
            if dropout:
                self._inputs = _tensors([env.get(a, a) for a in node.all_input_nodes])[:1]
            else:
                self._open(node, env)

    def finish(self, env: dict) -> None:
        self._close(env)

    def _open(self, node: fx.Node, env: dict) -> None:
        def arg(i: int, name: str, default=None):
            value = node.args[i] if len(node.args) > i else node.kwargs.get(name, default)
            return env.get(value, value) if isinstance(value, fx.Node) else value

        q, k, v = arg(0, "query"), arg(1, "key"), arg(2, "value")
        mask = arg(3, "attn_mask")
        causal = bool(arg(5, "is_causal", False))
        self._inputs = [t for t in (q, k, v) if isinstance(t, torch.Tensor)]
        b, heads, q_len, head_dim = q.shape[0], q.shape[-3], q.shape[-2], q.shape[-1]
        kv_len = k.shape[-2]
        q_bytes, kv_bytes = q.nbytes, k.nbytes + v.nbytes
        mask_bytes = mask.nbytes if isinstance(mask, torch.Tensor) else 0
        # Dao 2023: two matmuls of 2 * q_len * kv_len * head_dim FLOPs per head forward.
        flops = 4 * b * heads * q_len * kv_len * head_dim
        shape = (int(b), int(heads), int(q_len), int(kv_len), int(head_dim))
        dtype = _dtype_name(q.dtype)
        saved = saved_under_selective(SDPA_GPU_OP)
        # forward reads q, k, v (and a mask), writes the output (q-sized)
        self.forward.add(KernelRecord(SDPA_OP, KernelKind.ATTENTION, dtype, shape, 1, flops,
                                      0, 2 * q_bytes + kv_bytes + mask_bytes, saved, causal))
        # backward reads q, k, v, out, d_out (and the mask), writes dq, dk, dv
        self.backward.add(KernelRecord(
            SDPA_OP, KernelKind.ATTENTION, dtype, shape, 1,
            int(ATTENTION_BACKWARD_FLOPS_RATIO * flops), 0,
            4 * q_bytes + 2 * kv_bytes + mask_bytes, saved, causal))

    def _add_dropout(self) -> None:
        """CUDA's native_dropout: reads x, writes the output and a bool mask (1 byte per
        element); its backward reads the gradient and the mask and writes the result."""
        x = self._inputs[0]
        dtype, shape = _dtype_name(x.dtype), tuple(int(d) for d in x.shape)
        moved = 2 * x.nbytes + x.numel() * DROPOUT_MASK_BYTES_PER_ELEMENT
        saved = saved_under_selective(DROPOUT_GPU_OP)
        self.forward.add(KernelRecord(DROPOUT_OP, KernelKind.MEMORY, dtype, shape, 1,
                                      activation_bytes=moved, saved_under_selective=saved))
        self.backward.add(KernelRecord(DROPOUT_BACKWARD_OP, KernelKind.MEMORY, dtype, shape, 1,
                                       activation_bytes=moved))

    def _close(self, env: dict) -> None:
        node, self._running = self._running, None
        if node is None or (self._dropout and (not self._skipped or not self._inputs)):
            return
        if self._dropout:
            self._add_dropout()
        stop = {t.grad_fn for t in self._inputs}
        stack = [t.grad_fn for t in _tensors(env.get(node))]
        while stack:
            fn = stack.pop()
            if fn is None or fn in stop or fn in self.autograd_nodes:
                continue
            self.autograd_nodes.add(fn)
            stack.extend(f for f, _ in fn.next_functions)
