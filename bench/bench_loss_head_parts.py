"""The loss heads' backward (issue 17: mlp-small's head -20/-40/-37% at micro-batch 1/4/16,
dlrm-small's top_mlp -18..-22%, llama-tiny's norm after the head -27/-26% at 1/4, median
of ten repriced runs): what their calls pay that the host model may not see, each arm
alternating with its reference within one loop, this thread's CPU clock, one thread.

  scalar  a backward formula's number (RsqrtBackward0's `mul.Scalar(grad, -0.5)`,
          MeanBackward's `div.Scalar(grad, n)`: ATen wraps it in a 0-dim tensor, `aten::to`
          / `_to_copy` / `copy_` under the CPU profiler) against the same op on two
          tensors, beside Python's `x * -0.5` against `x * y` (the kit's
          `scalar_operand_float_host_s` measures that one) and the kit's own probe.
  rows    (log-)softmax forward and backward over 1 / 16 / 64 rows of 10 (mlp-small's
          classes) and of 128 (the tiny LMs' vocabulary): per extra row against the
          kit's `softmax_row_s` (rows of 32 against rows of 4096).
  mm      a Linear(64, 10) head's two backward products at m = 1 and 16, back to back,
          and a Linear (+ cross-entropy) backward call whole in the engine
          (`torch.autograd.backward`, its forward untimed).

Read here (2026-11-26 21:47-22:06 UTC, load 7-15 on the shared 2-core host; the last
run 22:05, load 10-14):
  scalar: mul.Scalar 1.14-1.17 us over mul.Tensor, div.Scalar 1.20-1.22 over div.Tensor,
    Python's number 1.24, the kit's probe 1.42-1.64: a C++ formula's number pays the
    forward's figure. The records marked these calls (`KernelRecord.scalar_operand`) but
    only the forward priced them; now `host_dispatch.backward_host_seconds` does too
    (ten repriced runs: rows over 15% 38 -> 38, 17 rows closer and 6 further; llama-tiny
    norm bwd mb 1/4 -27/-26% -> -21/-21%, t5-tiny head mb 1 -18 -> -16%, dlrm top_mlp
    -18/-19/-22 -> -18/-19/-21%; t5-tiny encoder_norm mb 1 +3 -> +12%, mb 16 +17 -> +20%:
    its backward runs the same three wraps, seen under the profiler, so its excess is
    elsewhere).
  rows: per extra row, rows of 10: log-softmax forward 127-131 ns, softmax forward
    153-154, their backwards 58-59 each; rows of 128: 59 / 70 / 43 / 15 (bytes there); the kits'
    `softmax_row_s` 8.4-8.8 ns (rows of 32). A row shorter than the vector (10 < 16
    fp32) runs a scalar tail per row: mlp-small's head forward at mb 16 pays ~2 us of
    it, its backward ~0.9, the kit prices 0.1 (no backward row term at all). Needs a
    kit figure at short widths: saved runs cannot judge it (not done).
  mm: back to back dx 1.07 -> 1.28 us (m 1 -> 16), dw 1.87 -> 2.11; the engine's Linear
    + cross-entropy backward 37.7 -> 40.5 (Linear alone 29.5 -> 30.4): the head's growth with the micro-batch (31 -> 44 us
    in the profile) is not its calls' own. Under the CPU profiler (which leaves every
    op's code cold) the head's two mm read 9.1 -> 13.6-14.9 us from mb 1 to 16 in both
    arrangements: MKL's GEMM code at m = 16 against its matrix-vector code at m = 1
    (bench_gemm_cold_m.py). Priced as cold (the kit's "gemm" kind, in full) for GEMM
    records in a warm step (`Layer.step_warm`, where op_cold_code prices none), ten
    repriced runs: the head's backward -20/-40/-37% -> -12/-33/-32%, but its forward mb 1
    +6 -> +17%, blocks.0's backward +31/+20/+31% -> +48/+35/+47%, blocks.1's +3 -> +18%:
    rows over 15% 38 -> 38, 9 rows further and 7 closer. Rejected.
  Not tried in code: the step's first backward (the last layer's) paying an entry, as a
    forward after other work does. Offline on the ten repriced rows, + the kit's least
    after-backward `ColdEntryPoint.entry_s` (3-6 us) on each last layer's backward:
    mlp-small head -20/-40/-37% -> -3/-26/-23%, t5-tiny head mb 1 -16 -> -8%, gpt-tiny
    and llama-tiny heads mb 1 -12 / -8 -> -1 / -1%, but their mb 16 +15 / +13 -> +18 /
    +16% and cnn-small's mb 1 +0 -> +9%: rows over 15% unchanged, and the figure is a
    forward's entry; a probe of the first backward node after a step's forwards would
    have to measure it first (bench_head_arrangement.py read 0.7-2.9 us for a head's
    nodes first in an engine call against after another graph's).
  Live, bench_head_arrangement.py (load 14): mlp-small's head backward at mb 1 stock 35.1
    us, warm ("neither") 33.5; at mb 16 43.8 and 34.3: the growth is the step's work
    between (blocks' GEMMs at m = 16), the warm part ~34 us against ~24 priced.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_loss_head_parts.py \
        [scalar] [rows] [mm]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.scalar_operand_probes import scalar_operand_seconds  # noqa: E402

CALLS = 300  # calls per timed round
ROUNDS = 15  # rounds; each arm's least (rows) or median (the others)
CLOCK = time.thread_time  # this thread's CPU time: a switch away does not count
aten = torch.ops.aten


def per_call_s(call) -> float:
    start = CLOCK()
    for _ in range(CALLS):
        call()
    return (CLOCK() - start) / CALLS


def alternate(arms: dict, pick=statistics.median) -> dict:
    """Each arm's per-call seconds over ROUNDS rounds, the arms alternating in each."""
    times = {name: [] for name in arms}
    for _ in range(ROUNDS):
        for name, call in arms.items():
            call()
            times[name].append(per_call_s(call))
    return {name: pick(t) for name, t in times.items()}


