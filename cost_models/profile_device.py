"""Measure one device's kernels and write a cluster spec carrying the tables.

`profile_device("cuda")` (or "cpu", same code) times, on whatever device it runs on:

  GEMM         torch.mm over a grid of (m, n, k) shapes per dtype: 2mnk FLOPs / seconds
  memory       copy, add, gelu, sum, softmax, layer_norm, batch_norm (and its backward)
               over a few sizes: bytes read plus written (each input once, each output
               once) / seconds
  conv         2-D convolutions forward and backward on a few shapes (`conv_probes`)
  SDPA         each torch.nn.attention.SDPBackend that runs on a few attention shapes,
               forward and backward, plus the dispatcher's own choice ("default")
  fresh output (CPU) an add into blocks not in cache over one hot block (`fresh_output`)
  cold kernel  (CPU) each memory kind's call after an L2 eviction over warm (`cold_kernel`)
  op cold code (CPU) each op kind's call after other distinct ops over warm (`op_cold_probe`)
  math         (CPU) tanh-GELU, GELU's backward (both variants), tanh and its backward at
               the memory sizes, each its own kind (`math_kernels`): bytes / seconds
  launch       host seconds to dispatch one tiny eager op; on CUDA also the device's
               seconds per tiny kernel replayed from a CUDA graph (no host in the loop)

Timing (METHOD.md of the device kit; Williams et al. 2009 for the two ceilings): warm up,
then the median over batches of back-to-back calls, each batch at least `MIN_BATCH_S` long.
On CUDA a batch is a captured CUDA graph replayed between two events, so GEMM and
memory-kernel figures are device time without launch gaps (SDPA runs eager: its backward
goes through autograd). Inputs are random, never zeros. On a GPU they rotate over enough
buffer sets (`ROTATE_BYTES`) that small shapes are not served from L2; on a CPU they do
not: layers run warm there (see `ROTATE_BYTES`). CPU probes run on one thread, as the
planner's local processes do. The grids: `cost_models.device_grids`.

The spec (`cost_models.device_spec`): device memory and measured copy bandwidth; peak
FLOP/s from the datasheet preset of a GPU it names exactly (with `matmul_efficiency` =
best measured bf16 / peak), else the best measured rate per dtype (efficiency 1); the
host's per-op figure as the median of repeated readings, their range recorded; links
are not measured here (the matching preset's, or the local gloo guesses: run `planner
profile-cluster` for them).

    spec, cal = profile_device("cpu", quick=True)            # doctest: +SKIP
    gemm_efficiency(spec, 512, 512, 512, "float32")           # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import datetime
import math
import platform
import statistics
import warnings
from collections.abc import Callable

from ir.cluster import ClusterSpec
from ir.errors import PlannerError
from ir.gemm_table import fastest_points
from ir.kernel_calibration import GemmPoint, KernelCalibration, SdpaPoint

from cost_models import clusters
from cost_models.device_grids import (  # noqa: F401  (read as pd.NAME too)
    GiB, MiB, CUDA_GEMM_SHAPES, CUDA_GEMM_DTYPES, CPU_GEMM_MIN_FLOPS,
    CPU_ZOO_GEMM_SHAPES, CPU_GEMM_SHAPES, CPU_GEMM_DTYPES, CUDA_MEMORY_BYTES,
    CPU_MEMORY_BYTES, ROW_ELEMENTS, CUDA_SDPA_SHAPES, CPU_SDPA_SHAPES, CUDA_SDPA_DTYPE,
    CPU_SDPA_DTYPE, QUICK_CUDA_GEMM_SHAPES, CPU_CONV_SHAPES, CUDA_CONV_SHAPES, CPU_CONV_DTYPE,
    CUDA_CONV_DTYPE, BATCH_NORM_CHANNELS, CPU_SMALL_ONLY_KINDS, CPU_SMALL_ONLY_MAX_BYTES)
from cost_models.conv_probes import probe_conv
from cost_models.cold_kernel import probe_cold_kernel
from cost_models.op_cold_probe import probe_op_cold_code
from cost_models.fresh_output import fresh_pool_bytes, probe_fresh_output
from cost_models.math_kernels import probe_math_kernels
from cost_models.memory_probes import (host_charged_seconds, net_of_call_cost, probe_memory,
                                       probe_row_seconds)
from cost_models.gemm_efficiency import gemm_shape_efficiency
from cost_models.gemm_layouts import LAYOUT_SHAPES, probe_gemm_layouts
from cost_models.host_probes import probe_clock
from cost_models.item_probes import (EMBEDDING_NARROW_PROBE_DIM, probe_embedding_backward,
                                     probe_embedding_bag, probe_embedding_forward)

# ---- timing -----------------------------------------------------------------------------
WARMUP_CALLS = 3  # first calls pay for kernel selection, workspaces, autograd caches
MIN_BATCH_S = 2e-3  # a timed batch lasts at least this: event/timer resolution is ~us
MAX_CALLS_PER_BATCH = 512  # a CUDA graph of this many small kernels still captures fast
BATCHES = 7  # the median of seven batches
MAX_POINT_S, MIN_BATCHES = 0.5, 3  # stop adding batches to a point after 0.5 s (>= 3 run)
# Buffer sets rotate until this many bytes are in flight: > 5x the H100's 50 MB L2, so no
# repeated call finds its inputs in cache. CPU: none (one set). A layer's op reads what
# the op before it just wrote, and the zoo's layers (KiBs to a few MiB of tensors, timed
# after warm-up by `planner profile`) run from this CPU's caches: rotating measured 256 KiB
# copies ~8x slower than warm ones (21 vs 166 GB/s here, 2026-11-24, on a loaded host).
# Tensors past the L3 (the 64 MiB points) come from DRAM either way.
ROTATE_BYTES = {"cuda": 256 * MiB, "cpu": 0}
MAX_ROTATE_SETS = 64
LAUNCH_PROBE_CALLS = 512  # tiny adds per launch-overhead batch
# Before the GPU grid, PREHEAT_S of back-to-back PREHEAT_DIM^3 bf16 products (REFERENCES.md's
# shape) in PREHEAT_WINDOW_S windows: the first window is the boost rate, the last the
# settled one. On the H100 here a grid without it measured 8192^3 at 795 TFLOP/s early and
# 707 some seconds later (2026-11-24): the grid must see one state, the one training sees.
PREHEAT_DIM = 8192
PREHEAT_S = 10.0
PREHEAT_WINDOW_S = 0.5
# Memory bandwidth of the spec: the best streaming kernel (copy or add) moving at least
# this much, well past the caches (H100 L2 50 MB; this CPU's L3 32 MiB).
HBM_MIN_MOVED_BYTES = {"cuda": 256 * MiB, "cpu": 32 * MiB}

_TORCH_DTYPES = {"float32": "float32", "tf32": "float32", "bfloat16": "bfloat16",
                 "float16": "float16"}


# ---- the timer --------------------------------------------------------------------------

def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _batch_seconds(run_batch: Callable[[], None], device: str) -> float:
    """Seconds of one batch: device events on CUDA, the host clock after a sync elsewhere."""
    import torch

    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run_batch()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds
    clock = probe_clock(device)  # the thread's CPU time: see host_probes.probe_clock
    begin = clock()
    run_batch()
    return clock() - begin


def seconds_per_call(fn: Callable[[int], object], device: str, graph: bool = False) -> float:
    """Median seconds of one `fn(i)` (i counts calls, for rotating buffers), measured in
    batches of back-to-back calls; `graph` replays each batch from a CUDA graph."""
    import torch

    for i in range(WARMUP_CALLS):
        fn(i)
    _sync(device)
    one_s = _batch_seconds(lambda: fn(0), device)
    calls = max(1, min(MAX_CALLS_PER_BATCH, math.ceil(MIN_BATCH_S / max(one_s, 1e-9))))

    def eager() -> None:
        for i in range(calls):
            fn(i)

    run_batch = eager
    if graph and device == "cuda":
        stream = torch.cuda.Stream()  # warm up on a side stream before capture (CUDA graphs doc)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            eager()
        torch.cuda.current_stream().wait_stream(stream)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            eager()
        run_batch = cuda_graph.replay
        run_batch()
    rounds, spent_s = [], 0.0
    while len(rounds) < BATCHES and (len(rounds) < MIN_BATCHES or spent_s < MAX_POINT_S):
        rounds.append(_batch_seconds(run_batch, device) / calls)
        spent_s += rounds[-1] * calls
    return statistics.median(rounds)


def _rotation_sets(device: str, set_bytes: int) -> int:
    return max(1, min(MAX_ROTATE_SETS, math.ceil(ROTATE_BYTES[device] / max(set_bytes, 1))))


def _random(shape, dtype_name: str, device: str):
    import torch

    dtype = getattr(torch, _TORCH_DTYPES[dtype_name])
    return torch.empty(shape, dtype=dtype, device=device).uniform_(-1.0, 1.0)


# ---- probes -----------------------------------------------------------------------------

def supported_gemm_dtypes(device: str, candidates) -> tuple[str, ...]:
    """The dtypes whose matmul runs here (one tiny product each)."""
    import torch

    out = []
    for name in candidates:
        try:
            a = _random((8, 8), name, device)
            torch.mm(a, a)
            _sync(device)
        except (RuntimeError, TypeError):
            continue
        out.append(name)
    return tuple(out)


def probe_gemm(device: str, shapes, dtypes, progress=None) -> list[GemmPoint]:
    """FLOP/s of (m x k) @ (k x n) per shape and dtype: 2mnk / seconds (a multiply and an
    add per term of each output element)."""
    import torch

    points = []
    precision = torch.get_float32_matmul_precision()
    try:
        for dtype in dtypes:
            torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
            for m, n, k in shapes:
                element_bytes = torch.finfo(getattr(torch, _TORCH_DTYPES[dtype])).bits // 8
                sets = _rotation_sets(device, (m * k + k * n + m * n) * element_bytes)
                a = [_random((m, k), dtype, device) for _ in range(sets)]
                b = [_random((k, n), dtype, device) for _ in range(sets)]
                c = [torch.empty((m, n), dtype=a[0].dtype, device=device) for _ in range(sets)]
                seconds = seconds_per_call(
                    lambda i: torch.mm(a[i % sets], b[i % sets], out=c[i % sets]),
                    device, graph=True)
                points.append(GemmPoint(m, n, k, dtype, 2.0 * m * n * k / seconds))
                if progress:
                    progress(f"gemm {points[-1]}")
                del a, b, c
    finally:
        torch.set_float32_matmul_precision(precision)
    return points


def probe_sdpa(device: str, shapes, dtype: str, progress=None) -> list[SdpaPoint]:
    """Forward and backward seconds of causal SDPA per backend that runs on each shape."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash_attention": SDPBackend.FLASH_ATTENTION,
                "efficient_attention": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn_attention": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH,
                "default": None}
    points = []
    for batch, heads, seq_len, head_dim in shapes:
        q, k, v = (_random((batch, heads, seq_len, head_dim), dtype, device).requires_grad_()
                   for _ in range(3))
        grad = _random((batch, heads, seq_len, head_dim), dtype, device)

        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def step():
            forward().backward(grad)

        for name, backend in backends.items():
            try:
                with warnings.catch_warnings():  # a backend that cannot run says why, loudly
                    warnings.simplefilter("ignore")
                    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                        forward_s = seconds_per_call(lambda i: forward(), device)
                        total_s = seconds_per_call(lambda i: step(), device)
            except RuntimeError as exc:  # "No available kernel": not for this device/shape
                if progress:
                    progress(f"sdpa {name} {batch}x{heads}x{seq_len}x{head_dim}: "
                             f"unavailable ({str(exc).splitlines()[0][:60]})")
                continue
            finally:
                q.grad = k.grad = v.grad = None
            points.append(SdpaPoint(name, dtype, batch, heads, seq_len, head_dim, True,
                                    forward_s, max(total_s - forward_s, 1e-9)))
            if progress:
                progress(f"sdpa {name} {batch}x{heads}x{seq_len}x{head_dim}: "
                         f"fwd {forward_s * 1e3:.3f} ms, bwd {points[-1].backward_s * 1e3:.3f} ms")
        del q, k, v, grad
    return points


