"""Elementwise math kernels priced as their own memory kinds, not at exact GELU's rate
(issue 17, round 2 of kernels in sequence).

`kernel_time.MEMORY_KERNEL_OF_OP` prices every elementwise math op (gelu, its backward,
silu, tanh, exp ...) at the "gelu" kind: exact GELU forward's measured bytes per second.
On this CPU (AMD EPYC Zen 5, torch 2.13, one thread, thread clock, fastest of 21,
2026-11-25, (512, 256) fp32 = the gpt-tiny / bert-tiny MLP at micro-batch 16, inputs
uniform(-1, 1)) per call:

    gelu 31.7 us   gelu_backward 68.1   gelu(tanh) 157.4   gelu_backward(tanh) 164.1
    tanh 276.2     tanh_backward 16.1   silu 30.0   silu_backward 37.0   add 16.6

At the "gelu" rate (2 element-bytes per element forward, 3 backward) a tanh-GELU is
priced at 32 us for 157 (5x under), its backward at 48 for 164 (3.4x), exact GELU's
backward at 48 for 68 (1.4x), tanh at 32 for 276 (8.7x), while tanh's backward streams
as add does (48 for 16: 3x over); silu and its backward land within 25%. The zoo's GPT
and BERT run exact GELU (their backward: +11 us a pass at micro-batch 16); a transformers
GPT-2 (`gelu_new`: torch.tanh of a cubic) ran a block's forward at micro-batch 16 in
2016 us, predicted 1164 without these kinds and 1411 with them (bench_kernel_sequence
--predict, load 4.5). The values do not matter: uniform(-1, 1), [0, 1), N(0, 1),
N(0, 16), N(0, 0.01), zeros and -20 all ran within 10% of one another; only denormal
inputs (1e-40) ran 2.5-3x slower, which layer activations are not.

Each kind of MATH_KINDS is probed as `memory_probes.probe_memory` probes the others:
rotating buffers, at `device_grids.CPU_MEMORY_BYTES` bytes moved, two passes in opposite
orders (the fastest point kept: `ir.gemm_table.fastest_points`), less what the host
model charges per call (`memory_probes.net_of_call_cost`, with the variants' own measured
host excess: `host_excess`). A spec without a kind's points prices that op as before
("gelu": `math_kind` answers None). CPU only: a GPU runs these ops at its memory
bandwidth (`kernel_time.GPU_MEMORY_KERNEL_BANDWIDTH_FRACTION`'s "gelu" share).
"""

from __future__ import annotations

from ir.kernel_records import KernelRecord

from cost_models.kernel_loops import measured

# kind -> (ATen op name, its recorded `approximate` variant, element-sized tensors read and
# written per element: forward x -> y; backward grad, x -> grad_x), host-excess key
# (`host_excess.HOST_EXCESS_OPS`; "" for an op the host model charges dispatch only)
MATH_KINDS = {
    "gelu_tanh": ("gelu", "tanh", 2, "aten::gelu(approximate=tanh)"),
    "gelu_backward": ("gelu_backward", "", 3, "aten::gelu_backward"),
    "gelu_tanh_backward": ("gelu_backward", "tanh", 3, "aten::gelu_backward(approximate=tanh)"),
    "tanh": ("tanh", "", 2, ""),
    "tanh_backward": ("tanh_backward", "", 3, ""),  # grad x (1 - y^2): it streams, as add
}
_KIND_OF_OP = {(op, variant): kind for kind, (op, variant, _, _) in MATH_KINDS.items()}


def math_kind(r: KernelRecord, cal) -> str | None:
    """The MATH_KINDS kind that prices a memory record where `cal` measured it, else None
    (the op keeps `kernel_time.MEMORY_KERNEL_OF_OP`'s kind)."""
    kind = _KIND_OF_OP.get((r.op.split("::")[-1], r.variant))
    return kind if kind is not None and measured(cal, kind) else None


def _call(kind: str, x, grad):
    """One call of `kind` on x (and the output gradient `grad` for a backward)."""
    import torch

    aten = torch.ops.aten
    op, variant, _, _ = MATH_KINDS[kind]
    approximate = variant or "none"
    if op == "gelu":
        return lambda: aten.gelu(x, approximate=approximate)
    if op == "gelu_backward":
        return lambda: aten.gelu_backward(grad, x, approximate=approximate)
    if op == "tanh_backward":  # reads the gradient and tanh's output y
        return lambda: aten.tanh_backward(grad, x)
    return lambda: aten.tanh(x)


def _probe_pass(device: str, sizes, dtype: str) -> list:
    """One pass over `sizes` (bytes moved) of every MATH_KINDS kind: MemoryKernelPoints."""
    from ir.kernel_calibration import MemoryKernelPoint

    from cost_models.profile_device import _random, _rotation_sets, seconds_per_call

    points = []
    element_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    for nbytes in sizes:
        for kind, (_, _, tensors, _) in MATH_KINDS.items():
            numel = max(1, nbytes // (tensors * element_bytes))
            sets = _rotation_sets(device, tensors * numel * element_bytes)
            calls = [_call(kind, _random(numel, dtype, device), _random(numel, dtype, device))
                     for _ in range(sets)]
            seconds = seconds_per_call(lambda i: calls[i % sets](), device)
            moved = tensors * numel * element_bytes
            points.append(MemoryKernelPoint(kind, dtype, moved, moved / seconds / 1e9))
            del calls
    return points


def probe_math_kernels(device: str, sizes, dtype: str = "float32") -> list:
    """The MATH_KINDS points of a CPU at `sizes` bytes moved (none elsewhere): the fastest
    of two passes, net of what the host model charges each call."""
    if device != "cpu":
        return []
    from ir.gemm_table import fastest_points

    from cost_models.clusters import _one_thread
    from cost_models.host_excess import plain_dispatch_seconds
    from cost_models.memory_probes import net_of_call_cost

    with _one_thread():  # as profile_device measures a CPU (and as local processes run)
        points = fastest_points(_probe_pass(device, sizes, dtype),
                                _probe_pass(device, tuple(sizes)[::-1], dtype))
    excess_ops = tuple(key for _, _, _, key in MATH_KINDS.values() if key)
    plain = plain_dispatch_seconds(device, ops=excess_ops)
    charged_s = {kind: plain.op_s + plain.excess_s.get(key, 0.0)
                 for kind, (_, _, _, key) in MATH_KINDS.items()}
    return net_of_call_cost(points, plain.op_s, charged_s)
