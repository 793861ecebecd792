"""Reading a measured GEMM or convolution table at a shape it may not hold.

The tables are `KernelCalibration`'s (`ir.kernel_calibration`), whose query methods call
these functions. A shape is found by the least squared distance of its log2 dimensions,
so 2x off in one dimension counts as much anywhere; points equally near (a size halfway,
in log2, between two grid points) are averaged geometrically, the log-space midpoint.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

from ir.kernel_points import GEMM_TIE_LOG2_DISTANCE, ConvPoint, GemmPoint


def _gemm_distance(m: int, n: int, k: int, p: GemmPoint) -> float:
    return sum(math.log2(a / b) ** 2 for a, b in ((m, p.m), (n, p.n), (k, p.k)))


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def nearest_gemm(points: Iterable[GemmPoint], m: int, n: int, k: int,
                 dtype: str) -> GemmPoint | None:
    """The point of this dtype closest in log-shape; None without one (or a 0 dimension)."""
    points = [p for p in points if p.dtype == dtype]
    if not points or min(m, n, k) <= 0:
        return None
    return min(points, key=lambda p: _gemm_distance(m, n, k, p))


def gemm_flop_per_s(points: Sequence[GemmPoint], m: int, n: int, k: int,
                    dtype: str) -> float | None:
    """FLOP/s of an (m x k) @ (k x n) product: the nearest point's rate, or the geometric
    mean of the equally near ones. None without a point of that dtype."""
    nearest = nearest_gemm(points, m, n, k, dtype)
    if nearest is None:
        return None
    least = _gemm_distance(m, n, k, nearest)
    tied = [p.flop_per_s for p in points if p.dtype == dtype
            and _gemm_distance(m, n, k, p) <= least + GEMM_TIE_LOG2_DISTANCE]
    return nearest.flop_per_s if len(tied) == 1 else _geometric_mean(tied)


def gemm_layout_factor(layout_points: Sequence[GemmPoint], plain_points: Sequence[GemmPoint],
                       m: int, n: int, k: int, dtype: str, charged_s: float = 0.0) -> float:
    """Seconds of an (m, n, k) product in a layout over the plain mm's: at the layout
    table's nearest shape (equally near ones averaged geometrically), the rate of the
    plain mm timed in the same passes (a pair timed apart on a shared host read 1.8x
    where 1.3 was so) over the layout's, the layout's seconds less `charged_s` (what the
    host model charges its op per call already). 1.0 where not measured."""
    points = [p for p in layout_points if p.dtype == dtype]
    plain_rate = {(p.m, p.n, p.k): p.flop_per_s for p in plain_points if p.dtype == dtype}
    if not points or min(m, n, k) <= 0:
        return 1.0
    least = min(_gemm_distance(m, n, k, p) for p in points)
    plain = [(plain_rate.get((p.m, p.n, p.k)), p) for p in points
             if _gemm_distance(m, n, k, p) <= least + GEMM_TIE_LOG2_DISTANCE]
    ratios = [(2.0 * p.m * p.n * p.k / p.flop_per_s - charged_s) * rate
              / (2.0 * p.m * p.n * p.k) for rate, p in plain if rate is not None]
    ratios = [r for r in ratios if r > 0]  # a fixed excess above a tiny layout's time
    return _geometric_mean(ratios) if ratios else 1.0


def nearest_conv(points: Iterable[ConvPoint], batch: int, in_channels: int,
                 out_channels: int, positions: int, kernel_area: int,
                 dtype: str) -> list[ConvPoint]:
    """The convolutions of this dtype nearest in log2 (batch x positions, in_channels,
    out_channels, kernel_area); several where equally near (the caller averages them).
    Empty without a point of that dtype."""
    points = [p for p in points if p.dtype == dtype]
    if not points:
        return []

    def distance(p: ConvPoint) -> float:
        return sum(math.log2(a / b) ** 2 for a, b in (
            (batch * positions, p.batch * p.spatial ** 2), (in_channels, p.in_channels),
            (out_channels, p.out_channels), (kernel_area, p.kernel ** 2)))

    least = min(map(distance, points))
    return [p for p in points if distance(p) <= least + GEMM_TIE_LOG2_DISTANCE]


def fastest_points(*passes):
    """Per measured point (same shape or kernel, dtype and size), the fastest of several
    passes over one grid, in the first pass's order. On a shared host, other processes
    only ever slow a kernel down, so the fastest reading is the least disturbed one (the
    rule of Python's `timeit` docs: "the lowest value gives a lower bound for how fast
    your machine can run the given code snippet")."""
    def key(p):
        return tuple(getattr(p, f.name) for f in dataclasses.fields(p)
                     if f.name not in ("flop_per_s", "gbps"))

    def rate(p):
        return p.flop_per_s if isinstance(p, GemmPoint) else p.gbps

    best = {}
    for points in passes:
        for p in points:
            if key(p) not in best or rate(p) > rate(best[key(p)]):
                best[key(p)] = p
    return [best[key(p)] for p in passes[0]]
