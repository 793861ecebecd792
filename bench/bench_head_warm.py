"""The warm part of the heads' backward (issue 17: heads under-predicted in most quiet
runs): which of the candidate terms a head's nodes really pay, live, one thread, the
probe clock; each comparison alternates its arms within one loop (a slow spell of the
shared host hits them alike). Prints medians in us.

  pieces  a BERT-tiny MLM head (dense 64x64, GELU, LayerNorm, decoder 64x128, token
          cross entropy over 32 positions) timed by `autograd_engine.NodeSpan` in its own
          call, and the same head with a piece swapped out (tanh-GELU, ReLU, no GELU, no
          LayerNorm, the decoder alone): each difference is that piece's nodes in situ.
  gelu    exact GELU's backward (`aten::gelu_backward` on 32 x 64) called back to back,
          with oneDNN off (`torch.backends.mkldnn.flags`), in situ (a pre-hook stamp on
          its node to the next node's, against a multiply's node in the same place), and
          called right after the head's forward and backward.
  loss    the log-softmax backward's node in situ (stamps as above) against the op alone,
          over rows of a 128 vocabulary (the loss's node kinds, the logits' fresh gradient).
  nodes   a chain of 8 Linear(8, 8) + ReLU blocks with and without parameter gradients:
          per function node and per gradient accumulation, less the ops at the kit's C++
          per-op and per-view figures (`host_excess.internal_dispatch_seconds`).

Read here (2026-11-25 16:30-16:40 UTC, load 4.6-6.1: absolute figures inflated, the
differences within a loop comparable): pieces full 117.0-123.1, tanh 85.4-90.4, relu
82.6-87.1, no GELU 77.8-82.3, no norm 108.8-115.7, decoder alone 43.0-45.6: the exact
GELU's nodes 39.2-40.8 us in situ where the kit prices node + op + kernel + fresh + excess
17.4 (excess 11.75, measured back to back); tanh-GELU 7.7-8.1, ReLU 4.8, LayerNorm 7.4-8.2
(priced ~13). gelu: exact GELU runs oneDNN's eltwise primitive: back to back its
backward 18.6-19.1 us (after any one other op alike: a GELU forward, a mm, a layer norm,
an add), oneDNN off 5.0 (forward 10 -> 3.2); in situ its node 30.7-32.3 against a
multiply's 9.0-9.1 (priced difference ~13.7: ~6-8 us a call unpriced, part of it this
load's larger excess), called right after the head's forward and backward 29.7-31.7;
its forward in situ 19.2-19.9 against a multiply's 12.6 (priced difference ~7: right).
loss: the log-softmax backward's node in situ 5.5-8.3 / 12.0-13.7 / 35.4-39.8 us at 32 /
128 / 512 rows, alone 4.3-7.7 / 8.3-12.8 / 23.6-43.4, priced (node, op, excess, kernel,
fresh) 6.4 / 12.7 / 33.1: priced right. nodes: 2.02-2.08 us per function node,
2.05-2.10 per accumulation (~1.6 less the bias sums' excess), the kit's average 2.03-2.09.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python bench/bench_head_warm.py \\
        [pieces] [gelu] [loss] [nodes]
"""

from __future__ import annotations

import os
import resource
import statistics
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cost_models.autograd_engine import NodeSpan  # noqa: E402
from cost_models.host_excess import internal_dispatch_seconds  # noqa: E402
from cost_models.host_probes import probe_clock  # noqa: E402

MEMORY_CAP_BYTES = 6 << 30
TOKENS, HIDDEN, VOCAB = 32, 64, 128  # bert-tiny's sequence, hidden size and vocabulary
ROUNDS, SKIPPED = 600, 60  # alternating rounds; the first SKIPPED are warm-up
aten = torch.ops.aten
clock = probe_clock("cpu")


def span_us(make) -> float:
    """us of the nodes of `make()`'s loss in their own call (NodeSpan: first node to marker)."""
    span = NodeSpan("cpu", clock, lambda: None)
    loss = make()
    span.arm([loss])
    torch.autograd.backward([loss, span.root], [torch.ones_like(loss), torch.ones_like(span.root)])
    return span.seconds() * 1e6


def node_us(make, pick) -> float:
    """us from the pre-hook of node `pick(graph output)` to its first next node's."""
    out, marks = make()
    node = pick(out)
    node.register_prehook(lambda g: marks.setdefault("a", clock()) and None)
    node.next_functions[0][0].register_prehook(lambda g: marks.setdefault("b", clock()) and None)
    loss = out[-1] if isinstance(out, tuple) else out
    loss.backward()
    return (marks["b"] - marks["a"]) * 1e6


def alternate(arms: dict, rounds: int = ROUNDS) -> dict:
    got = {k: [] for k in arms}
    for r in range(rounds):
        for k in (list(arms) if r % 2 else list(arms)[::-1]):
            got[k].append(arms[k]())
    return {k: statistics.median(v[SKIPPED:]) for k, v in got.items()}


class Head:
    """bert-tiny's MLM head and its loss, leaves cleared before each run."""

    def __init__(self, batch: int = 1):
        self.dense, self.norm = nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN)
        self.decoder = nn.Linear(HIDDEN, VOCAB)
        self.x = torch.randn(batch * TOKENS, HIDDEN, requires_grad=True)
        self.y = torch.randint(0, VOCAB, (batch * TOKENS,))
        self.leaves = [self.x, *self.dense.parameters(), *self.norm.parameters(),
                       *self.decoder.parameters()]

    def loss(self, act=F.gelu, norm=True, dense=True, keep=False):
        for p in self.leaves:
            p.grad = None
        h = self.dense(self.x) if dense else self.x
        a = act(h)
        z = self.norm(a) if norm else a
        loss = F.cross_entropy(self.decoder(z), self.y)
        return ((a, loss), {}) if keep else loss