def scalar() -> None:
    x, y = torch.rand(2, 2) + 1.0, torch.full((2, 2), -0.5)
    with torch.no_grad():
        s = alternate({"mul.Scalar": lambda: aten.mul.Scalar(x, -0.5),
                       "mul.Tensor": lambda: aten.mul.Tensor(x, y),
                       "div.Scalar": lambda: aten.div.Scalar(x, 3),
                       "div.Tensor": lambda: aten.div.Tensor(x, y),
                       "x * -0.5": lambda: x * -0.5, "x * y": lambda: x * y})
    kit = scalar_operand_seconds("cpu").float_s
    print(f"scalar: mul.Scalar - mul.Tensor {(s['mul.Scalar'] - s['mul.Tensor']) * 1e6:.2f} us, "
          f"div.Scalar - div.Tensor {(s['div.Scalar'] - s['div.Tensor']) * 1e6:.2f}, Python "
          f"{(s['x * -0.5'] - s['x * y']) * 1e6:.2f}; the kit's probe {kit * 1e6:.2f}")


def rows() -> None:
    arms = {}
    for width in (10, 128):
        for n in (1, 16, 64):
            x, g = torch.randn(n, width), torch.randn(n, width)
            lp, sm = torch.log_softmax(x, 1), torch.softmax(x, 1)
            arms[("log_softmax", width, n)] = lambda x=x: aten._log_softmax(x, 1, False)
            arms[("softmax", width, n)] = lambda x=x: aten._softmax(x, 1, False)
            arms[("log_softmax_backward", width, n)] = lambda g=g, lp=lp: \
                aten._log_softmax_backward_data(g, lp, 1, torch.float32)
            arms[("softmax_backward", width, n)] = lambda g=g, sm=sm: \
                aten._softmax_backward_data(g, sm, 1, torch.float32)
    with torch.no_grad():
        s = alternate(arms, min)
    for op in ("log_softmax", "softmax", "log_softmax_backward", "softmax_backward"):
        print(f"rows: {op}: " + ", ".join(
            f"width {w} {(s[(op, w, 64)] - s[(op, w, 1)]) / 63 * 1e9:.0f} ns per row"
            for w in (10, 128)))


def mm() -> None:
    weight = torch.randn(10, 64)
    arms = {}
    for m in (1, 16):
        g, x = torch.randn(m, 10), torch.randn(m, 64)
        arms[("dx", m)] = lambda g=g: torch.mm(g, weight)
        arms[("dw", m)] = lambda g=g, x=x: torch.mm(g.t(), x)
    with torch.no_grad():
        s = alternate(arms)
    linear = torch.nn.Linear(64, 10)

    def backward_s(m: int, loss: bool) -> float:
        """Seconds per backward call alone (the forward before it untimed)."""
        total = 0.0
        for _ in range(CALLS):
            x = torch.randn(m, 64, requires_grad=True)
            out = linear(x)
            if loss:
                out = F.cross_entropy(out, torch.randint(0, 10, (m,)))
            seed = torch.ones_like(out)
            start = CLOCK()
            torch.autograd.backward([out], [seed])
            total += CLOCK() - start
            linear.weight.grad = linear.bias.grad = None
        return total / CALLS
    engine = {(kind, m): [] for kind in ("linear", "linear + ce") for m in (1, 16)}
    for _ in range(ROUNDS):
        for kind, m in engine:
            engine[kind, m].append(backward_s(m, kind == "linear + ce"))
    e = {key: statistics.median(t) for key, t in engine.items()}
    for kind in ("dx", "dw", "linear", "linear + ce"):
        t = s if (kind, 1) in s else e
        print(f"mm: {kind}: m 1 {t[(kind, 1)] * 1e6:.2f} us, m 16 {t[(kind, 16)] * 1e6:.2f}")


def main() -> int:
    torch.set_num_threads(1)
    parts = {"scalar": scalar, "rows": rows, "mm": mm}
    for name in sys.argv[1:] or list(parts):
        parts[name]()
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
