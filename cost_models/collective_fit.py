"""Fitting the alpha-beta model of each collective to measured times (pure: numpy only).

The communication model (comm.py) prices a collective of S bytes over n ranks as

    t(S) = steps(n) * alpha + volume(n) * S / B
    all-reduce: steps 2(n-1), volume 2(n-1)/n       (ring form)
    all-gather, reduce-scatter, all-to-all: steps n-1, volume (n-1)/n
    broadcast: steps ceil(log2 n), volume ceil(log2 n)   (binomial tree)
    send/recv: steps 1, volume 1                    (one way, from a ping-pong)

`algorithm_factors` reads steps and volume off comm.py's own formulas (`PRICE`).
`fit_alpha_beta` fits the two parameters apart, as Hockney's model is measured (R. W.
Hockney, "The communication challenge for MPP", Parallel Computing 20(3), 1994: the
asymptotic bandwidth r_inf from long messages, the start-up t_0 from short ones):

  t          each reading capped by those of every larger size (the times' lower monotone
             envelope: a larger message cannot be faster, and noise on a shared host only
             adds time, so a small size read slower than a larger one was delayed);
  alpha      the median over the smaller half of the sizes of (t - volume*S/B) / steps,
             at least 0 (latency-bound: a slow small reading moves it, not B);
  bandwidth  the least-squares slope of (t - steps*alpha) against volume*S over the
             larger half, through the origin (absolute seconds: the longest messages,
             where volume dominates, weigh most);

the two solved together by fixed-point iteration. The envelope keeps an anomalous size
out: gloo's reduce-scatter of 256 KiB read 22-70 ms against 6-7 ms at 1 MiB, run after
run on this host, which turns a free least-squares slope over the large sizes negative.
A single least-squares line over every size in relative error (what this fitted before)
let the latency-bound sizes set the slope: on a loaded machine it came out <= 0 and was
clamped to 1.6e18 B/s for the 4-rank all-reduce (every message priced as pure latency).
Data that do not determine a parameter raise `CollectiveFitError` (profile-cluster
re-measures once, then says so): a largest message whose volume term is under
MIN_VOLUME_SHARE of its time (the sweep never left the latency-bound regime), a bandwidth
above `ceiling_bytes_per_s`, or a line that misses the median (envelope) reading by more
than MAX_MEDIAN_RELATIVE_RESIDUAL. S is the full tensor: the output of an all-gather, the
input of a reduce-scatter.

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


class CollectiveFitError(PlannerError):
    """The readings of one collective and group size do not determine its alpha-beta fit."""

    def __init__(self, collective: str, n: int, reason: str):
        self.collective, self.n = collective, n
        super().__init__(f"profile-cluster: cannot fit {collective} over {n} ranks: {reason}; "
                         "re-run profile-cluster on a quieter machine, or raise --max-bytes "
                         "(e.g. 4M) so the largest messages are bandwidth-bound")


# The largest message must spend at least this share of its time on volume for the
# bandwidth to be measured: a burst median of this host moves 20-50% between minutes
# under load (bench_validate's doc), so a smaller volume term is within the noise of the
# start-up it sits on. (A judgement, not a fit: re-check on a quiet machine.)
MIN_VOLUME_SHARE = 0.25
# A line that misses half the readings by more than this share does not describe them:
# half the sizes are off by over 1.5x or under 1/2 of the time the fit predicts. (The
# 2-process sweeps taken here at load 7-15 fit within 23% at the median; the bound leaves
# room for the 20-50% a burst median moves between minutes.)
MAX_MEDIAN_RELATIVE_RESIDUAL = 0.5


FIT_ITERATIONS = 50  # fixed-point rounds of alpha and B; exact data settle in a handful


def fit_alpha_beta(collective: str, n: int, sizes: list[int], seconds: list[float],
                   ceiling_bytes_per_s: float = math.inf) -> tuple[float, float]:
    """Alpha (s) >= 0 and bandwidth (bytes/s) of t = steps*alpha + volume*S/B: alpha from
    the smaller half of the sizes, bandwidth from the larger half (module doc); raises
    CollectiveFitError where the readings do not determine them."""
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise PlannerError(f"fitting {collective} over {n} ranks needs a time for each of at "
                           f"least two message sizes, got {len(sizes)} sizes and "
                           f"{len(seconds)} times")
    steps, per_byte = algorithm_factors(collective, n)
    order = np.argsort(sizes)
    volume = per_byte * np.asarray(sizes, dtype=float)[order]  # bytes each rank moves
    raw = np.asarray(seconds, dtype=float)[order]
    if not np.all(np.isfinite(raw)) or np.any(raw <= 0):
        raise CollectiveFitError(collective, n, f"a reading is not a positive time ({seconds})")
    # A larger message takes no less time (steps fixed, volume growing) and a shared
    # host's noise only adds time: each reading is capped by every larger one's.
    t = np.minimum.accumulate(raw[::-1])[::-1]
    half = (len(t) + 1) // 2  # with an odd count the middle size is in both halves
    small, large = slice(0, half), slice(len(t) - half, len(t))
    alpha = float(np.median(t[small])) / steps if steps else 0.0  # start: all latency
    inv_bw = 0.0
    for _ in range(FIT_ITERATIONS):
        excess = t[large] - steps * alpha  # the long messages' volume time
        new_inv_bw = float(np.dot(volume[large], excess) / np.dot(volume[large], volume[large]))
        if new_inv_bw <= 0:
            break
        new_alpha = max(float(np.median(t[small] - volume[small] * new_inv_bw)) / steps, 0.0) \
            if steps else 0.0
        done = math.isclose(new_inv_bw, inv_bw, rel_tol=1e-12) and \
            math.isclose(new_alpha, alpha, rel_tol=1e-12, abs_tol=1e-15)
        alpha, inv_bw = new_alpha, new_inv_bw
        if done:
            break
    volume_share = volume[-1] * inv_bw / t[-1]
    if new_inv_bw <= 0 or volume_share < MIN_VOLUME_SHARE:
        raise CollectiveFitError(collective, n, (
            f"its time hardly grows with the message size: "
            f"{int(volume[large][0] / per_byte)}..{int(volume[-1] / per_byte)} bytes took "
            f"{', '.join(f'{x * 1e3:.3g}' for x in raw[large])} ms against "
            f"{steps * alpha * 1e3:.3g} ms of start-up (volume under "
            f"{MIN_VOLUME_SHARE:.0%} of the largest)"))
    bandwidth = 1.0 / inv_bw
    if bandwidth > ceiling_bytes_per_s:
        raise CollectiveFitError(collective, n, (
            f"its long messages give {bandwidth / 1e9:.3g} GB/s, above the "
            f"{ceiling_bytes_per_s / 1e9:.3g} GB/s memory bandwidth no collective can beat"))
    predicted = steps * alpha + volume * inv_bw
    residual = float(np.median(np.abs(predicted / t - 1.0)))
    if residual > MAX_MEDIAN_RELATIVE_RESIDUAL:
        raise CollectiveFitError(collective, n, (
            f"the line alpha {alpha * 1e6:.3g} us, {bandwidth / 1e9:.3g} GB/s misses the median "
            f"reading by {residual:.0%} (over {MAX_MEDIAN_RELATIVE_RESIDUAL:.0%})"))
    return alpha, bandwidth


def fit_collectives(by_group_size: dict[int, dict[str, list[float]]], sizes: list[int],
                    ceiling_bytes_per_s: float = math.inf
                    ) -> tuple[list[CollectiveFit], list[CollectiveFitError]]:
    """One intra-node fit per collective and group size from the seconds timed at each
    message size, in the order given (the whole node first: the comm model's fallback),
    and the collectives whose readings did not determine one (to re-measure or report)."""
    fits, failures = [], []
    for size, table in by_group_size.items():
        for collective in COLLECTIVES:
            if collective in table:
                try:
                    alpha, bandwidth = fit_alpha_beta(collective, size, sizes, table[collective],
                                                      ceiling_bytes_per_s)
                except CollectiveFitError as exc:
                    failures.append(exc)
                    continue
                fits.append(CollectiveFit(collective, "intra_node", alpha, bandwidth, size))
    return fits, failures
