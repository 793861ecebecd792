"""The memory-bound kernel probe of `planner profile-device` (`cost_models.profile_device`):
GB/s of each kernel kind of `ir.kernel_calibration.MEMORY_KERNELS` by tensor size (bytes
read plus written), on the device's grid of sizes (`device_grids`).

Beside the streaming kinds (copy, add), the kinds whose speed per byte differs on a CPU
(one thread, 256 KiB to 1 MiB tensors, 2026-11-24, each against the table's add/copy):
  softmax_backward  `_softmax_backward_data` over rows (no exp: 17 us where the forward's
                    table priced 80 for llama-tiny's (16, 8, 32, 32) scores);
  log_softmax_backward  `_log_softmax_backward_data` over rows: grad - exp(y) x the
                    row's sum of grad, an exp per element that softmax's backward does
                    not run (2.5x its seconds here: 26 us against 10 for 512 x 128 fp32,
                    as in rows of 4096; one thread, thread clock, 2026-11-25, load 5);
  masked_fill       `masked_fill` with a causal (s x s) mask broadcast over the batch and
                    heads, as GPT/Llama/T5 mask scores (69 us for llama-tiny's 512 KiB, ~14x an add);
  short_run         a copy whose innermost loop runs SHORT_RUN_PROBE_ELEMENTS elements (a
                    transposed (n, 8, 8) view): TensorIterator pays per inner loop, so a
                    permute, an expand or a broadcast over a middle dim streams ~5x slower
                    (llama-tiny's (16, 32, 4, 2, 8) repeat_kv clone: 26 us for 128 KiB);
  layer_norm_backward  `native_layer_norm_backward` (all three gradients) over rows of
                    LAYER_NORM_BACKWARD_ROW_ELEMENTS: on this CPU ~half the forward's
                    seconds per byte (gpt-tiny's norm at micro-batch 16, 128 KiB of rows of
                    64: 11 us alone, where the forward's table priced 22).

  short_reduction   llama-tiny's repeat_kv backward: a sum over the n_rep dim of a
                    permuted gradient, loops of 2 strided (`device_grids`: ~2.3 ns per
                    loop here where short_run's copy loops of 8 cost ~3.5);
  short_outer       a copy in loops of 8 from a stride-0 middle dim of 2: 2 loops per 2-D
                    loop call (llama-tiny's repeat_kv clone), where short_run runs 8;
  broadcast_binary  x (n, 4, 8) times y (n, 1, 8): a product broadcast over a middle dim
                    (rotary's k * cos); both priced by `cost_models.kernel_loops`;
  strided_reduction the same sum from v's gradient, laid out (b, kv, n_rep, d, s): no
                    dim contiguous, ATen's reduce runs it element by element (52 us where
                    short_reduction's layout took 42, `reduction_unvectorized`);
  broadcast_scalar  a scalar times a column expanded along the rows (stride 0 innermost),
                    as a mean's backward divides: not vectorised, ~3.5x an add per byte
                    (`ir.kernel_recorder.scalar_over_broadcast` marks such records).
  dropout           (CPU only) what ATen's CPU dropout runs beside its draw: the float
                    mask scaled in place by 1 / keep (`div_`) and x times it (`mul`), as
                    GB/s over the bytes of the fused `native_dropout` the records hold
                    (x read, the output and a bool mask written); the draw is
                    `item_probes.probe_random_element_s`'s. CUDA runs the one fused
                    kernel: its record streams as an add there (`kernel_time`).

Two corrections beside the table (CPU):
  per call          each point less the per-call cost the host model charges per op
                    already (dispatch, plus the op's excess), at most the probe's own
                    fixed cost (the intercept of its two smallest sizes):
                    `net_of_call_cost`; at 32 KiB it was most of a copy's time;
  per row           softmax and layer norm pay per row beyond their bytes
                    (`probe_row_seconds`: the same bytes in short and long rows).

    probe_memory("cpu", [256 * 2**10], "float32")   # doctest: +SKIP
"""

from __future__ import annotations

