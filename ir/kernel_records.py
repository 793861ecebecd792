"""Per-kernel records of one layer: what each ATen op costs, as plain frozen data.

While a unique layer runs forward and backward on meta tensors (`ir.graph_measurer`),
`ir.kernel_recorder` notes every ATen op it dispatches: its kind, shape, dtype, FLOPs and
bytes. Records are aggregated per (op, shape, dtype) with a `count`, so a GPT block
holds a few dozen of them whatever its size; the cost model
(`cost_models.kernel_time`) prices each one as the kernel that runs on a device.

Kinds:
  gemm       matmuls (mm, addmm, bmm, baddbmm, ...): `shape` is (batch, m, n, k), an
             (m x k) @ (k x n) product `batch` times.
  conv       convolutions (convolution, convolution_backward): `shape` is (groups, batch,
             in_channels, out_channels, out_positions, kernel_area, grads), channels per
             group, positions and kernel area summed over the spatial dims; `grads` says
             which gradients a backward computes (CONV_GRAD_INPUT | CONV_GRAD_WEIGHT |
             CONV_GRAD_BIAS, ATen's output_mask), 0 forward. Its implicit GEMM
             (`conv_implicit_gemm`): m = batch x out_positions, n = out_channels, k =
             in_channels x kernel_area, `groups` times.
  attention  one fused scaled-dot-product-attention kernel (flash / efficient / cuDNN):
             `shape` is (batch, heads, q_len, kv_len, head_dim).
  memory     everything else that moves data (norms, softmax, dropout, activations,
             adds, casts, copies, gathers): `shape` is the first output's shape, but
             (indices, bags, dim) for an embedding bag's forward and backward
             (`ir.kernel_recorder.EMBEDDING_BAG_OPS`), whose cost counts ids.
  view       views and metadata ops: no kernel, no bytes (they still cost a host
             dispatch, which `LayerMeasurement.ops_fwd` / `ops_bwd` count).

Bytes per call: each distinct input tensor read once plus each output written once
(`weight_bytes` is the part of the reads that are the layer's parameters and buffers,
which does not grow with the micro-batch). FLOPs per call: torch.utils.flop_counter's
formulas (2mnk per matmul), and for attention 4*b*s^2*h forward and 2.5x that backward
(Dao 2023, FlashAttention-2 §4: the backward does 5 matmuls to the forward's 2).

    >>> r = KernelRecord("aten::mm", KernelKind.GEMM, "float32", (1, 64, 256, 64), count=2,
    ...                  flops=2 * 64 * 256 * 64, weight_bytes=64 * 256 * 4,
    ...                  activation_bytes=(64 * 64 + 64 * 256) * 4)
    >>> r.total_flops, r.bytes_per_call
    (4194304, 147456)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ir.strategy import Checkpoint


class KernelKind(str, enum.Enum):
    GEMM = "gemm"
    CONV = "conv"
    ATTENTION = "attention"
    MEMORY = "memory"
    VIEW = "view"

    def __str__(self) -> str:
        return self.value


# Ops recorded as views (no kernel, no bytes: `ir.kernel_recorder.NO_KERNEL_OPS`) that
# allocate a tensor: the host dispatches them as ops, not as metadata (tiny calls through
# torch.ops, thread clock, min of 9 rounds of 500, load 5, 2026-11-26: new_empty_strided
# 2.79 us, empty 1.70-1.95, add 1.52, detach 0.92). `KernelRecord.host_view`.
ALLOCATION_OPS = frozenset({"aten::empty", "aten::empty_like", "aten::empty_strided",
                            "aten::new_empty", "aten::new_empty_strided"})

# A conv record's `grads` bits: which outputs of convolution_backward are computed.
CONV_GRAD_INPUT, CONV_GRAD_WEIGHT, CONV_GRAD_BIAS = 1, 2, 4


def conv_implicit_gemm(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of a conv record's implicit GEMM (im2col, Chellapilla et al.
    2006; cuDNN's implicit GEMM, Chetlur et al. 2014): `groups` products of (batch x
    out_positions) x (in_channels x kernel_area) @ (... x out_channels)."""
    groups, batch, in_channels, out_channels, positions, kernel_area, _ = shape
    return groups, batch * positions, out_channels, in_channels * kernel_area


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """`count` calls of one op on one shape and dtype; FLOPs and bytes are per call."""

    op: str  # "aten::mm"; "aten::scaled_dot_product_attention" for a fused attention
    kind: KernelKind
    dtype: str  # dtype of the first floating input (or output): "float32", "bfloat16"
    shape: tuple[int, ...]  # see the module docstring, by kind
    count: int
    flops: int = 0
    weight_bytes: int = 0  # reads of the layer's parameters / buffers
    activation_bytes: int = 0  # every other read, plus every write
    # Selective checkpointing keeps this op's output (ir.checkpoint_policy); forward only.
    saved_under_selective: bool = False
    causal: bool = False  # attention only: a causal mask (FlashAttention skips half)
    # Memory kernels: innermost loops the op runs (`ir.kernel_recorder.inner_loops`:
    # its elements over the loop's trailing dims, coalesced over every operand); 0 unknown.
    inner_loops: int = 0
    # A non-default argument that changes what the op costs the host per call ("tanh" for
    # `gelu(approximate="tanh")`: a polynomial, not exact GELU's erf path); "" for none.
    variant: str = ""
    # Memory kernels: an elementwise op of a scalar and ONE tensor that is broadcast (stride
    # 0) along the innermost loop (a mean's backward: `grad.expand(...) / n`); ATen's CPU
    # loop does not vectorise it (`ir.kernel_recorder.scalar_over_broadcast`).
    unvectorized: bool = False
    # Memory kernels: elements in each of those loops (`inner_loops`'s first figure); 0
    # unknown (a loop shorter than ATen's vector step runs its scalar tail per element).
    inner_run: int = 0
    # Memory kernels: an operand walks memory out of the iteration's order (a permuted
    # source copied into a contiguous output: `ir.kernel_recorder.transposing`).
    transposing: bool = False
    # Memory kernels: inner loops per 2-D loop call of an elementwise op (the CPU pays per
    # call: `ir.kernel_recorder.loops_per_call`); 0 unknown. `binary`: it reads two or
    # more tensors (a broadcast product pays more per call than a copy).
    loops_per_call: int = 0
    binary: bool = False
    # Reductions: how many of the `count` calls have no contiguous inner dim, which ATen's
    # CPU reduce runs element by element (`ir.kernel_recorder.reduction_unvectorized`).
    strided_calls: int = 0
    # Memory kernels and GEMMs: the first output is shaped like a parameter of the layer, a
    # weight gradient (a bias's `sum`, x^T @ dy): it does not grow with the micro-batch
    # (`ir.kernel_recorder.KernelRecorder.weight_output`).
    weight_output: bool = False
    # A Python number among its operands, which the call wraps into a 0-dim tensor (`x * 2`,
    # `x > 0`: `ir.scalar_operands.wraps_python_number`); the host pays more per call.
    scalar_operand: bool = False

    @property
    def excess_key(self) -> str:
        """The op as the host-excess table keys it (`KernelCalibration.host_op_excess`):
        its name, with the variant where it has one ("aten::gelu(approximate=tanh)")."""
        return f"{self.op}(approximate={self.variant})" if self.variant else self.op

    @property
    def host_view(self) -> bool:
        """Whether the host dispatches it as a view (metadata only): a view record that
        allocates nothing (`ALLOCATION_OPS` dispatch as ops)."""
        return self.kind is KernelKind.VIEW and self.op not in ALLOCATION_OPS

    def __str__(self) -> str:
        dims = "x".join(map(str, self.shape))
        return f"{self.count} x {self.op}[{dims}]@{self.dtype}"

    @property
    def bytes_per_call(self) -> int:
        return self.weight_bytes + self.activation_bytes

    @property
    def total_flops(self) -> int:
        return self.flops * self.count

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_call * self.count


@dataclass(frozen=True, slots=True)
class KernelRecords:
    """The kernels of one forward and one backward of a layer (one micro-batch of the
    IR's shape), and which forward kernels each checkpointing mode runs again."""

    forward: tuple[KernelRecord, ...] = ()
    backward: tuple[KernelRecord, ...] = ()
    # Module calls the forward makes from Python (the leaf modules it runs, each paying
    # `nn.Module.__call__` on the host on top of its ops' dispatch); None: not counted.
    forward_module_calls: int | None = None

    def recomputed(self, mode: Checkpoint) -> tuple[KernelRecord, ...]:
        """Forward kernels run again in backward: FULL all of them, SELECTIVE those whose
        output the policy does not keep (`ir.checkpoint_policy.saved_under_selective`)."""
        if mode is Checkpoint.FULL:
            return self.forward
        if mode is Checkpoint.SELECTIVE:
            return tuple(r for r in self.forward if not r.saved_under_selective)
        return ()

    def of_kind(self, kind: KernelKind, backward: bool = False) -> tuple[KernelRecord, ...]:
        return tuple(r for r in (self.backward if backward else self.forward) if r.kind is kind)
