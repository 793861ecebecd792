"""GEMMs in the operand layouts a layer runs them in (issue 17, CPU).

profile-device's GEMM table times `torch.mm(a, b, out=c)` with both operands contiguous
and no bias. A layer's products are laid out otherwise (torch.nn.Linear, F.linear and its
autograd formula in tools/autograd/derivatives.yaml):

    linear         forward with a bias: addmm(bias, x, W.t()): the weight transposed,
                   the bias broadcast into the output first (ATen's addmm: beta = 1)
    linear_nobias  forward without one: mm(x, W.t())
    weight_grad    backward, the weight's gradient: mm(dy.t(), x): the first operand
                   transposed (x^T @ dy, summed over the tokens)

The input's gradient, dy @ W, runs both operands contiguous: the plain table's layout.
On this CPU (one thread, thread clock, load 5-12, 2026-11-25, /tmp/wb/gemm_ab*.py: the
median of five interleaved rounds of 200 calls) the linear forward ran 13-31% over the
plain mm of its shape (512 x 64 x 64: 32.2 us against 24.5; 512 x 256 x 64: 120 against
94), a bias-less one 4-12% (30% at 128 x 64 x 64), the weight gradient 8-11% (64 x 64 x
512: 29.0 against 26.3): gpt-tiny's block at micro-batch 16 ran its forward addmms
~25% over what the plain table priced, timed op by op in the layer's own sequence.

`probe_gemm_layouts` times each layout and a plain mm back to back per shape, for the
calibration's `gemm_<layout>` tables and `gemm_layout_mm`; `kernel_time` multiplies a
record's plain-table seconds by `KernelCalibration.gemm_layout_factor` of the layout
`layout_of` names (the layout's seconds over the plain mm's of the same passes).

    probe_gemm_layouts("cpu", [(512, 64, 64)], "float32", seconds_per_call)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Callable

from ir.gemm_table import fastest_points
from ir.kernel_calibration import GEMM_LAYOUT_TABLES, GemmPoint
from ir.kernel_records import KernelRecord

# Shapes whose layouts profile-device times beside its own: m tokens (a zoo layer's
# micro-batch x sequence), n and k the zoo's hidden sizes; a model's exact shapes are
# added where the caller knows them (`extra_gemm_shapes`). Smaller products time the
# dispatch, not the layout (`device_grids.CPU_GEMM_MIN_FLOPS`); larger ones (~2 ms and
# up here) took 10 of the 14 s of the probe's two passes (2026-11-25, load 7), and a
# layout's extra (the bias's pass over the output, a transposed operand's packing) is
# a shrinking share of a larger product's time: the largest measured shape's factor
# stands for them. The probe takes ~4.1 s of one thread (31 shapes x 4 layouts x 2
# passes, thread clock, 2026-11-25): profile-device's CPU run ~37 s -> ~41 (target 60).
LAYOUT_TOKENS = (32, 128, 512, 2048)
LAYOUT_FEATURES = (32, 128, 512)
LAYOUT_MIN_FLOPS, LAYOUT_MAX_FLOPS = 2**20, 2**28
LAYOUT_SHAPES = [(m, n, k) for m in LAYOUT_TOKENS for n in LAYOUT_FEATURES
                 for k in LAYOUT_FEATURES if LAYOUT_MIN_FLOPS <= 2 * m * n * k <= LAYOUT_MAX_FLOPS]


def layout_of(r: KernelRecord, backward: bool) -> str | None:
    """The layout a GEMM record runs in (None: the plain table's). An addmm is a Linear's
    forward; a weight-shaped output (`KernelRecord.weight_output`) a weight gradient; any
    other forward mm a bias-less Linear; a backward's other mm is dy @ W (plain)."""
    op = r.op.split("::")[-1]
    if op == "addmm":
        return "linear"
    if op != "mm":
        return None  # bmm, baddbmm: attention's batched products, priced as the table's
    if r.weight_output:
        return "weight_grad"
    return None if backward else "linear_nobias"


def _layout_call(layout: str, m: int, n: int, k: int, dtype, device: str) -> Callable:
    """One call of the (m x k) @ (k x n) product in `layout` on fresh random operands."""
    import torch

    def rand(*shape):
        return torch.empty(shape, dtype=dtype, device=device).uniform_(-1.0, 1.0)

    if layout == "mm":  # the plain product, a fresh output as the layouts': their reference
        a, b = rand(m, k), rand(k, n)
        return lambda i: torch.mm(a, b)
    if layout == "weight_grad":
        dy, x = rand(k, m), rand(k, n)  # dy.t(): (m x k), transposed
        return lambda i: torch.mm(dy.t(), x)
    x, weight = rand(m, k), rand(n, k)  # weight.t(): (k x n), transposed
    if layout == "linear":
        bias = rand(n)
        return lambda i: torch.addmm(bias, x, weight.t())
    return lambda i: torch.mm(x, weight.t())


def probe_gemm_layouts(device: str, shapes, dtype: str,
                       seconds_per_call: Callable) -> dict[str, tuple[GemmPoint, ...]]:
    """Per layout's calibration field, FLOP/s (2mnk / seconds) at each shape, the plain mm
    ("mm") timed beside each shape's layouts as their reference: two passes, the second
    reversed, the fastest of the two kept (as the plain table is measured)."""
    import torch

    torch_dtype = getattr(torch, dtype)

    def one_pass(order) -> list[GemmPoint]:
        return [GemmPoint(m, n, k, f"{layout}:{dtype}", 2.0 * m * n * k / seconds_per_call(
                    _layout_call(layout, m, n, k, torch_dtype, device), device))
                for m, n, k in order for layout in GEMM_LAYOUT_TABLES]

    points = fastest_points(one_pass(shapes), one_pass(shapes[::-1]))
    return {field: tuple(GemmPoint(p.m, p.n, p.k, dtype, p.flop_per_s) for p in points
                         if p.dtype == f"{layout}:{dtype}")
            for layout, field in GEMM_LAYOUT_TABLES.items()}