def pieces() -> None:
    head = Head()
    m = alternate({
        "full": lambda: span_us(head.loss),
        "tanh": lambda: span_us(lambda: head.loss(lambda t: F.gelu(t, approximate="tanh"))),
        "relu": lambda: span_us(lambda: head.loss(F.relu)),
        "no_gelu": lambda: span_us(lambda: head.loss(lambda t: t)),
        "no_norm": lambda: span_us(lambda: head.loss(norm=False)),
        "decoder": lambda: span_us(lambda: head.loss(lambda t: t, False, False))})
    print("pieces: " + " ".join(f"{k} {v:.1f}" for k, v in m.items()))
    print(f"  exact GELU {m['full'] - m['no_gelu']:.1f}, tanh-GELU {m['tanh'] - m['no_gelu']:.1f}, "
          f"ReLU {m['relu'] - m['no_gelu']:.1f}, LayerNorm {m['full'] - m['no_norm']:.1f}")


def gelu() -> None:
    head = Head()
    g, x = torch.randn(TOKENS, HIDDEN), torch.randn(TOKENS, HIDDEN)

    def back_to_back(onednn: bool) -> float:
        with torch.backends.mkldnn.flags(enabled=onednn):
            aten.gelu_backward(g, x)
            start = clock()
            aten.gelu_backward(g, x)
            return (clock() - start) * 1e6

    def after_head() -> float:
        span_us(head.loss)
        start = clock()
        aten.gelu_backward(g, x)
        return (clock() - start) * 1e6

    def forward_in_situ(act) -> float:  # the call in the head's forward, after its dense
        for p in head.leaves:
            p.grad = None
        h = head.dense(head.x)
        start = clock()
        a = act(h)
        took = (clock() - start) * 1e6
        F.cross_entropy(head.decoder(head.norm(a)), head.y).backward()
        return took

    m = alternate({
        "forward in situ": lambda: forward_in_situ(F.gelu),
        "mul forward in situ": lambda: forward_in_situ(lambda t: t * 1.5),
        "back to back": lambda: back_to_back(True),
        "oneDNN off": lambda: back_to_back(False),
        "in situ": lambda: node_us(lambda: head.loss(keep=True), lambda out: out[0].grad_fn),
        "mul in situ": lambda: node_us(lambda: head.loss(lambda t: t * 1.5, keep=True),
                                       lambda out: out[0].grad_fn),
        "after the head": after_head}, rounds=ROUNDS // 2)
    print("gelu: " + " ".join(f"{k} {v:.1f}" for k, v in m.items()))


def loss() -> None:
    for rows in (32, 128, 512):
        x = torch.randn(rows, HIDDEN, requires_grad=True)
        w = torch.randn(VOCAB, HIDDEN, requires_grad=True)
        lsm = torch.log_softmax(torch.randn(rows, VOCAB), -1)
        grad = torch.full((rows, VOCAB), 1e-3)

        def in_situ():
            x.grad = w.grad = None
            z = F.log_softmax(F.linear(x, w), -1)
            return (z, (z * 1e-3).sum()), {}

        def alone():
            start = clock()
            aten._log_softmax_backward_data(grad, lsm, 1, torch.float32)
            return (clock() - start) * 1e6

        m = alternate({"in situ": lambda: node_us(in_situ, lambda out: out[0].grad_fn),
                       "alone": alone}, rounds=ROUNDS // 2)
        print(f"log-softmax backward, {rows} x {VOCAB}: "
              + " ".join(f"{k} {v:.1f}" for k, v in m.items()))


def nodes() -> None:
    internal = internal_dispatch_seconds("cpu")
    views = {"t", "view", "detach", "expand", "alias"}
    runs = {}
    for arm, frozen in (("grads", False), ("frozen", True)):
        net = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(8, 8), nn.ReLU())])
        for p in net.parameters():
            p.requires_grad_(not frozen)
        x = torch.randn(2, 8, requires_grad=True)
        ops = []

        class Log(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                ops.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        out = net(x).sum()
        with Log():
            out.backward()
        functions, accumulations, seen, stack = 0, 0, set(), [out.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            stack.extend(f for f, _ in node.next_functions)
            if not hasattr(node, "variable"):
                functions += 1
            elif node.variable is not x:
                accumulations += 1
        n_views = sum(o in views for o in ops)

        def run(net=net, x=x):
            net.zero_grad(set_to_none=True)
            x.grad = None
            return span_us(lambda: net(x).sum())
        runs[arm] = (run, len(ops) - n_views, n_views, functions, accumulations)
    m = alternate({arm: r[0] for arm, r in runs.items()}, rounds=4 * ROUNDS)
    rest = {arm: m[arm] - (r[1] * internal.op_s + r[2] * internal.view_s) * 1e6
            for arm, r in runs.items()}
    function_us = rest["frozen"] / runs["frozen"][3]
    accumulation_us = (rest["grads"] - runs["grads"][3] * function_us) / runs["grads"][4]
    print(f"nodes: per function node {function_us:.2f} us, per accumulation "
          f"{accumulation_us:.2f}, all-node average "
          f"{rest['grads'] / (runs['grads'][3] + runs['grads'][4]):.2f}")


def main(argv: list[str]) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))
    torch.set_num_threads(1)
    modes = {"pieces": pieces, "gelu": gelu, "loss": loss, "nodes": nodes}
    for name in argv or list(modes):
        modes[name]()
        print(f"  load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