from ir.errors import PlannerError
from ir.kernel_calibration import MemoryKernelPoint

from cost_models.common import dtype_bytes
from cost_models.device_grids import (BATCH_NORM_CHANNELS, BROADCAST_BINARY_LOOPS_PER_CALL, CPU_SMALL_ONLY_KINDS,
                                      CPU_SMALL_ONLY_MAX_BYTES, MASK_SEQ_LEN, MiB,
                                      ROW_ELEMENTS, ROW_PROBE_BYTES, ROW_PROBE_PASSES,
                                      SHORT_ROW_ELEMENTS,
                                      SHORT_REDUCTION_KV_HEADS,
                                      SHORT_REDUCTION_PROBE_ELEMENTS,
                                      SHORT_OUTER_LOOPS_PER_CALL, SHORT_RUN_PROBE_ELEMENTS)

# The backward's weight and bias gradients sum over the rows per column: a cost per column
# that rows of ROW_ELEMENTS pay at any size (here, one thread, 2026-11-24: 10.8 us for 32
# KiB in rows of 4096, 5.8 in rows of 64; 42.8 vs 55.8 us at 512 KiB), which a wide-row
# table would charge narrow rows as bandwidth. Its table is measured on the zoo's hidden
# size (`SHORT_ROW_ELEMENTS["layer_norm"]`); wide hidden sizes on a CPU are priced at it.
LAYER_NORM_BACKWARD_ROW_ELEMENTS = SHORT_ROW_ELEMENTS["layer_norm"]


