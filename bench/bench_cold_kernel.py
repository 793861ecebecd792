"""Why memory-bound kernels run slower in a layer than in the kit (issue 17): an op's
code out of the core's caches, a fixed cost per call (`cost_models.cold_kernel`).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_cold_kernel.py [--rounds 40]

Part 1, the gpt-tiny block's MLP at micro-batch 16 run as a block's op sequence (no
grad): gelu of (16, 32, 256) fp32 timed in place (thread clock; calls with a context
switch dropped), with nothing, a 0-element gelu (its host path warm) or a 64-element
gelu (its AVX-512 loop run) just before it; and the same gelu alone, repeated.
Part 2, per op and size: the call after a 1 ms sleep (a context switch: the core ran
other work) over the call repeated, operands read back just before.

Read here (2026-11-25, one thread, load 5-7 on 2 shared cores): part 1: in the block
85 us (p25 80), after a 0-element gelu 83, after a 64-element one 65.5, alone 48 (the
remaining 17 us: the fresh output, `cost_models.fresh_output`). Part 2, the extra after
the switch, 8 KiB / 512 KiB / 2 MiB: gelu +45 / +57 / +50 us, layer norm +30 / +38,
add +13 / +16 / +16, sum +21 / +26 / +26: flat in size. A rerun at load 3 (20 rounds):
part 1 81 / 74.7 / 54.7 us, alone 45.9; part 2 smaller (gelu +8 / +26 / +24, add +3 / +9
/ +6): what the sleep lets run on the core varies, the block's own traffic does not. Hypotheses it rules out: the
operands cold (read back just before: no change), a fresh output (`out=` into one warm
buffer: the same), CPU frequency after AVX-512 GEMMs (a 64x64 mm or an 8 KiB exp before
the gelu did not help; an 8 KiB gelu did), the ATen path (the same op and variant).
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time

import torch
import torch.nn.functional as F

CLOCK = time.thread_time_ns  # this thread's CPU time: a switch away does not count


def switches() -> int:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_nivcsw + r.ru_nvcsw


def in_block(rounds: int) -> None:
    d, h = 64, 256  # gpt-tiny: hidden 64, MLP 4x; seq 32, micro-batch 16
    x = torch.randn(16, 32, d)
    lnw, lnb = torch.ones(d), torch.zeros(d)
    w1, b1 = torch.randn(h, d) * .1, torch.zeros(h)
    w2, b2 = torch.randn(d, h) * .1, torch.zeros(d)
    wq, bq = torch.randn(3 * d, d) * .1, torch.zeros(3 * d)
    wo, bo = torch.randn(d, d) * .1, torch.zeros(d)

    def block(before):
        hid = F.layer_norm(x, (d,), lnw, lnb)
        q, k, v = F.linear(hid, wq, bq).view(16, 32, 3, 4, 16).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(16, 32, d)
        y = x + F.dropout(F.linear(a, wo, bo), 0.1)
        m = F.linear(F.layer_norm(y, (d,), lnw, lnb), w1, b1)
        if before is not None:
            F.gelu(before)
        c0, t0 = switches(), CLOCK()
        g = F.gelu(m)
        t = (CLOCK() - t0) / 1e3
        _ = y + F.dropout(F.linear(g, w2, b2), 0.1)
        return t, switches() != c0

    befores = {"nothing": None, "gelu 0 el": torch.randn(0), "gelu 64 el": torch.randn(64)}
    times = {k: [] for k in befores}
    with torch.no_grad():
        for _ in range(rounds):
            for k in random.sample(list(befores), len(befores)):
                for _ in range(3):
                    t, switched = block(befores[k])
                    if not switched:
                        times[k].append(t)
        m = torch.randn(16, 32, h)
        alone = []
        for _ in range(300):
            t0 = CLOCK()
            F.gelu(m)
            alone.append((CLOCK() - t0) / 1e3)
    for k, v in times.items():
        print(f"gelu in the block, {k:10s} before: median {statistics.median(v):6.1f} us "
              f"(n={len(v)})")
    print(f"gelu alone, repeated: median {statistics.median(alone):6.1f} us")


def after_switch(rounds: int) -> None:
    ops = {"gelu": lambda a, o: torch.ops.aten.gelu.out(a, out=o),
           "add": lambda a, o: torch.add(a, a, out=o),
           "layer_norm": lambda a, o: torch.ops.aten.native_layer_norm(a, [256], None, None,
                                                                       1e-5),
           "sum": lambda a, o: torch.sum(a, 0, out=o[0])}
    sizes = (8 * 2**10, 512 * 2**10, 2 * 2**20)
    ins = {n: torch.randn(n // 1024, 256) for n in sizes}
    outs = {n: torch.empty(n // 1024, 256) for n in sizes}
    res = {}
    keys = [(o, n, sleep) for o in ops for n in sizes for sleep in (False, True)]
    for _ in range(rounds):
        random.shuffle(keys)
        for o, n, sleep in keys:
            f, a, b = ops[o], ins[n], outs[n]
            f(a, b), f(a, b)
            if sleep:
                time.sleep(0.001)
            a.sum(), b.zero_()  # operands back in cache
            t0 = CLOCK()
            f(a, b)
            res.setdefault((o, n, sleep), []).append((CLOCK() - t0) / 1e3)
    for o in ops:
        print(o, " ".join(f"{n >> 10} KiB: {statistics.median(res[(o, n, False)]):.1f} -> "
                          f"{statistics.median(res[(o, n, True)]):.1f} us" for n in sizes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    torch.set_num_threads(1)
    in_block(args.rounds)
    after_switch(args.rounds // 2)


if __name__ == "__main__":
    main()