def probe_sustained_gemm(device: str, dim: int = PREHEAT_DIM, seconds: float = PREHEAT_S,
                         progress=None) -> tuple[float, float]:
    """(first-window, last-window) FLOP/s of back-to-back dim^3 bf16 products (2 dim^3
    FLOPs each), run for `seconds`; leaves the device in its settled state."""
    import torch

    a, b = (_random((dim, dim), "bfloat16", device) for _ in range(2))
    c = torch.empty_like(a)
    one_s = seconds_per_call(lambda i: torch.mm(a, b, out=c), device)
    calls = max(1, round(PREHEAT_WINDOW_S / one_s))
    rates, spent_s = [], 0.0
    while spent_s < seconds:
        window_s = _batch_seconds(lambda: [torch.mm(a, b, out=c) for _ in range(calls)], device)
        rates.append(2.0 * dim**3 * calls / window_s)
        spent_s += window_s
    if progress:
        progress(f"preheat {dim}^3 bf16, TFLOP/s per {PREHEAT_WINDOW_S} s window: "
                 + " ".join(f"{r / 1e12:.0f}" for r in rates))
    return rates[0], rates[-1]


def probe_launch(device: str) -> tuple[float, float]:
    """(host seconds per tiny eager op, device seconds per tiny kernel from a CUDA graph;
    0 on CPU)."""
    import torch

    x = torch.ones(1, device=device)
    out = torch.empty_like(x)
    calls = LAUNCH_PROBE_CALLS

    def host_batch() -> None:
        for _ in range(calls):
            torch.add(x, 1.0, out=out)
        _sync(device)  # the host clock stops when the last kernel has run

    host_batch()
    rounds = []
    clock = probe_clock(device)
    for _ in range(BATCHES):
        begin = clock()
        host_batch()
        rounds.append((clock() - begin) / calls)
    host_s = statistics.median(rounds)
    device_s = 0.0
    if device == "cuda":
        device_s = seconds_per_call(lambda i: torch.add(x, 1.0, out=out), device, graph=True)
    return host_s, device_s