def _memory_kernel(name: str, x, y, out):
    """One call of a memory-bound kernel and the bytes it must move: each input read once,
    each output written once. Views are made here, once: each call is one op's dispatch."""
    import torch
    import torch.nn.functional as F

    aten = torch.ops.aten
    rows = x.numel() // ROW_ELEMENTS
    e = x.element_size()
    x_rows, y_rows = x.view(rows, ROW_ELEMENTS), y.view(rows, ROW_ELEMENTS)
    if name == "copy":
        return lambda: out.copy_(x), 2 * x.numel() * e
    if name == "add":
        return lambda: torch.add(x, y, out=out), 3 * x.numel() * e
    if name == "gelu":
        return lambda: F.gelu(x), 2 * x.numel() * e
    if name == "sum":  # reduce rows of ROW_ELEMENTS: read everything, write one per row
        return lambda: x_rows.sum(dim=-1), (x.numel() + rows) * e
    if name == "softmax":
        return lambda: torch.softmax(x_rows, dim=-1), 2 * x.numel() * e
    if name == "layer_norm":  # reads x, writes y (the row statistics are negligible)
        weight, bias = (torch.ones(ROW_ELEMENTS, dtype=x.dtype, device=x.device)
                        for _ in range(2))
        return (lambda: aten.native_layer_norm(x_rows, [ROW_ELEMENTS], weight, bias, 1e-5),
                2 * x.numel() * e)
    if name == "layer_norm_backward":  # rows of LAYER_NORM_BACKWARD_ROW_ELEMENTS
        width = LAYER_NORM_BACKWARD_ROW_ELEMENTS
        x_short, grad = x.view(-1, width), y.view(-1, width)
        weight, bias = (torch.ones(width, dtype=x.dtype, device=x.device) for _ in range(2))
        _, mean, rstd = aten.native_layer_norm(x_short, [width], weight, bias, 1e-5)
        # reads the gradient and x, writes grad_input (and the weight's and bias's)
        return (lambda: aten.native_layer_norm_backward(
            grad, x_short, [width], mean, rstd, weight, bias, [True, True, True]),
            3 * x.numel() * e)
    if name == "softmax_backward":  # reads the gradient and the output, writes the result
        rows_y = torch.softmax(y_rows, dim=-1)
        return (lambda: aten._softmax_backward_data(x_rows, rows_y, -1, x.dtype),
                3 * x.numel() * e)
    if name == "log_softmax_backward":  # reads the gradient and the output, writes the result
        rows_y = torch.log_softmax(y_rows, dim=-1)
        return (lambda: aten._log_softmax_backward_data(x_rows, rows_y, -1, x.dtype),
                3 * x.numel() * e)
    if name == "masked_fill":  # a causal mask over (..., s, s) scores: reads x, writes out
        causal = torch.ones(MASK_SEQ_LEN, MASK_SEQ_LEN, dtype=torch.bool,
                            device=x.device).triu(1)
        scores = x.view(-1, MASK_SEQ_LEN, MASK_SEQ_LEN)
        return lambda: scores.masked_fill(causal, float("-inf")), 2 * x.numel() * e
    if name == "dropout":  # x * mask.div_(keep): a zero mask stays zero, call after call
        from cost_models.item_probes import DROPOUT_KEEP_PROBABILITY
        from ir.kernel_recorder import DROPOUT_MASK_BYTES_PER_ELEMENT
        mask = torch.zeros_like(x)
        return (lambda: x * mask.div_(DROPOUT_KEEP_PROBABILITY),
                (2 * e + DROPOUT_MASK_BYTES_PER_ELEMENT) * x.numel())  # the record's bytes
    if name == "broadcast_scalar":  # a column broadcast along the rows, times a scalar
        column = x_rows[:, :1].expand(rows, ROW_ELEMENTS)  # read as the record counts it
        return lambda: column * 2.0, 2 * x.numel() * e
    if name == "short_run":  # out = x's (n, r, r) blocks transposed: inner loops of r
        r = SHORT_RUN_PROBE_ELEMENTS
        source, target = x.view(-1, r, r).transpose(1, 2), out.view(-1, r, r)
        return lambda: target.copy_(source), 2 * x.numel() * e
    if name == "short_outer":  # out = x's (n, 1, r) rows repeated o times: o loops per call
        o, r = SHORT_OUTER_LOOPS_PER_CALL, SHORT_RUN_PROBE_ELEMENTS
        source, target = x.view(-1, o, r)[:, :1].expand(-1, o, r), out.view(-1, o, r)
        return lambda: target.copy_(source), 2 * x.numel() * e
    if name == "broadcast_binary":  # x (n, o, r) times y (n, 1, r): reads both, writes out
        o, r = BROADCAST_BINARY_LOOPS_PER_CALL, SHORT_RUN_PROBE_ELEMENTS
        xs, ys, target = x.view(-1, o, r), y.view(-1, o, r)[:, :1], out.view(-1, o, r)
        return lambda: torch.mul(xs, ys, out=target), (2 * x.numel() + x.numel() // o) * e
    if name == "short_reduction":  # (b, k, r, s, d) memory summed over r: one loop per output
        r, k, s, w = (SHORT_REDUCTION_PROBE_ELEMENTS, SHORT_REDUCTION_KV_HEADS, MASK_SEQ_LEN,
                      SHORT_RUN_PROBE_ELEMENTS)
        grad = x.view(-1, k, r, s, w).permute(0, 3, 1, 2, 4)  # read as (b, s, k, r, d)
        return lambda: grad.sum(dim=3, keepdim=True), x.numel() * e + x.numel() // r * e
    if name == "strided_reduction":  # the same from (b, k, r, d, s) memory: d strided
        r, k, s, w = (SHORT_REDUCTION_PROBE_ELEMENTS, SHORT_REDUCTION_KV_HEADS, MASK_SEQ_LEN,
                      SHORT_RUN_PROBE_ELEMENTS)
        grad = x.view(-1, k, r, w, s).permute(0, 4, 1, 2, 3)  # read as (b, s, k, r, d)
        return lambda: grad.sum(dim=3, keepdim=True), x.numel() * e + x.numel() // r * e
    if name.startswith("batch_norm"):  # training mode over (rows, channels, positions)
        images = x.view(rows, BATCH_NORM_CHANNELS, ROW_ELEMENTS // BATCH_NORM_CHANNELS)
        stats = [torch.ones(BATCH_NORM_CHANNELS, dtype=x.dtype, device=x.device)
                 for _ in range(4)]  # weight, bias, running mean, running var
        _, mean, invstd = aten.native_batch_norm(images, *stats, True, 0.1, 1e-5)
        if name == "batch_norm":  # reads x, writes y
            return (lambda: aten.native_batch_norm(images, *stats, True, 0.1, 1e-5),
                    2 * x.numel() * e)
        grad = y.view_as(images)  # reads the gradient and x, writes grad_input
        return (lambda: aten.native_batch_norm_backward(
            grad, images, stats[0], stats[2], stats[3], mean, invstd, True, 1e-5,
            [True, True, True]), 3 * x.numel() * e)
    raise PlannerError(f"unknown memory kernel {name!r}")


# The op each probe kind's call dispatches whose per-call host excess the host model
# charges (`host_excess.HOST_EXCESS_OPS`); other kinds are charged plain dispatch only.
EXCESS_OP_OF_KIND = {"gelu": "aten::gelu", "sum": "aten::sum",
                     "short_reduction": "aten::sum", "strided_reduction": "aten::sum",
                     "layer_norm": "aten::native_layer_norm",
                     "layer_norm_backward": "aten::native_layer_norm_backward",
                     "softmax_backward": "aten::_softmax_backward_data",
                     "log_softmax_backward": "aten::_log_softmax_backward_data",
                     "masked_fill": "aten::masked_fill", "batch_norm": "aten::native_batch_norm",
                     "batch_norm_backward": "aten::native_batch_norm_backward"}
# Kinds whose probe call dispatches more than one op, each charged by the host model
# (a CPU dropout's div_ and mul); the others dispatch one.
DISPATCHES_OF_KIND = {"dropout": 2}
# Kinds only a CPU runs as probed (CUDA fuses a dropout into one kernel).
CPU_ONLY_KINDS = ("dropout",)


def host_charged_seconds(device: str) -> tuple[float, dict[str, float]]:
    """What the host model charges one call of each probe kind (CPU): one op's plain
    dispatch, plus the op's measured excess where it has one (`host_excess
    .plain_dispatch_seconds`, the figures `host_dispatch.forward_host_seconds` prices);
    returns (plain dispatch, {kind: dispatch + excess})."""
    from cost_models.host_excess import plain_dispatch_seconds

    plain = plain_dispatch_seconds(device, ops=tuple(EXCESS_OP_OF_KIND.values()))
    return plain.op_s, {**{kind: plain.op_s + plain.excess_s.get(op, 0.0)
                           for kind, op in EXCESS_OP_OF_KIND.items()},
                        **{kind: n * plain.op_s for kind, n in DISPATCHES_OF_KIND.items()}}


def net_of_call_cost(points: list[MemoryKernelPoint], dispatch_s: float,
                     charged_s: dict[str, float]) -> list[MemoryKernelPoint]:
    """CPU points less what of each probe call's fixed cost the host model charges per
    op already (`host_charged_seconds`: `charged_s[kind]`, else `dispatch_s`), at most
    the probe's own per-call cost: the intercept of the line through its kind's two
    smallest sizes' seconds (a call of no bytes; a `copy_` into a given output allocates
    nothing and costs less than the host's allocating reference op). Without it the small
    points (a 32 KiB copy: 1.1 us, most of it the call) carried the dispatch the host
    model charges too. Every point of the kind loses the same seconds, never going below
    `conv_probes.MIN_DEVICE_SHARE` of its own; a kind measured at one size is kept."""
    from cost_models.conv_probes import MIN_DEVICE_SHARE

    def seconds(p: MemoryKernelPoint) -> float:
        return p.nbytes / (p.gbps * 1e9)

    out = []
    for p in points:
        sizes = sorted({q.nbytes: q for q in points
                        if (q.kernel, q.dtype) == (p.kernel, p.dtype)}.values(),
                       key=lambda q: q.nbytes)
        if len(sizes) < 2:
            out.append(p)
            continue
        small, next_up = sizes[0], sizes[1]
        slope_s = (seconds(next_up) - seconds(small)) / (next_up.nbytes - small.nbytes)
        intercept_s = max(0.0, seconds(small) - slope_s * small.nbytes)
        call_s = min(intercept_s, charged_s.get(p.kernel, dispatch_s))
        device_s = max(seconds(p) - call_s, MIN_DEVICE_SHARE * seconds(p))
        out.append(MemoryKernelPoint(p.kernel, p.dtype, p.nbytes, p.nbytes / device_s / 1e9))
    return out


def probe_row_seconds(device: str, dtype: str) -> dict[str, float]:
    """Seconds per row of each row-wise kind of `device_grids.SHORT_ROW_ELEMENTS` beyond
    its bytes: ROW_PROBE_BYTES in rows of SHORT_ROW_ELEMENTS[kind] and in rows of
    ROW_ELEMENTS (the bandwidth table's), the time difference over the row-count
    difference (bytes and the call's fixed cost cancel); each time the fastest of
    ROW_PROBE_PASSES medians. Never below 0."""
    import torch

    from cost_models.profile_device import _random, seconds_per_call

    aten = torch.ops.aten
    element_bytes = dtype_bytes(dtype)
    numel = ROW_PROBE_BYTES // element_bytes // ROW_ELEMENTS * ROW_ELEMENTS
    x = _random(numel, dtype, device)
    def call_at(kind: str, width: int):
        rows_view = x.view(-1, width)
        ones = torch.ones(width, dtype=x.dtype, device=device)
        if kind == "softmax":
            return lambda i: torch.softmax(rows_view, dim=-1)
        return lambda i: aten.native_layer_norm(rows_view, [width], ones, ones, 1e-5)

    out = {}
    for kind, short in SHORT_ROW_ELEMENTS.items():
        widths = (ROW_ELEMENTS, short)
        calls = [call_at(kind, width) for width in widths]
        # The passes alternate the widths, so a slow spell of a shared host hits both.
        long_s, short_s = (min(passes) for passes in zip(*(
            [seconds_per_call(call, device) for call in calls]
            for _ in range(ROW_PROBE_PASSES))))
        long_rows, short_rows = (numel // width for width in widths)
        out[kind] = max(0.0, (short_s - long_s) / (short_rows - long_rows))
    return out


def probed_kinds(device: str, nbytes: int) -> list[str]:
    """The memory kinds `probe_memory` measures at `nbytes` on `device`."""
    from ir.kernel_calibration import MEMORY_KERNELS

    if device != "cpu":
        return [name for name in MEMORY_KERNELS if name not in CPU_ONLY_KINDS]
    return [name for name in MEMORY_KERNELS
            if name not in CPU_SMALL_ONLY_KINDS or nbytes <= CPU_SMALL_ONLY_MAX_BYTES]


def probe_memory(device: str, sizes, dtype: str, progress=None) -> list[MemoryKernelPoint]:
    """GB/s of each memory-bound kernel by tensor size (bytes read plus written)."""
    from cost_models.profile_device import _random, _rotation_sets, seconds_per_call

    points = []
    element_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    for nbytes in sizes:
        numel = max(ROW_ELEMENTS, nbytes // element_bytes // ROW_ELEMENTS * ROW_ELEMENTS)
        sets = _rotation_sets(device, 3 * numel * element_bytes)
        xs = [_random(numel, dtype, device) for _ in range(sets)]
        ys = [_random(numel, dtype, device) for _ in range(sets)]
        outs = [_random(numel, dtype, device) for _ in range(sets)]
        for name in probed_kinds(device, nbytes):
            calls = [_memory_kernel(name, xs[s], ys[s], outs[s]) for s in range(sets)]
            seconds = seconds_per_call(lambda i: calls[i % sets][0](), device, graph=True)
            moved = calls[0][1]
            points.append(MemoryKernelPoint(name, dtype, moved, moved / seconds / 1e9))
            if progress:
                progress(f"{name} {moved / MiB:.1f} MiB: {points[-1].gbps:.1f} GB/s")
        del xs, ys, outs
    return points
