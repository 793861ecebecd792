"""Fitting the alpha-beta model of each collective to measured times (pure: numpy only).

The communication model (comm.py) prices a collective of S bytes over n ranks as

    t(S) = steps(n) * alpha + volume(n) * S / B
    all-reduce: steps 2(n-1), volume 2(n-1)/n       (ring form)
    all-gather, reduce-scatter, all-to-all: steps n-1, volume (n-1)/n
    broadcast: steps ceil(log2 n), volume ceil(log2 n)   (binomial tree)
    send/recv: steps 1, volume 1                    (one way, from a ping-pong)

`algorithm_factors` reads steps and volume off comm.py's own formulas (`PRICE`), and
`fit_alpha_beta` finds alpha >= 0 and B > 0 by least squares over the message sizes
`profile-cluster` timed. S is the full tensor: the output of an all-gather, the input of
a reduce-scatter.

    >>> fit_alpha_beta("all_reduce", 2, [1024, 4096], [2e-5, 3e-5])   # (alpha_s, bytes_per_s)
"""

from __future__ import annotations

import math

import numpy as np

from ir.cluster import COLLECTIVES, CollectiveFit
from ir.errors import PlannerError

from cost_models.comm import (Link, all_gather_s, all_to_all_s, broadcast_s, reduce_scatter_s,
                              ring_all_reduce_s, send_recv_s)

KiB = 2**10
MiB = 2**20
DEFAULT_MIN_BYTES = 1 * KiB
# 256 MiB is the top size; on a 2-core machine gloo moves ~1 GB/s, so 64 MiB keeps
# a 2-process run near 10 s. Pass --max-bytes 256M for the full sweep.
DEFAULT_MAX_BYTES = 64 * MiB
SIZE_FACTOR = 4  # sizes grow x4: 1K, 4K, ..., 64M
FLOAT_BYTES = 4  # messages are float32 tensors

# How comm.py prices each fitted collective (all-reduce fits are made in ring form).
PRICE = {"all_reduce": ring_all_reduce_s, "all_gather": all_gather_s,
         "reduce_scatter": reduce_scatter_s, "all_to_all": all_to_all_s,
         "broadcast": broadcast_s,
         "send_recv": lambda nbytes, _n, link: send_recv_s(nbytes, link)}


def message_sizes(min_bytes: int = DEFAULT_MIN_BYTES, max_bytes: int = DEFAULT_MAX_BYTES,
                  factor: int = SIZE_FACTOR) -> list[int]:
    if min_bytes < FLOAT_BYTES or max_bytes < min_bytes:
        raise PlannerError(f"message sizes must satisfy 4 <= min ({min_bytes}) <= max "
                           f"({max_bytes}) bytes")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def smaller_group_sizes(world: int) -> list[int]:
    """Powers of two from 2 below `world` that divide it: the DP group sizes plans use."""
    return [2**k for k in range(1, world.bit_length()) if 2**k < world and world % 2**k == 0]


def algorithm_factors(collective: str, n: int) -> tuple[float, float]:
    """(latency steps, bytes moved per byte of S) of comm.py's formula for `collective`:
    its price of an empty message at unit latency, and of one byte at unit bandwidth
    (every formula is linear in alpha and in S/B)."""
    if collective not in PRICE:
        raise PlannerError(f"unknown collective {collective!r}; use one of {', '.join(COLLECTIVES)}")
    price = PRICE[collective]
    steps = price(0, n, Link(alpha_s=1.0, bytes_per_s=math.inf, spans_nodes=False))
    per_byte = price(1, n, Link(alpha_s=0.0, bytes_per_s=1.0, spans_nodes=False))
    return steps, per_byte


def fit_alpha_beta(collective: str, n: int, sizes: list[int],
                   seconds: list[float]) -> tuple[float, float]:
    """Least-squares alpha (s) and bandwidth (bytes/s) of t = steps*alpha + volume*S/B."""
    steps, per_byte = algorithm_factors(collective, n)
    x = np.array([[steps, per_byte * s] for s in sizes], dtype=float)
    y = np.array(seconds, dtype=float)
    # Relative error matters at every size: weight each row by 1/t.
    w = 1.0 / np.maximum(y, 1e-9)
    (alpha, inv_bw), *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    if inv_bw <= 0:  # latency-bound everywhere: bandwidth from the largest message alone
        inv_bw = max(y[-1] - steps * max(alpha, 0.0), 1e-12) / (per_byte * sizes[-1])
    if alpha < 0:  # bandwidth-bound everywhere: refit the slope through the origin
        alpha = 0.0
        inv_bw = float(np.dot(x[:, 1] * w, y * w) / np.dot(x[:, 1] * w, x[:, 1] * w))
    return float(alpha), float(1.0 / inv_bw)


def fit_collectives(by_group_size: dict[int, dict[str, list[float]]],
                    sizes: list[int]) -> list[CollectiveFit]:
    """One intra-node fit per collective and group size from the seconds timed at each
    message size; in the order given (the whole node first: the comm model's fallback)."""
    fits = []
    for size, table in by_group_size.items():
        for collective in COLLECTIVES:
            if collective in table:
                alpha, bandwidth = fit_alpha_beta(collective, size, sizes, table[collective])
                fits.append(CollectiveFit(collective, "intra_node", alpha, bandwidth, size))
    return fits