# ---- the spec ---------------------------------------------------------------------------

def check_device(device: str) -> None:
    import torch

    if device not in ("cpu", "cuda"):
        raise PlannerError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise PlannerError(f"--device cuda: no CUDA device is visible (torch {torch.__version__}"
                           f"{', built without CUDA' if torch.version.cuda is None else ''}); "
                           "use --device cpu")


def memory_sizes(device: str, quick: bool) -> tuple[int, ...]:
    """The memory-bound kernels' sizes; quick on a GPU keeps the smallest and the first
    past its L2 (the spec's bandwidth needs a copy of HBM_MIN_MOVED_BYTES)."""
    if device == "cpu":
        return CPU_MEMORY_BYTES
    return CUDA_MEMORY_BYTES[::2] if quick else CUDA_MEMORY_BYTES


def measure(device: str, quick: bool = False, progress=None,
            extra_gemm_shapes=()) -> KernelCalibration:
    """All probes on `device`; CPU on one thread (as local processes run). GEMMs run the
    device's grid plus `extra_gemm_shapes` ((m, n, k) a model runs: measured exactly)."""
    import torch

    check_device(device)
    cpu = device == "cpu"
    gemm_shapes = CPU_GEMM_SHAPES if cpu else QUICK_CUDA_GEMM_SHAPES if quick else CUDA_GEMM_SHAPES
    gemm_shapes = list(dict.fromkeys([*gemm_shapes, *map(tuple, extra_gemm_shapes)]))
    with clusters._one_thread() if cpu else contextlib.nullcontext():
        dtypes = supported_gemm_dtypes(device, CPU_GEMM_DTYPES if cpu else CUDA_GEMM_DTYPES)
        host_s, device_s = probe_launch(device)
        if progress:
            progress(f"launch: host {host_s * 1e6:.2f} us/op, device {device_s * 1e6:.2f} us/kernel")
        burst, sustained = (0.0, 0.0) if cpu or "bfloat16" not in dtypes else \
            probe_sustained_gemm(device, seconds=PREHEAT_S / 5 if quick else PREHEAT_S,
                                 progress=progress)
        gemm = probe_gemm(device, gemm_shapes, dtypes, progress)
        if cpu:  # a second pass, reversed: one slow spell of a shared host no longer decides
            gemm = fastest_points(gemm, probe_gemm(device, gemm_shapes[::-1], dtypes, progress))
        layouts = probe_gemm_layouts(device, list(dict.fromkeys([*LAYOUT_SHAPES, *map(
            tuple, extra_gemm_shapes)])), "float32", seconds_per_call) if cpu else {}
        memory_dtype, sizes = "float32" if cpu else "bfloat16", memory_sizes(device, quick)
        memory = probe_memory(device, sizes, memory_dtype, progress)
        if cpu:
            memory = fastest_points(memory, probe_memory(device, sizes[::-1], memory_dtype))
            memory = net_of_call_cost(memory, *host_charged_seconds(device))  # host's share
        row_s = probe_row_seconds(device, memory_dtype) if cpu else {}
        pool_bytes, cold = (fresh_pool_bytes(), probe_cold_kernel(device)) if cpu else (0, [])
        op_cold = probe_op_cold_code(device)  # per op kind after other ops (CPU only)
        memory = [*memory, *probe_fresh_output(device, seconds_per_call, pool_bytes)]
        memory = [*memory, *probe_math_kernels(device, sizes, memory_dtype)]  # seqkern2: CPU only
        sdpa_shapes = CPU_SDPA_SHAPES if cpu else CUDA_SDPA_SHAPES[:1] if quick else CUDA_SDPA_SHAPES
        sdpa = probe_sdpa(device, sdpa_shapes, CPU_SDPA_DTYPE if cpu else CUDA_SDPA_DTYPE, progress)
        conv = probe_conv(device, CPU_CONV_SHAPES if cpu else CUDA_CONV_SHAPES[:1] if quick
                          else CUDA_CONV_SHAPES, CPU_CONV_DTYPE if cpu else CUDA_CONV_DTYPE,
                          host_s if cpu else 0.0, progress)
        lookup = probe_embedding_forward(device, memory_dtype)
        index_s = probe_embedding_backward(device, memory_dtype)
        narrow_index_s = probe_embedding_backward(device, memory_dtype,
                                                  EMBEDDING_NARROW_PROBE_DIM)
        if progress:
            progress(f"embedding: forward {lookup.call_s * 1e6:.2f} us + "
                     f"{lookup.index_s * 1e9:.1f} ns per index, backward "
                     f"{index_s * 1e9:.1f} ns per index ({narrow_index_s * 1e9:.1f} at "
                     f"{EMBEDDING_NARROW_PROBE_DIM}-wide rows)")
        bag = probe_embedding_bag(device, memory_dtype, host_s if cpu else 0.0)
        if progress:
            progress(f"embedding bag: forward {bag.call_s * 1e6:.2f} us + "
                     f"{bag.index_s * 1e9:.1f} ns per index, backward "
                     f"{bag.backward_call_s * 1e6:.2f} us + {bag.backward_index_s * 1e9:.1f} ns, "
                     f"one bag {bag.multi_bag_s * 1e6:.2f} us less")
    name = cpu_model_name() if cpu else torch.cuda.get_device_name()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cuda = f", CUDA {torch.version.cuda}" if not cpu else ", 1 thread"
    return KernelCalibration(measured_on=f"{name}, torch {torch.__version__}{cuda}, {stamp}",
                             gemm=tuple(gemm), memory_kernels=tuple(memory), sdpa=tuple(sdpa),
                             conv=tuple(conv), **layouts,
                             launch_host_s=host_s, launch_device_s=device_s,
                             embedding_backward_index_s=index_s,
                             embedding_backward_narrow_index_s=narrow_index_s,
                             embedding_bag_call_s=bag.call_s, embedding_bag_index_s=bag.index_s,
                             embedding_bag_backward_call_s=bag.backward_call_s,
                             embedding_bag_backward_index_s=bag.backward_index_s,
                             embedding_bag_multi_bag_s=bag.multi_bag_s,
                             burst_gemm_flop_per_s=burst, sustained_gemm_flop_per_s=sustained,
                             softmax_row_s=row_s.get("softmax", 0.0),
                             layer_norm_row_s=row_s.get("layer_norm", 0.0),
                             embedding_call_s=lookup.call_s,
                             embedding_index_s=lookup.index_s,
                             fresh_output_pool_bytes=pool_bytes, cold_kernels=tuple(cold),
                             op_cold_code=tuple(op_cold))



def cpu_model_name() -> str:
    """The CPU's model as Linux names it, then the architecture ("Intel(R) Xeon(R) Processor,
    x86_64"): a shared VM can move between hosts, and a calibration must say which CPU it
    measured (`platform.processor()` is empty on Linux)."""
    machine = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"{model}, {machine}" if model else machine

def profile_device(device: str, quick: bool = False, name: str | None = None,
                   progress=None, extra_gemm_shapes=()) -> tuple[ClusterSpec, KernelCalibration]:
    """Measure `device` and return (spec, the tables in it)."""
    from cost_models.device_spec import spec_from_calibration

    cal = measure(device, quick=quick, progress=progress, extra_gemm_shapes=extra_gemm_shapes)
    spec = spec_from_calibration(device, cal, name or f"{device}-profiled", progress)
    return spec, spec.kernel_calibration


# Reading the table back, `gemm_efficiency(spec, m, n, k, dtype)`: one definition, shared
# with the kernel time model.
gemm_efficiency = gemm_shape_efficiency
