"""What a Python-level torch call costs the host, apart from what an ATen op dispatched
inside a C++ composite costs; one thread, grad mode off, the probe clock.

A layer's forward calls torch from Python: each call parses its arguments in Python's
binding and then dispatches one or more ATen ops. A plain op (`torch.add`) is one call,
one op; a composite (`F.linear` on a 3-D input: t, view, addmm, view) is one call whose
further ops are dispatched from C++ with no Python in front. On this CPU (torch 2.13, one
thread, thread clock, 2 x 8 fp32, grad off, 2026-11-24) `torch.add` took 0.97 us a call,
`x.view` 0.80, `torch.arange` 1.27, while `F.linear` on 2 x 1 x 8 took 2.56 us for 4 ops
(1.74 of them one `torch.addmm` call): ~0.27 us per op inside it. Pricing every op at one
figure makes rows of plain calls (index arithmetic, RMS norms written out) too fast and
rows of composites too slow.

A Python number handed for a Tensor argument (`x * 0.5`) is wrapped into a 0-dim tensor
by the binding, and cast where its dtype (double, long) is not the op's: `x * 0.5` on
float32 took 2.22 us against `x * y`'s 1.00, `xi * 2` on int64 1.40 against 1.05.

`python_call_seconds` times chains of CALL_CHAIN_CALLS tiny calls, each feeding the next:
  calls      `torch.add(y, x)`: 1 op per call, no excess (the reference of
             `cost_models.host_excess`), so per call = time / calls;
  composite  `F.linear` on a 3-D input: per op inside = (time - calls x per call - its
             ops' excess) / (its ops - calls), the excess (addmm's bias copy) being
             charged per record by the layer's model;
  cast       `torch.add(y, 0.5)` on float32: per cast number = time / calls - per call;
  number     `torch.add(yi, 1)` on int64: per number = time / calls - the same chain's
             per call with an int64 tensor for the 1 (`int_calls`).
`cost_models.compute.forward_host_seconds` prices a layer's forward as Python calls
(`Layer.python_calls_fwd`) x per call + the rest of its ops x per inner op + its wrapped
numbers, with module calls, python nodes, grad_fns recorded and excess on top (each
probed apart). profile-device does not write these figures: every layer runs its calls
in order, distinct calls after one another, and pays 22-43% over the same calls each in
a tight loop (what these chains time), an amount no one figure gives (bench/
bench_in_sequence.py); with them the model missed more layers' timings than the per-op
figures do (bench/bench_host_ab.py, which measures them itself).

    >>> cost = python_call_seconds("cpu")                            # doctest: +SKIP
    >>> cost.call_s, cost.inner_op_s                                 # ~1e-6, ~3e-7
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

# A chain is CALL_CHAIN_CALLS calls, each on the last one's output (2 x 1 x 8 fp32: a few
# dozen elements, nanoseconds of arithmetic, so what is timed is the host). A round runs
# each chain CALL_RUNS_PER_ROUND times in turn (milliseconds: far above the thread
# clock's resolution); each figure is the median over CALL_ROUNDS rounds, after
# CALL_WARMUP_RUNS untimed runs of each.
CALL_CHAIN_CALLS = 16
CALL_RUNS_PER_ROUND = 50
CALL_ROUNDS = 11
CALL_WARMUP_RUNS = 10
CALL_SHAPE = (2, 1, 8)  # 3-D and contiguous: F.linear flattens it, addmm, views back


@dataclass(frozen=True, slots=True)
class PythonCallCost:
    """Host seconds per Python-level torch call (its first op included: `call_s`) and per
    ATen op a composite dispatches inside a call (`inner_op_s`), grad mode off, the ops'
    fixed excess out; the ops each chain dispatched, for the record."""

    call_s: float
    inner_op_s: float
    chain_ops: int
    composite_ops: int
    wrapped_number_s: float = 0.0  # per Python number for a Tensor argument, op's dtype
    cast_wrapped_number_s: float = 0.0  # ... of another dtype (cast)

    def calibration_fields(self) -> dict:
        """The `KernelCalibration` fields these figures fill."""
        return dict(python_call_host_s=self.call_s, inner_op_host_s=self.inner_op_s,
                    wrapped_number_host_s=self.wrapped_number_s,
                    cast_wrapped_number_host_s=self.cast_wrapped_number_s)


def python_call_seconds(device: str = "cpu",
                        excess_s: Callable[[str], float] = lambda op: 0.0) -> PythonCallCost:
    """Per Python call, per inner op and per wrapped number from the chains of the module
    docstring, run in turn within each round (a slow spell of a shared machine hits all).
    `excess_s(op key)`: the per-call host excess of an op (`KernelCalibration
    .host_excess_s`, a `host_excess.PlainDispatch.excess_s` look-up), taken out of the composite
    chain as `compute.forward_host_seconds` charges it per record."""
    import torch
    import torch.nn.functional as F

    from cost_models.clusters import _one_thread
    from cost_models.host_excess import records_excess_seconds
    from cost_models.host_probes import probe_clock
    from ir.kernel_recorder import KernelRecorder
    from ir.op_count import OpCounter, count_ops

    clock = probe_clock(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with _one_thread(), torch.no_grad():  # recording is priced apart (forward_node_host_s)
        x = torch.randn(*CALL_SHAPE, device=device)
        weight = torch.randn(CALL_SHAPE[-1], CALL_SHAPE[-1], device=device)
        bias = torch.randn(CALL_SHAPE[-1], device=device)

        def add_chain(first, operand):
            """CALL_CHAIN_CALLS `torch.add` calls, each one Python-level call."""
            def chain():
                y = first
                for _ in range(CALL_CHAIN_CALLS):
                    y = torch.add(y, operand)
                return y
            return chain

        def composites():
            y = x
            for _ in range(CALL_CHAIN_CALLS):
                y = F.linear(y, weight, bias)
            return y

        ints = torch.ones(*CALL_SHAPE, dtype=torch.int64, device=device)
        calls = add_chain(x, x)
        cast_numbers = add_chain(x, 0.5)  # a double into float32: cast
        int_calls = add_chain(ints, ints)
        int_numbers = add_chain(ints, 1)  # a long into int64: no cast
        chains = (calls, composites, cast_numbers, int_calls, int_numbers)

        chain_ops, composite_ops = count_ops(calls), count_ops(composites)
        inner_ops = composite_ops - CALL_CHAIN_CALLS
        if chain_ops != CALL_CHAIN_CALLS or inner_ops <= 0:
            raise RuntimeError(f"call probe: torch.add chain dispatched {chain_ops} ops and "
                               f"F.linear chain {composite_ops} for {CALL_CHAIN_CALLS} calls "
                               "each; expected one op per add and more per linear")
        recorder = KernelRecorder(set())
        with OpCounter(recorder):
            composites()
        composite_excess_s = records_excess_seconds(recorder.records(), excess_s)
        for _ in range(CALL_WARMUP_RUNS):
            for chain in chains:
                chain()
        rounds = {name: [] for name in ("call", "inner", "cast", "number")}
        for _ in range(CALL_ROUNDS):
            seconds = [0.0] * len(chains)
            for _ in range(CALL_RUNS_PER_ROUND):
                for i, chain in enumerate(chains):
                    start = clock()
                    chain()
                    sync()
                    seconds[i] += clock() - start
            call_s, composite_s, cast_s, int_call_s, int_number_s = (
                s / CALL_RUNS_PER_ROUND / CALL_CHAIN_CALLS for s in seconds)
            rest_s = CALL_CHAIN_CALLS * (composite_s - call_s) - composite_excess_s
            rounds["call"].append(call_s)
            rounds["inner"].append(rest_s / inner_ops)
            rounds["cast"].append(cast_s - call_s)
            rounds["number"].append(int_number_s - int_call_s)
    median = {name: max(0.0, statistics.median(r)) for name, r in rounds.items()}
    return PythonCallCost(median["call"], median["inner"], chain_ops, composite_ops,
                          median["number"], median["cast"])
