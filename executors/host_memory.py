"""Keep freed host memory from staying resident (glibc malloc; a no-op elsewhere).

glibc serves a request below its mmap threshold from the heap and keeps the block when
it is freed; the threshold starts at 128 KiB and RISES to the size of every mmapped
block freed, up to 32 MiB (mallopt(3), M_MMAP_THRESHOLD). A training step frees many
tensors of 1-32 MiB (a 2048 x 2048 fp32 weight is 16 MiB), so after the first step they
all came from the heap: measured on a 0.3B GPT under ZeRO-3 over 4 gloo ranks (issue
15), a rank's resident set after a step was 1.6 GiB where its live tensors and the
interpreter took 0.8 GiB, and its step peak 0.45 GiB above the same run with the
threshold fixed.

    keep_freed_memory_off_heap()   fix the threshold at glibc's starting value: tensors
                                   from 128 KiB up are mmapped and go back to the OS on
                                   free (`executors.apply` calls it for a CPU device)
    release_freed_memory()         return the heap's free blocks now (malloc_trim)
"""

from __future__ import annotations

import ctypes

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial (default) threshold, mallopt(3)


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc.malloc_trim, libc.mallopt
    except (OSError, AttributeError):  # not glibc: its allocator keeps its own policy
        return None, None


_MALLOC_TRIM, _MALLOPT = _libc()


def keep_freed_memory_off_heap() -> None:
    """Fix glibc's mmap threshold (setting it turns the dynamic raise off), process-wide."""
    if _MALLOPT is not None:
        _MALLOPT(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS. glibc keeps freed blocks below its mmap
    threshold (up to 32 MiB) in the heap: drawing a 1.3B model's scratch tensors one by
    one otherwise left ~2.5 GiB resident that nothing used."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
