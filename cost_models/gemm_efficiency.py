"""What fraction of peak a matmul reaches, by size: measured table or analytic saturation.

Two readings of one idea. `gemm_efficiency(dim, device)` is the analytic default: a GEMM
of square edge n runs at best * n / (n + n_half) of peak (a saturation fit to cuBLAS
benchmarks). `gemm_shape_efficiency(spec, m, n, k, dtype)` answers for an (m x k) @
(k x n) product: the nearest measured shape of the spec's kernel calibration
(`ir.kernel_calibration`, written by `planner profile-device`), else the analytic default
at the edge of the square GEMM of equal arithmetic intensity.

    >>> round(gemm_efficiency(8192, "H100-SXM5-80GB", 0.82), 3)
    0.795
"""

from __future__ import annotations

from ir.cluster import ClusterSpec
from ir.errors import PlannerError

from cost_models.id_memo import IdMemo

# n_half per device kind: the square-GEMM edge at which a matmul reaches half of its best
# throughput. Chosen so an 8192^3 product lands at ~97% of the best measured rate on
# Hopper (REFERENCES.md: ~795 of 989 TFLOP/s) and small GEMMs fall off as cuBLAS
# benchmarks show (n = 256 runs at roughly half rate); CPUs saturate much earlier.
GEMM_HALF_EFFICIENCY_DIM = {"A100": 192.0, "H100": 256.0, "H200": 256.0, "cpu": 24.0}
DEFAULT_GEMM_HALF_EFFICIENCY_DIM = 256.0
# Best fraction of peak when the spec does not carry a measured `matmul_efficiency`.
DEFAULT_MATMUL_EFFICIENCY = 0.8
# A square n^3 GEMM does 2n^3 FLOPs on 3n^2 elements of e bytes: n = (3/2) * e * FLOPs/byte.
SQUARE_GEMM_EDGE_PER_INTENSITY = 1.5


def device_kind(device: str) -> str:
    """"H100-SXM5-80GB" -> "H100"; anything CPU-like -> "cpu"."""
    upper = device.upper()
    for kind in GEMM_HALF_EFFICIENCY_DIM:
        if kind != "cpu" and kind in upper:
            return kind
    return "cpu" if "CPU" in upper or "X86" in upper or "ARM" in upper else device


def gemm_efficiency(dim, device: str, max_efficiency: float | None = None):
    """Fraction of peak a GEMM of edge `dim` reaches: best * n / (n + n_half) (saturation fit)."""
    n_half = GEMM_HALF_EFFICIENCY_DIM.get(device_kind(device), DEFAULT_GEMM_HALF_EFFICIENCY_DIM)
    best = DEFAULT_MATMUL_EFFICIENCY if max_efficiency is None else max_efficiency
    return best * dim / (dim + n_half)


# `KernelCalibration.gemm_flop_per_s` by (calibration, m, n, k, dtype): the search asks
# per kernel of every priced row, and each answer scans the whole table.
_RATES = IdMemo(max_entries=4096)


def _table_rate(cal, m: int, n: int, k: int, dtype: str) -> float | None:
    """`cal.gemm_flop_per_s(m, n, k, dtype)`, kept."""
    return _RATES.get((id(cal), m, n, k, dtype), cal, cal.gemm_flop_per_s, m, n, k, dtype)


def gemm_shape_efficiency(spec: ClusterSpec, m: int, n: int, k: int, dtype: str) -> float:
    """Fraction of `spec.peak_flops(dtype)` an (m x k) @ (k x n) GEMM reaches.

    Measured: the nearest GEMM of that dtype in the spec's table (log-shape distance;
    equally near shapes averaged geometrically, `KernelCalibration.gemm_flop_per_s`), its
    FLOP/s over the peak, at most 1. Analytic
    default: `gemm_efficiency` at the edge of the square GEMM of equal arithmetic
    intensity, 2mnk / (mk + kn + mn) elements = 2e/3 for an e^3 product, so
    e = 3mnk / (mk + kn + mn) (the same equivalence compute.py uses for whole layers).
    """
    for size in (m, n, k):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise PlannerError(f"gemm_efficiency: m, n, k must be positive integers, "
                               f"got {(m, n, k)}")
    peak = spec.peak_flops(dtype)
    cal = spec.kernel_calibration
    rate = _table_rate(cal, m, n, k, dtype) if cal is not None else None
    if rate is not None:
        return min(1.0, rate / peak)
    edge = 3.0 * m * n * k / (m * k + k * n + m * n)
    return gemm_efficiency(edge, spec.device, spec.matmul_efficiency)
