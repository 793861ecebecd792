"""The rows of a device's measured kernel tables (`ir.kernel_calibration`): one GEMM, one
memory-bound kernel at one size, one SDPA backend's run, one convolution, one op's host
excess; each a frozen dataclass validated when built (a spec file is data: a bad row is
one PlannerError naming it), and the names the tables may use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ir.errors import PlannerError

# Memory-bound kernels a calibration can describe (what profile-device times;
# `cost_models.memory_probes` says what each one runs).
MEMORY_KERNELS = ("copy", "add", "gelu", "sum", "softmax", "layer_norm", "batch_norm",
                  "batch_norm_backward", "softmax_backward", "masked_fill", "short_run",
                  "layer_norm_backward", "broadcast_scalar",
                  # kdev2 (issue 17): a sum over a middle dim in short strided loops
                  "short_reduction",
                  # kdev3 (issue 17): few loops per 2-D loop call, a copy and a product
                  "short_outer", "broadcast_binary",
                  # kdev3: the same middle-dim sum with no contiguous dim (unvectorised)
                  "strided_reduction",
                  # kernelprice (issue 17): log-softmax's backward, an exp per element
                  "log_softmax_backward",
                  # a CPU's dropout beside its draw: the mask's div_ and the mul (CPU only)
                  "dropout")
# SDPA backends as torch.nn.attention.SDPBackend names them, lower case, plus "default"
# (whatever torch's dispatcher picks with no backend forced).
SDPA_BACKENDS = ("flash_attention", "efficient_attention", "cudnn_attention", "math", "default")
# ---- seqkern (issue 17): memory-table kinds measured apart from `probe_memory`'s grid ----
# "fresh_output": the extra a kernel pays writing its output into lines not in cache, as
# in a layer's sequence (`cost_models.fresh_output`); its `nbytes` are the output's bytes
# and its `gbps` those bytes over the extra seconds. A spec without its points prices
# as before.
# "gelu_tanh", "gelu_backward", "gelu_tanh_backward", "tanh", "tanh_backward": elementwise
# math priced at its own rate, not exact GELU forward's (`cost_models.math_kernels`); same
# fields as the `MEMORY_KERNELS` kinds (bytes moved, GB/s).
APART_MEMORY_KERNELS = ("fresh_output", "gelu_tanh", "gelu_backward", "gelu_tanh_backward",
                        "tanh", "tanh_backward")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(where: str, field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlannerError(f"{where}: {field} must be a positive integer, got {value!r}")


def _positive(where: str, field: str, value: Any) -> None:
    if not _is_number(value) or value <= 0:
        raise PlannerError(f"{where}: {field} must be a number > 0, got {value!r}")


def _non_negative(where: str, record: Any, *fields: str) -> None:
    for field in fields:
        value = getattr(record, field)
        if not _is_number(value) or value < 0:
            raise PlannerError(f"{where}: {field} must be a number >= 0, got {value!r}")


def _ops_count(where: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlannerError(f"{where}: after_ops must be an integer >= 0, got {value!r}")


def _text(where: str, field: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise PlannerError(f"{where}: {field} must be a non-empty string, got {value!r}")


# Two table shapes count as equally near a queried one when their squared log2 distances
# differ by less than this (float rounding of log2 of integers; a real difference is >= 1e-3).
GEMM_TIE_LOG2_DISTANCE = 1e-9


@dataclass(frozen=True, slots=True)
class GemmPoint:
    """One measured matmul: (m x k) @ (k x n) in `dtype` ran at `flop_per_s` (2mnk FLOPs)."""

    m: int
    n: int
    k: int
    dtype: str
    flop_per_s: float

    def __post_init__(self) -> None:
        where = f"gemm {self.m}x{self.n}x{self.k}"
        for field in ("m", "n", "k"):
            _positive_int(where, field, getattr(self, field))
        _text(where, "dtype", self.dtype)
        _positive(where, "flop_per_s", self.flop_per_s)

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k}@{self.dtype}: {self.flop_per_s / 1e12:.3g} TFLOP/s"


@dataclass(frozen=True, slots=True)
class MemoryKernelPoint:
    """One memory-bound kernel over `nbytes` (read + written) at `gbps`."""

    kernel: str
    dtype: str
    nbytes: int
    gbps: float

    def __post_init__(self) -> None:
        where = f"memory kernel {self.kernel!r}"
        if self.kernel not in MEMORY_KERNELS + APART_MEMORY_KERNELS:
            raise PlannerError(f"{where}: unknown kernel; use one of "
                               f"{', '.join(MEMORY_KERNELS + APART_MEMORY_KERNELS)}")
        _text(where, "dtype", self.dtype)
        _positive_int(where, "nbytes", self.nbytes)
        _positive(where, "gbps", self.gbps)


@dataclass(frozen=True, slots=True)
class SdpaPoint:
    """One SDPA backend on one shape (batch, heads, seq_len, head_dim): seconds forward and
    backward (backward: a forward-plus-backward run less the forward)."""

    backend: str
    dtype: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool
    forward_s: float
    backward_s: float

    def __post_init__(self) -> None:
        where = f"sdpa {self.backend!r}"
        if self.backend not in SDPA_BACKENDS:
            raise PlannerError(f"{where}: unknown backend; use one of {', '.join(SDPA_BACKENDS)}")
        _text(where, "dtype", self.dtype)
        for field in ("batch", "heads", "seq_len", "head_dim"):
            _positive_int(where, field, getattr(self, field))
        if not isinstance(self.causal, bool):
            raise PlannerError(f"{where}: causal must be true or false, got {self.causal!r}")
        _positive(where, "forward_s", self.forward_s)
        _positive(where, "backward_s", self.backward_s)


@dataclass(frozen=True, slots=True)
class ConvPoint:
    """One measured 2-D convolution (stride 1, padding kernel // 2, one group, no bias):
    input (batch, in_channels, spatial, spatial), weight (out_channels, in_channels,
    kernel, kernel). Device seconds of the forward and of each half of the backward
    (ATen convolution_backward with only grad_input, only grad_weight requested); on a
    CPU each less one tiny op's host dispatch (`launch_host_s`), which the host model
    charges per op apart."""

    dtype: str
    batch: int
    in_channels: int
    out_channels: int
    spatial: int
    kernel: int
    forward_s: float
    input_backward_s: float
    weight_backward_s: float

    def __post_init__(self) -> None:
        where = (f"conv {self.batch}x{self.in_channels}x{self.spatial}^2 -> "
                 f"{self.out_channels} k{self.kernel}")
        _text(where, "dtype", self.dtype)
        for field in ("batch", "in_channels", "out_channels", "spatial", "kernel"):
            _positive_int(where, field, getattr(self, field))
        for field in ("forward_s", "input_backward_s", "weight_backward_s"):
            _positive(where, field, getattr(self, field))

    @property
    def flops(self) -> int:
        """2 x MACs of the forward (each backward half does as many)."""
        return (2 * self.batch * self.spatial ** 2 * self.out_channels * self.in_channels
                * self.kernel ** 2)

    def __str__(self) -> str:
        return (f"conv {self.batch}x{self.in_channels}x{self.spatial}^2->{self.out_channels} "
                f"k{self.kernel}@{self.dtype}: fwd {self.forward_s * 1e6:.1f} us, bwd input "
                f"{self.input_backward_s * 1e6:.1f}, weight {self.weight_backward_s * 1e6:.1f}")


@dataclass(frozen=True, slots=True)
class HostOpExcess:
    """Host seconds one call of ATen op `op` ("aten::gelu") costs beyond a streaming op's
    dispatch at tiny sizes (`cost_models.host_excess.host_op_excess_seconds`): a fixed
    cost per call that no bandwidth prices (exact GELU's erf path, a norm's statistics)."""

    op: str
    seconds: float

    def __post_init__(self) -> None:
        where = f"host op excess {self.op!r}"
        _text(where, "op", self.op)
        _non_negative(where, self, "seconds")


@dataclass(frozen=True, slots=True)
class ColdEntryPoint:
    """What a forward pays for starting after a layer after's forward and backward of
    `after_ops` ATen ops, then a layer before's forward of other code (`after_backward`:
    none, a step's first layer; `cost_models.cold_entry_probes.cold_entry_calibration`):
    `entry_s` per layer + `op_s` per cold distinct op; `same_code_entry_s`, the entry
    after the same work with the layer's own code run just before instead (a table after
    a table; 0 where not measured: after a backward, older kits)."""

    after_ops: int
    after_backward: bool
    entry_s: float
    op_s: float
    same_code_entry_s: float = 0.0

    def __post_init__(self) -> None:
        where = f"cold entry point at {self.after_ops!r} ops"
        _ops_count(where, self.after_ops)
        _non_negative(where, self, "entry_s", "op_s", "same_code_entry_s")


@dataclass(frozen=True, slots=True)
class ColdBackwardPoint:
    """What a backward pays for running after the forward and backward of layers of
    `after_ops` ATen ops (`cost_models.cold_backward_probes.cold_backward_calibration`):
    `op_s` per cold distinct backward op, `inner_op_s` per cold op a composite runs inside."""

    after_ops: int
    op_s: float
    inner_op_s: float

    def __post_init__(self) -> None:
        where = f"cold backward point at {self.after_ops!r} ops"
        _ops_count(where, self.after_ops)
        _non_negative(where, self, "op_s", "inner_op_s")


@dataclass(frozen=True, slots=True)
class ColdKernelPoint:
    """Seconds a memory kernel kind's call pays, with its code out of the core's L2, over
    the same call warm (`cost_models.cold_kernel.probe_cold_kernel`), and the L2 bytes the
    probe's eviction was twice of."""

    kernel: str
    dtype: str
    seconds: float
    l2_bytes: float

    def __post_init__(self) -> None:
        where = f"cold kernel point {self.kernel!r}"
        _text(where, "kernel", self.kernel)
        _text(where, "dtype", self.dtype)
        _non_negative(where, self, "seconds", "l2_bytes")


@dataclass(frozen=True, slots=True)
class OpColdCodePoint:
    """Seconds an op kind's call pays after other distinct ops ran (its dispatch path and
    kernel code out of the caches, its data warm) over the same call warm
    (`cost_models.op_cold_probe.probe_op_cold_code`); kind "reference" is a small unary
    op's, the kind the per-cold-op host figures were fitted on."""

    kind: str
    dtype: str
    seconds: float

    def __post_init__(self) -> None:
        where = f"op cold-code point {self.kind!r}"
        _text(where, "kind", self.kind)
        _text(where, "dtype", self.dtype)
        _non_negative(where, self, "seconds")
