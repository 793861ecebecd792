"""Matmul FLOP/s, copy bandwidth and per-op overhead of this process's CUDA device."""

from __future__ import annotations

import time

REPEATS = 3  # timed calls after one warm-up
# The matmul edge and copy size on a GPU: REFERENCES.md's 8192^3 product and a 1 GiB copy.
CUDA_MATMUL_DIM = 8192
CUDA_COPY_BYTES = 1 << 30


def cuda_matmul_flops() -> tuple[tuple[str, float], ...]:
    import torch

    out = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        a = torch.randn(CUDA_MATMUL_DIM, CUDA_MATMUL_DIM, device="cuda", dtype=dtype)
        b = torch.randn_like(a)
        torch.mm(a, b)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(REPEATS):
            torch.mm(a, b)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / REPEATS
        out.append((str(dtype).removeprefix("torch."), 2 * CUDA_MATMUL_DIM**3 / seconds))
    return tuple(sorted(out))


def cuda_op_overhead_s() -> float:
    """Seconds per op of tiny CUDA work: the host's dispatch-and-launch rate (or the
    kernels' own floor, whichever is slower: the launch queue fills up)."""
    import torch

    from cost_models.clusters import OP_OVERHEAD_WIDTH, _overhead_block, seconds_per_op

    x = torch.randn(2, OP_OVERHEAD_WIDTH, device="cuda")
    seconds = seconds_per_op(_overhead_block().cuda(), x)
    torch.cuda.synchronize()
    return seconds


def cuda_copy_gbps() -> float:
    import torch

    src = torch.empty(CUDA_COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(REPEATS):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * CUDA_COPY_BYTES * REPEATS / (time.perf_counter() - start) / 1e9
